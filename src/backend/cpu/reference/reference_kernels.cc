#include "src/backend/cpu/reference/reference_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "src/base/check.h"
#include "src/base/float16.h"

namespace loom::cpu::ref {

float LoadAsF32(const void* p, DType dtype, int64_t i) {
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

// Rounds an f32 activation to the compute type of a `dtype` weight.
static float RoundTo(float x, DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return Bf16ToF32(F32ToBf16(x));
    case DType::kF16:
      return F16ToF32(F32ToF16(x));
    default:
      return x;
  }
}

void Gemm(const GemmArgs& a) {
  const int64_t ldy = a.ldy == 0 ? a.n : a.ldy;
  // x rounded to the weight type and the weight as f32 [n, k], once each.
  std::vector<float> xr(static_cast<size_t>(a.m * a.k));
  std::vector<float> wt(static_cast<size_t>(a.n * a.k));
  for (int64_t i = 0; i < a.m * a.k; ++i) xr[i] = RoundTo(a.x[i], a.w_dtype);
  for (int64_t j = 0; j < a.n; ++j)
    for (int64_t p = 0; p < a.k; ++p)
      wt[j * a.k + p] = LoadAsF32(
          a.w, a.w_dtype,
          a.layout == WeightLayout::kOutIn ? j * a.k + p : p * a.n + j);
  for (int64_t i = 0; i < a.m; ++i) {
    for (int64_t j = 0; j < a.n; ++j) {
      double acc = 0.0;
      for (int64_t p = 0; p < a.k; ++p)
        acc += static_cast<double>(xr[i * a.k + p]) * wt[j * a.k + p];
      if (a.bias != nullptr) acc += LoadAsF32(a.bias, a.bias_dtype, j);
      float* out = &a.y[i * ldy + j];
      *out = static_cast<float>(a.accumulate ? acc + *out : acc);
    }
  }
}

void RmsNorm(const float* x, const void* w, DType w_dtype, float offset,
             float eps, float* y, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i)
      ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t i = 0; i < dim; ++i) {
      double v = x[r * dim + i] * inv;
      if (w != nullptr)
        v *= static_cast<double>(LoadAsF32(w, w_dtype, i)) + offset;
      y[r * dim + i] = static_cast<float>(v);
    }
  }
}

void LayerNorm(const float* x, const void* w, const void* b, DType w_dtype,
               float offset, float eps, float* y, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum += x[r * dim + i];
    const double mean = sum / dim;
    double var = 0.0;
    for (int64_t i = 0; i < dim; ++i) {
      const double d = x[r * dim + i] - mean;
      var += d * d;
    }
    const double inv = 1.0 / std::sqrt(var / dim + eps);
    for (int64_t i = 0; i < dim; ++i) {
      double v = (x[r * dim + i] - mean) * inv;
      if (w != nullptr)
        v *= static_cast<double>(LoadAsF32(w, w_dtype, i)) + offset;
      if (b != nullptr) v += LoadAsF32(b, w_dtype, i);
      y[r * dim + i] = static_cast<float>(v);
    }
  }
}

void RopeTables(const int32_t* positions, int64_t tokens, const float* inv_freq,
                int64_t half, float attention_scaling, float* cos, float* sin) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle =
          static_cast<float>(positions[t]) * inv_freq[i];  // f32 product
      cos[t * half + i] =
          static_cast<float>(std::cos(static_cast<double>(angle))) *
          attention_scaling;
      sin[t * half + i] =
          static_cast<float>(std::sin(static_cast<double>(angle))) *
          attention_scaling;
    }
  }
}

void ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
               int64_t row_stride, const float* cos, const float* sin,
               int64_t half) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * row_stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const double c = cos[t * half + i], s = sin[t * half + i];
        const double x1 = v[i], x2 = v[i + half];
        v[i] = static_cast<float>(x1 * c - x2 * s);
        v[i + half] = static_cast<float>(x2 * c + x1 * s);
      }
    }
  }
}

void ApplyRopePairs(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                    int64_t row_stride, const float* cos, const float* sin,
                    int64_t half) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * row_stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const double c = cos[t * half + i], s = sin[t * half + i];
        const double x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = static_cast<float>(x0 * c - x1 * s);
        v[2 * i + 1] = static_cast<float>(x1 * c + x0 * s);
      }
    }
  }
}

