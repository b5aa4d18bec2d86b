// PLACEHOLDER: bodies to be written (see kernels.h).
#include "src/backend/cuda/kernels.h"

namespace loom::cuda {

void RopeTables(const int32_t* positions, int64_t tokens, const float* inv_freq, int64_t half, float attention_scaling, float* cos, float* sin, cudaStream_t s) {}

void ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t row_stride, const float* cos, const float* sin, int64_t half, cudaStream_t s) {}

}  // namespace loom::cuda
