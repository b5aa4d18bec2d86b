// Internal to the CPU GEMM (kernels_gemm.cc): the packed operand layouts and
// the per-ISA micro-kernels behind GemmContext.
//
// Batch invariance is the rule every kernel here keeps: an output element
// y[i, j] is one chain of multiply-adds over k = 0, 1, ..., K-1 in that order,
// started from 0 (or from y[i, j] itself when accumulating), whatever the
// number of rows M, the row's position in a tile, the tile sizes, the blocking
// of K or the thread count. So a sequence's activations do not depend on what
// else shares its batch. What a "multiply-add" is depends on the kernel
// family, fixed per process by the ISA level and the compute dtype:
//
//   family  level           step                                  per step
//   fma     baseline        acc = acc + round(a b)  (SSE2, 4 lanes)  1 k
//   fma     avx2, avx512    acc = fma(a, b, acc)    (8 / 16 lanes)   1 k
//   dot     avx512bf16      vdpbf16ps: acc += a0 b0 + a1 b1 (bf16)   2 k
//   amx     amx             tdpbf16ps: a 32-k block into acc (bf16)  32 k
//
// f32 GEMMs and 16-bit ones below the dot level run the fma family (16-bit
// weights widened to f32 while they are packed, x rounded to the 16-bit type:
// the products are exact in f32, as in a native 16-bit GEMM); bf16 GEMMs run
// dot or amx. A level's results therefore equal themselves for every M; the
// avx2 and avx512 fma kernels even give the same bytes as each other.
//
// Packed B (the weight) is per column block, made by the task that uses it,
// or made once at load (WeightLayout::kPanels, kStrips):
//   f32 panels (fma): panel q holds columns [16 q, 16 q + 16) as [kc][16]
//     f32, columns past the weight's end zero. A kPanels weight is [n / 16]
//     such panels over all of k in its own dtype (f32, bf16, f16): f32 ones
//     are read as they are, 16-bit ones widened as they are read (tiles of
//     few rows) or into the slot (more rows).
//   bf16 strips (dot, amx): strip s holds columns [16 s, 16 s + 16) as pairs
//     [kcp / 2][16][2] bf16 (kcp = kc rounded up to 32, zero-padded): pair p,
//     column c is (w[c, 2p], w[c, 2p + 1]). One strip of 32 k is exactly one
//     AMX B tile (16 rows of 64 bytes).
// x for the dot and amx families is a bf16 copy [rows + 32, ldx] with zero
// columns past K up to a multiple of 32 and zero rows past the last row.
#ifndef LOOM_BACKEND_CPU_GEMM_INTERNAL_H_
#define LOOM_BACKEND_CPU_GEMM_INTERNAL_H_

#include <cstdint>

#include "src/core/dtype.h"
#include "src/core/quant_codes.h"

namespace loom::cpu::gemm {

// Columns of one bf16 strip, k values of one AMX block.
inline constexpr int64_t kStripCols = 16;
inline constexpr int64_t kTileK = 32;
// Columns of one f32 (or kPanels) panel of the fma family.
inline constexpr int64_t kPanelCols = 16;
// Tasks of at most this many rows read a 16-bit kPanels weight without
// packing it (more rows: widened into the slot once per K block).
inline constexpr int64_t kFmaFewRows = 4;

// The weight a task packs from: a dense matrix (f32, bf16 or f16, [n, k]
// when out_in, else [k, n]) or a quantized one ([n, k] codes).
struct WeightSource {
  const void* w = nullptr;
  DType dtype = DType::kF32;
  bool out_in = true;
  int64_t n = 0, k = 0;
  bool strips = false;  // bf16 [n, k] in kStrips (already packed)
  bool panels = false;  // [n, k] in kPanels (already packed)
  const QuantMatrix* quant = nullptr;  // set: quantized, `w` unused
  // Quantized only: the compute dtype the decoded values are rounded to.
  DType round_to = DType::kF32;
};

// ---- fma family (portable / avx2 / avx512) ----------------------------------

}  // namespace loom::cpu::gemm

namespace loom::cpu {

// Per ISA:
//   FmaTile: C[rows, cols] (row stride ldc) = (load_c ? C : 0) + A[rows, kc]
//     B, A with row stride lda, B 16-column panels of `bt` (f32; bf16 or f16
//     for rows <= kFmaFewRows) from b, panel p at b + p * pstride elements,
//     row k of a panel 16 elements on. rows <= kFmaMr, cols <=
//     FmaVectorsForRows(rows) x kFmaLanes (vectors a tile row holds: more
//     for few rows, to keep about 8 independent accumulators).
//   PackPanels: columns [j0, j0 + cols), k [k0, k0 + kc) of `src` into f32
//     panels at `out` (ceil(cols / 16) of [kc][16], columns past the weight
//     zero); `scratch`: 16 kc floats (a quantized weight's decoded rows).
//   DecodeCodesRange: row r of `w`, columns [c0, c1) (c0 on the format's
//     blocks) to f32, bit-identical to DecodeRowsReference.
#define LOOM_GEMM_FMA_DECLS                                                  \
  int64_t FmaVectorsForRows(int64_t rows);                                   \
  void FmaTile(const float* a, int64_t lda, int64_t rows, const void* b,     \
               int64_t pstride, DType bt, int64_t kc, float* c, int64_t ldc, \
               int64_t cols, bool load_c);                                   \
  void PackPanels(const gemm::WeightSource& src, int64_t j0, int64_t cols,   \
                  int64_t k0, int64_t kc, float* out, float* scratch);       \
  void DecodeCodesRange(const QuantMatrix& w, int64_t r, int64_t c0,         \
                        int64_t c1, float* out);                             \
  extern const int64_t kFmaMr;                                               \
  extern const int64_t kFmaLanes;
namespace portable {
LOOM_GEMM_FMA_DECLS
}
namespace avx2 {
LOOM_GEMM_FMA_DECLS
}
namespace avx512 {
LOOM_GEMM_FMA_DECLS
}
#undef LOOM_GEMM_FMA_DECLS

}  // namespace loom::cpu

