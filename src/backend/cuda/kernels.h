// The CUDA backend's kernels, as host-callable launchers. Every pointer is
// device memory unless its comment says otherwise; every launcher enqueues on
// `stream` and returns at once (errors surface at the backend's next
// Synchronize, see CudaBackend). Activations are f32, as on the CPU backend;
// weights arrive in their stored dtype and are widened in the kernel.
//
// This header is included by .cu files: it uses plain types only (no model or
// backend headers), so nvcc's front end sees little of the project.
//
// Each kernel has a scalar reference in the CPU backend
// (src/backend/cpu/reference/), which the `cuda` tests compare against.
#ifndef LOOM_BACKEND_CUDA_KERNELS_H_
#define LOOM_BACKEND_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "src/core/dtype.h"
#include "src/core/quant_codes.h"

namespace loom::cuda {

// The same values as loom::ActivationFn (checked in cuda_backend.cc).
enum class Act : int {
  kSilu = 0,
  kGeluTanh = 1,
  kGeluExact = 2,
  kRelu = 3,
  kReluSquared = 4
};
// The same values as loom::RouterKind.
enum class Route : int { kSoftmaxTopK = 0, kTopKSoftmax = 1 };

// ---- Elementwise (kernels_elementwise.cu) ----
void Add(const float* x, float* y, int64_t n, cudaStream_t s);  // y += x
void Scale(float* x, int64_t n, float scale, cudaStream_t s);
void Softcap(float* x, int64_t n, float cap,
             cudaStream_t s);  // cap*tanh(x/cap)
void SetZero(float* x, int64_t n, cudaStream_t s);
// x [rows, cols] row stride ld.
void Clamp(float* x, int64_t rows, int64_t cols, int64_t ld, float lo, float hi,
           cudaStream_t s);
void RoundToBf16(float* x, int64_t rows, int64_t cols, int64_t ld,
                 cudaStream_t s);
void Activation(Act fn, float* x, int64_t n, cudaStream_t s);
// out [rows, n] dense = fn(gate) * up; gate/up row strides gate_rs / up_rs.
void GatedActivation(Act fn, const float* gate, int64_t gate_rs,
                     const float* up, int64_t up_rs, float* out, int64_t rows,
                     int64_t n, cudaStream_t s);
// gpt-oss: gate_up [rows, 2n] interleaved (row stride gu_rs), out [rows, n].
void ClampedSwiglu(const float* gate_up, int64_t gu_rs, float* out,
                   int64_t rows, int64_t n, float alpha, float limit,
                   cudaStream_t s);
// y[r, :] += sigmoid(gate_logit[r]) * x[r, :]; x [rows, cols] dense, y row
// stride ldy.
void SigmoidGateAddRows(const float* x, const float* gate_logit, int64_t rows,
                        int64_t cols, float* y, int64_t ldy, cudaStream_t s);
// f32 <-> F32 / BF16 / F16 (round to nearest even), n values.
void ConvertFromF32(const float* src, void* dst, DType dtype, int64_t n,
                    cudaStream_t s);
void ConvertToF32(const void* src, DType dtype, float* dst, int64_t n,
                  cudaStream_t s);
// y [rows, cols] (row stride ldy) in dtype BF16 / F16 = x [rows, cols] f32
// (row stride ldx): a GEMM's 16-bit input.
void ConvertRows(const float* x, int64_t ldx, void* y, int64_t ldy, DType dtype,
                 int64_t rows, int64_t cols, cudaStream_t s);

// ---- Norms (kernels_norm.cu); w, b [dim] in w_dtype (F32 / BF16 / F16) ----
// y = x * rsqrt(mean(x^2) + eps) * (w + offset); w may be null. x, y [rows,
// dim] dense, may alias.
void RmsNorm(const float* x, const void* w, DType w_dtype, float offset,
             float eps, float* y, int64_t rows, int64_t dim, cudaStream_t s);
// y = bf16(w * bf16(x * rsqrt(mean(x^2) + eps))), w BF16.
void RmsNormBf16(const float* x, const void* w, float eps, float* y,
                 int64_t rows, int64_t dim, cudaStream_t s);
// In place on `groups` groups of `dim` values in each of `tokens` rows (row
// stride ld).
void RmsNormRows(float* x, int64_t tokens, int64_t ld, int64_t groups,
                 int64_t dim, const void* w, DType w_dtype, float offset,
                 float eps, cudaStream_t s);
// y = (x - mean) * rsqrt(var + eps) * (w + offset) + b; w, b may be null.
void LayerNorm(const float* x, const void* w, const void* b, DType w_dtype,
               float offset, float eps, float* y, int64_t rows, int64_t dim,
               cudaStream_t s);
// LayerNorm in place on `groups` groups of `dim` values in each of `tokens`
// rows (row stride ld).
void LayerNormRows(float* x, int64_t tokens, int64_t ld, int64_t groups,
                   int64_t dim, const void* w, const void* b, DType w_dtype,
                   float eps, cudaStream_t s);

// ---- RoPE (kernels_rope.cu) ----
// cos/sin [tokens, half] = cos/sin(positions[t] * inv_freq[i]) * scaling,
// the angle formed in f32 as the CPU does.
void RopeTables(const int32_t* positions, int64_t tokens, const float* inv_freq,
                int64_t half, float attention_scaling, float* cos, float* sin,
                cudaStream_t s);
// Rotate-half RoPE in place on x [tokens, heads, head_dim] (row stride
// row_stride) over the first 2 * half dims of each head.
void ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
               int64_t row_stride, const float* cos, const float* sin,
               int64_t half, cudaStream_t s);

