#include "src/backend/cpu/reference/reference_moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace loom::cpu::ref {

void TopKRoute(const float* logits, int64_t rows, int64_t cols, int64_t ld,
               int64_t k, TopKMode mode, bool renormalize, int32_t* ids,
               float* weights) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * ld;
    std::vector<double> score(static_cast<size_t>(cols));
    double m = x[0], sum = 0;
    for (int64_t j = 0; j < cols; ++j) m = std::max(m, double{x[j]});
    for (int64_t j = 0; j < cols; ++j) sum += std::exp(x[j] - m);
    for (int64_t j = 0; j < cols; ++j)
      score[j] = mode == TopKMode::kSoftmaxThenTopK
                     ? static_cast<float>(std::exp(x[j] - m) / sum)
                     : double{x[j]};
    std::vector<int32_t> order(static_cast<size_t>(cols));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return score[a] > score[b]; });
    std::vector<double> w(static_cast<size_t>(k));
    double ksum = 0;
    for (int64_t i = 0; i < k; ++i) {
      ids[r * k + i] = order[i];
      w[i] = mode == TopKMode::kSoftmaxThenTopK
                 ? std::exp(x[order[i]] - m) / sum
                 : std::exp(double{x[order[i]]} - x[order[0]]);
      ksum += w[i];
    }
    const bool divide = mode == TopKMode::kTopKThenSoftmax || renormalize;
    for (int64_t i = 0; i < k; ++i)
      weights[r * k + i] = static_cast<float>(divide ? w[i] / ksum : w[i]);
  }
}

namespace {

// Indices [0, n) of v sorted by value descending, index ascending.
std::vector<int32_t> Ranked(const std::vector<float>& v) {
  std::vector<int32_t> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return v[a] > v[b]; });
  return order;
}

}  // namespace

void SigmoidGroupTopKRoute(const float* logits, int64_t rows, int64_t cols,
                           int64_t ld, int64_t k, const float* bias,
                           int64_t groups, int64_t keep_groups,
                           bool renormalize, float scale, int32_t* ids,
                           float* weights) {
  const int64_t per = cols / groups;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> s(static_cast<size_t>(cols)), c(s.size());
    for (int64_t j = 0; j < cols; ++j) {
      s[j] =
          static_cast<float>(1 / (1 + std::exp(-double{logits[r * ld + j]})));
      c[j] = s[j] + (bias != nullptr ? bias[j] : 0.0f);
    }
    std::vector<float> gscore(static_cast<size_t>(groups));
    for (int64_t g = 0; g < groups; ++g) {
      const std::vector<float> members(c.begin() + g * per,
                                       c.begin() + (g + 1) * per);
      const std::vector<int32_t> o = Ranked(members);
      gscore[g] = members[o[0]] + members[o[1]];
    }
    const std::vector<int32_t> gorder = Ranked(gscore);
    std::vector<bool> keep(static_cast<size_t>(groups), false);
    for (int64_t i = 0; i < keep_groups; ++i) keep[gorder[i]] = true;
    for (int64_t j = 0; j < cols; ++j)
      if (!keep[j / per]) c[j] = 0.0f;
    const std::vector<int32_t> order = Ranked(c);
    double sum = 0;
    for (int64_t i = 0; i < k; ++i) sum += s[order[i]];
    for (int64_t i = 0; i < k; ++i) {
      ids[r * k + i] = order[i];
      const double w = renormalize ? s[order[i]] / (sum + 1e-20) : s[order[i]];
      weights[r * k + i] = static_cast<float>(w * scale);
    }
  }
}

void ClampedSwiglu(const float* gate_up, int64_t gu_rs, float* out,
                   int64_t rows, int64_t n, float alpha, float limit) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      const double g =
          std::min(double{gate_up[r * gu_rs + 2 * i]}, double{limit});
      const double u = std::clamp(double{gate_up[r * gu_rs + 2 * i + 1]},
                                  -double{limit}, double{limit});
      out[r * n + i] =
          static_cast<float>((u + 1) * g / (1 + std::exp(-alpha * g)));
    }
}

void SigmoidGateAddRows(const float* x, const float* g, int64_t rows,
                        int64_t cols, float* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) {
    const double s = 1 / (1 + std::exp(-double{g[r]}));
    for (int64_t j = 0; j < cols; ++j)
      y[r * ldy + j] = static_cast<float>(y[r * ldy + j] + s * x[r * cols + j]);
  }
}

}  // namespace loom::cpu::ref
