// Norm kernels of the CUDA backend (see kernels.h), with the CPU backend's
// arithmetic (src/backend/cpu/kernels_portable.cc, RmsNormRow /
// LayerNormRow): sums of squares (and the LayerNorm mean and variance) in
// double, the inverse root 1 / sqrt(double) rounded once to f32, then the f32
// products in the CPU's order, each rounded (no FMA). Only the order of the
// double sums differs (a tree instead of a sequence), which moves the f32
// inverse root by one ulp in rare cases.
//
// One row per group of kGroup threads: a warp for short rows (q/k norms), a
// 256-thread block for model-width rows. The reduction tree is fixed, so
// results are deterministic.
#include <cuda_fp16.h>

#include <cstdint>

#include "src/backend/cuda/device_util.cuh"
#include "src/backend/cuda/kernels.h"

namespace loom::cuda {
namespace {

constexpr int kBlock = 256;
// Rows at most this long are normalised by one warp.
constexpr int64_t kWarpRowMax = 512;

__device__ __forceinline__ float LoadW(const void* w, DType dtype, int64_t i) {
  if (dtype == DType::kBF16)
    return Bf16ToF32(static_cast<const uint16_t*>(w)[i]);
  if (dtype == DType::kF16)
    return F16ToF32(static_cast<const uint16_t*>(w)[i]);
  return static_cast<const float*>(w)[i];
}

// Sum of v over the kGroup threads of a row (every thread gets it). `shared`
// holds kBlock / 32 doubles (used when kGroup > 32).
template <int kGroup>
__device__ __forceinline__ double GroupSum(double v, double* shared) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if constexpr (kGroup > 32) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // `shared` may still be read from a previous sum
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    double t = 0.0;
#pragma unroll
    for (int w = 0; w < kGroup / 32; ++w) t += shared[w];
    v = t;
  }
  return v;
}

// Row r of the rows: groups of `dim` values, `groups` per token, tokens
// `ld` apart (a dense [rows, dim] array is groups = 1, ld = dim).
__device__ __forceinline__ int64_t RowOffset(int64_t r, int64_t groups,
                                             int64_t ld, int64_t dim) {
  return (r / groups) * ld + (r % groups) * dim;
}

// y = x * inv * (w + offset), or bf16(w * bf16(x * inv)) when `bf16`;
// x, y [rows of dim] (see RowOffset; may alias).
template <int kGroup>
__global__ void RmsNormKernel(const float* x, float* y, int64_t rows,
                              int64_t groups, int64_t ld, int64_t dim,
                              const void* w, DType w_dtype, float offset,
                              float eps, bool bf16) {
  __shared__ double shared[kBlock / 32];
  constexpr int kRowsPerBlock = kBlock / kGroup;
  const int64_t r = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kGroup;
  const int t = threadIdx.x % kGroup;
  if (kGroup == 32 && r >= rows) return;  // whole warps only
  const int64_t off = RowOffset(r, groups, ld, dim);
  const float* xr = x + off;
  float* yr = y + off;
  double ss = 0.0;
  for (int64_t i = t; i < dim; i += kGroup) {
    const double v = xr[i];
    ss += v * v;  // exact: a product of two floats fits a double
  }
  ss = GroupSum<kGroup>(ss, shared);
  const float inv = static_cast<float>(
      1.0 / sqrt(ss / static_cast<double>(dim) + static_cast<double>(eps)));
  for (int64_t i = t; i < dim; i += kGroup) {
    const float v = __fmul_rn(xr[i], inv);
    if (bf16) {
      yr[i] = RoundBf16(__fmul_rn(LoadW(w, DType::kBF16, i), RoundBf16(v)));
    } else if (w != nullptr) {
      yr[i] = __fmul_rn(v, __fadd_rn(LoadW(w, w_dtype, i), offset));
    } else {
      yr[i] = v;
    }
  }
}

