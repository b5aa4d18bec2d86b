// Fast decoders of quantized weight rows (src/core/quant_codes.h gives the
// rule and the scalar reference each one is tested against), and the bytes
// of the panel workspace a quantized GEMM decodes into.
#ifndef LOOM_BACKEND_CPU_QUANT_DECODE_H_
#define LOOM_BACKEND_CPU_QUANT_DECODE_H_

#include <cstdint>

#include "src/core/dtype.h"
#include "src/core/format.h"
#include "src/core/quant_codes.h"

namespace loom::cpu {

// Weight rows (output columns) a quantized GEMM decodes per panel.
inline constexpr int64_t kQuantPanelRows = 512;

// Bytes of the decode workspace of one GEMM with an [n, k] weight stored in
// `kind`, computed in `compute` (f32, bf16 or f16): one panel of
// min(n, kQuantPanelRows) decoded rows, in `compute` or, where the active ISA
// does not multiply it natively (NativeGemmDType), in f32; or, when larger,
// NumThreads() decode tiles of the few-row path (CodesGemmTileBytes). 0 for
// dense weights.
int64_t QuantDecodeWorkspaceBytes(int64_t n, int64_t k, FormatKind kind,
                                  DType compute);

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
