// Fast decoders of quantized weight rows (src/core/quant_codes.h gives the
// rule and the scalar reference each one is tested against). The GEMM
// decodes its own blocks (gemm_internal.h); these decode whole rows.
#ifndef LOOM_BACKEND_CPU_QUANT_DECODE_H_
#define LOOM_BACKEND_CPU_QUANT_DECODE_H_

#include <cstdint>

#include "src/core/dtype.h"
#include "src/core/format.h"
#include "src/core/quant_codes.h"

namespace loom::cpu {

// Whether every decoded value of `kind` is exactly representable in `dtype`,
// so that rounding the f32 decode to it changes nothing: f32, and MXFP4 in
// bf16 (two significant bits times a power of two, lowest bit >= 2^-128, in
// bf16's exponent range).
bool DecodeIsExactIn(FormatKind kind, DType dtype);

// Decodes rows [row0, row0 + rows) of `m` into out [rows, k] in `out_dtype`
// (f32: the exact f32 decode; bf16/f16: that value rounded to nearest even).
// Bit-identical to DecodeRowsReference (then rounded). Parallel over rows.
void DecodeRows(const QuantMatrix& m, int64_t row0, int64_t rows,
                DType out_dtype, void* out);

}  // namespace loom::cpu

#endif  // LOOM_BACKEND_CPU_QUANT_DECODE_H_
