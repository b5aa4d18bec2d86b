// Quantized element codes and the weight-only decode rule of every quantized
// storage format (src/core/format.h), as scalar references any backend can
// use and test against.
//
// Codes:
//   E2M1 (FP4)  s.ee.m, bias 1, no inf/NaN: magnitudes [0, .5, 1, 1.5, 2, 3,
//               4, 6], bit 3 = sign. Two codes per byte, the even element in
//               the low nibble.
//   E4M3 (fn)   s.eeee.mmm, bias 7, subnormals m/8 * 2^-6, S.1111.111 = NaN,
//               no inf, max 448.
//   E8M0        unsigned exponent byte b: 2^(b - 127), 255 = NaN.
//
// Decode of a quantized matrix W [n = out, k = in] (weight-only: activations
// are never quantized; input scales are not read):
//   fp8-per-tensor   W[r, c] = E4M3(w[r, c]) * weight_scale
//   fp8-block        W[r, c] = E4M3(w[r, c]) * scale_inv[r / bo, c / bi]
//                    (scale_inv is a multiplier, BF16 or F32)
//   mxfp4            W[r, c] = E2M1(code[r, c]) * 2^(scales[r, c / 32] - 127)
//   nvfp4-modelopt   W[r, c] = E2M1(code) * (E4M3(scale[r, c / 16]) * scale_2)
//   nvfp4-ct         W[r, c] = E2M1(code) * (E4M3(scale[r, c / 16]) / global)
// Every product is formed in f32, the block factor first (NVFP4).
#ifndef LOOM_CORE_QUANT_CODES_H_
#define LOOM_CORE_QUANT_CODES_H_

#include <cstdint>

#include "src/core/dtype.h"
#include "src/core/format.h"

namespace loom {

float E2M1ToF32(uint8_t code);  // low 4 bits used
float E4M3ToF32(uint8_t code);
float E8M0ToF32(uint8_t code);

// The 16 E2M1 values in code order (the table every decoder indexes).
const float* E2M1Table();
// All 256 E4M3 values in code order.
const float* E4M3Table();

// A quantized weight matrix [n, k] as stored (row-major over `n`; one expert
// of a stacked tensor is a matrix of its own).
struct QuantMatrix {
  FormatKind kind = FormatKind::kDense;
  const void* values = nullptr;  // codes: [n, k] bytes (FP8) or [n, k/2] (FP4)
  // Block scales: fp8-block [ceil(n/bo), ceil(k/bi)] in scale_dtype (BF16 or
  // F32); mxfp4 [n, k/32] E8M0; nvfp4 [n, k/16] E4M3. Null for per-tensor.
  const void* scales = nullptr;
  DType scale_dtype = DType::kF32;
  int64_t n = 0, k = 0;
  int64_t block_out = 1, block_in = 0;  // rows/cols one block scale covers
  // Per-tensor scale: fp8-per-tensor weight_scale, nvfp4-modelopt
  // weight_scale_2 (multiplied), nvfp4-ct weight_global_scale (divided).
  float global_scale = 1.0f;
  bool divide_global = false;
};

// The [block_out, block_in] a format's block scales cover (FP8 block: from
// the config; MX: [1, 32]; NVFP4: [1, 16]; per-tensor: [n, k], i.e. none).
void FormatBlock(const WeightFormat& format, int64_t* block_out,
                 int64_t* block_in);

// The factor of block (row r, block column g) in f32: the block scale times
// (or over) the global scale, for FP4 formats; the block scale for FP8 block;
// the global scale for FP8 per-tensor.
float BlockFactor(const QuantMatrix& m, int64_t r, int64_t c);

// Scalar reference: decodes rows [row0, row0 + rows) of `m` to f32 into
// out [rows, k].
void DecodeRowsReference(const QuantMatrix& m, int64_t row0, int64_t rows,
                         float* out);

}  // namespace loom

#endif  // LOOM_CORE_QUANT_CODES_H_
