// PLACEHOLDER: bodies to be written (see kernels.h).
#include "src/backend/cuda/kernels.h"

namespace loom::cuda {

void Add(const float* x, float* y, int64_t n, cudaStream_t s) {}

void Scale(float* x, int64_t n, float scale, cudaStream_t s) {}

void Softcap(float* x, int64_t n, float cap, cudaStream_t s) {}

void SetZero(float* x, int64_t n, cudaStream_t s) {}

void Clamp(float* x, int64_t rows, int64_t cols, int64_t ld, float lo, float hi, cudaStream_t s) {}

void RoundToBf16(float* x, int64_t rows, int64_t cols, int64_t ld, cudaStream_t s) {}

void Activation(Act fn, float* x, int64_t n, cudaStream_t s) {}

void GatedActivation(Act fn, const float* gate, int64_t gate_rs, const float* up, int64_t up_rs, float* out, int64_t rows, int64_t n, cudaStream_t s) {}

void ClampedSwiglu(const float* gate_up, int64_t gu_rs, float* out, int64_t rows, int64_t n, float alpha, float limit, cudaStream_t s) {}

void SigmoidGateAddRows(const float* x, const float* gate_logit, int64_t rows, int64_t cols, float* y, int64_t ldy, cudaStream_t s) {}

void ConvertFromF32(const float* src, void* dst, DType dtype, int64_t n, cudaStream_t s) {}

void ConvertToF32(const void* src, DType dtype, float* dst, int64_t n, cudaStream_t s) {}

void ConvertRows(const float* x, int64_t ldx, void* y, int64_t ldy, DType dtype, int64_t rows, int64_t cols, cudaStream_t s) {}

void RmsNorm(const float* x, const void* w, DType w_dtype, float offset, float eps, float* y, int64_t rows, int64_t dim, cudaStream_t s) {}

void RmsNormBf16(const float* x, const void* w, float eps, float* y, int64_t rows, int64_t dim, cudaStream_t s) {}

void RmsNormRows(float* x, int64_t tokens, int64_t ld, int64_t groups, int64_t dim, const void* w, DType w_dtype, float eps, cudaStream_t s) {}

void LayerNorm(const float* x, const void* w, const void* b, DType w_dtype, float eps, float* y, int64_t rows, int64_t dim, cudaStream_t s) {}

}  // namespace loom::cuda
