// The GEMM's bf16 side (gemm_internal.h): x rounded to bf16, weights packed
// into bf16 strips, and the dot family's tile (AVX512_BF16 vdpbf16ps).
// Compiled with the AVX-512 and AVX512_BF16 flags; called only at the
// avx512bf16 and amx levels.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "src/backend/cpu/gemm_internal.h"
#include "src/base/check.h"
#include "src/base/float16.h"

namespace loom::cpu::gemm {
namespace {

inline __mmask16 Mask16(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff)
                 : static_cast<__mmask16>((1u << n) - 1);
}

// 16 floats -> 16 bf16, round to nearest even, NaN made quiet (F32ToBf16).
inline __m256i ToBf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan =
      _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
  const __m512i lsb =
      _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r =
      _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  r = _mm512_srli_epi32(r, 16);
  const __m512i q =
      _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  r = _mm512_mask_mov_epi32(r, nan, q);
  return _mm512_cvtepi32_epi16(r);
}

// C[R, cols] (+)= A B over S strips, one vdpbf16ps chain per accumulator.
template <int R, int S>
void Tile(const uint16_t* a, int64_t ldx, BTile b, int64_t kcp, float* c,
          int64_t ldc, int64_t cols, bool load_c) {
  constexpr int64_t kCols = S * kStripCols;
  const bool full = cols == kCols;
  alignas(64) float edge[R][kCols];
  __m512 acc[R][S];
  for (int i = 0; i < R; ++i) {
    const float* ci = c + i * ldc;
    if (load_c && !full) {
      std::memcpy(edge[i], ci, static_cast<size_t>(cols) * 4);
      ci = edge[i];
    }
    for (int s = 0; s < S; ++s)
      acc[i][s] = load_c ? _mm512_loadu_ps(ci + s * 16) : _mm512_setzero_ps();
  }
  // Strips past the weight's last column (an edge block narrower than S
  // strips) are not read: their accumulators reread the first strip, and
  // are never stored.
  const int64_t strips = (cols + kStripCols - 1) / kStripCols;
  int64_t offset[S];
  for (int s = 0; s < S; ++s) offset[s] = s < strips ? s * b.strip_stride : 0;
  for (int64_t p = 0; p < kcp / 2; ++p) {
    __m512i bv[S];
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s)
      bv[s] = _mm512_loadu_si512(b.b + offset[s] + p * 32);
#pragma GCC unroll 12
    for (int i = 0; i < R; ++i) {
      int32_t pair;
      std::memcpy(&pair, a + i * ldx + 2 * p, 4);
      const __m512i av = _mm512_set1_epi32(pair);
#pragma GCC unroll 8
      for (int s = 0; s < S; ++s)
        acc[i][s] = _mm512_dpbf16_ps(acc[i][s], reinterpret_cast<__m512bh>(av),
                                     reinterpret_cast<__m512bh>(bv[s]));
    }
  }
  for (int i = 0; i < R; ++i) {
    float* ci = full ? c + i * ldc : edge[i];
    for (int s = 0; s < S; ++s) _mm512_storeu_ps(ci + s * 16, acc[i][s]);
    if (!full) std::memcpy(c + i * ldc, edge[i], static_cast<size_t>(cols) * 4);
  }
}

template <int S>
void TileRows(const uint16_t* a, int64_t ldx, int64_t rows, BTile b,
              int64_t kcp, float* c, int64_t ldc, int64_t cols, bool load_c) {
  switch (rows) {
#define LOOM_DOT_ROWS(r)                                \
  case r:                                               \
    if constexpr (r <= kDotMr)                          \
      Tile<r, S>(a, ldx, b, kcp, c, ldc, cols, load_c); \
    return;
    LOOM_DOT_ROWS(1)
    LOOM_DOT_ROWS(2)
    LOOM_DOT_ROWS(3)
    LOOM_DOT_ROWS(4)
    LOOM_DOT_ROWS(5)
    LOOM_DOT_ROWS(6)
    LOOM_DOT_ROWS(7)
    LOOM_DOT_ROWS(8)
    LOOM_DOT_ROWS(9)
    LOOM_DOT_ROWS(10)
    LOOM_DOT_ROWS(11)
    LOOM_DOT_ROWS(12)
#undef LOOM_DOT_ROWS
    default:
      LOOM_CHECK(false) << "dot tile of " << rows << " rows";
  }
}

// Blocks of B dwords of a and b interleaved, from their low halves (kHi 0)
// or high halves (kHi 8).
template <int B, int kHi>
inline __m512i Interleave(__m512i a, __m512i b) {
  alignas(64) static constexpr int32_t kIdx[16] = {
#define LOOM_IDX(p) ((p / B) % 2) * 16 + ((p / B) / 2) * B + p % B + kHi
      LOOM_IDX(0),  LOOM_IDX(1),  LOOM_IDX(2),  LOOM_IDX(3),  LOOM_IDX(4),
      LOOM_IDX(5),  LOOM_IDX(6),  LOOM_IDX(7),  LOOM_IDX(8),  LOOM_IDX(9),
      LOOM_IDX(10), LOOM_IDX(11), LOOM_IDX(12), LOOM_IDX(13), LOOM_IDX(14),
      LOOM_IDX(15)
#undef LOOM_IDX
  };
  return _mm512_permutex2var_epi32(a, _mm512_load_si512(kIdx), b);
}

