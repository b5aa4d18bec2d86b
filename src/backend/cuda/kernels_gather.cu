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

void ScatterAddRows(const float* x, const int32_t* rows, const float* weights,
                    int64_t n, int64_t cols, float* y, int64_t ldy,
                    cudaStream_t s) {
  if (n <= 0 || cols <= 0) return;
  ScatterAddRowsKernel<<<GridFor(n * cols), kThreads, 0, s>>>(x, rows, weights,
                                                              n, cols, y, ldy);
}

}  // namespace loom::cuda