void Attention(const AttentionArgs& a) {
  const int64_t group = a.q_heads / a.kv_heads;
  const int64_t d = a.head_dim, dv = a.v_head_dim > 0 ? a.v_head_dim : d;
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const int64_t t0 = a.seq_start[s];
    const int64_t len = a.seq_start[s + 1] - t0;
    std::vector<double> scores(len * len);
    for (int64_t h = 0; h < a.q_heads; ++h) {
      const int64_t kvh = h / group;
      for (int64_t i = 0; i < len; ++i) {
        const float* q = a.q + (t0 + i) * a.q_rs + h * d;
        // The sink logit (if any) joins the max and the normalisation; its
        // own probability is not part of the output.
        const bool has_sink = a.sinks != nullptr;
        const double sink =
            has_sink ? LoadAsF32(a.sinks, a.sinks_dtype, h) : 0.0;
        double mx = has_sink ? sink : -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < len; ++j) {
          const bool visible = j <= i && (a.window <= 0 || i - j < a.window);
          if (!visible) {
            scores[i * len + j] = -std::numeric_limits<double>::infinity();
            continue;
          }
          const float* k = a.k + (t0 + j) * a.k_rs + kvh * d;
          double dot = 0.0;
          for (int64_t p = 0; p < d; ++p)
            dot += static_cast<double>(q[p]) * k[p];
          dot *= a.scale;
          if (a.alibi_slopes != nullptr)
            dot += static_cast<double>(a.alibi_slopes[h]) * j;
          if (a.softcap > 0.0f) dot = a.softcap * std::tanh(dot / a.softcap);
          scores[i * len + j] = dot;
          mx = std::max(mx, dot);
        }
        double sum = has_sink ? std::exp(sink - mx) : 0.0;
        for (int64_t j = 0; j < len; ++j) {
          double& e = scores[i * len + j];
          e = std::isinf(e) ? 0.0 : std::exp(e - mx);
          sum += e;
        }
        for (int64_t j = 0; j < len; ++j) scores[i * len + j] /= sum;
        float* z = a.z + (t0 + i) * a.q_heads * dv + h * dv;
        for (int64_t p = 0; p < dv; ++p) {
          double acc = 0.0;
          for (int64_t j = 0; j <= i; ++j) {
            acc += scores[i * len + j] * a.v[(t0 + j) * a.v_rs + kvh * dv + p];
          }
          z[p] = static_cast<float>(acc);
        }
        if (a.probs != nullptr && s == a.probs_seq) {
          for (int64_t j = 0; j < len; ++j) {
            a.probs[(h * len + i) * len + j] =
                static_cast<float>(scores[i * len + j]);
          }
        }
      }
    }
  }
}

