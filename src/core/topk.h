// Ranking a row of scores: the order the top-k outputs use everywhere (SAE
// features, lens tokens). Descending; equal values by the lower index; NaN
// (a row that overflowed) after every number. A total order, as
// std::nth_element and std::partial_sort need, so a row's result depends on
// nothing but the row.
#ifndef LOOM_CORE_TOPK_H_
#define LOOM_CORE_TOPK_H_

#include <cmath>
#include <cstdint>
#include <vector>

namespace loom {

// Whether v[a] ranks before v[b].
inline bool RanksBefore(const float* v, int32_t a, int32_t b) {
  const bool na = std::isnan(v[a]), nb = std::isnan(v[b]);
  if (na != nb) return nb;
  return (!na && v[a] > v[b]) || ((na || v[a] == v[b]) && a < b);
}

// The `k` first of v [n] in that order: indices [k] and values [k]. A small
// k (8k <= n) is one pass that allocates nothing; otherwise `scratch` (n
// indices; null: allocated here) is reused from call to call.
void TopKDescending(const float* v, int64_t n, int64_t k, int32_t* indices,
                    float* values, std::vector<int32_t>* scratch = nullptr);

}  // namespace loom

#endif  // LOOM_CORE_TOPK_H_
