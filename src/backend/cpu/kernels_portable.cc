// Portable (compiler-vectorised) versions of the per-row kernels, used when the
// CPU lacks AVX-512. Same math and summation structure as the AVX-512 versions.
// Compiled twice: here for baseline x86-64 (namespace portable), and by
// kernels_avx2.cc with -mavx2 -mfma -mf16c (namespace avx2, which defines
// LOOM_PORTABLE_NS and LOOM_PORTABLE_KERNELS_ONLY first).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "src/backend/cpu/kernels_internal.h"
#include "src/base/check.h"
#include "src/base/float16.h"

#ifndef LOOM_PORTABLE_NS
#define LOOM_PORTABLE_NS portable
#endif

namespace loom::cpu {

#ifndef LOOM_PORTABLE_KERNELS_ONLY
float LoadScalarAsF32(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(p)[i]);
    default:
      LOOM_CHECK(false) << "unsupported dtype " << static_cast<int>(dtype);
  }
  return 0.0f;
}

int64_t AttnTileScratchFloats(int64_t max_nk, int64_t width) {
  auto pad16 = [](int64_t x) { return (x + 15) / 16 * 16; };
  // The AVX-512 and AVX2 tiles also keep O [kAttnBlock, v_dim] and one chunk
  // of packed V [kAttnBlock, v_dim] (padded to 16; their staging of Q rows
  // reuses the V chunk, so it is max(head_dim, v_dim) wide).
  return pad16(width) * kAttnBlock + max_nk * kAttnBlock + 2 * kAttnBlock +
         2 * kAttnBlock * pad16(width);
}

#endif  // LOOM_PORTABLE_KERNELS_ONLY

namespace LOOM_PORTABLE_NS {
namespace {

float Act(Activation act, float x) {
  switch (act) {
    case Activation::kSilu:
      return x / (1.0f + std::exp(-x));
    case Activation::kGeluTanh: {
      // 0.5 x (1 + tanh(u)) == x * sigmoid(2u), without the cancellation for x
      // << 0.
      const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
      return x / (1.0f + std::exp(-2.0f * u));
    }
    case Activation::kGeluExact:
      return 0.5f * x * std::erfc(-x * 0.70710678118654752f);
    case Activation::kRelu:
      return x > 0.0f ? x : 0.0f;
    case Activation::kReluSquared: {
      const float r = x > 0.0f ? x : 0.0f;
      return r * r;
    }
  }
  return 0.0f;
}

}  // namespace

void RmsNormRow(const float* x, const void* w, DType w_dtype, float offset,
                float eps, float* y, int64_t dim) {
  double ss = 0.0;
  for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv =
      static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
  if (w == nullptr) {
    for (int64_t i = 0; i < dim; ++i) y[i] = x[i] * inv;
  } else {
    for (int64_t i = 0; i < dim; ++i)
      y[i] = x[i] * inv * (LoadScalarAsF32(w, w_dtype, i) + offset);
  }
}

void LayerNormRow(const float* x, const void* w, const void* b, DType w_dtype,
                  float offset, float eps, float* y, int64_t dim) {
  double sum = 0.0;
  for (int64_t i = 0; i < dim; ++i) sum += x[i];
  const double mean = sum / static_cast<double>(dim);
  double var = 0.0;
  for (int64_t i = 0; i < dim; ++i) {
    const double d = x[i] - mean;
    var += d * d;
  }
  const float inv =
      static_cast<float>(1.0 / std::sqrt(var / static_cast<double>(dim) + eps));
  const float meanf = static_cast<float>(mean);
  for (int64_t i = 0; i < dim; ++i) {
    float v = (x[i] - meanf) * inv;
    if (w != nullptr) v *= LoadScalarAsF32(w, w_dtype, i) + offset;
    if (b != nullptr) v += LoadScalarAsF32(b, w_dtype, i);
    y[i] = v;
  }
}

void GatedRow(Activation act, const float* gate, const float* up, float* out,
              int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = Act(act, gate[i]) * up[i];
}

void ActivationSpan(Activation act, float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = Act(act, x[i]);
}

void SoftcapSpan(float* x, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inv);
}

