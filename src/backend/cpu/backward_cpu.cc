#include "src/backend/cpu/backward_cpu.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "src/backend/cpu/quant_decode.h"
#include "src/base/float16.h"

namespace loom::cpu {
namespace {

constexpr int64_t kLanes = 16;  // columns of a panel or strip

float Load(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

// Element (r, c) of a dense or packed weight (not quantized).
float WeightAt(const WeightRows& w, int64_t r, int64_t c) {
  if (w.in_out) return Load(w.data, w.dtype, c * w.n + r);
  if (w.panels)
    return Load(w.data, w.dtype,
                (r / kLanes) * kLanes * w.k + c * kLanes + r % kLanes);
  if (w.strips)
    return Load(w.data, DType::kBF16,
                (r / kLanes) * kLanes * w.k + (c / 2) * 2 * kLanes +
                    (r % kLanes) * 2 + c % 2);
  return Load(w.data, w.dtype, r * w.k + c);
}

double Gain(const void* w, DType dtype, float offset, int64_t i) {
  return w == nullptr ? 1.0 : static_cast<double>(Load(w, dtype, i)) + offset;
}

}  // namespace

void DecodeWeightRows(const WeightRows& w, int64_t row0, int64_t rows,
                      float* out) {
  if (w.quant != nullptr) {
    DecodeRows(*w.quant, row0, rows, DType::kF32, out);
    return;
  }
  if (!w.in_out && !w.panels && !w.strips) {
    ConvertToF32(
        static_cast<const char*>(w.data) + row0 * w.k * DTypeSize(w.dtype),
        w.dtype, out, rows * w.k);
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < w.k; ++c)
      out[r * w.k + c] = WeightAt(w, row0 + r, c);
}

namespace {
int64_t Aligned(int64_t bytes) { return (bytes + 63) / 64 * 64; }
}  // namespace

int64_t GemmBackwardWorkspaceBytes(int64_t m, int64_t n, int64_t k) {
  const int64_t nb = std::min(kBackwardRowBlock, std::max<int64_t>(n, 1));
  // (+ 64: the start is aligned here, whatever the caller's alignment.)
  return 64 + Aligned(nb * k * 4) + Aligned(std::max<int64_t>(m, 1) * nb * 4) +
         GemmWorkspaceBytes(std::max<int64_t>(m, 1), nb, DType::kF32);
}

void GemmBackwardInput(GemmContext& ctx, const WeightRows& w, const float* dy,
                       int64_t ldy, int64_t m, float* dx, int64_t ldx,
                       bool accumulate, void* workspace) {
  const int64_t n = w.n, k = w.k;
  if (m <= 0) return;
  const int64_t nb_max = std::min(kBackwardRowBlock, n);
  char* ws = reinterpret_cast<char*>(
      (reinterpret_cast<uintptr_t>(workspace) + 63) / 64 * 64);
  float* block = reinterpret_cast<float*>(ws);  // [nb, k]
  float* cols =
      reinterpret_cast<float*>(ws + Aligned(nb_max * k * 4));  // [m, nb]
  void* gemm_ws = ws + Aligned(nb_max * k * 4) + Aligned(m * nb_max * 4);
  for (int64_t j0 = 0; j0 < n; j0 += kBackwardRowBlock) {
    const int64_t nb = std::min(kBackwardRowBlock, n - j0);
    DecodeWeightRows(w, j0, nb, block);
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(cols + r * nb, dy + r * ldy + j0, nb * 4);
    GemmArgs a;
    a.x = cols;
    a.w = block;
    a.w_dtype = DType::kF32;
    a.layout = WeightLayout::kInOut;  // [in = nb, out = k]
    a.y = dx;
    a.ldy = ldx;
    a.m = m;
    a.n = k;
    a.k = nb;
    a.accumulate = accumulate || j0 > 0;
    a.workspace = gemm_ws;
    ctx.Gemm(a);
  }
}

void NormBackward(const float* x, const float* dy, float* dx, int64_t rows,
                  int64_t dim, const void* w, DType w_dtype, float offset,
                  float eps, bool layer_norm, bool freeze_scale,
                  bool accumulate) {
#pragma omp parallel for schedule(static) if (rows * dim > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float* gr = dy + r * dim;
    float* out = dx + r * dim;
    double mean = 0.0;
    if (layer_norm) {
      for (int64_t i = 0; i < dim; ++i) mean += xr[i];
      mean /= static_cast<double>(dim);
    }
    double var = 0.0;
    for (int64_t i = 0; i < dim; ++i) {
      const double c = xr[i] - mean;
      var += c * c;
    }
    var /= static_cast<double>(dim);
    const double scale = 1.0 / std::sqrt(var + eps);
    // g = dy * gain; sums of g and of g * xhat.
    double sum_g = 0.0, sum_gx = 0.0;
    for (int64_t i = 0; i < dim; ++i) {
      const double g = gr[i] * Gain(w, w_dtype, offset, i);
      sum_g += g;
      sum_gx += g * (xr[i] - mean) * scale;
    }
    const double mg = layer_norm ? sum_g / dim : 0.0;
    const double mgx = freeze_scale ? 0.0 : sum_gx / dim;
    for (int64_t i = 0; i < dim; ++i) {
      const double g = gr[i] * Gain(w, w_dtype, offset, i);
      const double xhat = (xr[i] - mean) * scale;
      const float v = static_cast<float>(scale * (g - mg - xhat * mgx));
      out[i] = accumulate ? out[i] + v : v;
    }
  }
}

int64_t AttentionBackwardWorkspaceBytes(int64_t max_len, int num_threads) {
  return static_cast<int64_t>(num_threads) * 3 * std::max<int64_t>(max_len, 1) *
         static_cast<int64_t>(sizeof(float));
}

namespace {

// One (sequence, kv head) of AttentionBackward: the group's q heads, queries
// ascending, keys ascending. row: [3, len] scratch (scores, p, dp).
void AttentionBackwardGroup(const AttentionArgs& a, int64_t s, int64_t g,
                            const float* dz, float* dq, float* dk, float* dv,
                            bool freeze, float* row) {
  const int64_t group = a.q_heads / a.kv_heads, d = a.head_dim;
  const int64_t dvw = a.v_head_dim > 0 ? a.v_head_dim : d;
  const int64_t t0 = a.seq_start[s], len = a.seq_start[s + 1] - t0;
  float* sc = row;
  float* p = row + len;
  float* dp = row + 2 * len;
  for (int64_t j = 0; j < len; ++j) {
    std::memset(dk + (t0 + j) * a.k_rs + g * d, 0, d * 4);
    std::memset(dv + (t0 + j) * a.v_rs + g * dvw, 0, dvw * 4);
  }
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    const bool has_sink = a.sinks != nullptr;
    const float sink = has_sink ? Load(a.sinks, a.sinks_dtype, h) : 0.0f;
    for (int64_t i = 0; i < len; ++i) {
      const float* q = a.q + (t0 + i) * a.q_rs + h * d;
      const float* gz = dz + (t0 + i) * a.q_heads * dvw + h * dvw;
      const int64_t j0 =
          a.window > 0 ? std::max<int64_t>(0, i - a.window + 1) : 0;
      float mx = has_sink ? sink : -std::numeric_limits<float>::infinity();
      for (int64_t j = j0; j <= i; ++j) {
        const float* kr = a.k + (t0 + j) * a.k_rs + g * d;
        float dot = 0.0f;
        for (int64_t c = 0; c < d; ++c) dot += q[c] * kr[c];
        dot *= a.scale;
        if (a.softcap > 0.0f) dot = a.softcap * std::tanh(dot / a.softcap);
        sc[j] = dot;
        mx = std::max(mx, dot);
      }
      double sum = has_sink ? std::exp(static_cast<double>(sink) - mx) : 0.0;
      for (int64_t j = j0; j <= i; ++j) {
        p[j] = std::exp(sc[j] - mx);
        sum += p[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      double dsum = 0.0;
      for (int64_t j = j0; j <= i; ++j) {
        p[j] *= inv;
        const float* vr = a.v + (t0 + j) * a.v_rs + g * dvw;
        float* dvr = dv + (t0 + j) * a.v_rs + g * dvw;
        float acc = 0.0f;
        for (int64_t c = 0; c < dvw; ++c) {
          acc += gz[c] * vr[c];
          dvr[c] += p[j] * gz[c];
        }
        dp[j] = acc;
        dsum += static_cast<double>(p[j]) * acc;
      }
      float* dqr = dq + (t0 + i) * a.q_rs + h * d;
      if (freeze) {
        std::memset(dqr, 0, d * 4);
        continue;
      }
      std::memset(dqr, 0, d * 4);
      const float D = static_cast<float>(dsum);
      for (int64_t j = j0; j <= i; ++j) {
        float ds = p[j] * (dp[j] - D);
        if (a.softcap > 0.0f) {
          const float t = sc[j] / a.softcap;
          ds *= 1.0f - t * t;
        }
        ds *= a.scale;
        const float* kr = a.k + (t0 + j) * a.k_rs + g * d;
        float* dkr = dk + (t0 + j) * a.k_rs + g * d;
        for (int64_t c = 0; c < d; ++c) {
          dqr[c] += ds * kr[c];
          dkr[c] += ds * q[c];
        }
      }
    }
  }
}

}  // namespace

void AttentionBackward(const AttentionArgs& a, const float* dz, float* dq,
                       float* dk, float* dv, bool freeze_pattern,
                       void* workspace) {
  int64_t max_len = 1;
  for (int64_t s = 0; s < a.num_seqs; ++s)
    max_len = std::max(max_len, a.seq_start[s + 1] - a.seq_start[s]);
  const int64_t tasks = a.num_seqs * a.kv_heads;
  auto* ws = static_cast<float*>(workspace);
#pragma omp parallel
  {
    float* row = ws + static_cast<int64_t>(omp_get_thread_num()) * 3 * max_len;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t)
      AttentionBackwardGroup(a, t / a.kv_heads, t % a.kv_heads, dz, dq, dk, dv,
                             freeze_pattern, row);
  }
}

void ClampedSwigluBackward(const float* gate_up, int64_t gu_rs,
                           const float* dout, float* dgate_up, int64_t dgu_rs,
                           int64_t rows, int64_t n, float alpha, float limit) {
#pragma omp parallel for schedule(static) if (rows * n > 16384)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      const float gate = gate_up[r * gu_rs + 2 * i];
      const float up = gate_up[r * gu_rs + 2 * i + 1];
      const float d = dout[r * n + i];
      const float g = std::min(gate, limit);
      const float u = std::clamp(up, -limit, limit);
      const float s = 1.0f / (1.0f + std::exp(-alpha * g));
      // d/dg [g s(alpha g)] = s + alpha g s (1 - s).
      const float dglu = s + alpha * g * s * (1.0f - s);
      dgate_up[r * dgu_rs + 2 * i] = gate <= limit ? d * (u + 1.0f) * dglu : 0;
      dgate_up[r * dgu_rs + 2 * i + 1] =
          up >= -limit && up <= limit ? d * g * s : 0.0f;
    }
}

