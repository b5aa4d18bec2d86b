// Rotary embedding kernels of the CUDA backend (see kernels.h), with the CPU
// backend's arithmetic (src/backend/cpu/kernels.cc RopeTables,
// kernels_portable.cc RopeToken): the angle is the f32 product
// float(position) * inv_freq[i]; cos / sin are CUDA's precise cosf / sinf
// (within 2 ulp; the host's libm is within 1), times attention_scaling; the
// rotation rounds each product before the sum (no FMA), as the portable CPU
// kernel does.
#include <cstdint>

#include "src/backend/cuda/device_util.cuh"
#include "src/backend/cuda/kernels.h"

namespace loom::cuda {
namespace {


// cos/sin [tokens, half] for positions [tokens], inv_freq [half].
__global__ void RopeTablesKernel(const int32_t* positions, int64_t tokens,
                                 const float* inv_freq, int64_t half,
                                 float scaling, float* cos, float* sin) {
  const int64_t n = tokens * half;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / half, j = i % half;
    const float angle =
        __fmul_rn(static_cast<float>(positions[t]), inv_freq[j]);
    cos[i] = __fmul_rn(cosf(angle), scaling);
    sin[i] = __fmul_rn(sinf(angle), scaling);
  }
}

// x [tokens, heads, head_dim] (row stride row_stride), rotate-half on the
// first 2 * half dims of each head; cos/sin [tokens, half]. One thread per
// (token, head, i < half) pair of elements.
__global__ void ApplyRopeKernel(float* x, int64_t tokens, int64_t heads,
                                int64_t head_dim, int64_t row_stride,
                                const float* cos, const float* sin,
                                int64_t half) {
  const int64_t n = tokens * heads * half;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = i % half;
    const int64_t th = i / half;  // token * heads + head
    const int64_t t = th / heads, h = th % heads;
    float* v = x + t * row_stride + h * head_dim;
    const float c = cos[t * half + j], s = sin[t * half + j];
    const float x1 = v[j], x2 = v[j + half];
    v[j] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    v[j + half] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
  }
}

}  // namespace

void RopeTables(const int32_t* positions, int64_t tokens, const float* inv_freq,
                int64_t half, float attention_scaling, float* cos, float* sin,
                cudaStream_t s) {
  if (tokens <= 0 || half <= 0) return;
  RopeTablesKernel<<<GridFor(tokens * half), kThreads, 0, s>>>(
      positions, tokens, inv_freq, half, attention_scaling, cos, sin);
}

void ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
               int64_t row_stride, const float* cos, const float* sin,
               int64_t half, cudaStream_t s) {
  if (tokens <= 0 || heads <= 0 || half <= 0) return;
  ApplyRopeKernel<<<GridFor(tokens * heads * half), kThreads, 0, s>>>(
      x, tokens, heads, head_dim, row_stride, cos, sin, half);
}

}  // namespace loom::cuda