namespace loom::cpu::gemm {

// ---- dot and amx families (bf16) --------------------------------------------

// x [rows, k] f32 -> bf16 [rows_padded, ldx] (round to nearest even, NaN
// kept, subnormals kept), zero columns [k, ldx) and zero rows [rows,
// rows_padded). The dot family's x.
void RoundXToBf16(const float* x, int64_t rows, int64_t k, uint16_t* out,
                  int64_t ldx, int64_t rows_padded);
// The amx family's x: rows [r0, r1) of x [rows, k] rounded to bf16 into
// 32-k blocks, block-major: out[(b * rows_padded + r) * 32 + j] = x[r, 32 b
// + j] (zero past k and for rows >= rows), so that 16 consecutive rows of a
// block, from any row, are one contiguous 1 KB tile (tiles read at a row
// stride of a whole row were measured twice as slow).
void RoundXToBf16Blocks(const float* x, int64_t rows, int64_t k, uint16_t* out,
                        int64_t rows_padded, int64_t r0, int64_t r1);
// Packs columns [j0, j0 + cols) and k [k0, k0 + kc) of `src` (bf16 dense or
// quantized, rounded to bf16) into bf16 strips at `out` (ceil(cols / 16)
// strips of AlignUp(kc, 32) / 2 x 16 pairs; strip stride
// 16 AlignUp(kc, 32) elements). `scratch`: 16 x kc floats.
void PackStrips(const WeightSource& src, int64_t j0, int64_t cols, int64_t k0,
                int64_t kc, uint16_t* out, float* scratch);

// C[rows, cols] (ldc) = (load_c ? C : 0) + A B, A: bf16 rows [rows, kcp] with
// row stride ldx (elements), B: `cols` columns of bf16 strips with strip
// stride `strip_stride` elements, kcp a multiple of 32.
struct BTile {
  const uint16_t* b;
  int64_t strip_stride;
};
// vdpbf16ps (avx512bf16): rows <= kDotMr, cols <= DotStripsForRows(rows) * 16.
inline constexpr int64_t kDotMr = 12;
int64_t DotStripsForRows(int64_t rows);
void DotTile(const uint16_t* a, int64_t ldx, int64_t rows, BTile b,
             int64_t kcp, float* c, int64_t ldc, int64_t cols, bool load_c);

// Where AMX finds A's tiles: tile rows `row_bytes` apart, the next 32-k
// block `kstep` elements on, the second 16-row tile `second` elements on.
struct ATile {
  int64_t row_bytes, kstep, second;
};
// AMX: C (+)= A B for a 32 x 32 block (16 x 16 tiles past `rows` / `cols`
// skipped; A rows past `rows` are read: the x copy is padded). C is four
// 1 KB f32 tiles in tile order: (0, 0) at c, (0, 1) at c + 256, (1, 0) at c
// + c_second, (1, 1) at c + c_second + 256. `out` (else null): the tiles,
// every one whole (rows and cols 16 or 32), are stored there instead (row
// stride ldo floats): the last K block writing straight into y.
void AmxTile(const uint16_t* a, ATile al, int64_t rows, BTile b, int64_t kcp,
             float* c, int64_t c_second, int64_t cols, bool load_c,
             float* out = nullptr, int64_t ldo = 0);
// A task's C in tile order ([row_tiles][col_tiles][16][16] f32) from / to y
// [rows, cols] (row stride ldy): AmxLoadC zero-fills past rows and cols;
// AmxStoreC stores rows [r0, r1) x columns [c0, c1) (c0 a multiple of 16),
// adding `bias` [cols] (f32, or null) as it stores.
void AmxLoadC(const float* y, int64_t ldy, int64_t rows, int64_t cols,
              float* c, int64_t col_tiles, int64_t row_tiles);
void AmxStoreC(const float* c, int64_t col_tiles, int64_t r0, int64_t r1,
               int64_t c0, int64_t c1, float* y, int64_t ldy,
               const float* bias);
// Loads this thread's tile configuration (before AmxTile on a thread) and
// releases it (after the last AmxTile of a parallel region).
void AmxBegin();
void AmxEnd();

}  // namespace loom::cpu::gemm

#endif  // LOOM_BACKEND_CPU_GEMM_INTERNAL_H_
