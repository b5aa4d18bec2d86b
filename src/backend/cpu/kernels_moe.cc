#include "src/backend/cpu/kernels_moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "src/base/check.h"

namespace loom::cpu {
namespace {

// Whether (v, j) comes after (pv, pj) in the selection order: descending
// value, ascending index on equal values.
inline bool After(float v, int64_t j, float pv, int64_t pj) {
  return v < pv || (v == pv && j > pj);
}

// The k best columns of s [cols] in selection order, into ids [k].
void SelectTopK(const float* s, int64_t cols, int64_t k, int32_t* ids) {
  float pv = 0.0f;
  int64_t pj = -1;
  for (int64_t slot = 0; slot < k; ++slot) {
    int64_t best = -1;
    for (int64_t j = 0; j < cols; ++j) {
      if (pj >= 0 && !After(s[j], j, pv, pj)) continue;
      if (best < 0 || s[j] > s[best]) best = j;
    }
    ids[slot] = static_cast<int32_t>(best);
    pv = s[best];
    pj = best;
  }
}

inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void TopKRoute(const float* logits, int64_t rows, int64_t cols, int64_t ld,
               int64_t k, TopKMode mode, bool renormalize, int32_t* ids,
               float* weights) {
  LOOM_CHECK(k > 0 && k <= cols && cols <= kMaxRouteColumns)
      << "k=" << k << " cols=" << cols;
#pragma omp parallel for schedule(static) if (rows * cols > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * ld;
    int32_t* id = ids + r * k;
    float* w = weights + r * k;
    if (mode == TopKMode::kSoftmaxThenTopK) {
      float p[kMaxRouteColumns];  // [cols] probabilities (checked above)
      float m = x[0];
      for (int64_t j = 1; j < cols; ++j) m = std::max(m, x[j]);
      float sum = 0.0f;
      for (int64_t j = 0; j < cols; ++j) {
        p[j] = std::exp(x[j] - m);
        sum += p[j];
      }
      for (int64_t j = 0; j < cols; ++j) p[j] /= sum;
      SelectTopK(p, cols, k, id);
      float ksum = 0.0f;
      for (int64_t i = 0; i < k; ++i) {
        w[i] = p[id[i]];
        ksum += w[i];
      }
      if (renormalize)
        for (int64_t i = 0; i < k; ++i) w[i] /= ksum;
    } else {
      SelectTopK(x, cols, k, id);
      const float m = x[id[0]];  // the largest
      float sum = 0.0f;
      for (int64_t i = 0; i < k; ++i) {
        w[i] = std::exp(x[id[i]] - m);
        sum += w[i];
      }
      for (int64_t i = 0; i < k; ++i) w[i] /= sum;
    }
  }
}

void SigmoidGroupTopKRoute(const float* logits, int64_t rows, int64_t cols,
                           int64_t ld, int64_t k, const float* bias,
                           int64_t groups, int64_t keep_groups,
                           bool renormalize, float scale, int32_t* ids,
                           float* weights) {
  LOOM_CHECK(groups > 0 && cols % groups == 0 && cols / groups >= 2 &&
             keep_groups > 0 && keep_groups <= groups && k > 0 && k <= cols &&
             cols <= kMaxRouteColumns)
      << "k=" << k << " cols=" << cols << " groups=" << groups
      << " keep_groups=" << keep_groups;
  const int64_t per = cols / groups;
#pragma omp parallel for schedule(static) if (rows * cols > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * ld;
    int32_t* id = ids + r * k;
    float* w = weights + r * k;
    float s[kMaxRouteColumns];  // [cols] sigmoid scores (checked above)
    float c[kMaxRouteColumns];  // [cols] choice values
    for (int64_t j = 0; j < cols; ++j) {
      s[j] = Sigmoid(x[j]);
      c[j] = bias != nullptr ? s[j] + bias[j] : s[j];
    }
    float gscore[kMaxRouteColumns];  // [groups] sum of the top-2 c
    for (int64_t g = 0; g < groups; ++g) {
      int32_t top2[2];
      SelectTopK(c + g * per, per, 2, top2);
      gscore[g] = c[g * per + top2[0]] + c[g * per + top2[1]];
    }
    int32_t kept[kMaxRouteColumns];  // [keep_groups] group ids
    SelectTopK(gscore, groups, keep_groups, kept);
    bool keep[kMaxRouteColumns] = {};  // [groups]
    for (int64_t i = 0; i < keep_groups; ++i) keep[kept[i]] = true;
    for (int64_t j = 0; j < cols; ++j)
      if (!keep[j / per]) c[j] = 0.0f;
    SelectTopK(c, cols, k, id);
    float sum = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      w[i] = s[id[i]];
      sum += w[i];
    }
    const float denom = sum + 1e-20f;
    for (int64_t i = 0; i < k; ++i)
      w[i] = (renormalize ? w[i] / denom : w[i]) * scale;
  }
}

void ClampedSwiglu(const float* gate_up, int64_t gu_rs, float* out,
                   int64_t rows, int64_t n, float alpha, float limit) {
#pragma omp parallel for schedule(static) if (rows * n > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    const float* gu = gate_up + r * gu_rs;
    float* o = out + r * n;
    for (int64_t i = 0; i < n; ++i) {
      const float g = std::min(gu[2 * i], limit);
      const float u = std::clamp(gu[2 * i + 1], -limit, limit);
      const float glu = g * Sigmoid(g * alpha);
      o[i] = (u + 1.0f) * glu;
    }
  }
}

void SigmoidGateAddRows(const float* x, const float* g, int64_t rows,
                        int64_t cols, float* y, int64_t ldy) {
#pragma omp parallel for schedule(static) if (rows * cols > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    const float s = Sigmoid(g[r]);
    for (int64_t j = 0; j < cols; ++j) y[r * ldy + j] += s * x[r * cols + j];
  }
}

void SetZero(float* x, int64_t n) {
  std::memset(x, 0, sizeof(float) * static_cast<size_t>(n));
}

int64_t GroupByExpert(const int32_t* ids, const float* w, int64_t tokens,
                      int64_t k, int64_t experts, int32_t* offsets,
                      int32_t* rows, float* row_w) {
  std::fill(offsets, offsets + experts + 1, 0);
  for (int64_t i = 0; i < tokens * k; ++i) {
    if (ids[i] < 0 || ids[i] >= experts) return i;
    ++offsets[ids[i] + 1];
  }
  for (int64_t e = 0; e < experts; ++e) offsets[e + 1] += offsets[e];
  // offsets[e] is the next free row of expert e while filling; shifted back
  // afterwards.
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t s = 0; s < k; ++s) {
      const int32_t r = offsets[ids[t * k + s]]++;
      rows[r] = static_cast<int32_t>(t);
      row_w[r] = w[t * k + s];
    }
  for (int64_t e = experts; e > 0; --e) offsets[e] = offsets[e - 1];
  offsets[0] = 0;
  return -1;
}

}  // namespace loom::cpu
