// CPU kernels of the mixture-of-experts block: top-k routing, the clamped
// interleaved SwiGLU, the sigmoid-gated row add and zero fill. Plain arrays,
// no model knowledge; each has a scalar reference in
// reference/reference_moe.h and a test against it (kernels_moe_test.cc).
#ifndef LOOM_BACKEND_CPU_KERNELS_MOE_H_
#define LOOM_BACKEND_CPU_KERNELS_MOE_H_

#include <cstdint>

namespace loom::cpu {

enum class TopKMode {
  kSoftmaxThenTopK,  // p = softmax over all columns, the k largest p
  kTopKThenSoftmax,  // the k largest logits, softmax over those k
};

// The most columns (experts) TopKRoute takes: its per-row scratch.
inline constexpr int64_t kMaxRouteColumns = 4096;

// For each of `rows` rows of `cols` logits (row stride ld): the k selected
// columns in descending order of their score (equal scores: lower column
// first) into ids [rows, k], and their weights into weights [rows, k]. With
// kSoftmaxThenTopK and `renormalize`, the k probabilities are divided by
// their sum. Softmax in f32 (max subtracted). 0 < k <= cols <=
// kMaxRouteColumns.
void TopKRoute(const float* logits, int64_t rows, int64_t cols, int64_t ld,
               int64_t k, TopKMode mode, bool renormalize, int32_t* ids,
               float* weights);

// Group-limited sigmoid routing (DeepSeek-V3's), for each of `rows` rows of
// `cols` logits x (row stride ld): s = sigmoid(x), choice c = s + bias
// (bias [cols] f32, null = zeros). The columns form `groups` consecutive
// groups of cols / groups (>= 2) columns, each scored by the sum of its two
// largest c; the `keep_groups` best groups are kept (equal scores: lower
// group first) and the other groups' c set to 0.0 (not -inf: a kept column
// with c < 0 ranks below them). ids [rows, k] = the k largest c in
// descending order (equal: lower column first); weights [rows, k] = s of
// those (not c), divided by (their sum + 1e-20) when `renormalize`, times
// `scale`. 0 < keep_groups <= groups, cols % groups == 0, 0 < k <= cols <=
// kMaxRouteColumns (k may exceed the kept columns: masked ones then fill
// the remaining slots, as in HF).
void SigmoidGroupTopKRoute(const float* logits, int64_t rows, int64_t cols,
                           int64_t ld, int64_t k, const float* bias,
                           int64_t groups, int64_t keep_groups,
                           bool renormalize, float scale, int32_t* ids,
                           float* weights);

// gate_up [rows, 2n] (row stride gu_rs) holds gate in the even columns and up
// in the odd ones: g = min(gate, limit), u = clamp(up, -limit, limit),
// out[r, i] = (u + 1) * (g * sigmoid(alpha * g)).   out: [rows, n] dense
void ClampedSwiglu(const float* gate_up, int64_t gu_rs, float* out,
                   int64_t rows, int64_t n, float alpha, float limit);

// y[r, :] += sigmoid(g[r]) * x[r, :].   x: [rows, cols] dense; g: [rows];
// y: [rows, cols] row stride ldy
void SigmoidGateAddRows(const float* x, const float* g, int64_t rows,
                        int64_t cols, float* y, int64_t ldy);

// x[0, n) = 0.
void SetZero(float* x, int64_t n);

// Counting sort of the tokens * k (token, slot) pairs of ids/w [tokens, k] by
// expert, stable in token order: offsets [experts + 1], rows [tokens * k]
// (token of each routed row), row_w [tokens * k]. Returns -1, or the flat
// index of the first id outside [0, experts) (outputs then unspecified).
int64_t GroupByExpert(const int32_t* ids, const float* w, int64_t tokens,
                      int64_t k, int64_t experts, int32_t* offsets,
                      int32_t* rows, float* row_w);

}  // namespace loom::cpu

#endif  // LOOM_BACKEND_CPU_KERNELS_MOE_H_
