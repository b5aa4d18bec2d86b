// PLACEHOLDER: bodies to be written (see kernels.h).
#include "src/backend/cuda/kernels.h"

namespace loom::cuda {

void TopKRoute(const float* logits, int64_t tokens, int64_t experts, int64_t ld, int64_t k, Route kind, bool renormalize, int32_t* ids, float* weights, cudaStream_t s) {}

void GroupByExpert(const int32_t* ids, const float* weights, int64_t tokens, int64_t k, int64_t experts, int32_t* offsets, int32_t* rows, float* row_weights, int32_t* bad, cudaStream_t s) {}

}  // namespace loom::cuda
