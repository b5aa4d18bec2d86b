#include "src/core/topk.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace loom {
namespace {

TEST(TopKTest, TiesGoToTheLowerIndexAndNaNLast) {
  const float v[] = {0, 3, 1, 3, 0, 2, 3, 0};
  int32_t idx[6];
  float val[6];
  TopKDescending(v, 8, 6, idx, val);
  EXPECT_EQ(std::vector<int32_t>(idx, idx + 6),
            (std::vector<int32_t>{1, 3, 6, 5, 2, 0}));
  EXPECT_EQ(std::vector<float>(val, val + 6),
            (std::vector<float>{3, 3, 3, 2, 1, 0}));
  // A NaN (an overflowed row) ranks after every number, even -inf.
  const float inf = std::numeric_limits<float>::infinity();
  const float w[] = {std::nanf(""), -inf, 1, std::nanf(""), 2};
  TopKDescending(w, 5, 5, idx, val);
  EXPECT_EQ(std::vector<int32_t>(idx, idx + 5),
            (std::vector<int32_t>{4, 2, 1, 0, 3}));
}

// The one-pass path (few of many) and partial_sort agree on every input,
// ties and NaNs included.
TEST(TopKTest, OnePassEqualsTheSort) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> small(0, 5);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = 40 + trial;
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) {
      const int r = small(rng);
      x = r == 5 ? std::nanf("") : static_cast<float>(r);  // many ties
    }
    for (int64_t k : {int64_t{1}, int64_t{3}, n / 8}) {
      std::vector<int32_t> fast(k), slow(n);
      std::vector<float> fv(k), sv(n);
      TopKDescending(v.data(), n, k, fast.data(), fv.data());
      TopKDescending(v.data(), n, n, slow.data(), sv.data());  // the sort
      for (int64_t i = 0; i < k; ++i) {
        ASSERT_EQ(fast[i], slow[i]) << "n " << n << " k " << k << " rank " << i;
        ASSERT_EQ(std::memcmp(&fv[i], &sv[i], 4), 0);
      }
    }
  }
}

}  // namespace
}  // namespace loom