// ---- Gather / scatter (kernels_gather.cu) ----
// out[t, :] = table[ids[t], :] widened to f32; table [vocab, dim] in dtype.
void Gather(const void* table, DType table_dtype, const int32_t* ids,
            int64_t tokens, int64_t dim, float* out, cudaStream_t s);
// y[r, (p * groups + g) * width + i] = x[r, (g * parts + p) * width + i];
// x row stride ldx, y row stride ldy (Backend::DeinterleaveBlocks).
void DeinterleaveBlocks(const float* x, int64_t ldx, int64_t rows,
                        int64_t groups, int64_t parts, int64_t width, float* y,
                        int64_t ldy, cudaStream_t s);
// y[r * ldy + g * gsy + i * isy] = x[r * ldx + g * gsx + i * isx]
// (Backend::StridedCopy).
void StridedCopy(const float* x, int64_t ldx, int64_t gsx, int64_t isx,
                 float* y, int64_t ldy, int64_t gsy, int64_t isy, int64_t rows,
                 int64_t groups, int64_t n, cudaStream_t s);
// out[i, :] = x[rows[i], :]; x row stride ldx, out [n, cols] dense.
void GatherRows(const float* x, int64_t ldx, const int32_t* rows, int64_t n,
                int64_t cols, float* out, cudaStream_t s);
// y[rows[i], :] += weights[i] * x[i, :] (weights null = 1); the rows of one
// call are distinct, as the CPU kernel requires (deterministic: no atomics).
// x [n, cols] dense, y row stride ldy.
void ScatterAddRows(const float* x, const int32_t* rows, const float* weights,
                    int64_t n, int64_t cols, float* y, int64_t ldy,
                    cudaStream_t s);

// ---- Mixture of experts (kernels_moe.cu) ----
// Top-k routing of logits [tokens, experts] (row stride ld): ids/weights
// [tokens, k], slot order = descending score, ties to the lower expert id.
// Same arithmetic as the CPU kernel (softmax in f32 with expf).
void TopKRoute(const float* logits, int64_t tokens, int64_t experts, int64_t ld,
               int64_t k, Route kind, bool renormalize, int32_t* ids,
               float* weights, cudaStream_t s);
// Counting sort of the tokens * k (token, slot) pairs by expert, stable in
// token order: offsets [experts + 1] (offsets[e] = first routed row of expert
// e), rows [tokens * k] (token of each routed row), row_weights [tokens * k].
// An id outside [0, experts) sets *bad (device int, zeroed by the caller) to
// 1 + the id's flat index and leaves the outputs unspecified.
void GroupByExpert(const int32_t* ids, const float* weights, int64_t tokens,
                   int64_t k, int64_t experts, int32_t* offsets, int32_t* rows,
                   float* row_weights, int32_t* bad, cudaStream_t s);