void KvAttention(const AttentionArgs& a) {
  const int64_t group = a.q_heads / a.kv_heads;
  const int64_t d = a.head_dim, kvd = a.kv_heads * a.head_dim;
  const int64_t dv = a.v_head_dim > 0 ? a.v_head_dim : d, kvv = a.kv_heads * dv;
  const int64_t cap = a.kv_capacity;
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const int64_t t0 = a.seq_start[s];
    const int64_t len = a.seq_start[s + 1] - t0;
    const int64_t p0 = a.q_pos0[s];
    // Cache row of position j of this sequence: its page's row when paged,
    // else row j % cap of the slot.
    auto cache_row = [&](int64_t j) -> int64_t {
      if (a.kv_page_size > 0)
        return int64_t{a.kv_page_table[s * a.kv_pages_per_seq +
                                       j / a.kv_page_size]} *
                   a.kv_page_size +
               j % a.kv_page_size;
      return a.kv_slot[s] * cap + j % cap;
    };
    // Key / value row of position j (kv head kvh) for this sequence.
    auto key = [&](int64_t j, int64_t kvh) {
      return j >= p0 ? a.k + (t0 + j - p0) * a.k_rs + kvh * d
                     : a.k_cache + cache_row(j) * kvd + kvh * d;
    };
    auto value = [&](int64_t j, int64_t kvh) {
      return j >= p0 ? a.v + (t0 + j - p0) * a.v_rs + kvh * dv
                     : a.v_cache + cache_row(j) * kvv + kvh * dv;
    };
    for (int64_t h = 0; h < a.q_heads; ++h) {
      const int64_t kvh = h / group;
      const bool has_sink = a.sinks != nullptr;
      const double sink = has_sink ? LoadAsF32(a.sinks, a.sinks_dtype, h) : 0.0;
      for (int64_t i = 0; i < len; ++i) {
        const int64_t p = p0 + i;
        const int64_t lo =
            a.window > 0 ? std::max<int64_t>(0, p - a.window + 1) : 0;
        const float* q = a.q + (t0 + i) * a.q_rs + h * d;
        std::vector<double> e(static_cast<size_t>(p + 1 - lo));
        double mx = has_sink ? sink : -std::numeric_limits<double>::infinity();
        for (int64_t j = lo; j <= p; ++j) {
          const float* k = key(j, kvh);
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c)
            dot += static_cast<double>(q[c]) * k[c];
          dot *= a.scale;
          if (a.alibi_slopes != nullptr)
            dot += static_cast<double>(a.alibi_slopes[h]) * j;
          if (a.softcap > 0.0f) dot = a.softcap * std::tanh(dot / a.softcap);
          e[static_cast<size_t>(j - lo)] = dot;
          mx = std::max(mx, dot);
        }
        double sum = has_sink ? std::exp(sink - mx) : 0.0;
        for (double& x : e) {
          x = std::exp(x - mx);
          sum += x;
        }
        float* z = a.z + (t0 + i) * a.q_heads * dv + h * dv;
        for (int64_t c = 0; c < dv; ++c) {
          double acc = 0.0;
          for (int64_t j = lo; j <= p; ++j)
            acc += e[static_cast<size_t>(j - lo)] / sum * value(j, kvh)[c];
          z[c] = static_cast<float>(acc);
        }
      }
    }
    for (int64_t i = 0; i < len; ++i) {
      const int64_t row = cache_row(p0 + i);
      std::memcpy(a.k_cache + row * kvd, a.k + (t0 + i) * a.k_rs,
                  sizeof(float) * kvd);
      std::memcpy(a.v_cache + row * kvv, a.v + (t0 + i) * a.v_rs,
                  sizeof(float) * kvv);
    }
  }
}

float ActivationScalar(Activation act, float xf) {
  const double x = xf;
  switch (act) {
    case Activation::kSilu:
      return static_cast<float>(x / (1.0 + std::exp(-x)));
    case Activation::kGeluTanh: {
      const double kSqrt2OverPi = 0.7978845608028654;
      // 0.5 x (1 + tanh(u)) written as x sigmoid(2u): the same function without
      // the cancellation of 1 + tanh(u) for x << 0.
      return static_cast<float>(
          x /
          (1.0 + std::exp(-2.0 * kSqrt2OverPi * (x + 0.044715 * x * x * x))));
    }
    // 0.5 x (1 + erf(x / sqrt 2)) == 0.5 x erfc(-x / sqrt 2), accurate for x <<
    // 0.
    case Activation::kGeluExact:
      return static_cast<float>(0.5 * x * std::erfc(-x / std::sqrt(2.0)));
    case Activation::kRelu:
      return xf > 0.0f ? xf : 0.0f;
    case Activation::kReluSquared: {
      const float r = xf > 0.0f ? xf : 0.0f;
      return r * r;
    }
  }
  return 0.0f;
}

void GatedActivation(Activation act, const float* gate, int64_t gate_rs,
                     const float* up, int64_t up_rs, float* out, int64_t rows,
                     int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      out[r * n + i] = static_cast<float>(
          static_cast<double>(ActivationScalar(act, gate[r * gate_rs + i])) *
          up[r * up_rs + i]);
    }
  }
}

void ApplyActivation(Activation act, float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = ActivationScalar(act, x[i]);
}

void Softcap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i)
    x[i] = static_cast<float>(cap * std::tanh(static_cast<double>(x[i]) / cap));
}

