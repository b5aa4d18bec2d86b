// The MoE kernels (kernels_moe.h) against their scalar references, with
// tolerances from the f32 unit roundoff u = 2^-24: a softmax over n values
// is within (n + 4) u relative (n rounded additions, one expf and one
// division per value), renormalising adds k + 1 u; the SwiGLU's terms carry
// one rounding each plus the rounding of alpha * g, which moves sigmoid by
// at most u |alpha g| relative.
#include "src/backend/cpu/kernels_moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "src/backend/cpu/reference/reference_moe.h"

namespace loom::cpu {
namespace {

constexpr double kU = 1.0 / (1 << 24);

// Distinct logits, at least 1e-2 apart (far above any rounding), shuffled.
std::vector<float> SeparatedLogits(int64_t rows, int64_t cols, int64_t ld,
                                   unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(static_cast<size_t>(rows * ld), 1e30f);
  std::vector<int> perm(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < cols; ++j)
      x[r * ld + j] = 0.0123f * static_cast<float>(perm[j] - cols / 2);
  }
  return x;
}

TEST(MoeKernels, TopKRouteMatchesReferenceInBothModes) {
  struct Case {
    int64_t rows, cols, ld, k;
  };
  for (const Case& c : {Case{1, 4, 4, 2}, Case{37, 8, 11, 2},
                        Case{300, 128, 130, 8}, Case{5, 32, 32, 4}}) {
    const std::vector<float> x = SeparatedLogits(c.rows, c.cols, c.ld, 7);
    for (TopKMode mode :
         {TopKMode::kSoftmaxThenTopK, TopKMode::kTopKThenSoftmax}) {
      for (bool renorm : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "rows " << c.rows << " cols " << c.cols << " k " << c.k
                     << " mode " << static_cast<int>(mode) << " renorm "
                     << renorm);
        std::vector<int32_t> ids(c.rows * c.k), ids_ref(c.rows * c.k);
        std::vector<float> w(c.rows * c.k), w_ref(c.rows * c.k);
        TopKRoute(x.data(), c.rows, c.cols, c.ld, c.k, mode, renorm, ids.data(),
                  w.data());
        ref::TopKRoute(x.data(), c.rows, c.cols, c.ld, c.k, mode, renorm,
                       ids_ref.data(), w_ref.data());
        EXPECT_EQ(ids, ids_ref);
        const int64_t n = mode == TopKMode::kSoftmaxThenTopK ? c.cols : c.k;
        const double rel = (n + 4 + (renorm ? c.k + 1 : 0)) * kU;
        for (size_t i = 0; i < w.size(); ++i)
          ASSERT_NEAR(w[i], w_ref[i], rel * std::abs(w_ref[i]) + 1e-30)
              << "weight " << i;
        // Slot order: descending weight within each row.
        for (int64_t r = 0; r < c.rows; ++r)
          for (int64_t i = 1; i < c.k; ++i)
            EXPECT_GE(w[r * c.k + i - 1], w[r * c.k + i]);
      }
    }
  }
}

TEST(MoeKernels, TopKRouteBreaksTiesTowardsTheLowerExpert) {
  // Row 0: all equal; row 1: experts 1 and 3 tie for the top, 0 and 2 tie
  // below them.
  const std::vector<float> x = {0.5f,  0.5f, 0.5f,  0.5f,
                                -1.0f, 2.0f, -1.0f, 2.0f};
  for (TopKMode mode :
       {TopKMode::kSoftmaxThenTopK, TopKMode::kTopKThenSoftmax}) {
    std::vector<int32_t> ids(6);
    std::vector<float> w(6);
    TopKRoute(x.data(), 2, 4, 4, 3, mode, true, ids.data(), w.data());
    EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2, 1, 3, 0}));
    // Equal scores, equal weights: exactly 1/3 after renormalisation of
    // three equal values (up to the rounding of the division).
    EXPECT_NEAR(w[0], 1.0 / 3, kU);
    EXPECT_EQ(w[0], w[1]);
    EXPECT_EQ(w[3], w[4]);
  }
}