// y = (x - mean) * inv * (w + offset) + b; x, y [rows of dim] (see
// RowOffset; may alias).
template <int kGroup>
__global__ void LayerNormKernel(const float* x, float* y, int64_t rows,
                                int64_t groups, int64_t ld, int64_t dim,
                                const void* w, const void* b, DType w_dtype,
                                float offset, float eps) {
  __shared__ double shared[kBlock / 32];
  constexpr int kRowsPerBlock = kBlock / kGroup;
  const int64_t r = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kGroup;
  const int t = threadIdx.x % kGroup;
  if (kGroup == 32 && r >= rows) return;
  const int64_t off = RowOffset(r, groups, ld, dim);
  const float* xr = x + off;
  float* yr = y + off;
  double sum = 0.0;
  for (int64_t i = t; i < dim; i += kGroup) sum += static_cast<double>(xr[i]);
  const double mean = GroupSum<kGroup>(sum, shared) / static_cast<double>(dim);
  double var = 0.0;
  for (int64_t i = t; i < dim; i += kGroup) {
    const double d = static_cast<double>(xr[i]) - mean;
    var = __dadd_rn(var, __dmul_rn(d, d));  // d * d rounded, as the CPU
  }
  var = GroupSum<kGroup>(var, shared);
  const float inv = static_cast<float>(
      1.0 / sqrt(var / static_cast<double>(dim) + static_cast<double>(eps)));
  const float meanf = static_cast<float>(mean);
  for (int64_t i = t; i < dim; i += kGroup) {
    float v = __fmul_rn(__fsub_rn(xr[i], meanf), inv);
    if (w != nullptr)
      v = __fmul_rn(v, __fadd_rn(LoadW(w, w_dtype, i), offset));
    if (b != nullptr) v = __fadd_rn(v, LoadW(b, w_dtype, i));
    yr[i] = v;
  }
}

void LaunchRms(const float* x, float* y, int64_t rows, int64_t groups,
               int64_t ld, int64_t dim, const void* w, DType w_dtype,
               float offset, float eps, bool bf16, cudaStream_t s) {
  if (rows <= 0 || dim <= 0) return;
  if (dim <= kWarpRowMax) {
    constexpr int64_t per = kBlock / 32;
    RmsNormKernel<32>
        <<<static_cast<unsigned>((rows + per - 1) / per), kBlock, 0, s>>>(
            x, y, rows, groups, ld, dim, w, w_dtype, offset, eps, bf16);
  } else {
    RmsNormKernel<kBlock><<<static_cast<unsigned>(rows), kBlock, 0, s>>>(
        x, y, rows, groups, ld, dim, w, w_dtype, offset, eps, bf16);
  }
}

void LaunchLayer(const float* x, float* y, int64_t rows, int64_t groups,
                 int64_t ld, int64_t dim, const void* w, const void* b,
                 DType w_dtype, float offset, float eps, cudaStream_t s) {
  if (rows <= 0 || dim <= 0) return;
  if (dim <= kWarpRowMax) {
    constexpr int64_t per = kBlock / 32;
    LayerNormKernel<32>
        <<<static_cast<unsigned>((rows + per - 1) / per), kBlock, 0, s>>>(
            x, y, rows, groups, ld, dim, w, b, w_dtype, offset, eps);
  } else {
    LayerNormKernel<kBlock><<<static_cast<unsigned>(rows), kBlock, 0, s>>>(
        x, y, rows, groups, ld, dim, w, b, w_dtype, offset, eps);
  }
}

}  // namespace

void RmsNorm(const float* x, const void* w, DType w_dtype, float offset,
             float eps, float* y, int64_t rows, int64_t dim, cudaStream_t s) {
  LaunchRms(x, y, rows, 1, dim, dim, w, w_dtype, offset, eps, false, s);
}

void RmsNormBf16(const float* x, const void* w, float eps, float* y,
                 int64_t rows, int64_t dim, cudaStream_t s) {
  LaunchRms(x, y, rows, 1, dim, dim, w, DType::kBF16, 0.0f, eps, true, s);
}

void RmsNormRows(float* x, int64_t tokens, int64_t ld, int64_t groups,
                 int64_t dim, const void* w, DType w_dtype, float offset,
                 float eps, cudaStream_t s) {
  if (groups <= 0) return;
  LaunchRms(x, x, tokens * groups, groups, ld, dim, w, w_dtype, offset, eps,
            false, s);
}

void LayerNorm(const float* x, const void* w, const void* b, DType w_dtype,
               float offset, float eps, float* y, int64_t rows, int64_t dim,
               cudaStream_t s) {
  LaunchLayer(x, y, rows, 1, dim, dim, w, b, w_dtype, offset, eps, s);
}

void LayerNormRows(float* x, int64_t tokens, int64_t ld, int64_t groups,
                   int64_t dim, const void* w, const void* b, DType w_dtype,
                   float eps, cudaStream_t s) {
  if (groups <= 0) return;
  LaunchLayer(x, x, tokens * groups, groups, ld, dim, w, b, w_dtype, 0.0f, eps,
              s);
}

}  // namespace loom::cuda
