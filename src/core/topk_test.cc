#include "src/core/topk.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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

}  // namespace
}  // namespace loom
