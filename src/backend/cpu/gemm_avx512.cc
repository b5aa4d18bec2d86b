// The GEMM's fma-family kernels, panel packing and quantized row decoding for
// AVX-512 (16 lanes; compiled with the AVX-512 flags, called after
// HasAvx512()); FP4 blocks through the AVX-512 row decoder of
// quant_decode_avx512.cc. See gemm_kernels.inc.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "src/backend/cpu/quant_decode_internal.h"

namespace loom::cpu::avx512 {
namespace {

inline void DecodeFp4Block(const uint8_t* codes, int64_t count, float f,
                           const float* lut16, float* out) {
  DecodeFp4Row(codes, &f, count, count, lut16, DType::kF32, out);
}

}  // namespace
}  // namespace loom::cpu::avx512

#define LOOM_GEMM_NS avx512
#define LOOM_GEMM_LANES 16
#define LOOM_GEMM_MR 12
#define LOOM_GEMM_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define LOOM_GEMM_SPLAT(s) _mm512_set1_ps(s)
#define LOOM_CODES_FP4_DECODE DecodeFp4Block
#include "src/backend/cpu/gemm_kernels.inc"  // NOLINT(build/include)