float ActivationValue(Activation act, float x) {
  switch (act) {
    case Activation::kSilu:
      return x / (1.0f + std::exp(-x));
    case Activation::kGeluTanh: {
      const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
      return x / (1.0f + std::exp(-2.0f * u));
    }
    case Activation::kGeluExact:
      return 0.5f * x * std::erfc(-x * 0.70710678118654752f);
    case Activation::kRelu:
      return x > 0.0f ? x : 0.0f;
    case Activation::kReluSquared:
      return x > 0.0f ? x * x : 0.0f;
  }
  return 0.0f;
}

float ActivationDerivative(Activation act, float x) {
  switch (act) {
    case Activation::kSilu: {
      const float s = 1.0f / (1.0f + std::exp(-x));
      return s * (1.0f + x * (1.0f - s));
    }
    case Activation::kGeluTanh: {
      // x sigmoid(2u): sigmoid(2u) + 2 x sigmoid(2u) (1 - sigmoid(2u)) u'.
      const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
      const float du = 0.7978845608028654f * (1.0f + 3 * 0.044715f * x * x);
      const float s = 1.0f / (1.0f + std::exp(-2.0f * u));
      return s + 2.0f * x * s * (1.0f - s) * du;
    }
    case Activation::kGeluExact: {
      const float cdf = 0.5f * std::erfc(-x * 0.70710678118654752f);
      const float pdf = 0.3989422804014327f * std::exp(-0.5f * x * x);
      return cdf + x * pdf;
    }
    case Activation::kRelu:
      return x > 0.0f ? 1.0f : 0.0f;
    case Activation::kReluSquared:
      return x > 0.0f ? 2.0f * x : 0.0f;
  }
  return 0.0f;
}

void ActivationBackward(Activation act, const float* x, const float* dy,
                        float* dx, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i)
    dx[i] = dy[i] * ActivationDerivative(act, x[i]);
}

void GatedActivationBackward(Activation act, const float* gate, int64_t gate_rs,
                             const float* up, int64_t up_rs, const float* dout,
                             float* dgate, int64_t dg_rs, float* dup,
                             int64_t du_rs, int64_t rows, int64_t n) {
#pragma omp parallel for schedule(static) if (rows * n > 65536)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      const float g = gate[r * gate_rs + i], u = up[r * up_rs + i];
      const float d = dout[r * n + i];
      // Both read before either is written (dgate/dup may alias gate/up).
      const float dg = d * u * ActivationDerivative(act, g);
      const float du = d * ActivationValue(act, g);
      dgate[r * dg_rs + i] = dg;
      dup[r * du_rs + i] = du;
    }
}

}  // namespace loom::cpu
