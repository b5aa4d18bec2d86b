#include "src/backend/cpu/reference/reference_backward.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "src/backend/cpu/reference/reference_kernels.h"

namespace loom::cpu::ref {

void GemmBackwardInput(const float* w, int64_t n, int64_t k, const float* dy,
                       int64_t m, float* dx) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < k; ++c) {
      double acc = 0.0;
      for (int64_t j = 0; j < n; ++j)
        acc += static_cast<double>(dy[r * n + j]) * w[j * k + c];
      dx[r * k + c] = static_cast<float>(acc);
    }
}

void NormBackward(const float* x, const float* dy, float* dx, int64_t rows,
                  int64_t dim, const float* w, float offset, float eps,
                  bool layer_norm, bool freeze_scale) {
  const double D = static_cast<double>(dim);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    double mean = 0.0;
    if (layer_norm) {
      for (int64_t i = 0; i < dim; ++i) mean += xr[i];
      mean /= D;
    }
    double var = 0.0;
    for (int64_t i = 0; i < dim; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= D;
    const double s = 1.0 / std::sqrt(var + eps);
    for (int64_t j = 0; j < dim; ++j) {
      double acc = 0.0;
      for (int64_t i = 0; i < dim; ++i) {
        const double gain = (w == nullptr ? 1.0 : w[i]) + (w ? offset : 0.0);
        // d y_i / d x_j.
        double jac = ((i == j ? 1.0 : 0.0) - (layer_norm ? 1.0 / D : 0.0)) * s;
        if (!freeze_scale)
          jac -= (xr[i] - mean) * (xr[j] - mean) * s * s * s / D;
        acc += dy[r * dim + i] * gain * jac;
      }
      dx[r * dim + j] = static_cast<float>(acc);
    }
  }
}

void AttentionBackward(const AttentionArgs& a, const float* dz, float* dq,
                       float* dk, float* dv, bool freeze_pattern) {
  const int64_t group = a.q_heads / a.kv_heads, d = a.head_dim;
  const int64_t dvw = a.v_head_dim > 0 ? a.v_head_dim : d;
  const int64_t T = a.seq_start[a.num_seqs];
  std::vector<double> gq(T * a.q_heads * d, 0.0), gk(T * a.kv_heads * d, 0.0),
      gv(T * a.kv_heads * dvw, 0.0);
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const int64_t t0 = a.seq_start[s], len = a.seq_start[s + 1] - t0;
    for (int64_t h = 0; h < a.q_heads; ++h) {
      const int64_t g = h / group;
      const bool has_sink = a.sinks != nullptr;
      const double sink = has_sink ? LoadAsF32(a.sinks, a.sinks_dtype, h) : 0;
      std::vector<double> S(len * len, 0.0), P(len * len, 0.0),
          raw(len * len, 0.0);
      for (int64_t i = 0; i < len; ++i) {
        double mx = has_sink ? sink : -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          if (a.window > 0 && i - j >= a.window) continue;
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c)
            dot += static_cast<double>(a.q[(t0 + i) * a.q_rs + h * d + c]) *
                   a.k[(t0 + j) * a.k_rs + g * d + c];
          raw[i * len + j] = dot * a.scale;
          S[i * len + j] =
              a.softcap > 0 ? a.softcap * std::tanh(dot * a.scale / a.softcap)
                            : dot * a.scale;
          mx = std::max(mx, S[i * len + j]);
        }
        double sum = has_sink ? std::exp(sink - mx) : 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          if (a.window > 0 && i - j >= a.window) continue;
          P[i * len + j] = std::exp(S[i * len + j] - mx);
          sum += P[i * len + j];
        }
        for (int64_t j = 0; j <= i; ++j) P[i * len + j] /= sum;
      }
      for (int64_t i = 0; i < len; ++i) {
        const float* gz = dz + (t0 + i) * a.q_heads * dvw + h * dvw;
        std::vector<double> dP(len, 0.0);
        double Dsum = 0.0;
        for (int64_t j = 0; j < len; ++j) {
          for (int64_t c = 0; c < dvw; ++c) {
            dP[j] += gz[c] *
                     static_cast<double>(a.v[(t0 + j) * a.v_rs + g * dvw + c]);
            gv[((t0 + j) * a.kv_heads + g) * dvw + c] += P[i * len + j] * gz[c];
          }
          Dsum += P[i * len + j] * dP[j];
        }
        if (freeze_pattern) continue;
        for (int64_t j = 0; j < len; ++j) {
          if (P[i * len + j] == 0.0) continue;
          double ds = P[i * len + j] * (dP[j] - Dsum);
          if (a.softcap > 0) {
            const double t = std::tanh(raw[i * len + j] / a.softcap);
            ds *= 1.0 - t * t;
          }
          ds *= a.scale;
          for (int64_t c = 0; c < d; ++c) {
            gq[((t0 + i) * a.q_heads + h) * d + c] +=
                ds * a.k[(t0 + j) * a.k_rs + g * d + c];
            gk[((t0 + j) * a.kv_heads + g) * d + c] +=
                ds * a.q[(t0 + i) * a.q_rs + h * d + c];
          }
        }
      }
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < a.q_heads * d; ++c)
      dq[t * a.q_rs + c] = static_cast<float>(gq[t * a.q_heads * d + c]);
    for (int64_t c = 0; c < a.kv_heads * d; ++c)
      dk[t * a.k_rs + c] = static_cast<float>(gk[t * a.kv_heads * d + c]);
    for (int64_t c = 0; c < a.kv_heads * dvw; ++c)
      dv[t * a.v_rs + c] = static_cast<float>(gv[t * a.kv_heads * dvw + c]);
  }
}

namespace {
double Value(Activation act, double x) {
  switch (act) {
    case Activation::kSilu:
      return x / (1.0 + std::exp(-x));
    case Activation::kGeluTanh:
      return 0.5 * x *
             (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case Activation::kGeluExact:
      return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
    case Activation::kRelu:
      return x > 0 ? x : 0;
    case Activation::kReluSquared:
      return x > 0 ? x * x : 0;
  }
  return 0;
}
}  // namespace

void ClampedSwigluDerivatives(double gate, double up, double alpha,
                              double limit, double* d_gate, double* d_up) {
  auto f = [&](double gt, double u) {
    const double g = std::min(gt, limit);
    const double c = std::clamp(u, -limit, limit);
    return (c + 1.0) * g / (1.0 + std::exp(-alpha * g));
  };
  const double h = 1e-6;
  *d_gate = (f(gate + h, up) - f(gate - h, up)) / (2 * h);
  *d_up = (f(gate, up + h) - f(gate, up - h)) / (2 * h);
}

double ActivationDerivative(Activation act, double x) {
  const double h = 1e-5 * std::max(1.0, std::fabs(x));
  return (Value(act, x + h) - Value(act, x - h)) / (2 * h);
}

}  // namespace loom::cpu::ref
