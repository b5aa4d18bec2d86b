// Kernels of the CUDA GEMM path (gemm.cc): the weight-only decode of
// quantized weights (DecodeRows, see kernels.h) and the bias add of GEMMs
// whose bias cuBLASLt's epilogue does not take (AddBiasRows, declared in
// gemm.cc).
//
// DecodeRows reproduces DecodeRowsReference (src/core/quant_codes.cc)
// exactly: the codes are widened to the same f32 values (built here from
// their bits, which is exact: every E2M1 / E4M3 / E8M0 value is an f32),
// the block factor is formed in f32 first (NVFP4: E4M3(scale) * or / the
// global scale, IEEE round-to-nearest), then code * factor is one f32
// product. The f32 result is therefore bit-identical to the reference (NaN
// payloads aside: a NaN code or scale gives a NaN); 16-bit outputs are that
// value rounded once to nearest even (src/base/float16.h semantics).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "src/backend/cuda/device_util.cuh"
#include "src/backend/cuda/kernels.h"

namespace loom::cuda {

void AddBiasRows(float* y, int64_t ldy, int64_t rows, int64_t cols,
                 const void* bias, DType bias_dtype, cudaStream_t s);

namespace {

// gridDim.y limit; rows beyond it are covered by a grid-stride loop.
constexpr int64_t kMaxGridY = 65535;
// Blocks along a row (columns beyond are covered by a grid-stride loop).
constexpr int64_t kMaxGridX = 1 << 16;
// The reference's quiet NaN (std::numeric_limits<float>::quiet_NaN()).
constexpr uint32_t kQuietNaN = 0x7fc00000u;

// E2M1 s.ee.m (low 4 bits of `code`): e == 0 -> 0.5 * m, else
// (1 + 0.5 m) 2^(e - 1); bit 3 = sign (code 8 = -0).
__device__ __forceinline__ float E2M1(uint32_t code) {
  const uint32_t s = (code >> 3) & 1u, e = (code >> 1) & 3u, m = code & 1u;
  const uint32_t mag =
      e == 0 ? (m != 0 ? 0x3f000000u : 0u) : ((e + 126u) << 23) | (m << 22);
  return __uint_as_float((s << 31) | mag);
}

// E4M3 (fn) s.eeee.mmm, bias 7: e == 0 -> m/8 * 2^-6, else (1 + m/8)
// 2^(e - 7); S.1111.111 = NaN (positive quiet NaN, as the reference).
__device__ __forceinline__ float E4M3(uint32_t code) {
  const uint32_t s = code >> 7, e = (code >> 3) & 15u, m = code & 7u;
  if (e == 15 && m == 7) return __uint_as_float(kQuietNaN);
  // Subnormal m * 2^-9: exact (m < 8, a power-of-two scale).
  const float mag = e == 0 ? __fmul_rn(static_cast<float>(m), 0x1p-9f)
                           : __uint_as_float(((e + 120u) << 23) | (m << 20));
  return s != 0 ? -mag : mag;
}

// E8M0 2^(b - 127); b = 0 is the f32 subnormal 2^-127; 255 = NaN.
__device__ __forceinline__ float E8M0(uint32_t b) {
  if (b == 255) return __uint_as_float(kQuietNaN);
  return __uint_as_float(b == 0 ? 0x00400000u : (b << 23));
}

// Block scale i of `p` in `dtype`, as the reference's LoadScale. Multi-byte
// scales are read bytewise (little endian): a scale tensor need not be
// aligned.
__device__ __forceinline__ float LoadScale(const uint8_t* p, DType dtype,
                                           int64_t i) {
  switch (dtype) {
    case DType::kBF16: {
      const uint32_t h = uint32_t{p[2 * i]} | (uint32_t{p[2 * i + 1]} << 8);
      return __uint_as_float(h << 16);
    }
    case DType::kF8E4M3:
      return E4M3(p[i]);
    case DType::kF8E8M0:
    case DType::kU8:
      return E8M0(p[i]);
    default: {
      const uint32_t u = uint32_t{p[4 * i]} | (uint32_t{p[4 * i + 1]} << 8) |
                         (uint32_t{p[4 * i + 2]} << 16) |
                         (uint32_t{p[4 * i + 3]} << 24);
      return __uint_as_float(u);
    }
  }
}

// The reference's BlockFactor(m, r, c), in f32.
__device__ __forceinline__ float ScaleFactor(const QuantMatrix& m, int64_t r,
                                             int64_t c) {
  const auto* scales = static_cast<const uint8_t*>(m.scales);
  switch (m.kind) {
    case FormatKind::kFp8PerTensor:
      return m.global_scale;
    case FormatKind::kFp8Block: {
      const int64_t cols = (m.k + m.block_in - 1) / m.block_in;
      return LoadScale(scales, m.scale_dtype,
                       (r / m.block_out) * cols + c / m.block_in);
    }
    case FormatKind::kMxfp4:
      return E8M0(scales[r * (m.k / 32) + c / 32]);
    case FormatKind::kNvfp4ModelOpt:
    case FormatKind::kNvfp4CompressedTensors: {
      const float s = E4M3(scales[r * (m.k / 16) + c / 16]);
      return m.divide_global ? __fdiv_rn(s, m.global_scale)
                             : __fmul_rn(s, m.global_scale);
    }
    default:
      return __uint_as_float(kQuietNaN);
  }
}

// BF16 and F16 both travel as uint16_t; the tag picks the rounding.
struct Bf16Tag {};
struct F16Tag {};
template <typename Tag>
__device__ __forceinline__ uint16_t Round16(float v);
template <>
__device__ __forceinline__ uint16_t Round16<Bf16Tag>(float v) {
  return F32ToBf16(v);
}
template <>
__device__ __forceinline__ uint16_t Round16<F16Tag>(float v) {
  return __half_as_ushort(__float2half_rn(v));
}

// out [rows, m.k] dense: decoded rows [row0, row0 + rows) of m. One thread
// per output element: x over the columns, y over the rows (both
// grid-stride).
template <typename Out, typename Tag>
__global__ void DecodeRowsKernel(QuantMatrix m, int64_t row0, int64_t rows,
                                 Out* __restrict__ out) {
  const auto* v = static_cast<const uint8_t*>(m.values);
  const bool fp4 = m.kind == FormatKind::kMxfp4 ||
                   m.kind == FormatKind::kNvfp4ModelOpt ||
                   m.kind == FormatKind::kNvfp4CompressedTensors;
  for (int64_t i = blockIdx.y; i < rows; i += gridDim.y) {
    const int64_t r = row0 + i;
    for (int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; c < m.k;
         c += int64_t{gridDim.x} * blockDim.x) {
      float q;
      if (fp4) {
        const uint32_t byte = v[r * (m.k / 2) + c / 2];
        q = E2M1((c & 1) == 0 ? (byte & 15u) : (byte >> 4));
      } else {
        q = E4M3(v[r * m.k + c]);
      }
      const float w = __fmul_rn(q, ScaleFactor(m, r, c));
      if constexpr (std::is_same_v<Out, float>) {
        out[i * m.k + c] = w;
      } else {
        out[i * m.k + c] = Round16<Tag>(w);
      }
    }
  }
}

// y[i, j] += float(bias[j]) (f32 addition, round to nearest) for y [rows,
// cols] row stride ldy; bias [cols] in BF16 / F16 / F32, read bytewise
// (little endian) so any alignment works.
__global__ void AddBiasRowsKernel(float* __restrict__ y, int64_t ldy,
                                  int64_t rows, int64_t cols,
                                  const uint8_t* __restrict__ bias,
                                  DType dtype) {
  for (int64_t i = blockIdx.y; i < rows; i += gridDim.y) {
    for (int64_t j = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; j < cols;
         j += int64_t{gridDim.x} * blockDim.x) {
      float b;
      if (dtype == DType::kF32) {
        const uint32_t u = uint32_t{bias[4 * j]} |
                           (uint32_t{bias[4 * j + 1]} << 8) |
                           (uint32_t{bias[4 * j + 2]} << 16) |
                           (uint32_t{bias[4 * j + 3]} << 24);
        b = __uint_as_float(u);
      } else {
        const uint16_t h = static_cast<uint16_t>(
            uint32_t{bias[2 * j]} | (uint32_t{bias[2 * j + 1]} << 8));
        b = dtype == DType::kBF16 ? __uint_as_float(uint32_t{h} << 16)
                                  : __half2float(__ushort_as_half(h));
      }
      float* p = y + i * ldy + j;
      *p = __fadd_rn(*p, b);
    }
  }
}

dim3 RowsGrid(int64_t rows, int64_t cols) {
  const int64_t gx = std::min((cols + kThreads - 1) / kThreads, kMaxGridX);
  const int64_t gy = std::min(rows, kMaxGridY);
  return dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
}

}  // namespace

void DecodeRows(const QuantMatrix& m, int64_t row0, int64_t rows, void* out,
                DType dtype, cudaStream_t s) {
  // The caller (GemmRunner) validates the matrix; nothing to do for empty
  // ranges.
  if (rows <= 0 || m.k <= 0) return;
  const dim3 grid = RowsGrid(rows, m.k);
  switch (dtype) {
    case DType::kF32:
      DecodeRowsKernel<float, void>
          <<<grid, kThreads, 0, s>>>(m, row0, rows, static_cast<float*>(out));
      break;
    case DType::kBF16:
      DecodeRowsKernel<uint16_t, Bf16Tag><<<grid, kThreads, 0, s>>>(
          m, row0, rows, static_cast<uint16_t*>(out));
      break;
    case DType::kF16:
      DecodeRowsKernel<uint16_t, F16Tag><<<grid, kThreads, 0, s>>>(
          m, row0, rows, static_cast<uint16_t*>(out));
      break;
    default:
      break;  // refused by the caller
  }
}

void AddBiasRows(float* y, int64_t ldy, int64_t rows, int64_t cols,
                 const void* bias, DType bias_dtype, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  AddBiasRowsKernel<<<RowsGrid(rows, cols), kThreads, 0, s>>>(
      y, ldy, rows, cols, static_cast<const uint8_t*>(bias), bias_dtype);
}

}  // namespace loom::cuda
