// LogSumExp of the CUDA backend (see kernels.h), with the CPU backend's
// arithmetic (src/backend/cpu/kernels_portable.cc LogSumExpRow): the row max
// in f32 (exact in any order; NaN skipped as std::max skips it), each
// exp(x - max) in f32 (CUDA's precise expf), summed in double (a fixed tree
// instead of the CPU's sequence: a relative difference near 1e-16), and
// max + log(sum) in double. A row whose max is infinite gives that max.
#include <cmath>
#include <cstdint>

#include "src/backend/cuda/kernels.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 512;

// lse [rows] (double) for logits [rows, vocab] dense; one block per row.
__global__ void LogSumExpKernel(const float* logits, int64_t vocab,
                                double* lse) {
  __shared__ float smax[kThreads / 32];
  __shared__ double ssum[kThreads / 32];
  const float* x = logits + blockIdx.x * vocab;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) m = fmaxf(m, x[i]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) smax[warp] = m;
  __syncthreads();
  m = smax[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, smax[w]);
  if (isinf(m)) {
    if (threadIdx.x == 0) lse[blockIdx.x] = static_cast<double>(m);
    return;
  }
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads)
    sum += static_cast<double>(expf(__fsub_rn(x[i], m)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) ssum[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) t += ssum[w];
    lse[blockIdx.x] = static_cast<double>(m) + log(t);
  }
}

}  // namespace

void LogSumExp(const float* logits, int64_t rows, int64_t vocab, double* lse,
               cudaStream_t s) {
  if (rows <= 0 || vocab <= 0) return;
  LogSumExpKernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(logits,
                                                                   vocab, lse);
}

}  // namespace loom::cuda
