// Scalar references of the MoE kernels (src/backend/cpu/kernels_moe.h):
// the plainest version, in double where a value is computed. Tests only.
#ifndef LOOM_BACKEND_CPU_REFERENCE_REFERENCE_MOE_H_
#define LOOM_BACKEND_CPU_REFERENCE_REFERENCE_MOE_H_

#include <cstdint>

#include "src/backend/cpu/kernels_moe.h"

namespace loom::cpu::ref {

// Selection by sorting (score descending, index ascending); softmax and
// renormalisation in double. Scores are the f32 probabilities (for
// kSoftmaxThenTopK) computed in double and rounded once, or the logits.
void TopKRoute(const float* logits, int64_t rows, int64_t cols, int64_t ld,
               int64_t k, TopKMode mode, bool renormalize, int32_t* ids,
               float* weights);
// Group scores, group and column selection by sorting (value descending,
// index ascending); s = sigmoid in double rounded once to f32, c = s + bias
// in f32 (selections agree with the kernel's where the choice values are
// further apart than a few ulp), the weights' sum and division in double.
void SigmoidGroupTopKRoute(const float* logits, int64_t rows, int64_t cols,
                           int64_t ld, int64_t k, const float* bias,
                           int64_t groups, int64_t keep_groups,
                           bool renormalize, float scale, int32_t* ids,
                           float* weights);
void ClampedSwiglu(const float* gate_up, int64_t gu_rs, float* out,
                   int64_t rows, int64_t n, float alpha, float limit);
void SigmoidGateAddRows(const float* x, const float* g, int64_t rows,
                        int64_t cols, float* y, int64_t ldy);

}  // namespace loom::cpu::ref

#endif  // LOOM_BACKEND_CPU_REFERENCE_REFERENCE_MOE_H_
