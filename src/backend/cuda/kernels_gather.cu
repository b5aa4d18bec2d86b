// PLACEHOLDER: bodies to be written (see kernels.h).
#include "src/backend/cuda/kernels.h"

namespace loom::cuda {

void Gather(const void* table, DType table_dtype, const int32_t* ids, int64_t tokens, int64_t dim, float* out, cudaStream_t s) {}

void GatherRows(const float* x, int64_t ldx, const int32_t* rows, int64_t n, int64_t cols, float* out, cudaStream_t s) {}

void ScatterAddRows(const float* x, const int32_t* rows, const float* weights, int64_t n, int64_t cols, float* y, int64_t ldy, cudaStream_t s) {}

}  // namespace loom::cuda
