// Vectorised FP4 row decoder (quant_decode_avx512.cc), used by DecodeRows.
#ifndef LOOM_BACKEND_CPU_QUANT_DECODE_INTERNAL_H_
#define LOOM_BACKEND_CPU_QUANT_DECODE_INTERNAL_H_

#include <cstdint>

#include "src/core/dtype.h"

namespace loom::cpu::avx512 {

// One row of k FP4 values (k % 16 == 0, block % 16 == 0): codes [k / 2]
// bytes, factors[k / block] the f32 block factors, lut16 the 16 E2M1 values;
// out [k] in f32 or bf16 (out_dtype).
void DecodeFp4Row(const uint8_t* codes, const float* factors, int64_t k,
                  int64_t block, const float* lut16, DType out_dtype,
                  void* out);

}  // namespace loom::cpu::avx512

#endif  // LOOM_BACKEND_CPU_QUANT_DECODE_INTERNAL_H_