void AddSpan(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void ScaleSpan(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void RoundSpan(const float* src, float* dst, DType dtype, int64_t n) {
  switch (dtype) {
    case DType::kBF16:
      // The switch outside the loop: the loop vectorises.
      for (int64_t i = 0; i < n; ++i) dst[i] = RoundBf16(src[i]);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToF32(F32ToF16(src[i]));
      break;
    default:
      if (dst != src) std::memmove(dst, src, static_cast<size_t>(n) * 4);
      break;
  }
}

void FromF32Span(const float* src, void* dst, DType dtype, int64_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i)
        static_cast<uint16_t*>(dst)[i] = F32ToBf16(src[i]);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i)
        static_cast<uint16_t*>(dst)[i] = F32ToF16(src[i]);
      break;
    default:
      LOOM_CHECK(false) << "unsupported dtype " << static_cast<int>(dtype);
  }
}

void ToF32Span(const void* src, DType dtype, float* dst, int64_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i)
        dst[i] = Bf16ToF32(static_cast<const uint16_t*>(src)[i]);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i)
        dst[i] = F16ToF32(static_cast<const uint16_t*>(src)[i]);
      break;
    default:
      LOOM_CHECK(false) << "unsupported dtype " << static_cast<int>(dtype);
  }
}

double LogSumExpRow(const float* x, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  if (std::isinf(mx)) return mx;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - mx);
  return static_cast<double>(mx) + std::log(sum);
}

void RopeToken(float* x, int64_t heads, int64_t head_dim, const float* cos,
               const float* sin, int64_t half) {
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = v[i], x2 = v[i + half];
      v[i] = x1 * cos[i] - x2 * sin[i];
      v[i + half] = x2 * cos[i] + x1 * sin[i];
    }
  }
}

void AttentionTile(const AttnTile& t) {
  constexpr int64_t B = kAttnBlock;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  float* st = t.scratch;  // S^T [nk, B]
  float* rmax = st + t.nk * B;
  float* rsum = rmax + B;
  for (int64_t r = 0; r < t.rows; ++r) {
    rmax[r] = t.has_sink ? t.sink : kNegInf;  // the max covers the sink
    rsum[r] = 0.0f;
  }
  // Scores.
  for (int64_t jj = 0; jj < t.nk; ++jj) {
    const int64_t j = t.j_lo + jj;
    const float* krow = t.k + jj * t.k_rs;
    for (int64_t r = 0; r < t.rows; ++r) {
      const int64_t i = t.i0 + r;
      float s = kNegInf;
      if (j <= i && (t.window <= 0 || i - j < t.window)) {
        const float* qrow = t.q + r * t.q_rs;
        float dot = 0.0f;
        for (int64_t d = 0; d < t.head_dim; ++d) dot += qrow[d] * krow[d];
        s = dot * t.scale;
        if (t.alibi != 0.0f) s += t.alibi * static_cast<float>(j);
        if (t.softcap > 0.0f) s = t.softcap * std::tanh(s / t.softcap);
        rmax[r] = std::max(rmax[r], s);
      }
      st[jj * B + r] = s;
    }
  }
  // Softmax over keys (and the sink, whose column is then dropped), per
  // query row.
  if (t.has_sink) {
    for (int64_t r = 0; r < t.rows; ++r) rsum[r] = std::exp(t.sink - rmax[r]);
  }
  for (int64_t jj = 0; jj < t.nk; ++jj) {
    for (int64_t r = 0; r < t.rows; ++r) {
      float& s = st[jj * B + r];
      s = s == kNegInf ? 0.0f : std::exp(s - rmax[r]);
      rsum[r] += s;
    }
  }
  for (int64_t r = 0; r < t.rows; ++r) rsum[r] = 1.0f / rsum[r];
  for (int64_t jj = 0; jj < t.nk; ++jj) {
    for (int64_t r = 0; r < t.rows; ++r) st[jj * B + r] *= rsum[r];
  }
  // Z = P V.
  for (int64_t r = 0; r < t.rows; ++r) {
    float* z = t.z + r * t.z_rs;
    for (int64_t d = 0; d < t.v_dim; ++d) z[d] = 0.0f;
    const int64_t i = t.i0 + r;
    const int64_t jj_end = std::min(t.nk, i - t.j_lo + 1);
    for (int64_t jj = 0; jj < jj_end; ++jj) {
      const float p = st[jj * B + r];
      if (p == 0.0f) continue;
      const float* vrow = t.v + jj * t.v_rs;
      for (int64_t d = 0; d < t.v_dim; ++d) z[d] += p * vrow[d];
    }
  }
  if (t.probs != nullptr) {
    for (int64_t r = 0; r < t.rows; ++r) {
      for (int64_t jj = 0; jj < t.nk; ++jj)
        t.probs[r * t.probs_rs + t.j_lo + jj] = st[jj * B + r];
    }
  }
}

}  // namespace LOOM_PORTABLE_NS
}  // namespace loom::cpu