TEST(MoeKernels, TopKRouteSoftmaxSumsToOneWhenRenormalised) {
  const int64_t rows = 64, cols = 16, k = 4;
  const std::vector<float> x = SeparatedLogits(rows, cols, cols, 11);
  std::vector<int32_t> ids(rows * k);
  std::vector<float> w(rows * k);
  for (TopKMode mode :
       {TopKMode::kSoftmaxThenTopK, TopKMode::kTopKThenSoftmax}) {
    TopKRoute(x.data(), rows, cols, cols, k, mode, true, ids.data(), w.data());
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t i = 0; i < k; ++i) s += w[r * k + i];
      EXPECT_NEAR(s, 1.0, (2 * k + 2) * kU);
    }
  }
}

TEST(MoeKernels, SigmoidGroupTopKRouteMatchesReference) {
  struct Case {
    int64_t rows, cols, ld, k, groups, keep;
  };
  // DeepSeek-V3's 256 experts in 8 groups keep 4, top 8; the tiny model's
  // 8 in 4 keep 2, top 3; a single group (plain sigmoid top-k).
  for (const Case& c : {Case{37, 8, 11, 3, 4, 2}, Case{300, 256, 259, 8, 8, 4},
                        Case{5, 64, 64, 6, 8, 3}, Case{9, 16, 16, 4, 1, 1}}) {
    const std::vector<float> x = SeparatedLogits(c.rows, c.cols, c.ld, 13);
    // Distinct small biases: the choice values stay far apart.
    const std::vector<float> b = SeparatedLogits(1, c.cols, c.cols, 17);
    std::vector<float> bias(b.begin(), b.begin() + c.cols);
    for (float& v : bias) v *= 0.031f;
    for (bool renorm : {false, true}) {
      for (float scale : {1.0f, 2.5f}) {
        SCOPED_TRACE(::testing::Message()
                     << "cols " << c.cols << " k " << c.k << " groups "
                     << c.groups << " keep " << c.keep << " renorm " << renorm
                     << " scale " << scale);
        std::vector<int32_t> ids(c.rows * c.k), ids_ref(c.rows * c.k);
        std::vector<float> w(c.rows * c.k), w_ref(c.rows * c.k);
        SigmoidGroupTopKRoute(x.data(), c.rows, c.cols, c.ld, c.k, bias.data(),
                              c.groups, c.keep, renorm, scale, ids.data(),
                              w.data());
        ref::SigmoidGroupTopKRoute(x.data(), c.rows, c.cols, c.ld, c.k,
                                   bias.data(), c.groups, c.keep, renorm, scale,
                                   ids_ref.data(), w_ref.data());
        EXPECT_EQ(ids, ids_ref);
        // sigmoid (expf + add + divide: 6 u), the sum of k, one division and
        // the scale.
        const double rel = (6 + 2 * c.k + 4) * kU;
        for (size_t i = 0; i < w.size(); ++i)
          ASSERT_NEAR(w[i], w_ref[i], rel * std::abs(w_ref[i]) + 1e-30)
              << "weight " << i;
      }
    }
  }
}

TEST(MoeKernels, SigmoidGroupTopKRouteMasksDroppedGroupsWithZero) {
  // s = 0.5 everywhere; c = [0.7, -0.4 | 0, 0]: group 0 scores 0.3 and is
  // kept, group 1 (0.0) is dropped and its c set to 0.0, which still beats
  // the kept expert 1's -0.4 (HF masks with 0.0, not -inf). The two masked
  // experts tie at 0.0: the lower goes first.
  const std::vector<float> x = {0.0f, 0.0f, 0.0f, 0.0f};
  const std::vector<float> bias = {0.2f, -0.9f, -0.5f, -0.5f};
  std::vector<int32_t> ids(3);
  std::vector<float> w(3);
  SigmoidGroupTopKRoute(x.data(), 1, 4, 4, 3, bias.data(), 2, 1, true, 2.5f,
                        ids.data(), w.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 2, 3}));
  // The weights are the unbiased s (all 0.5), renormalised, times 2.5.
  for (float v : w) EXPECT_NEAR(v, 2.5 / 3, 4 * kU);
}

