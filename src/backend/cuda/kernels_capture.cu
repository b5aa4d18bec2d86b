// PLACEHOLDER: bodies to be written (see kernels.h).
#include "src/backend/cuda/kernels.h"

namespace loom::cuda {

void GatherRowsConvert(const float* src, int64_t ld, const int32_t* index, int64_t n, int64_t cols, void* dst, DType dtype, cudaStream_t s) {}

void SegmentReduce(const float* src, int64_t ld, const int32_t* begin, const int32_t* end, int64_t segments, int64_t cols, Reduce op, bool accumulate, double* out, cudaStream_t s) {}

}  // namespace loom::cuda
