// Scalar reference kernels: the plainest correct version of every kernel in
// src/backend/cpu/kernels.h, written for readability, not speed. Reductions
// accumulate in double so that the references are (much) more accurate than
// the optimised kernels they check. Used by the kernel tests only.
#ifndef LOOM_BACKEND_CPU_REFERENCE_REFERENCE_KERNELS_H_
#define LOOM_BACKEND_CPU_REFERENCE_REFERENCE_KERNELS_H_

#include <cstdint>

#include "src/backend/cpu/kernels.h"
#include "src/core/dtype.h"

namespace loom::cpu::ref {

// Reads element i of an F32/BF16/F16 array as f32.
float LoadAsF32(const void* p, DType dtype, int64_t i);

// Naive GEMM with the semantics of GemmContext::Gemm: for 16-bit weights the
// activation is first rounded to the weight type. Products accumulate in
// double. Honours bias, accumulate and ldy.
void Gemm(const GemmArgs& args);

// Norms, see kernels.h. x [rows, dim], y [rows, dim], w/b [dim].
void RmsNorm(const float* x, const void* w, DType w_dtype, float offset,
             float eps, float* y, int64_t rows, int64_t dim);
void LayerNorm(const float* x, const void* w, const void* b, DType w_dtype,
               float offset, float eps, float* y, int64_t rows, int64_t dim);

// Rotary embeddings. positions [tokens], inv_freq [half], cos/sin [tokens,
// half].
void RopeTables(const int32_t* positions, int64_t tokens, const float* inv_freq,
                int64_t half, float attention_scaling, float* cos, float* sin);
// x [tokens, heads, head_dim] with token stride row_stride; cos/sin [tokens,
// half].
void ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
               int64_t row_stride, const float* cos, const float* sin,
               int64_t half);
// Adjacent pairs (x[2i], x[2i+1]) rotated in place (rotate_every_two), in
// double.
void ApplyRopePairs(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                    int64_t row_stride, const float* cos, const float* sin,
                    int64_t half);

// Naive attention: materialises the full [L, L] score matrix per (sequence,
// head), masks, softmaxes in double (over keys plus the sink logit when
// args.sinks is set; the sink column is dropped). Ignores args.workspace.
void Attention(const AttentionArgs& args);
// Naive attention over a KV cache (args.k_cache set): for each new query at
// position p = q_pos0[s] + i, the keys at positions [0, p] (window applied)
// are taken from the new rows (positions >= q_pos0[s]) or from the cache row
// j % kv_capacity of the slot (paged: row page_table[j / page_size] *
// page_size + j % page_size), in double; then every new row is stored into
// the cache in position order.
void KvAttention(const AttentionArgs& args);

// Elementwise, see kernels.h.
float ActivationScalar(Activation act, float x);
void GatedActivation(Activation act, const float* gate, int64_t gate_rs,
                     const float* up, int64_t up_rs, float* out, int64_t rows,
                     int64_t n);
void ApplyActivation(Activation act, float* x, int64_t n);
void Softcap(float* x, int64_t n, float cap);
void Add(const float* x, float* y, int64_t n);
void Scale(float* x, int64_t n, float s);
// table [vocab, dim], ids [tokens], out [tokens, dim].
void Gather(const void* table, DType table_dtype, const int32_t* ids,
            int64_t tokens, int64_t dim, float* out);
void ConvertFromF32(const float* src, void* dst, DType dtype, int64_t n);
void ConvertToF32(const void* src, DType dtype, float* dst, int64_t n);
// logits [rows, vocab], lse [rows].
void LogSumExp(const float* logits, int64_t rows, int64_t vocab, double* lse);

// Row operations, see kernels.h.
void RmsNormBf16(const float* x, const void* w, float eps, float* y,
                 int64_t rows, int64_t dim);
void RmsNormRows(float* x, int64_t tokens, int64_t ld, int64_t groups,
                 int64_t dim, const void* w, DType w_dtype, float offset,
                 float eps);
void LayerNormRows(float* x, int64_t tokens, int64_t ld, int64_t groups,
                   int64_t dim, const void* w, const void* b, DType w_dtype,
                   float eps);
void Clamp(float* x, int64_t rows, int64_t cols, int64_t ld, float lo,
           float hi);
void RoundToBf16(float* x, int64_t rows, int64_t cols, int64_t ld);
void DeinterleaveBlocks(const float* x, int64_t ldx, int64_t rows,
                        int64_t groups, int64_t parts, int64_t width, float* y,
                        int64_t ldy);
void StridedCopy(const float* x, int64_t ldx, int64_t gsx, int64_t isx,
                 float* y, int64_t ldy, int64_t gsy, int64_t isy, int64_t rows,
                 int64_t groups, int64_t n);
void GatherRows(const float* x, int64_t ldx, const int32_t* rows, int64_t n,
                int64_t cols, float* out);
void ScatterAddRows(const float* x, const int32_t* rows, const float* w,
                    int64_t n, int64_t cols, float* y, int64_t ldy);

}  // namespace loom::cpu::ref

#endif  // LOOM_BACKEND_CPU_REFERENCE_REFERENCE_KERNELS_H_
