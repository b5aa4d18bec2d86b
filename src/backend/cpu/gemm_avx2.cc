// The GEMM's fma-family kernels, panel packing and quantized row decoding for
// AVX2 + FMA (8 lanes; compiled with -mavx2 -mfma, called after ActiveIsa() >=
// kAvx2), with an AVX2 FP4 block decoder; see gemm_kernels.inc.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace loom::cpu::avx2 {
namespace {

// Decodes `count` FP4 values (count % 8 == 0; two codes per byte, the even
// value in the low nibble) times f into out. lut16: the 16 E2M1 values. Each
// value is lut16[code] * f rounded once, as the reference.
inline void DecodeFp4Block(const uint8_t* codes, int64_t count, float f,
                           const float* lut16, float* out) {
  const __m256 magnitudes = _mm256_loadu_ps(lut16);  // codes 0-7: + values
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256 factor = _mm256_set1_ps(f);
  for (int64_t c = 0; c < count; c += 8) {
    uint32_t word;
    std::memcpy(&word, codes + c / 2, 4);
    // Lane i: nibble i of the four bytes (low nibble of byte 0 first).
    const __m256i nib = _mm256_srlv_epi32(
        _mm256_set1_epi32(static_cast<int32_t>(word)), shifts);
    // permutevar8x32 reads the low 3 bits: the magnitude; bit 3 is the sign.
    const __m256 mag = _mm256_permutevar8x32_ps(magnitudes, nib);
    const __m256 sign = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_and_si256(nib, _mm256_set1_epi32(8)), 28));
    _mm256_storeu_ps(out + c, _mm256_mul_ps(_mm256_xor_ps(mag, sign), factor));
  }
}

}  // namespace
}  // namespace loom::cpu::avx2

#define LOOM_GEMM_NS avx2
#define LOOM_GEMM_LANES 8
#define LOOM_GEMM_MR 6
#define LOOM_GEMM_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define LOOM_GEMM_SPLAT(s) _mm256_set1_ps(s)
#define LOOM_CODES_FP4_DECODE DecodeFp4Block
#include "src/backend/cpu/gemm_kernels.inc"  // NOLINT(build/include)
