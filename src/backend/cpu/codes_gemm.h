// GEMMs with few rows on quantized weights, computed from the stored codes:
// y = x W^T (+ y) (+ bias) with W [n, k] in FP8 / MXFP4 / NVFP4, without
// decoding a whole weight panel. Each task takes kCodesTileCols weight rows:
// for every chunk of kCodesTileK input columns it decodes that
// [kCodesTileCols, chunk] slab into its thread's slot of the workspace (an
// L1-sized f32 tile, rounded to the compute dtype), then multiplies every row
// of x against it (4 x 3 dot-product blocks, ISA-wide partial sums, one
// horizontal sum per chunk), adding each chunk's sums into y.
//
// Same math as the panel path of GemmContext::GemmQuantized: x and the
// decoded weights are rounded to the compute dtype, products and sums in f32.
// Each output element is computed by one task in a fixed order (chunks in
// order, lanes then their fixed halving sum), so the bytes do not depend on the
// thread count; they differ from the panel path's (oneDNN's summation order)
// by f32 rounding only.
#ifndef LOOM_BACKEND_CPU_CODES_GEMM_H_
#define LOOM_BACKEND_CPU_CODES_GEMM_H_

#include <cstdint>

#include "src/core/dtype.h"
#include "src/core/quant_codes.h"

namespace loom::cpu {

inline constexpr int64_t kCodesTileCols = 12;  // weight rows per task
inline constexpr int64_t kCodesTileK = 512;    // input columns per chunk

// The largest row count for which GemmQuantized (and GemmQuantizedGroup, the
// same bound) multiplies on the codes instead of decoding 512-row panels: set
// by BM_MoePrefill for experts in a group, above the single-GEMM crossover of
// BM_CodesGemmVsPanels (docs/design/cpu-backend.md). 0: never.
int64_t CodesGemmMaxRows(FormatKind kind);

// Bytes of one thread's decode tile for an input width k (64-byte aligned).
int64_t CodesGemmTileBytes(int64_t k);

// One GEMM of a group. x: [m, k] already rounded to `compute` (an f32 copy
// holding compute-dtype values), row stride k.
struct CodesGemmItem {
  const float* x = nullptr;
  int64_t m = 0;
  QuantMatrix w;       // [n, k]
  float* y = nullptr;  // [m, ldy]
  int64_t ldy = 0;     // 0: n
  bool accumulate = false;
  const void* bias = nullptr;  // [n] in bias_dtype, or null
  DType bias_dtype = DType::kF32;
};

// Computes every item (all with the same k and compute dtype) as the tasks of
// one parallel region. `tiles` holds NumThreads() slots of
// CodesGemmTileBytes(k) bytes, 64-byte aligned (with fewer slots, at least
// one, as many threads run as there are slots).
void CodesGemm(const CodesGemmItem* items, int64_t count, DType compute,
               void* tiles, int64_t tiles_bytes);

// Per ISA (codes_gemm_kernels.inc): decodes row r of `w`, columns [c0, c1)
// (c0 a multiple of the format's block width), to f32 into out [c1 - c0].
// Bit-identical to DecodeRowsReference.
// And y[i, j] += sum_c x[i, c] w[j, c] for i < m, j < nb (x row stride ldx,
// w row stride kc, y row stride ldy), c < kc.
#define LOOM_CODES_GEMM_DECLS                                          \
  void DecodeCodesRange(const QuantMatrix& w, int64_t r, int64_t c0,   \
                        int64_t c1, float* out);                       \
  void DotTile(const float* x, int64_t ldx, int64_t m, const float* w, \
               int64_t nb, int64_t kc, float* y, int64_t ldy);
namespace portable {
LOOM_CODES_GEMM_DECLS
}
namespace avx2 {
LOOM_CODES_GEMM_DECLS
}
namespace avx512 {
LOOM_CODES_GEMM_DECLS
}
#undef LOOM_CODES_GEMM_DECLS

}  // namespace loom::cpu

#endif  // LOOM_BACKEND_CPU_CODES_GEMM_H_
