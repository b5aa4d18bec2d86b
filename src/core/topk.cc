#include "src/core/topk.h"

#include <algorithm>
#include <numeric>

#include "src/base/check.h"

namespace loom {

void TopKDescending(const float* v, int64_t n, int64_t k, int32_t* indices,
                    float* values, std::vector<int32_t>* scratch) {
  LOOM_CHECK(k >= 0 && k <= n) << "k=" << k << " n=" << n;
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
