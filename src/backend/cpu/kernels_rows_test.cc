// The row-edit kernels (kernels_rows.h) against their scalar references (bit
// for bit: same roundings), against values worked out by hand, across thread
// counts (byte-identical), and the CPU backend's argument and index checks.
#include "src/backend/cpu/kernels_rows.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/backend/cpu/cpu_backend.h"
#include "src/backend/cpu/kernels.h"
#include "src/backend/cpu/reference/reference_rows.h"

namespace loom::cpu {
namespace {

std::vector<float> Random(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<float> Unit(int64_t n, unsigned seed) {
  std::vector<float> u = Random(n, seed);
  double s = 0;
  for (float x : u) s += double{x} * x;
  for (float& x : u) x = static_cast<float>(x / std::sqrt(s));
  return u;
}

bool SameBytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Shape {
  int64_t rows, cols, ld;
  std::vector<int32_t> idx;
};

std::vector<Shape> Shapes() {
  std::vector<int32_t> many;
  for (int32_t r = 1; r < 400; r += 2) many.push_back(r);
  return {{1, 1, 1, {0}},
          {5, 7, 9, {0, 2, 4}},
          {9, 64, 64, {8}},
          {9, 64, 70, {}},
          {400, 96, 100, many}};  // above the parallel threshold
}

TEST(RowKernels, AddRowsBroadcastMatchesReference) {
  for (const Shape& s : Shapes()) {
    SCOPED_TRACE(::testing::Message() << "rows " << s.rows << " cols " << s.cols
                                      << " n " << s.idx.size());
    std::vector<float> x = Random(s.rows * s.ld, 1), want = x;
    const std::vector<float> v = Random(s.cols, 2);
    const int64_t n = static_cast<int64_t>(s.idx.size());
    EXPECT_EQ(AddRowsBroadcast(x.data(), s.rows, s.cols, s.ld, s.idx.data(), n,
                               v.data(), 4.0f),
              -1);
    ref::AddRowsBroadcast(want.data(), s.ld, s.cols, s.idx.data(), n, v.data(),
                          4.0f);
    EXPECT_TRUE(SameBytes(x, want));
  }
}

TEST(RowKernels, AddRowsBroadcastNormMatchedMatchesReference) {
  for (const Shape& s : Shapes()) {
    SCOPED_TRACE(::testing::Message() << "rows " << s.rows << " cols " << s.cols
                                      << " n " << s.idx.size());
    std::vector<float> x = Random(s.rows * s.ld, 21), want = x;
    const std::vector<float> v = Random(s.cols, 22);
    const int64_t n = static_cast<int64_t>(s.idx.size());
    EXPECT_EQ(AddRowsBroadcast(x.data(), s.rows, s.cols, s.ld, s.idx.data(), n,
                               v.data(), 3.0f, /*norm_match=*/true),
              -1);
    ref::AddRowsBroadcast(want.data(), s.ld, s.cols, s.idx.data(), n, v.data(),
                          3.0f, /*norm_match=*/true);
    EXPECT_TRUE(SameBytes(x, want));
    // Each edited row keeps its norm (to f32 rounding) and changes direction.
    const std::vector<float> x0 = Random(s.rows * s.ld, 21);
    for (int32_t r : s.idx) {
      double n0 = 0, n1 = 0, dot = 0;
      for (int64_t j = 0; j < s.cols; ++j) {
        const double a = x0[r * s.ld + j], b = x[r * s.ld + j];
        n0 += a * a, n1 += b * b, dot += a * b;
      }
      EXPECT_NEAR(std::sqrt(n1), std::sqrt(n0), 1e-5 * std::sqrt(n0)) << r;
      if (s.cols > 1) {
        EXPECT_LT(dot, n0 * (1 - 1e-6)) << r;
      }
    }
  }
}

// Norm matching of a hand-computed row: (3, 4) + (0, 2)·1 = (3, 6), norm 5
// before, sqrt(45) after: (3, 6) · 5 / sqrt(45). A zero row stays zero.
TEST(RowKernels, NormMatchHandComputed) {
  std::vector<float> x = {3, 4, 0, 0};
  const float v[] = {0, 2}, minus[] = {0, 0};
  const int32_t idx[] = {0};
  ASSERT_EQ(AddRowsBroadcast(x.data(), 2, 2, 2, idx, 1, v, 1.0f, true), -1);
  const float f = static_cast<float>(5.0 / std::sqrt(45.0));
  EXPECT_EQ(x[0], 3.0f * f);
  EXPECT_EQ(x[1], 6.0f * f);
  const int32_t zero_row[] = {1};
  ASSERT_EQ(AddRowsBroadcast(x.data(), 2, 2, 2, zero_row, 1, minus, 1.0f, true),
            -1);
  EXPECT_EQ(x[2], 0.0f);
  EXPECT_EQ(x[3], 0.0f);
}

TEST(RowKernels, ProjectOutRowsMatchesReference) {
  for (const Shape& s : Shapes()) {
    SCOPED_TRACE(::testing::Message()
                 << "rows " << s.rows << " cols " << s.cols);
    std::vector<float> x = Random(s.rows * s.ld, 3), want = x;
    const std::vector<float> u = Unit(s.cols, 4);
    const int64_t n = static_cast<int64_t>(s.idx.size());
    EXPECT_EQ(ProjectOutRows(x.data(), s.rows, s.cols, s.ld, s.idx.data(), n,
                             u.data()),
              -1);
    ref::ProjectOutRows(want.data(), s.ld, s.cols, s.idx.data(), n, u.data());
    EXPECT_TRUE(SameBytes(x, want));
    // What is left of an edited row is orthogonal to u (up to rounding).
    for (int32_t r : s.idx) {
      double dot = 0, norm = 0;
      for (int64_t j = 0; j < s.cols; ++j) {
        dot += double{x[r * s.ld + j]} * u[j];
        norm += double{x[r * s.ld + j]} * x[r * s.ld + j];
      }
      EXPECT_LE(std::abs(dot), 1e-5 * (1 + std::sqrt(norm)));
    }
  }
}

TEST(RowKernels, SetRowsMatchesReferenceForBroadcastPerRowAndColumnRange) {
  for (const Shape& s : Shapes()) {
    const int64_t n = static_cast<int64_t>(s.idx.size());
    for (int64_t src_rows : {int64_t{1}, n}) {
      for (auto [cb, ce] : {std::pair<int64_t, int64_t>{0, s.cols},
                            {s.cols / 3, s.cols / 3 + s.cols / 2}}) {
        SCOPED_TRACE(::testing::Message()
                     << "rows " << s.rows << " src_rows " << src_rows
                     << " cols [" << cb << ", " << ce << ")");
        std::vector<float> x = Random(s.rows * s.ld, 5), want = x;
        const std::vector<float> src =
            Random((src_rows ? src_rows : 1) * (ce - cb), 6);
        EXPECT_EQ(SetRows(x.data(), s.rows, s.cols, s.ld, s.idx.data(), n, cb,
                          ce, src.data(), src_rows),
                  -1);
        ref::SetRows(want.data(), s.ld, s.idx.data(), n, cb, ce, src.data(),
                     src_rows);
        EXPECT_TRUE(SameBytes(x, want));
      }
    }
  }
}

TEST(RowKernels, CopyRowsMatchesReference) {
  for (const Shape& s : Shapes()) {
    SCOPED_TRACE(::testing::Message()
                 << "rows " << s.rows << " cols " << s.cols);
    const int64_t n = static_cast<int64_t>(s.idx.size());
    const int64_t src_rows = 11, ld_src = s.cols + 3;
    std::vector<int32_t> src_idx(s.idx.size());
    for (size_t i = 0; i < src_idx.size(); ++i)
      src_idx[i] = static_cast<int32_t>((7 * i + 3) % src_rows);  // repeats
    std::vector<float> x = Random(s.rows * s.ld, 7), want = x;
    const std::vector<float> src = Random(src_rows * ld_src, 8);
    EXPECT_EQ(CopyRows(x.data(), s.rows, s.cols, s.ld, s.idx.data(), n,
                       src.data(), src_rows, ld_src, src_idx.data()),
              -1);
    ref::CopyRows(want.data(), s.ld, s.cols, s.idx.data(), n, src.data(),
                  ld_src, src_idx.data());
    EXPECT_TRUE(SameBytes(x, want));
  }
}

// 3 rows of 4 (row stride 5; column 4 is padding that must stay put), rows 0
// and 2 edited, with values whose results are exact in f32.
TEST(RowKernels, HandComputedValues) {
  const std::vector<float> x0 = {1,  2, 3, 4, 99,  //
                                 5,  6, 7, 8, 99,  //
                                 -1, 0, 2, 4, 99};
  const int32_t idx[] = {0, 2};
  {
    std::vector<float> x = x0;
    const float v[] = {1, -1, 0.5f, 0};
    ASSERT_EQ(AddRowsBroadcast(x.data(), 3, 4, 5, idx, 2, v, 2.0f), -1);
    EXPECT_EQ(x, (std::vector<float>{3, 0, 4, 4, 99, 5, 6, 7, 8, 99,  //
                                     1, -2, 3, 4, 99}));
  }
  {
    std::vector<float> x = x0;
    const float u[] = {0, 0, 1, 0};  // removes column 2
    ASSERT_EQ(ProjectOutRows(x.data(), 3, 4, 5, idx, 2, u), -1);
    EXPECT_EQ(x, (std::vector<float>{1, 2, 0, 4, 99, 5, 6, 7, 8, 99,  //
                                     -1, 0, 0, 4, 99}));
    std::vector<float> y = x0;
    const float w[] = {0.6f, 0.8f, 0, 0};
    ASSERT_EQ(ProjectOutRows(y.data(), 3, 4, 5, idx + 1, 1, w), -1);
    // Row 2: d = -0.6; x - d w = (-1 + 0.36, 0.48, 2, 4).
    EXPECT_FLOAT_EQ(y[10], -0.64f);
    EXPECT_FLOAT_EQ(y[11], 0.48f);
    EXPECT_EQ(y[12], 2.0f);
  }
  {
    std::vector<float> x = x0;
    const float zero[] = {0, 0};
    ASSERT_EQ(SetRows(x.data(), 3, 4, 5, idx, 2, 2, 4, zero, 1), -1);  // head
    EXPECT_EQ(x, (std::vector<float>{1, 2, 0, 0, 99, 5, 6, 7, 8, 99,   //
                                     -1, 0, 0, 0, 99}));
    const float per_row[] = {10, 11, 12, 13, 20, 21, 22, 23};
    ASSERT_EQ(SetRows(x.data(), 3, 4, 5, idx, 2, 0, 4, per_row, 2), -1);
    EXPECT_EQ(x, (std::vector<float>{10, 11, 12, 13, 99, 5, 6, 7, 8, 99,  //
                                     20, 21, 22, 23, 99}));
  }
  {
    std::vector<float> x = x0;
    const float src[] = {7, 7, 7, 7, 0, 0, 0, 0};  // 2 rows, ld_src 4
    const int32_t src_idx[] = {1, 0};
    ASSERT_EQ(CopyRows(x.data(), 3, 4, 5, idx, 2, src, 2, 4, src_idx), -1);
    EXPECT_EQ(x, (std::vector<float>{0, 0, 0, 0, 99, 5, 6, 7, 8, 99,  //
                                     7, 7, 7, 7, 99}));
  }
}

// 1, 2 and 3 threads, as the GEMM thread test (more threads than the CI's
// two cores make the sanitizers' libomp report a leak of its own).
TEST(RowKernels, ByteIdenticalForAnyThreadCount) {
  const int64_t rows = 600, cols = 128, ld = 130;
  std::vector<int32_t> idx;
  for (int32_t r = 0; r < rows; r += 3) idx.push_back(r);
  const int64_t n = static_cast<int64_t>(idx.size());
  const std::vector<float> x0 = Random(rows * ld, 9), v = Random(cols, 10),
                           u = Unit(cols, 11), src = Random(rows * cols, 12);
  std::vector<int32_t> src_idx(idx.rbegin(), idx.rend());
  auto run_all = [&](int threads) {
    SetNumThreads(threads);
    std::vector<float> x = x0;
    EXPECT_EQ(AddRowsBroadcast(x.data(), rows, cols, ld, idx.data(), n,
                               v.data(), 0.37f),
              -1);
    EXPECT_EQ(AddRowsBroadcast(x.data(), rows, cols, ld, idx.data(), n,
                               v.data(), 1.5f, /*norm_match=*/true),
              -1);
    EXPECT_EQ(ProjectOutRows(x.data(), rows, cols, ld, idx.data(), n, u.data()),
              -1);
    EXPECT_EQ(SetRows(x.data(), rows, cols, ld, idx.data(), n / 2, 16, 48,
                      src.data(), n / 2),
              -1);
    EXPECT_EQ(CopyRows(x.data(), rows, cols, ld, idx.data() + n / 2, n - n / 2,
                       src.data(), rows, cols, src_idx.data()),
              -1);
    return x;
  };
  const int before = NumThreads();
  const std::vector<float> one = run_all(1);
  for (int t : {2, 3}) EXPECT_TRUE(SameBytes(run_all(t), one)) << t;
  SetNumThreads(before);
}

TEST(RowKernels, BadIndicesAreReportedBeforeAnyWrite) {
  std::vector<float> x = Random(4 * 3, 13);
  const std::vector<float> x0 = x, v = Random(3, 14);
  const int32_t out_of_range[] = {0, 4};
  const int32_t negative[] = {-1};
  const int32_t repeated[] = {1, 1};
  const int32_t decreasing[] = {2, 3, 0};
  EXPECT_EQ(AddRowsBroadcast(x.data(), 4, 3, 3, out_of_range, 2, v.data(), 1),
            1);
  EXPECT_EQ(ProjectOutRows(x.data(), 4, 3, 3, negative, 1, v.data()), 0);
  EXPECT_EQ(SetRows(x.data(), 4, 3, 3, repeated, 2, 0, 3, v.data(), 1), 1);
  EXPECT_EQ(
      CopyRows(x.data(), 4, 3, 3, decreasing, 3, v.data(), 1, 3, negative), 2);
  const int32_t dst[] = {0, 1}, bad_src[] = {0, 1};
  EXPECT_EQ(CopyRows(x.data(), 4, 3, 3, dst, 2, v.data(), 1, 3, bad_src), 3);
  EXPECT_TRUE(SameBytes(x, x0));
}

TEST(RowKernels, CpuBackendChecksArgumentsAndNamesTheBadIndex) {
  CpuBackend be;
  std::vector<float> x(4 * 3, 1.0f), v(3, 0.5f);
  const int32_t good[] = {0, 3}, bad[] = {0, 4}, dup[] = {2, 2};
  EXPECT_TRUE(
      be.AddRowsBroadcast(x.data(), 4, 3, 3, good, 2, v.data(), 2, false).ok());
  EXPECT_EQ(x[0], 2.0f);
  Status s = be.AddRowsBroadcast(x.data(), 4, 3, 3, bad, 2, v.data(), 2, false);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("idx[1] = 4 is outside [0, 4)"), std::string::npos)
      << s.message();
  s = be.ProjectOutRows(x.data(), 4, 3, 3, dup, 2, v.data());
  EXPECT_NE(s.message().find("strictly increasing"), std::string::npos)
      << s.message();
  s = be.SetRows(x.data(), 4, 3, 3, good, 2, 2, 4, v.data(), 1);
  EXPECT_NE(s.message().find("column range [2, 4)"), std::string::npos)
      << s.message();
  s = be.SetRows(x.data(), 4, 3, 3, good, 2, 0, 3, v.data(), 3);
  EXPECT_NE(s.message().find("src has 3 rows"), std::string::npos)
      << s.message();
  const int32_t src_bad[] = {0, 5};
  s = be.CopyRows(x.data(), 4, 3, 3, good, 2, v.data(), 1, 3, src_bad);
  EXPECT_NE(s.message().find("src_idx[1] = 5 is outside [0, 1)"),
            std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace loom::cpu