// Transposes 16 x 16 dwords in place; column j ends in r[BitReverse(j)].
template <int B = 1>
inline void Transpose16(__m512i* r) {
  if constexpr (B < 16) {
    for (int i = 0; i < 16; ++i) {
      if (i & B) continue;
      const __m512i lo = Interleave<B, 0>(r[i], r[i + B]);
      const __m512i hi = Interleave<B, 8>(r[i], r[i + B]);
      r[i] = lo;
      r[i + B] = hi;
    }
    Transpose16<B * 2>(r);
  }
}

constexpr int BitReverse16(int j) {
  return ((j & 1) << 3) | ((j & 2) << 1) | ((j & 4) >> 1) | ((j & 8) >> 3);
}

inline __mmask32 Mask32(int64_t n) {
  return n >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << n) - 1);
}

// One strip [kcp / 2][16][2] from 16 rows of 32-k blocks given by `row`
// (row(c, k, valid) -> the 16 dwords of row c, k [k, k + 32), the first
// `valid` bf16 of them real, the rest zero).
template <typename RowFn>
void StripFromRows(int64_t nc, int64_t kc, uint16_t* p, RowFn row) {
  for (int64_t k = 0; k < kc; k += kTileK) {
    const int64_t valid = std::min(kTileK, kc - k);
    __m512i r[16];
    for (int c = 0; c < 16; ++c)
      r[c] = c < nc ? row(c, k, valid) : _mm512_setzero_si512();
    Transpose16(r);
    for (int j = 0; j < 16; ++j)
      _mm512_storeu_si512(p + (k / 2 + j) * 32, r[BitReverse16(j)]);
  }
}

// The 16 E2M1 values as bf16 (each is one exactly), twice: the table of a
// 32-lane word permute whose indices are the codes 0..15 (built once).
__m512i E2M1Bf16Table() {
  alignas(64) static const std::array<uint16_t, 32> t = [] {
    std::array<uint16_t, 32> v{};
    const float* lut = E2M1Table();
    for (int i = 0; i < 32; ++i) v[i] = F32ToBf16(lut[i % 16]);
    return v;
  }();
  return _mm512_load_si512(t.data());
}

// Whether an MXFP4 block of scale byte `s` decodes by moving exponents:
// the nonzero E2M1 values 0.5..6 have bf16 exponent fields 126..129, and
// times 2^(s - 127) they stay normal numbers for s in [2, 252].
inline bool Mxfp4ExponentShiftExact(uint8_t s) { return s >= 2 && s <= 252; }

// One MXFP4 block (32 codes in 16 bytes, the even code in the low nibble)
// of scale byte `s` (Mxfp4ExponentShiftExact) as 32 bf16 values: the same
// bits as the f32 decode (value x 2^(s - 127)) rounded to bf16, since every
// product is exact; zeros keep their sign and stay zero.
inline __m512i Mxfp4BlockToBf16(const uint8_t* codes, uint8_t s,
                                __m512i table) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
  const __m128i nib = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(v, nib);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), nib);
  const __m512i idx = _mm512_cvtepu8_epi16(_mm256_set_m128i(
      _mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi)));  // [32] codes
  const __m512i x = _mm512_permutexvar_epi16(idx, table);
  const __mmask32 nonzero =
      _mm512_test_epi16_mask(x, _mm512_set1_epi16(0x7fff));
  return _mm512_mask_add_epi16(
      x, nonzero, x, _mm512_set1_epi16(static_cast<int16_t>((s - 127) << 7)));
}

// A strip's rows of an MXFP4 matrix straight into bf16 (no f32 pass),
// where every 32-k block of [k0, k0 + kc) is whole and its scale shifts
// exactly; false (nothing written) otherwise.
bool PackMxfp4Strip(const QuantMatrix& m, int64_t js, int64_t nc, int64_t k0,
                    int64_t kc, uint16_t* p) {
  static_assert(kTileK == 32, "an MXFP4 block is one 32-k block");
  if (m.kind != FormatKind::kMxfp4 || k0 % 32 != 0 || kc % 32 != 0)
    return false;
  const auto* codes = static_cast<const uint8_t*>(m.values);
  const auto* scales = static_cast<const uint8_t*>(m.scales);
  const int64_t blocks = m.k / 32;
  for (int64_t c = 0; c < nc; ++c)
    for (int64_t b = k0 / 32; b < (k0 + kc) / 32; ++b)
      if (!Mxfp4ExponentShiftExact(scales[(js + c) * blocks + b])) return false;
  const __m512i table = E2M1Bf16Table();
  StripFromRows(nc, kc, p, [&](int c, int64_t k, int64_t /*valid*/) {
    const int64_t r = js + c, b = (k0 + k) / 32;
    return Mxfp4BlockToBf16(codes + r * (m.k / 2) + b * 16,
                            scales[r * blocks + b], table);
  });
  return true;
}

}  // namespace