TEST(MoeKernels, SigmoidGroupTopKRouteBreaksGroupTiesTowardsTheLowerGroup) {
  // Row 0: every choice value equal: group 0 is kept, then columns 0, 1.
  // Row 1: groups 1 and 2 tie above group 0: group 1 is kept. The weights
  // are s, not c: without renormalisation 0.5 each despite the bias.
  const std::vector<float> x(12, 0.0f);
  const std::vector<float> bias = {0.0f, 0.0f, 0.1f, 0.1f, 0.1f, 0.1f};
  std::vector<int32_t> ids(4);
  std::vector<float> w(4);
  SigmoidGroupTopKRoute(x.data(), 1, 6, 6, 2, nullptr, 3, 1, false, 1.0f,
                        ids.data(), w.data());
  SigmoidGroupTopKRoute(x.data() + 6, 1, 6, 6, 2, bias.data(), 3, 1, false,
                        1.0f, ids.data() + 2, w.data() + 2);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2, 3}));
  for (float v : w) EXPECT_EQ(v, 0.5f);
}

TEST(MoeKernels, ClampedSwigluMatchesReference) {
  const int64_t rows = 41, n = 37, ld = 2 * n + 3;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-12.0f, 12.0f);
  std::vector<float> gu(rows * ld);
  for (float& v : gu) v = d(rng);
  const float alpha = 1.702f, limit = 7.0f;
  std::vector<float> out(rows * n), want(rows * n);
  ClampedSwiglu(gu.data(), ld, out.data(), rows, n, alpha, limit);
  ref::ClampedSwiglu(gu.data(), ld, want.data(), rows, n, alpha, limit);
  int clamped = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      const double g = std::min(gu[r * ld + 2 * i], limit);
      clamped += gu[r * ld + 2 * i] > limit;
      const double tol =
          (10 + std::abs(alpha * g)) * kU * std::abs(want[r * n + i]) + 1e-30;
      ASSERT_NEAR(out[r * n + i], want[r * n + i], tol) << r << "," << i;
    }
  EXPECT_GT(clamped, 0) << "the inputs must exercise the clamp";
  // The clamp itself: gate 9 acts as 7, up -9 as -7.
  const float one[2] = {9.0f, -9.0f};
  float got = 0;
  ClampedSwiglu(one, 2, &got, 1, 1, alpha, limit);
  const double expect = (-7.0 + 1) * 7.0 / (1 + std::exp(-alpha * 7.0));
  EXPECT_NEAR(got, expect, 16 * kU * std::abs(expect));
}

TEST(MoeKernels, SigmoidGateAddRowsMatchesReference) {
  const int64_t rows = 29, cols = 45, ldy = 50;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  std::vector<float> x(rows * cols), g(rows), y(rows * ldy);
  for (float& v : x) v = d(rng);
  for (float& v : g) v = d(rng);
  for (float& v : y) v = d(rng);
  std::vector<float> y_ref = y;
  SigmoidGateAddRows(x.data(), g.data(), rows, cols, y.data(), ldy);
  ref::SigmoidGateAddRows(x.data(), g.data(), rows, cols, y_ref.data(), ldy);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < ldy; ++j) {
      const size_t i = static_cast<size_t>(r * ldy + j);
      const double tol =
          j < cols ? 6 * kU * (std::abs(y_ref[i]) + std::abs(x[r * cols + j]))
                   : 0.0;
      ASSERT_NEAR(y[i], y_ref[i], tol) << r << "," << j;
    }
  std::vector<float> z(77, 1.5f);
  SetZero(z.data(), 76);
  EXPECT_EQ(std::count(z.begin(), z.end(), 0.0f), 76);
  EXPECT_EQ(z[76], 1.5f);
}

}  // namespace
}  // namespace loom::cpu
