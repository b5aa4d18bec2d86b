// CodesGemm's kernels for AVX-512 (16 lanes; compiled with the AVX-512 flags
// and -ffp-contract=fast, called after HasAvx512()); FP4 blocks through the
// AVX-512 row decoder of quant_decode_avx512.cc. See codes_gemm_kernels.inc.
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

#define LOOM_CODES_NS avx512
#define LOOM_CODES_LANES 16
#define LOOM_CODES_FP4_DECODE DecodeFp4Block
#include "src/backend/cpu/codes_gemm_kernels.inc"  // NOLINT(build/include)
