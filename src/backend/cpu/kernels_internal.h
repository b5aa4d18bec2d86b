// Internal to the CPU backend: per-row kernels behind the public entry points
// of kernels.h, in a portable version (kernels_portable.cc) and an AVX-512
// version (kernels_avx512.cc, compiled with -mavx512f/bw/dq/vl). The
// entry points in kernels.cc split work over OpenMP threads and pick the
// version once per process.
#ifndef LOOM_BACKEND_CPU_KERNELS_INTERNAL_H_
#define LOOM_BACKEND_CPU_KERNELS_INTERNAL_H_

#include <cstdint>

#include "src/backend/cpu/kernels.h"
#include "src/core/dtype.h"

namespace loom::cpu {

// True when the active ISA (ActiveIsa(), src/backend/cpu/isa.h) includes
// AVX-512 F/BW/DQ/VL.
bool HasAvx512();

// Reads element i of an F32/BF16/F16 array as f32.
float LoadScalarAsF32(const void* p, DType dtype, int64_t i);
// dst[i] = f32(round_to_dtype(src[i])) for dtype F32/BF16/F16, n elements
// (vectorised, multithreaded).
void RoundToDTypeAsF32(const float* src, float* dst, DType dtype, int64_t n);
// ConvertToF32 without threading (for use inside parallel loops).
void ConvertToF32Serial(const void* src, DType dtype, float* dst, int64_t n);

// Polynomial coefficients of the vector kernels' own transcendentals, highest
// degree first, shared by the AVX-512 and AVX2 versions so that every ISA
// evaluates the same functions (Horner: p = c[0]; p = p x + c[i]).
//   exp(r), |r| <= ln2 / 2: Taylor, degree 7 (x = n ln2 + r, ln2 = hi + lo).
inline constexpr float kExpPoly[] = {
    1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
    1.0f / 6.0f,    0.5f,          1.0f,          1.0f};
inline constexpr float kLn2Hi = 0.693145751953125f;
inline constexpr float kLn2Lo = 1.428606765330187e-06f;
//   expm1(z) = z + z^2 P(z): P is Taylor 1/2! .. 1/10!.
inline constexpr float kExpm1Poly[] = {
    1.0f / 3628800.0f, 1.0f / 362880.0f, 1.0f / 40320.0f,
    1.0f / 5040.0f,    1.0f / 720.0f,    1.0f / 120.0f,
    1.0f / 24.0f,      1.0f / 6.0f,      0.5f};
//   erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z / 2), z >= 0.
inline constexpr float kErfcPoly[] = {
    0.17087277f,  -0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f,
    -0.18628806f, 0.09678418f,  0.37409196f, 1.00002368f,  -1.26551223f};

// Query rows per attention tile.
inline constexpr int64_t kAttnBlock = 64;

// Geometry of one attention work item: query rows [i0, i0 + rows) of one
// sequence (positions within the sequence), one query head.
struct AttnTile {
  const float* q;  // first query row of the tile, head h: [rows, head_dim], row
                   // stride q_rs
  const float*
      k;  // key row of position j_lo, kv head: [nk, head_dim], row stride k_rs
  const float* v;  // value row of position j_lo: [nk, v_dim], row stride v_rs
  float* z;        // output row of the tile's first query: [rows, v_dim], row
                   // stride z_rs
  int64_t q_rs, k_rs, v_rs, z_rs;
  int64_t rows;      // <= kAttnBlock
  int64_t i0;        // position of the first query row
  int64_t j_lo;      // position of the first key considered
  int64_t nk;        // keys considered: [j_lo, j_lo + nk)
  int64_t head_dim;  // q and k head width
  int64_t v_dim;     // v and z head width (MLA: v_head_dim < head_dim)
  int64_t window;    // <= 0: none
  float scale, softcap;
  bool has_sink;  // the head's sink logit joins every row's softmax
  float sink;     // (then its column is dropped)
  float alibi;    // the head's ALiBi slope: score += alibi * j (0 = none)
  float* probs;   // probs row of query i0 for this head: [rows, seq_len] (row
                  // stride probs_rs), or null
  int64_t probs_rs;
  float* scratch;  // AttnTileScratchFloats(max nk, max(head_dim, v_dim))
                   // floats, 64-byte aligned
};
// Scratch floats one tile needs (a multiple of 16), `width` = max(head_dim,
// v_dim): Q^T [head_dim, kAttnBlock], S^T [nk, kAttnBlock], per-row
// statistics [2, kAttnBlock], the output accumulator and one chunk of packed
// V (each [kAttnBlock, width padded to 16]).
int64_t AttnTileScratchFloats(int64_t max_nk, int64_t width);

// The per-row kernels of the portable source, declared for the baseline
// (portable) and the AVX2 (avx2) compilations of kernels_portable.cc.
// RopeToken: one token, x [heads, head_dim], cos/sin [half].
#define LOOM_PORTABLE_KERNEL_DECLS                                            \
  void RmsNormRow(const float* x, const void* w, DType w_dtype, float offset, \
                  float eps, float* y, int64_t dim);                          \
  void LayerNormRow(const float* x, const void* w, const void* b,             \
                    DType w_dtype, float offset, float eps, float* y,         \
                    int64_t dim);                                             \
  void GatedRow(Activation act, const float* gate, const float* up,           \
                float* out, int64_t n);                                       \
  void ActivationSpan(Activation act, float* x, int64_t n);                   \
  void SoftcapSpan(float* x, int64_t n, float cap);                           \
  void AddSpan(const float* x, float* y, int64_t n);                          \
  void ScaleSpan(float* x, int64_t n, float s);                               \
  void FromF32Span(const float* src, void* dst, DType dtype, int64_t n);      \
  void ToF32Span(const void* src, DType dtype, float* dst, int64_t n);        \
  void RoundSpan(const float* src, float* dst, DType dtype, int64_t n);       \
  double LogSumExpRow(const float* x, int64_t n);                             \
  void RopeToken(float* x, int64_t heads, int64_t head_dim, const float* cos, \
                 const float* sin, int64_t half);                             \
  void AttentionTile(const AttnTile& t);

namespace portable {
LOOM_PORTABLE_KERNEL_DECLS
}  // namespace portable
namespace avx2 {
LOOM_PORTABLE_KERNEL_DECLS
}  // namespace avx2

namespace avx512 {
void RmsNormRow(const float* x, const void* w, DType w_dtype, float offset,
                float eps, float* y, int64_t dim);
void LayerNormRow(const float* x, const void* w, const void* b, DType w_dtype,
                  float offset, float eps, float* y, int64_t dim);
void GatedRow(Activation act, const float* gate, const float* up, float* out,
              int64_t n);
void ActivationSpan(Activation act, float* x, int64_t n);
void SoftcapSpan(float* x, int64_t n, float cap);
void AddSpan(const float* x, float* y, int64_t n);
void ScaleSpan(float* x, int64_t n, float s);
void FromF32Span(const float* src, void* dst, DType dtype, int64_t n);
void ToF32Span(const void* src, DType dtype, float* dst, int64_t n);
double LogSumExpRow(const float* x, int64_t n);
void RopeToken(float* x, int64_t heads, int64_t head_dim, const float* cos,
               const float* sin, int64_t half);
void AttentionTile(const AttnTile& t);
// dst = f32(round_to_dtype(src)), n elements (dtype F32/BF16/F16).
void RoundSpan(const float* src, float* dst, DType dtype, int64_t n);
}  // namespace avx512

}  // namespace loom::cpu

#endif  // LOOM_BACKEND_CPU_KERNELS_INTERNAL_H_