void RoundXToBf16(const float* x, int64_t rows, int64_t k, uint16_t* out,
                  int64_t ldx, int64_t rows_padded) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* xi = x + i * k;
    uint16_t* oi = out + i * ldx;
    int64_t c = 0;
    for (; c + 16 <= k; c += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(oi + c),
                          ToBf16(_mm512_loadu_ps(xi + c)));
    if (c < k) {
      const __mmask16 m = Mask16(k - c);
      _mm256_mask_storeu_epi16(oi + c, m,
                               ToBf16(_mm512_maskz_loadu_ps(m, xi + c)));
    }
    std::fill(oi + k, oi + ldx, uint16_t{0});
  }
  for (int64_t i = rows; i < rows_padded; ++i)
    std::fill(out + i * ldx, out + (i + 1) * ldx, uint16_t{0});
}

void RoundXToBf16Blocks(const float* x, int64_t rows, int64_t k, uint16_t* out,
                        int64_t rows_padded, int64_t r0, int64_t r1) {
  const int64_t blocks = (k + kTileK - 1) / kTileK;
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * k;
    for (int64_t b = 0; b < blocks; ++b) {
      uint16_t* o = out + (b * rows_padded + r) * kTileK;
      if (r >= rows) {
        _mm512_storeu_si512(o, _mm512_setzero_si512());
        continue;
      }
      const int64_t c = b * kTileK, valid = std::min(kTileK, k - c);
      const __m256i lo = ToBf16(_mm512_maskz_loadu_ps(Mask16(valid), xr + c));
      const __m256i hi = ToBf16(_mm512_maskz_loadu_ps(
          Mask16(std::max<int64_t>(valid - 16, 0)), xr + c + 16));
      _mm512_storeu_si512(
          o, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
    }
  }
}

void PackStrips(const WeightSource& src, int64_t j0, int64_t cols, int64_t k0,
                int64_t kc, uint16_t* out, float* scratch) {
  const int64_t kcp = (kc + kTileK - 1) / kTileK * kTileK;
  for (int64_t s = 0; s * kStripCols < cols; ++s) {
    const int64_t js = j0 + s * kStripCols;
    const int64_t nc = std::min(kStripCols, cols - s * kStripCols);
    uint16_t* p = out + s * kStripCols * kcp;  // [kcp / 2][16][2]
    if (src.quant != nullptr) {
      if (PackMxfp4Strip(*src.quant, js, nc, k0, kc, p)) continue;
      // The rows decoded to f32 [nc][kc], rounded to bf16 as they are
      // packed (exact for MXFP4).
      for (int64_t c = 0; c < nc; ++c)
        avx512::DecodeCodesRange(*src.quant, js + c, k0, k0 + kc,
                                 scratch + c * kc);
      StripFromRows(nc, kc, p, [&](int c, int64_t k, int64_t valid) {
        const float* f = scratch + c * kc + k;
        const __m256i lo = ToBf16(_mm512_maskz_loadu_ps(Mask16(valid), f));
        const __m256i hi = ToBf16(_mm512_maskz_loadu_ps(
            Mask16(std::max<int64_t>(valid - 16, 0)), f + 16));
        return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      });
      continue;
    }
    const auto* w = static_cast<const uint16_t*>(src.w);
    if (src.out_in) {
      StripFromRows(nc, kc, p, [&](int c, int64_t k, int64_t valid) {
        return _mm512_maskz_loadu_epi16(Mask32(valid),
                                        w + (js + c) * src.k + k0 + k);
      });
      continue;
    }
    // W [K, N]: pair p of column c is (W[2p][c], W[2p + 1][c]).
    const __mmask16 cm = Mask16(nc);
    for (int64_t pp = 0; pp < kcp / 2; ++pp) {
      const int64_t k = 2 * pp;
      __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
      if (k < kc)
        even = _mm512_cvtepu16_epi32(
            _mm256_maskz_loadu_epi16(cm, w + (k0 + k) * src.n + js));
      if (k + 1 < kc)
        odd = _mm512_cvtepu16_epi32(
            _mm256_maskz_loadu_epi16(cm, w + (k0 + k + 1) * src.n + js));
      _mm512_storeu_si512(p + pp * 32,
                          _mm512_or_si512(even, _mm512_slli_epi32(odd, 16)));
    }
  }
}

int64_t DotStripsForRows(int64_t rows) {
  return rows >= 4 ? 2 : (rows >= 2 ? 4 : 8);
}

void DotTile(const uint16_t* a, int64_t ldx, int64_t rows, BTile b, int64_t kcp,
             float* c, int64_t ldc, int64_t cols, bool load_c) {
  switch (DotStripsForRows(rows)) {
    case 2:
      return TileRows<2>(a, ldx, rows, b, kcp, c, ldc, cols, load_c);
    case 4:
      return TileRows<4>(a, ldx, rows, b, kcp, c, ldc, cols, load_c);
    default:
      return TileRows<8>(a, ldx, rows, b, kcp, c, ldc, cols, load_c);
  }
}

}  // namespace loom::cpu::gemm
