#include "src/core/topk.h"

#include <algorithm>
#include <numeric>

#include "src/base/check.h"

namespace loom {

void TopKDescending(const float* v, int64_t n, int64_t k, int32_t* indices,
                    float* values, std::vector<int32_t>* scratch) {
  LOOM_CHECK(k >= 0 && k <= n) << "k=" << k << " n=" << n;
  if (k == 0) return;
  if (k * 8 <= n) {
    // Few of many (a lens's top-10 of a vocabulary): one pass keeping the
    // k first so far in order, most candidates rejected by one comparison
    // with the k-th. The order is total, so the result is partial_sort's.
    int64_t have = 0;
    for (int32_t i = 0; i < n; ++i) {
      if (have == k && !RanksBefore(v, i, indices[k - 1])) continue;
      int64_t at = have < k ? have++ : k - 1;
      while (at > 0 && RanksBefore(v, i, indices[at - 1])) {
        indices[at] = indices[at - 1];
        --at;
      }
      indices[at] = i;
    }
    for (int64_t r = 0; r < k; ++r) values[r] = v[indices[r]];
    return;
  }
  std::vector<int32_t> own;
  std::vector<int32_t>& order = scratch ? *scratch : own;
  order.resize(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return RanksBefore(v, a, b); });
  for (int64_t i = 0; i < k; ++i) {
    indices[i] = order[static_cast<size_t>(i)];
    values[i] = v[order[static_cast<size_t>(i)]];
  }
}

}  // namespace loom