void Add(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void Scale(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void Gather(const void* table, DType table_dtype, const int32_t* ids,
            int64_t tokens, int64_t dim, float* out) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < dim; ++i)
      out[t * dim + i] = LoadAsF32(table, table_dtype, ids[t] * dim + i);
  }
}

void ConvertFromF32(const float* src, void* dst, DType dtype, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kF32:
        static_cast<float*>(dst)[i] = src[i];
        break;
      case DType::kBF16:
        static_cast<uint16_t*>(dst)[i] = F32ToBf16(src[i]);
        break;
      case DType::kF16:
        static_cast<uint16_t*>(dst)[i] = F32ToF16(src[i]);
        break;
      default:
        LOOM_CHECK(false) << "unsupported dtype";
    }
  }
}

void ConvertToF32(const void* src, DType dtype, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = LoadAsF32(src, dtype, i);
}

void LogSumExp(const float* logits, int64_t rows, int64_t vocab, double* lse) {
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < vocab; ++i)
      mx = std::max(mx, static_cast<double>(logits[r * vocab + i]));
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i)
      sum += std::exp(logits[r * vocab + i] - mx);
    lse[r] = mx + std::log(sum);
  }
}

void RmsNormBf16(const float* x, const void* w, float eps, float* y,
                 int64_t rows, int64_t dim) {
  RmsNorm(x, nullptr, DType::kBF16, 0.0f, eps, y, rows, dim);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < dim; ++i)
      y[r * dim + i] =
          RoundBf16(LoadAsF32(w, DType::kBF16, i) * RoundBf16(y[r * dim + i]));
}

void RmsNormRows(float* x, int64_t tokens, int64_t ld, int64_t groups,
                 int64_t dim, const void* w, DType w_dtype, float offset,
                 float eps) {
  for (int64_t t = 0; t < tokens; ++t)
    RmsNorm(x + t * ld, w, w_dtype, offset, eps, x + t * ld, groups, dim);
}

void LayerNormRows(float* x, int64_t tokens, int64_t ld, int64_t groups,
                   int64_t dim, const void* w, const void* b, DType w_dtype,
                   float eps) {
  for (int64_t t = 0; t < tokens; ++t)
    LayerNorm(x + t * ld, w, b, w_dtype, 0.0f, eps, x + t * ld, groups, dim);
}

void Clamp(float* x, int64_t rows, int64_t cols, int64_t ld, float lo,
           float hi) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      float& v = x[r * ld + j];
      if (v < lo) v = lo;
      if (v > hi) v = hi;
    }
}

void RoundToBf16(float* x, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) x[r * ld + j] = RoundBf16(x[r * ld + j]);
}

void DeinterleaveBlocks(const float* x, int64_t ldx, int64_t rows,
                        int64_t groups, int64_t parts, int64_t width, float* y,
                        int64_t ldy) {
  // Column j of y: part p = j / (groups * width), group g, offset i.
  const int64_t cols = groups * parts * width;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t p = j / (groups * width), g = (j / width) % groups,
                    i = j % width;
      y[r * ldy + j] = x[r * ldx + (g * parts + p) * width + i];
    }
}

void StridedCopy(const float* x, int64_t ldx, int64_t gsx, int64_t isx,
                 float* y, int64_t ldy, int64_t gsy, int64_t isy, int64_t rows,
                 int64_t groups, int64_t n) {
  for (int64_t e = 0; e < rows * groups * n; ++e) {
    const int64_t r = e / (groups * n), g = (e / n) % groups, i = e % n;
    y[r * ldy + g * gsy + i * isy] = x[r * ldx + g * gsx + i * isx];
  }
}

void GatherRows(const float* x, int64_t ldx, const int32_t* rows, int64_t n,
                int64_t cols, float* out) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = x[rows[i] * ldx + j];
}

void ScatterAddRows(const float* x, const int32_t* rows, const float* w,
                    int64_t n, int64_t cols, float* y, int64_t ldy) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < cols; ++j)
      y[rows[i] * ldy + j] += (w ? w[i] : 1.0f) * x[i * cols + j];
}

}  // namespace loom::cpu::ref