// ---- Head (kernels_head.cu) ----
// lse[r] = log(sum_j exp(logits[r, j])) for logits [rows, vocab] dense, in
// double as the CPU computes it (max, then sum of exp in double).
void LogSumExp(const float* logits, int64_t rows, int64_t vocab, double* lse,
               cudaStream_t s);

// ---- Capture (kernels_capture.cu) ----
// dst row i = src row index[i] converted to `dtype` (F32 / BF16 / F16):
// src [*, cols] row stride ld f32; dst [n, cols] dense in dtype. dst may be
// mapped pinned host memory (written over the bus, no staging copy).
void GatherRowsConvert(const float* src, int64_t ld, const int32_t* index,
                       int64_t n, int64_t cols, void* dst, DType dtype,
                       cudaStream_t s);
// out[g, :] (+)= sum (mean) or max over rows [begin[g], end[g]) of src [*,
// cols] (row stride ld), in double; `accumulate`: combine with out's values.
enum class Reduce : int { kSum = 0, kMax = 1 };
void SegmentReduce(const float* src, int64_t ld, const int32_t* begin,
                   const int32_t* end, int64_t segments, int64_t cols,
                   Reduce op, bool accumulate, double* out, cudaStream_t s);

// ---- Quantized weights (kernels_gemm.cu) ----
// Decodes rows [row0, row0 + rows) of `m` (pointers in device memory) to
// dtype BF16 / F16 / F32 into out [rows, m.k] dense, with the arithmetic of
// DecodeRowsReference (src/core/quant_codes.h): bit-identical in f32 and
// rounded once to the 16-bit dtype.
void DecodeRows(const QuantMatrix& m, int64_t row0, int64_t rows, void* out,
                DType dtype, cudaStream_t s);

// ---- Attention (attention.cu) ----
// Causal self-attention over packed sequences, as cpu::AttentionArgs: q [T,
// q_heads, hd] (row stride q_rs), k/v [T, kv_heads, hd] (k_rs, v_rs), z [T,
// q_heads * hd] dense; seq_start [num_seqs + 1] i64 in device memory;
// max_seq_len bounds every sequence. sinks [q_heads] (sinks_dtype) or null.
// `compute`: BF16 / F16 = the tensor-core kernel (q, k, v and the
// probabilities rounded to that dtype as they are loaded, f32 accumulation
// and softmax: FlashAttention-2's arithmetic); F32 = f32 FMA throughout (the
// CPU kernel's arithmetic, for f32 models).
struct AttentionArgs {
  const float* q = nullptr;
  int64_t q_rs = 0;
  const float* k = nullptr;
  int64_t k_rs = 0;
  const float* v = nullptr;
  int64_t v_rs = 0;
  float* z = nullptr;
  const int64_t* seq_start = nullptr;  // device
  int64_t num_seqs = 0;
  int64_t total_tokens = 0;  // seq_start[num_seqs]
  int64_t max_seq_len = 0;
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
  float softcap = 0.0f;
  int64_t window = 0;
  const void* sinks = nullptr;
  DType sinks_dtype = DType::kF32;
  DType compute = DType::kF32;
  // With probs: the single sequence's probabilities [q_heads, L, L] are
  // written too (num_seqs must be 1; computed by the f32 path).
  float* probs = nullptr;
  // Scratch of the planner's attention workspace (AttentionScratchBytes,
  // costs.h: 0, the kernels keep their row statistics in registers).
  void* workspace = nullptr;
};
// Head dims the kernels support (e.g. 64, 80, 96, 128, 256); the backend
// refuses others with a clear error.
bool AttentionSupportsHeadDim(int64_t head_dim);
void Attention(const AttentionArgs& a, cudaStream_t s);

}  // namespace loom::cuda

#endif  // LOOM_BACKEND_CUDA_KERNELS_H_
