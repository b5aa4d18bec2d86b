// Capture kernels of the CUDA backend (see kernels.h), equal bit for bit to
// the CPU backend's (src/backend/cpu/kernels.cc): GatherRowsConvert rounds
// f32 to BF16 / F16 to nearest even exactly as src/base/float16.h;
// SegmentReduce gives each (segment, column) to one thread that walks the
// segment's rows in order, so its double sums are the CPU's sequential sums.
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "src/backend/cuda/device_util.cuh"
#include "src/backend/cuda/kernels.h"

namespace loom::cuda {
namespace {


// dst [n, cols] dense in dtype = src rows index[i] (src row stride ld).
__global__ void GatherRowsConvertKernel(const float* src, int64_t ld,
                                        const int32_t* index, int64_t n,
                                        int64_t cols, void* dst, DType dtype) {
  const int64_t total = n * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float v = src[static_cast<int64_t>(index[r]) * ld + c];
    if (dtype == DType::kBF16)
      static_cast<uint16_t*>(dst)[i] = F32ToBf16(v);
    else if (dtype == DType::kF16)
      static_cast<uint16_t*>(dst)[i] = F32ToF16(v);
    else
      static_cast<float*>(dst)[i] = v;
  }
}

// out [segments, cols] (+)= sum / max over rows [begin[g], end[g]) of src
// (row stride ld), in double, rows in order.
__global__ void SegmentReduceKernel(const float* src, int64_t ld,
                                    const int32_t* begin, const int32_t* end,
                                    int64_t segments, int64_t cols, bool max,
                                    bool accumulate, double* out) {
  const int64_t total = segments * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t g = i / cols, c = i % cols;
    double acc = accumulate ? out[i] : (max ? -INFINITY : 0.0);
    const int64_t r1 = end[g];
    for (int64_t r = begin[g]; r < r1; ++r) {
      const double v = static_cast<double>(src[r * ld + c]);
      if (max)
        acc = acc < v ? v : acc;  // std::max(acc, v)
      else
        acc = __dadd_rn(acc, v);
    }
    out[i] = acc;
  }
}

}  // namespace

void GatherRowsConvert(const float* src, int64_t ld, const int32_t* index,
                       int64_t n, int64_t cols, void* dst, DType dtype,
                       cudaStream_t s) {
  if (n <= 0 || cols <= 0) return;
  GatherRowsConvertKernel<<<GridFor(n * cols), kThreads, 0, s>>>(
      src, ld, index, n, cols, dst, dtype);
}

void SegmentReduce(const float* src, int64_t ld, const int32_t* begin,
                   const int32_t* end, int64_t segments, int64_t cols,
                   Reduce op, bool accumulate, double* out, cudaStream_t s) {
  if (segments <= 0 || cols <= 0) return;
  SegmentReduceKernel<<<GridFor(segments * cols), kThreads, 0, s>>>(
      src, ld, begin, end, segments, cols, op == Reduce::kMax, accumulate, out);
}

}  // namespace loom::cuda
