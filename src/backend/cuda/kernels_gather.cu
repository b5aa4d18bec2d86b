// Gather / scatter kernels of the CUDA backend (see kernels.h). Copies and
// widenings are exact; ScatterAddRows rounds the product before the sum
// (no FMA), as the CPU kernel (src/backend/cpu/kernels.cc) does, so its
// results equal the CPU's bit for bit.
#include <cuda_fp16.h>

#include <cstdint>

#include "src/backend/cuda/device_util.cuh"
#include "src/backend/cuda/kernels.h"

namespace loom::cuda {
namespace {


// out [tokens, dim] f32 = table [vocab, dim] (dtype) rows ids [tokens].
__global__ void GatherKernel(const void* table, DType dtype, const int32_t* ids,
                             int64_t tokens, int64_t dim, float* out) {
  const int64_t n = tokens * dim;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / dim, c = i % dim;
    const int64_t src = static_cast<int64_t>(ids[t]) * dim + c;
    if (dtype == DType::kBF16)
      out[i] = __uint_as_float(
          static_cast<uint32_t>(static_cast<const uint16_t*>(table)[src])
          << 16);
    else if (dtype == DType::kF16)
      out[i] = F16ToF32(static_cast<const uint16_t*>(table)[src]);
    else
      out[i] = static_cast<const float*>(table)[src];
  }
}

// out [n, cols] dense = x rows rows[i] (row stride ldx).
__global__ void GatherRowsKernel(const float* x, int64_t ldx,
                                 const int32_t* rows, int64_t n, int64_t cols,
                                 float* out) {
  const int64_t total = n * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    out[i] = x[static_cast<int64_t>(rows[r]) * ldx + c];
  }
}

// One thread per output element: y[r, j] with j = (p * groups + g) * width
// + i reads x[r, (g * parts + p) * width + i].
__global__ void DeinterleaveBlocksKernel(const float* x, int64_t ldx,
                                         int64_t rows, int64_t groups,
                                         int64_t parts, int64_t width, float* y,
                                         int64_t ldy) {
  const int64_t cols = groups * parts * width, total = rows * cols;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / cols, j = e % cols;
    const int64_t p = j / (groups * width), g = (j / width) % groups,
                  i = j % width;
    y[r * ldy + j] = x[r * ldx + (g * parts + p) * width + i];
  }
}

// One thread per copied element (r, g, i).
__global__ void StridedCopyKernel(const float* x, int64_t ldx, int64_t gsx,
                                  int64_t isx, float* y, int64_t ldy,
                                  int64_t gsy, int64_t isy, int64_t rows,
                                  int64_t groups, int64_t n) {
  const int64_t total = rows * groups * n;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / (groups * n), g = (e / n) % groups, i = e % n;
    y[r * ldy + g * gsy + i * isy] = x[r * ldx + g * gsx + i * isx];
  }
}

// y[rows[i], :] (row stride ldy) += w[i] * x[i, :] (x [n, cols] dense; w
// null = 1). rows are distinct within a call (as the CPU kernel requires),
// so every output element has one writer.
__global__ void ScatterAddRowsKernel(const float* x, const int32_t* rows,
                                     const float* w, int64_t n, int64_t cols,
                                     float* y, int64_t ldy) {
  const int64_t total = n * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float s = w != nullptr ? w[r] : 1.0f;
    float* p = y + static_cast<int64_t>(rows[r]) * ldy + c;
    *p = __fadd_rn(*p, __fmul_rn(s, x[i]));
  }
}

}  // namespace

void Gather(const void* table, DType table_dtype, const int32_t* ids,
            int64_t tokens, int64_t dim, float* out, cudaStream_t s) {
  if (tokens <= 0 || dim <= 0) return;
  GatherKernel<<<GridFor(tokens * dim), kThreads, 0, s>>>(
      table, table_dtype, ids, tokens, dim, out);
}

void GatherRows(const float* x, int64_t ldx, const int32_t* rows, int64_t n,
                int64_t cols, float* out, cudaStream_t s) {
  if (n <= 0 || cols <= 0) return;
  GatherRowsKernel<<<GridFor(n * cols), kThreads, 0, s>>>(x, ldx, rows, n, cols,
                                                          out);
}

void DeinterleaveBlocks(const float* x, int64_t ldx, int64_t rows,
                        int64_t groups, int64_t parts, int64_t width, float* y,
                        int64_t ldy, cudaStream_t s) {
  const int64_t total = rows * groups * parts * width;
  if (total <= 0) return;
  DeinterleaveBlocksKernel<<<GridFor(total), kThreads, 0, s>>>(
      x, ldx, rows, groups, parts, width, y, ldy);
}

void StridedCopy(const float* x, int64_t ldx, int64_t gsx, int64_t isx,
                 float* y, int64_t ldy, int64_t gsy, int64_t isy, int64_t rows,
                 int64_t groups, int64_t n, cudaStream_t s) {
  const int64_t total = rows * groups * n;
  if (total <= 0) return;
  StridedCopyKernel<<<GridFor(total), kThreads, 0, s>>>(
      x, ldx, gsx, isx, y, ldy, gsy, isy, rows, groups, n);
}

void ScatterAddRows(const float* x, const int32_t* rows, const float* weights,
                    int64_t n, int64_t cols, float* y, int64_t ldy,
                    cudaStream_t s) {
  if (n <= 0 || cols <= 0) return;
  ScatterAddRowsKernel<<<GridFor(n * cols), kThreads, 0, s>>>(x, rows, weights,
                                                              n, cols, y, ldy);
}

}  // namespace loom::cuda
