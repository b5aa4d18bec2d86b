// AVX-512 FP4 row decoders (called after HasAvx512()): 16 codes at a time
// through a 16-entry permute table, times the block factor, stored as f32 or
// rounded to bf16 (round to nearest even, NaN kept quiet: exactly
// F32ToBf16).
#include <immintrin.h>

#include "src/backend/cpu/quant_decode_internal.h"

namespace loom::cpu::avx512 {
namespace {

// 8 bytes (16 codes, the even one in the low nibble) -> 16 f32 values.
inline __m512 Decode16(const uint8_t* b, __m512 lut, __m512 factor) {
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(v, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
  const __m512i idx = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
  return _mm512_mul_ps(_mm512_permutexvar_ps(idx, lut), factor);
}

inline void StoreBf16(uint16_t* dst, __m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb =
      _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb),
      16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
      _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16),
                           _mm512_set1_epi32(0x40));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                      _mm512_cvtepi32_epi16(r));
}

}  // namespace

void DecodeFp4Row(const uint8_t* codes, const float* factors, int64_t k,
                  int64_t block, const float* lut16, DType out_dtype,
                  void* out) {
  const __m512 lut = _mm512_loadu_ps(lut16);
  for (int64_t c0 = 0; c0 < k; c0 += 16) {
    const __m512 f = _mm512_set1_ps(factors[c0 / block]);
    const __m512 x = Decode16(codes + c0 / 2, lut, f);
    if (out_dtype == DType::kF32)
      _mm512_storeu_ps(static_cast<float*>(out) + c0, x);
    else
      StoreBf16(static_cast<uint16_t*>(out) + c0, x);
  }
}

}  // namespace loom::cpu::avx512
