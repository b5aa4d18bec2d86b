// AVX-512 versions of the per-row kernels (see kernels_internal.h).
#include "src/backend/cpu/kernels_internal.h"

namespace loom::cpu::avx512 {

void RmsNormRow(const float* x, const void* w, DType w_dtype, float offset, float eps, float* y, int64_t dim) {
  portable::RmsNormRow(x, w, w_dtype, offset, eps, y, dim);
}
void LayerNormRow(const float* x, const void* w, const void* b, DType w_dtype, float eps, float* y, int64_t dim) {
  portable::LayerNormRow(x, w, b, w_dtype, eps, y, dim);
}
void GatedRow(Activation act, const float* gate, const float* up, float* out, int64_t n) {
  portable::GatedRow(act, gate, up, out, n);
}
void ActivationSpan(Activation act, float* x, int64_t n) { portable::ActivationSpan(act, x, n); }
void SoftcapSpan(float* x, int64_t n, float cap) { portable::SoftcapSpan(x, n, cap); }
void AddSpan(const float* x, float* y, int64_t n) { portable::AddSpan(x, y, n); }
void ScaleSpan(float* x, int64_t n, float s) { portable::ScaleSpan(x, n, s); }
void FromF32Span(const float* src, void* dst, DType dtype, int64_t n) { portable::FromF32Span(src, dst, dtype, n); }
void ToF32Span(const void* src, DType dtype, float* dst, int64_t n) { portable::ToF32Span(src, dtype, dst, n); }
double LogSumExpRow(const float* x, int64_t n) { return portable::LogSumExpRow(x, n); }
void RopeToken(float* x, int64_t heads, int64_t head_dim, const float* cos, const float* sin, int64_t half) {
  portable::RopeToken(x, heads, head_dim, cos, sin, half);
}
void AttentionTile(const AttnTile& t) { portable::AttentionTile(t); }

}  // namespace loom::cpu::avx512
