// CPU kernels of the backward: vector-Jacobian products with respect to
// activations (weights are constants). Each is paired with a scalar
// reference in reference/reference_backward.h.
//
// Invariances (the forward's rule, docs/design/batch-invariance.md): one
// row's (one token's) result depends only on that row's inputs and, for
// attention, its own sequence; never on the batch's other rows or
// sequences, nor on the thread count. Every reduction runs in a fixed order
// (weight-row blocks in order in GemmBackwardInput, keys ascending then queries
// ascending in AttentionBackward), and the work is split between threads
// only along dimensions no reduction crosses.
#ifndef LOOM_BACKEND_CPU_BACKWARD_CPU_H_
#define LOOM_BACKEND_CPU_BACKWARD_CPU_H_

#include <cstdint>

#include "src/backend/cpu/kernels.h"
#include "src/core/dtype.h"
#include "src/core/quant_codes.h"

namespace loom::cpu {

// A GEMM weight W [n, k] (out, in) as the forward GEMM reads it: dense
// `dtype` values stored [n, k] (in_out false) or [k, n] (in_out true), or in
// one of the CPU's packed layouts (panels: [n / 16][k][16]; strips, bf16:
// [n / 16][k / 2][16][2]); or quantized codes (`quant`, dtype ignored).
struct WeightRows {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t n = 0, k = 0;
  bool in_out = false, panels = false, strips = false;
  const QuantMatrix* quant = nullptr;
};

// out [rows, k] f32 = W[row0 .. row0 + rows, :], exactly (the stored value,
// or the format's exact f32 decode).
void DecodeWeightRows(const WeightRows& w, int64_t row0, int64_t rows,
                      float* out);

// Rows of W decoded per block of GemmBackwardInput.
inline constexpr int64_t kBackwardRowBlock = 256;
// Its workspace for dy [m, n] and W [n, k]: the decoded block [256, k] f32,
// the block's columns of dy [m, 256] and the forward GEMM's workspace.
int64_t GemmBackwardWorkspaceBytes(int64_t m, int64_t n, int64_t k);

// dx [m, k] (row stride ldx) (+)= dy [m, n] (row stride ldy) W: per block of
// kBackwardRowBlock rows of W (decoded to f32 in `workspace`), the forward's
// tiled GEMM with the block as a [in = rows, out = k] weight, accumulated
// block after block in order (so a row's result depends on that row alone).
void GemmBackwardInput(GemmContext& ctx, const WeightRows& w, const float* dy,
                       int64_t ldy, int64_t m, float* dx, int64_t ldx,
                       bool accumulate, void* workspace);

// RMSNorm / LayerNorm VJP per row (sums in double); see NormBackwardOp in
// src/backend/backend.h. w null: no gain.
void NormBackward(const float* x, const float* dy, float* dx, int64_t rows,
                  int64_t dim, const void* w, DType w_dtype, float offset,
                  float eps, bool layer_norm, bool freeze_scale,
                  bool accumulate);

// Attention's VJP (AttentionArgs as the forward's, no KV cache, no probs);
// dz [T, q_heads * dv]; dq (row stride q_rs), dk (k_rs), dv (v_rs) written.
// Parallel over (sequence, kv head) pairs; `workspace` holds
// AttentionBackwardWorkspaceBytes(longest sequence, NumThreads()) bytes.
void AttentionBackward(const AttentionArgs& a, const float* dz, float* dq,
                       float* dk, float* dv, bool freeze_pattern,
                       void* workspace);
int64_t AttentionBackwardWorkspaceBytes(int64_t max_len, int num_threads);

// dx[i] = dy[i] * act'(x[i]) (dx may alias dy).
void ActivationBackward(Activation act, const float* x, const float* dy,
                        float* dx, int64_t n);
// out = act(gate) * up: dgate = dout * up * act'(gate), dup = dout *
// act(gate).
void GatedActivationBackward(Activation act, const float* gate, int64_t gate_rs,
                             const float* up, int64_t up_rs, const float* dout,
                             float* dgate, int64_t dg_rs, float* dup,
                             int64_t du_rs, int64_t rows, int64_t n);

// out = (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g), g = min(gate,
// limit), gate and up interleaved in gate_up [rows, 2n] (row stride gu_rs):
// dgate_up [rows, 2n] (row stride dgu_rs) from dout [rows, n].
void ClampedSwigluBackward(const float* gate_up, int64_t gu_rs,
                           const float* dout, float* dgate_up, int64_t dgu_rs,
                           int64_t rows, int64_t n, float alpha, float limit);

// act(x) and act'(x) in f32, as the forward's activation kernels compute
// act (shared by the kernel and its test).
float ActivationValue(Activation act, float x);
float ActivationDerivative(Activation act, float x);

}  // namespace loom::cpu

#endif  // LOOM_BACKEND_CPU_BACKWARD_CPU_H_
