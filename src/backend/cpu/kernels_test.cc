// Every kernel of kernels.h against its scalar reference, on odd shapes.
//
// Tolerances are derived from the unit roundoff u = 2^-24 of f32 and the size
// of each reduction, never guessed: an f32 dot product of length k satisfies
// |err| <= k u sum|a_i b_i| (the classic gamma_k bound), and every other bound
// below is built from that and from the relative error of one rounded
// operation (u) or one vectorised transcendental (a few u).
#include "src/backend/cpu/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/backend/cpu/gemm_test_util.h"
#include "src/backend/cpu/isa.h"
#include "src/backend/cpu/reference/reference_kernels.h"
#include "src/base/float16.h"

namespace loom::cpu {
namespace {

constexpr double kU = 1.0 / (1 << 24);  // unit roundoff of f32

std::vector<float> Random(int64_t n, uint32_t seed, float lo = -1.0f,
                          float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Stores f32 values as `dtype` (returned as raw bytes).
std::vector<uint16_t> To16(const std::vector<float>& v, DType dtype) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = dtype == DType::kBF16 ? F32ToBf16(v[i]) : F32ToF16(v[i]);
  return out;
}

// Compares got against want element-wise with per-element tolerance tol[i];
// on failure reports the count, the worst violation and where it is.
void ExpectNear(const std::string& what, const float* got, const float* want,
                const std::vector<double>& tol, int64_t n) {
  int64_t bad = 0, worst = -1;
  double worst_ratio = 0.0, max_err = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    max_err = std::max(max_err, err);
    const bool ok = err <= tol[i] ||
                    (std::isnan(got[i]) && std::isnan(want[i])) ||
                    (std::isinf(got[i]) && got[i] == want[i]);
    if (!ok) {
      ++bad;
      const double ratio = tol[i] > 0 ? err / tol[i] : INFINITY;
      if (worst < 0 || ratio > worst_ratio) worst_ratio = ratio, worst = i;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << n
                    << " elements out of tolerance; max |err| " << max_err
                    << "; worst at index " << worst << ": got "
                    << (worst >= 0 ? got[worst] : 0.0f) << " want "
                    << (worst >= 0 ? want[worst] : 0.0f) << " tol "
                    << (worst >= 0 ? tol[worst] : 0.0) << " (err/tol "
                    << worst_ratio << ")";
}

void ExpectBitwise(const std::string& what, const void* got, const void* want,
                   int64_t bytes) {
  const auto* g = static_cast<const uint8_t*>(got);
  const auto* w = static_cast<const uint8_t*>(want);
  int64_t first = -1;
  for (int64_t i = 0; i < bytes && first < 0; ++i)
    if (g[i] != w[i]) first = i;
  EXPECT_EQ(first, -1) << what << ": first differing byte " << first;
}

// ---- GEMM
// ---------------------------------------------------------------------------

struct GemmCase {
  int64_t m;
  DType w_dtype;
};

class GemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmTest, MatchesReference) {
  const auto [m, w_dtype] = GetParam();
  GemmContext ctx;
  const int64_t shapes[][2] = {{19, 37}, {64, 200}, {257, 130}, {33, 2048}};
  uint32_t seed = 1;
  for (const auto& [n, k] : shapes) {
    for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
      for (int bias_kind = 0; bias_kind < 3;
           ++bias_kind) {  // none, f32, weight dtype
        for (bool accumulate : {false, true}) {
          for (int64_t ldy : {int64_t{0}, n + 5}) {
            const int64_t ld = ldy == 0 ? n : ldy;
            std::vector<float> x = Random(m * k, seed++);
            std::vector<float> wf = Random(n * k, seed++);
            std::vector<float> bf = Random(n, seed++);
            std::vector<float> y0 = Random(m * ld, seed++);
            std::vector<uint16_t> w16, b16;
            const void* w = wf.data();
            if (w_dtype != DType::kF32) {
              w16 = To16(wf, w_dtype);
              w = w16.data();
            }
            const void* bias = nullptr;
            DType bias_dtype = DType::kF32;
            if (bias_kind == 1) bias = bf.data();
            if (bias_kind == 2) {
              bias_dtype = w_dtype;
              if (w_dtype == DType::kF32) {
                bias = bf.data();
              } else {
                b16 = To16(bf, w_dtype);
                bias = b16.data();
              }
            }
            AlignedBuf ws(GemmWorkspaceBytes(m, k, w_dtype));
            GemmArgs a;
            a.x = x.data();
            a.w = w;
            a.w_dtype = w_dtype;
            a.layout = layout;
            a.bias = bias;
            a.bias_dtype = bias_dtype;
            a.ldy = ldy;
            a.m = m;
            a.n = n;
            a.k = k;
            a.accumulate = accumulate;
            a.workspace = ws.p;
            std::vector<float> got = y0, want = y0;
            a.y = got.data();
            ctx.Gemm(a);
            a.y = want.data();
            ref::Gemm(a);
            // Bound: k-term dot (products exact for 16-bit inputs, rounded once
            // for f32), plus the bias and accumulate additions.
            // |x| rounded as the GEMM rounds it, |w| as [n, k]: the sum of
            // |products| row by column (a plain loop: this bound is most of
            // the test's time under the sanitizers otherwise).
            std::vector<float> xa(m * k), wa(n * k);
            for (int64_t i = 0; i < m * k; ++i) {
              float xv = x[i];
              if (w_dtype == DType::kBF16) xv = RoundBf16(xv);
              if (w_dtype == DType::kF16) xv = F16ToF32(F32ToF16(xv));
              xa[i] = std::abs(xv);
            }
            for (int64_t j = 0; j < n; ++j)
              for (int64_t p = 0; p < k; ++p)
                wa[j * k + p] = std::abs(ref::LoadAsF32(
                    w, w_dtype,
                    layout == WeightLayout::kOutIn ? j * k + p : p * n + j));
            std::vector<double> tol(m * ld, 0.0);
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t j = 0; j < n; ++j) {
                double mag = 0.0;
                const float* xr = xa.data() + i * k;
                const float* wr = wa.data() + j * k;
                for (int64_t p = 0; p < k; ++p) mag += xr[p] * wr[p];
                if (bias != nullptr)
                  mag += std::abs(ref::LoadAsF32(bias, bias_dtype, j));
                if (accumulate) mag += std::abs(y0[i * ld + j]);
                tol[i * ld + j] = 2.0 * (k + 2) * kU * mag;
              }
            }
            ExpectNear(
                "gemm m=" + std::to_string(m) + " n=" + std::to_string(n) +
                    " k=" + std::to_string(k) +
                    " dtype=" + std::string(DTypeName(w_dtype)) +
                    " layout=" + std::to_string(static_cast<int>(layout)) +
                    " bias=" + std::to_string(bias_kind) + " acc=" +
                    std::to_string(accumulate) + " ldy=" + std::to_string(ldy),
                got.data(), want.data(), tol, m * ld);
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmTest,
    ::testing::Values(GemmCase{1, DType::kF32}, GemmCase{3, DType::kF32},
                      GemmCase{13, DType::kF32}, GemmCase{17, DType::kF32},
                      GemmCase{129, DType::kF32}, GemmCase{2, DType::kBF16},
                      GemmCase{33, DType::kBF16}, GemmCase{1, DType::kBF16},
                      GemmCase{3, DType::kBF16}, GemmCase{4, DType::kBF16},
                      GemmCase{5, DType::kBF16}, GemmCase{17, DType::kBF16},
                      GemmCase{129, DType::kBF16}, GemmCase{1, DType::kF16},
                      GemmCase{17, DType::kF16}, GemmCase{129, DType::kF16}),
    [](const ::testing::TestParamInfo<GemmCase>& info) {
      // "m17_BF16": the test name CTest shows.
      return "m" + std::to_string(info.param.m) + "_" +
             std::string(DTypeName(info.param.w_dtype));
    });

// bf16 GEMM against the exact f32 product: the only extra error is rounding
// each activation to bf16, at most 2^-8 relative per element.
TEST(GemmBf16, ActivationRoundingBound) {
  GemmContext ctx;
  const int64_t m = 17, n = 45, k = 333;
  std::vector<float> x = Random(m * k, 7), wf = Random(n * k, 8);
  // Weights exactly representable in bf16, so only x is rounded.
  for (auto& v : wf) v = RoundBf16(v);
  std::vector<uint16_t> w16 = To16(wf, DType::kBF16);
  AlignedBuf ws(GemmWorkspaceBytes(m, k, DType::kBF16));
  std::vector<float> got(m * n), want(m * n);
  GemmArgs a;
  a.x = x.data();
  a.w = w16.data();
  a.w_dtype = DType::kBF16;
  a.m = m;
  a.n = n;
  a.k = k;
  a.y = got.data();
  a.workspace = ws.p;
  ctx.Gemm(a);
  a.w = wf.data();
  a.w_dtype = DType::kF32;
  a.y = want.data();
  ref::Gemm(a);
  std::vector<double> tol(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double mag = 0.0;
      for (int64_t p = 0; p < k; ++p)
        mag += std::abs(x[i * k + p] * wf[j * k + p]);
      tol[i * n + j] = (std::ldexp(1.0, -8) + 2.0 * k * kU) * mag;
    }
  ExpectNear("bf16 vs exact", got.data(), want.data(), tol, m * n);
}

// reuse_x_workspace: a second GEMM on the same x skips the conversion and
// still matches a fresh computation bit for bit.
TEST(GemmReuse, SameXSecondWeight) {
  GemmContext ctx;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (int64_t m : {int64_t{2}, int64_t{40}}) {
      const int64_t n = 70, k = 96;
      std::vector<float> x = Random(m * k, 131), w1 = Random(n * k, 132),
                         w2 = Random(n * k, 133);
      std::vector<uint16_t> w1h = To16(w1, dt), w2h = To16(w2, dt);
      AlignedBuf ws(GemmWorkspaceBytes(m, k, dt));
      std::vector<float> y1(m * n), y2(m * n), fresh(m * n);
      GemmArgs a;
      a.x = x.data(), a.w_dtype = dt, a.m = m, a.n = n, a.k = k,
      a.workspace = ws.p;
      a.w = w1h.data(), a.y = y1.data();
      ctx.Gemm(a);
      a.w = w2h.data(), a.y = y2.data(), a.reuse_x_workspace = true;
      ctx.Gemm(a);
      a.y = fresh.data(), a.reuse_x_workspace = false;
      ctx.Gemm(a);
      ExpectBitwise("reuse m=" + std::to_string(m), y2.data(), fresh.data(),
                    m * n * 4);
    }
  }
}

// Every GEMM path gives the same bytes at 1, 2 and 3 threads: output tiles
// depend on the shape only and each is one thread's single-threaded
// primitive (f32; bf16 and f16, native or widened per panel; both layouts;
// bias and accumulate; several row and column tiles, ragged edges).
TEST(GemmThreads, BytesDoNotDependOnTheThreadCount) {
  const int before = NumThreads();
  const int64_t shapes[][3] = {{1, 300, 96}, {7, 1000, 200}, {600, 333, 70}};
  uint32_t seed = 77;
  for (const auto& [m, n, k] : shapes) {
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
        std::vector<float> x = Random(m * k, seed++),
                           wf = Random(n * k, seed++);
        std::vector<float> bf = Random(n, seed++), y0 = Random(m * n, seed++);
        std::vector<uint16_t> w16 =
            To16(wf, dt == DType::kF32 ? DType::kBF16 : dt);
        std::vector<float> first;
        for (int threads : {1, 2, 3}) {
          SetNumThreads(threads);
          GemmContext ctx;
          AlignedBuf ws(GemmWorkspaceBytes(m, k, dt));
          GemmArgs a;
          a.x = x.data();
          a.w = dt == DType::kF32 ? static_cast<const void*>(wf.data())
                                  : static_cast<const void*>(w16.data());
          a.w_dtype = dt;
          a.layout = layout;
          a.bias = bf.data();
          a.m = m;
          a.n = n;
          a.k = k;
          a.accumulate = true;
          a.workspace = ws.p;
          std::vector<float> y = y0;
          a.y = y.data();
          ctx.Gemm(a);
          if (threads == 1) {
            first = y;
          } else {
            EXPECT_EQ(0, std::memcmp(first.data(), y.data(), 4 * y.size()))
                << "m=" << m << " n=" << n << " k=" << k << " " << DTypeName(dt)
                << " layout=" << static_cast<int>(layout)
                << " threads=" << threads;
          }
        }
      }
    }
  }
  SetNumThreads(before);
}

// A group of GEMMs over row ranges of one x (experts: ragged row counts,
// two weights reading the same rows, one item past 512 rows, biases, both
// layouts) equals one Gemm per item byte for byte, at 1, 2 and 3 threads.
TEST(GemmGroup, EqualsOneGemmPerItemAtEveryThreadCount) {
  const int before = NumThreads();
  const int64_t k = 96, n = 130;
  const std::vector<int64_t> counts = {5, 9, 33, 0, 530, 1, 6, 17, 2};
  std::vector<int64_t> row0 = {0};
  for (int64_t c : counts) row0.push_back(row0.back() + c);
  const int64_t rows = row0.back();
  uint32_t seed = 901;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
      const std::vector<float> x = Random(rows * k, seed++);
      std::vector<std::vector<float>> wf;
      std::vector<std::vector<uint16_t>> w16;
      for (size_t e = 0; e < 2 * counts.size(); ++e) {
        wf.push_back(Random(n * k, seed++));
        w16.push_back(To16(wf.back(), dt == DType::kF32 ? DType::kBF16 : dt));
      }
      const std::vector<float> bias = Random(n, seed++);
      // Items: per row range, a "gate" into columns [0, n) and an "up" into
      // [n, 2n) of y [rows, 2n]; the gate of every other range has a bias.
      std::vector<GemmArgs> items;
      for (size_t e = 0; e < counts.size(); ++e) {
        if (counts[e] == 0) continue;
        for (int half = 0; half < 2; ++half) {
          GemmArgs a;
          a.x = x.data() + row0[e] * k;
          const size_t wi = 2 * e + half;
          a.w = dt == DType::kF32 ? static_cast<const void*>(wf[wi].data())
                                  : static_cast<const void*>(w16[wi].data());
          a.w_dtype = dt;
          a.layout = layout;
          a.bias = half == 0 && e % 2 == 0 ? bias.data() : nullptr;
          a.m = counts[e], a.n = n, a.k = k;
          a.ldy = 2 * n;
          a.y = reinterpret_cast<float*>(half * n * 4 + row0[e] * 2 * n * 4);
          items.push_back(a);
        }
      }
      std::vector<float> first;
      for (int threads : {1, 2, 3}) {
        SetNumThreads(threads);
        const auto [one, grouped] = OneByOneAndGrouped(items, x.data(), rows, k,
                                                       dt, rows * 2 * n, -1.0f);
        const std::string name = std::string(DTypeName(dt)) + " layout=" +
                                 std::to_string(static_cast<int>(layout)) +
                                 " threads=" + std::to_string(threads);
        EXPECT_EQ(0, std::memcmp(one.data(), grouped.data(), 4 * one.size()))
            << name;
        if (threads == 1)
          first = grouped;
        else
          EXPECT_EQ(0,
                    std::memcmp(first.data(), grouped.data(), 4 * first.size()))
              << name;
      }
    }
  }
  SetNumThreads(before);
}

// Every row of rows [off, off + M) of one input, for every M in 1..max_m
// (off varies, so a row sits at every position of the tiles), equals that
// row computed alone, byte for byte; a bias and accumulate, n and k off
// every panel and block width.
void ExpectBatchInvariant(DType dt, WeightLayout layout, int64_t max_m,
                          uint32_t seed) {
  const int64_t n = 70, k = 300, total = max_m + 50;
  const std::vector<float> x = Random(total * k, seed++);
  const std::vector<float> wf = Random(n * k, seed++);
  const std::vector<float> bias = Random(n, seed++);
  const std::vector<float> y0 = Random(total * n, seed++);
  const std::vector<uint16_t> w16 =
      To16(wf, dt == DType::kF32 ? DType::kBF16 : dt);
  GemmContext ctx;
  AlignedBuf ws(GemmWorkspaceBytes(total, k, dt));
  GemmArgs a;
  a.w = dt == DType::kF32 ? static_cast<const void*>(wf.data())
                          : static_cast<const void*>(w16.data());
  a.w_dtype = dt;
  a.layout = layout;
  a.bias = bias.data();
  a.n = n;
  a.k = k;
  a.accumulate = true;
  a.workspace = ws.p;
  std::vector<float> alone = y0;  // each row alone
  for (int64_t r = 0; r < total; ++r) {
    a.x = x.data() + r * k;
    a.m = 1;
    a.y = alone.data() + r * n;
    ctx.Gemm(a);
  }
  for (int64_t m = 1; m <= max_m; ++m) {
    const int64_t off = (m * 37) % (total - m + 1);
    std::vector<float> y(y0.begin() + off * n, y0.begin() + (off + m) * n);
    a.x = x.data() + off * k;
    a.m = m;
    a.y = y.data();
    ctx.Gemm(a);
    ASSERT_EQ(0, std::memcmp(y.data(), alone.data() + off * n, 4 * m * n))
        << DTypeName(dt) << " layout=" << static_cast<int>(layout) << " M=" << m
        << " rows from " << off << " (" << GemmPathName(dt) << ")";
  }
}

// Batch invariance: a row's output is the same bytes whatever else shares
// its GEMM, for every M in 1..600; f32, bf16 and f16, both layouts.
TEST(GemmBatchInvariance, EveryRowEqualsItselfAloneForMUpTo600) {
  uint32_t seed = 4242;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
      ExpectBatchInvariant(dt, layout, 600, seed);
      seed += 4;
    }
}

// The bf16 families this level runs, each forced in turn (the policy picks
// one; GemmFamilyOf): fma always, dot at avx512bf16 and above, amx at amx.
std::vector<GemmFamily> Bf16Families() {
  std::vector<GemmFamily> f = {GemmFamily::kFma};
  if (ActiveIsa() >= CpuIsa::kAvx512Bf16) f.push_back(GemmFamily::kDot);
  if (ActiveIsa() >= CpuIsa::kAmx) f.push_back(GemmFamily::kAmx);
  return f;
}
struct ForcedBf16Family {
  explicit ForcedBf16Family(GemmFamily f) { SetBf16GemmFamilyForTesting(f); }
  ~ForcedBf16Family() { SetBf16GemmFamilyForTesting(std::nullopt); }
};
const char* FamilyName(GemmFamily f) {
  return f == GemmFamily::kAmx ? "amx" : f == GemmFamily::kDot ? "dot" : "fma";
}

// Every bf16 family the level runs, not only the one the policy picks: the
// reference GEMM's bound (rows off every tile, k off every block, both
// layouts, bias and accumulate) and batch invariance for M up to 200.
TEST(GemmBf16Families, EachMatchesTheReferenceAndIsBatchInvariant) {
  for (GemmFamily f : Bf16Families()) {
    SCOPED_TRACE(FamilyName(f));
    ForcedBf16Family forced(f);
    ASSERT_EQ(GemmFamilyOf(DType::kBF16), f);
    uint32_t seed = 91;
    for (int64_t m : {1, 3, 13, 33, 70})
      for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
        const int64_t n = 45, k = 333;
        const std::vector<float> x = Random(m * k, seed++),
                                 wf = Random(n * k, seed++),
                                 bias = Random(n, seed++),
                                 y0 = Random(m * n, seed++);
        const std::vector<uint16_t> w16 = To16(wf, DType::kBF16);
        AlignedBuf ws(GemmWorkspaceBytes(m, k, DType::kBF16));
        GemmContext ctx;
        GemmArgs a;
        a.x = x.data(), a.w = w16.data(), a.w_dtype = DType::kBF16;
        a.layout = layout, a.bias = bias.data(), a.m = m, a.n = n, a.k = k;
        a.accumulate = true, a.workspace = ws.p;
        std::vector<float> got = y0, want = y0;
        a.y = got.data();
        ctx.Gemm(a);
        a.y = want.data();
        ref::Gemm(a);
        std::vector<double> tol(m * n);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double mag = std::abs(bias[j]) + std::abs(y0[i * n + j]);
            for (int64_t p = 0; p < k; ++p)
              mag += std::abs(
                  RoundBf16(x[i * k + p]) *
                  Bf16ToF32(w16[layout == WeightLayout::kOutIn ? j * k + p
                                                               : p * n + j]));
            tol[i * n + j] = 2.0 * (k + 2) * kU * mag;
          }
        ExpectNear(std::string(FamilyName(f)) + " m=" + std::to_string(m),
                   got.data(), want.data(), tol, m * n);
      }
    ExpectBatchInvariant(DType::kBF16, WeightLayout::kOutIn, 200, 555);
  }
}

void ExpectStripsGiveThePerCallBytes();

// A bf16 weight repacked in place into kStrips (the dot and amx families)
// multiplies to the bytes of the same weight packed per call, whole and as
// a slice of rows at a multiple of 16; the strip layout is the documented
// one (pair p of column c: (w[c, 2p], w[c, 2p + 1]), 16 columns a strip).
TEST(GemmStrips, RepackedWeightGivesThePerCallBytes) {
  if (ActiveIsa() < CpuIsa::kAvx512Bf16) {
    EXPECT_FALSE(StripsLayoutFits(16, 32, DType::kBF16));
    GTEST_SKIP() << "SKIPPED LOUDLY: no bf16 family of the "
                 << IsaName(ActiveIsa()) << " level reads strips";
  }
  for (GemmFamily f : Bf16Families()) {
    if (f == GemmFamily::kFma) continue;
    SCOPED_TRACE(FamilyName(f));
    ForcedBf16Family forced(f);
    ExpectStripsGiveThePerCallBytes();
  }
}

void ExpectStripsGiveThePerCallBytes() {
  EXPECT_FALSE(StripsLayoutFits(24, 32, DType::kBF16));
  EXPECT_FALSE(StripsLayoutFits(16, 40, DType::kBF16));
  EXPECT_FALSE(StripsLayoutFits(16, 32, DType::kF16));
  uint32_t seed = 611;
  for (const auto& [n, k] :
       {std::pair<int64_t, int64_t>{64, 96}, {96, 2048}, {48, 1024 + 64}}) {
    const std::vector<float> wf = Random(n * k, seed++);
    const std::vector<uint16_t> w16 = To16(wf, DType::kBF16);
    std::vector<uint16_t> strips(w16.size()), in_place = w16;
    PackWeightStrips(w16.data(), n, k, strips.data());
    PackWeightStrips(in_place.data(), n, k, in_place.data());
    ASSERT_EQ(strips, in_place);
    for (int64_t c = 0; c < n; c += 7)
      for (int64_t kk = 0; kk < k; kk += 5)
        ASSERT_EQ(
            strips[(c / 16) * 16 * k + (kk / 2) * 32 + (c % 16) * 2 + kk % 2],
            w16[c * k + kk])
            << "element (" << c << ", " << kk << ") of a [" << n << ", " << k
            << "] weight";
    for (int64_t m : {1, 5, 33, 200}) {
      const std::vector<float> x = Random(m * k, seed++);
      const std::vector<float> y0 = Random(m * n, seed++);
      AlignedBuf ws(GemmWorkspaceBytes(m, k, DType::kBF16));
      GemmContext ctx;
      GemmArgs a;
      a.x = x.data();
      a.w_dtype = DType::kBF16;
      a.m = m, a.n = n, a.k = k;
      a.accumulate = true;
      a.workspace = ws.p;
      std::vector<float> per_call = y0, packed = y0;
      a.w = w16.data();
      a.y = per_call.data();
      ctx.Gemm(a);
      a.w = strips.data();
      a.layout = WeightLayout::kStrips;
      a.y = packed.data();
      ctx.Gemm(a);
      ASSERT_EQ(0, std::memcmp(per_call.data(), packed.data(), 4 * m * n))
          << "m=" << m << " n=" << n << " k=" << k;
      // Rows [16, n) of the weight: a slice of the strips.
      std::vector<float> slice_call(m * (n - 16)), slice_packed(m * (n - 16));
      a.n = n - 16;
      a.accumulate = false;
      a.w = w16.data() + 16 * k;
      a.layout = WeightLayout::kOutIn;
      a.y = slice_call.data();
      ctx.Gemm(a);
      a.w = strips.data() + 16 * k;
      a.layout = WeightLayout::kStrips;
      a.y = slice_packed.data();
      ctx.Gemm(a);
      ASSERT_EQ(0, std::memcmp(slice_call.data(), slice_packed.data(),
                               4 * m * (n - 16)))
          << "slice m=" << m << " n=" << n << " k=" << k;
    }
  }
}

// A weight repacked in place into kPanels (the fma family: f32, bf16 and
// f16) multiplies to the bytes of the same weight packed per call, for few
// rows (16-bit panels read as they are) and more, whole and as a slice of
// rows at a multiple of 16, n off every tile width; the panel layout is the
// documented one (column c of panel c / 16, row k at k * 16 + c % 16).
TEST(GemmPanels, RepackedWeightGivesThePerCallBytes) {
  uint32_t seed = 711;
  int checked = 0;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    if (!PanelsLayoutFits(16, 32, dt)) {
      EXPECT_NE(GemmFamilyOf(dt), GemmFamily::kFma) << DTypeName(dt);
      continue;  // bf16 on the dot or amx family (GemmStrips)
    }
    EXPECT_FALSE(PanelsLayoutFits(24, 32, dt));
    for (const auto& [n, k] :
         {std::pair<int64_t, int64_t>{48, 96}, {160, 300}, {144, 1100}}) {
      const std::vector<float> wf = Random(n * k, seed++);
      std::vector<uint16_t> w16 =
          To16(wf, dt == DType::kF16 ? dt : DType::kBF16);
      const void* w = dt == DType::kF32 ? static_cast<const void*>(wf.data())
                                        : static_cast<const void*>(w16.data());
      const int64_t es = DTypeSize(dt);
      std::vector<char> panels(static_cast<size_t>(n * k * es)),
          in_place(static_cast<const char*>(w),
                   static_cast<const char*>(w) + n * k * es);
      PackWeightPanels(w, n, k, dt, panels.data());
      PackWeightPanels(in_place.data(), n, k, dt, in_place.data());
      ASSERT_EQ(panels, in_place);
      for (int64_t c = 0; c < n; c += 5)
        for (int64_t kk = 0; kk < k; kk += 7)
          ASSERT_EQ(0,
                    std::memcmp(panels.data() +
                                    ((c / 16) * 16 * k + kk * 16 + c % 16) * es,
                                static_cast<const char*>(w) + (c * k + kk) * es,
                                static_cast<size_t>(es)))
              << DTypeName(dt) << " element (" << c << ", " << kk << ")";
      for (int64_t m : {1, 3, 4, 5, 33, 200}) {
        const std::vector<float> x = Random(m * k, seed++);
        const std::vector<float> y0 = Random(m * n, seed++);
        AlignedBuf ws(GemmWorkspaceBytes(m, k, dt));
        GemmContext ctx;
        GemmArgs a;
        a.x = x.data();
        a.w_dtype = dt;
        a.m = m, a.n = n, a.k = k;
        a.accumulate = true;
        a.workspace = ws.p;
        std::vector<float> per_call = y0, packed = y0;
        a.w = w;
        a.y = per_call.data();
        ctx.Gemm(a);
        a.w = panels.data();
        a.layout = WeightLayout::kPanels;
        a.y = packed.data();
        ctx.Gemm(a);
        ASSERT_EQ(0, std::memcmp(per_call.data(), packed.data(), 4 * m * n))
            << DTypeName(dt) << " m=" << m << " n=" << n << " k=" << k;
        std::vector<float> slice_call(m * (n - 16)), slice_packed(m * (n - 16));
        a.n = n - 16;
        a.accumulate = false;
        a.w = static_cast<const char*>(w) + 16 * k * es;
        a.layout = WeightLayout::kOutIn;
        a.y = slice_call.data();
        ctx.Gemm(a);
        a.w = panels.data() + 16 * k * es;
        a.layout = WeightLayout::kPanels;
        a.y = slice_packed.data();
        ctx.Gemm(a);
        ASSERT_EQ(0, std::memcmp(slice_call.data(), slice_packed.data(),
                                 4 * m * (n - 16)))
            << DTypeName(dt) << " slice m=" << m << " n=" << n;
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 36) << "f32 and f16 always run the fma family";
}

// ---- Norms
// ---------------------------------------------------------------------------

TEST(Norms, RmsNorm) {
  for (int64_t rows : {int64_t{1}, int64_t{3}, int64_t{129}}) {
    for (int64_t dim :
         {int64_t{7}, int64_t{64}, int64_t{2048}, int64_t{2051}}) {
      for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
        for (float offset : {0.0f, 1.0f}) {
          for (bool has_w : {true, false}) {
            std::vector<float> x = Random(rows * dim, 21, -3.0f, 3.0f),
                               wf = Random(dim, 22);
            std::vector<uint16_t> w16 =
                To16(wf, dt == DType::kF32 ? DType::kBF16 : dt);
            const void* w =
                has_w ? (dt == DType::kF32 ? static_cast<const void*>(wf.data())
                                           : w16.data())
                      : nullptr;
            std::vector<float> got(rows * dim), want(rows * dim);
            RmsNorm(x.data(), w, dt, offset, 1e-6f, got.data(), rows, dim);
            ref::RmsNorm(x.data(), w, dt, offset, 1e-6f, want.data(), rows,
                         dim);
            // Sum of squares: <= dim u relative; rsqrt and two products: a few
            // u.
            std::vector<double> tol(rows * dim);
            for (int64_t i = 0; i < rows * dim; ++i)
              tol[i] = (0.5 * dim + 6.0) * kU * std::abs(want[i]) + 1e-30;
            ExpectNear("rmsnorm rows=" + std::to_string(rows) +
                           " dim=" + std::to_string(dim),
                       got.data(), want.data(), tol, rows * dim);
            // In place.
            std::vector<float> inplace = x;
            RmsNorm(inplace.data(), w, dt, offset, 1e-6f, inplace.data(), rows,
                    dim);
            ExpectBitwise("rmsnorm in place", inplace.data(), got.data(),
                          rows * dim * 4);
          }
        }
      }
    }
  }
}

TEST(Norms, LayerNorm) {
  for (int64_t rows : {int64_t{1}, int64_t{3}, int64_t{129}}) {
    for (int64_t dim : {int64_t{7}, int64_t{64}, int64_t{768}, int64_t{2051}}) {
      for (DType dt : {DType::kF32, DType::kBF16}) {
        for (bool affine : {true, false})
          for (float offset : {0.0f, 1.0f}) {
            // An offset mean makes the centring matter; offset 1 is
            // LayerNorm1P's (1 + w).
            std::vector<float> x = Random(rows * dim, 31, 1.0f, 4.0f),
                               wf = Random(dim, 32), bf = Random(dim, 33);
            std::vector<uint16_t> w16 = To16(wf, DType::kBF16),
                                  b16 = To16(bf, DType::kBF16);
            const void* w = affine ? (dt == DType::kF32
                                          ? static_cast<const void*>(wf.data())
                                          : w16.data())
                                   : nullptr;
            const void* b = affine ? (dt == DType::kF32
                                          ? static_cast<const void*>(bf.data())
                                          : b16.data())
                                   : nullptr;
            std::vector<float> got(rows * dim), want(rows * dim);
            LayerNorm(x.data(), w, b, dt, offset, 1e-5f, got.data(), rows, dim);
            ref::LayerNorm(x.data(), w, b, dt, offset, 1e-5f, want.data(), rows,
                           dim);
            std::vector<double> tol(rows * dim);
            for (int64_t r = 0; r < rows; ++r) {
              double mean = 0.0, var = 0.0;
              for (int64_t i = 0; i < dim; ++i) mean += x[r * dim + i];
              mean /= dim;
              for (int64_t i = 0; i < dim; ++i)
                var += (x[r * dim + i] - mean) * (x[r * dim + i] - mean);
              const double rstd = 1.0 / std::sqrt(var / dim + 1e-5);
              for (int64_t i = 0; i < dim; ++i) {
                const double wv =
                    w ? std::abs(ref::LoadAsF32(w, dt, i) + offset) : 1.0;
                const double bv = b ? std::abs(ref::LoadAsF32(b, dt, i)) : 0.0;
                // Mean error (dim u |x|) propagated through rstd*w, variance
                // error (dim u relative), and a few roundings of the output.
                const double centred =
                    std::abs(x[r * dim + i] - mean) * rstd * wv;
                tol[r * dim + i] = dim * kU * std::abs(mean) * rstd * wv +
                                   (0.5 * dim + 6.0) * kU * centred +
                                   2 * kU * bv;
              }
            }
            ExpectNear("layernorm rows=" + std::to_string(rows) +
                           " dim=" + std::to_string(dim) +
                           " offset=" + std::to_string(offset),
                       got.data(), want.data(), tol, rows * dim);
          }
      }
    }
  }
}

// ---- RoPE
// -------------------------------------------------------------------------------

TEST(Rope, TablesAndApply) {
  // 16 and 20: GPT-NeoX's and Phi's tiny head sizes (rotary halves of 4 and
  // 5 when partial: below one vector, odd).
  for (int64_t head_dim : {int64_t{8}, int64_t{16}, int64_t{20}, int64_t{64},
                           int64_t{80}, int64_t{128}}) {
    for (bool partial : {false, true}) {
      const int64_t half =
          partial ? head_dim / 4 : head_dim / 2;  // partial rotary (e.g. phi)
      const int64_t tokens = 37, heads = 3, rs = heads * head_dim + 5;
      std::vector<int32_t> pos(tokens);
      for (int64_t t = 0; t < tokens; ++t)
        pos[t] = static_cast<int32_t>(t * 113 % 4099);
      std::vector<float> inv_freq(half);
      for (int64_t i = 0; i < half; ++i)
        inv_freq[i] = static_cast<float>(
            1.0 / std::pow(10000.0, static_cast<double>(2 * i) / (2 * half)));
      const float scaling = 1.0f;
      std::vector<float> cg(tokens * half), sg(tokens * half),
          cw(tokens * half), sw(tokens * half);
      RopeTables(pos.data(), tokens, inv_freq.data(), half, scaling, cg.data(),
                 sg.data());
      ref::RopeTables(pos.data(), tokens, inv_freq.data(), half, scaling,
                      cw.data(), sw.data());
      // cos/sin of the same f32 angle: one rounding of the function (libm is
      // within 1 ulp) plus the scaling product.
      std::vector<double> tt(tokens * half);
      for (int64_t i = 0; i < tokens * half; ++i)
        tt[i] = 2 * kU * std::max(std::abs(cw[i]), 1e-30f);
      ExpectNear("rope cos", cg.data(), cw.data(), tt, tokens * half);
      for (int64_t i = 0; i < tokens * half; ++i)
        tt[i] = 2 * kU * std::max(std::abs(sw[i]), 1e-30f);
      ExpectNear("rope sin", sg.data(), sw.data(), tt, tokens * half);

      std::vector<float> x = Random(tokens * rs, 41), got = x, want = x;
      ApplyRope(got.data(), tokens, heads, head_dim, rs, cw.data(), sw.data(),
                half);
      ref::ApplyRope(want.data(), tokens, heads, head_dim, rs, cw.data(),
                     sw.data(), half);
      std::vector<double> tol(tokens * rs, 0.0);
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t i = 0; i < half; ++i) {
            const float* v = &x[t * rs + h * head_dim];
            const double c = std::abs(cw[t * half + i]),
                         s = std::abs(sw[t * half + i]);
            const double mag = std::abs(v[i]) * c + std::abs(v[i + half]) * s;
            const double mag2 = std::abs(v[i + half]) * c + std::abs(v[i]) * s;
            tol[t * rs + h * head_dim + i] = 3 * kU * mag;
            tol[t * rs + h * head_dim + i + half] = 3 * kU * mag2;
          }
      ExpectNear("rope apply head_dim=" + std::to_string(head_dim), got.data(),
                 want.data(), tol, tokens * rs);

      // Adjacent pairs (rotate_every_two): the same bound, pair-wise.
      std::vector<float> pgot = x, pwant = x;
      ApplyRopePairs(pgot.data(), tokens, heads, head_dim, rs, cw.data(),
                     sw.data(), half);
      ref::ApplyRopePairs(pwant.data(), tokens, heads, head_dim, rs, cw.data(),
                          sw.data(), half);
      std::vector<double> ptol(tokens * rs, 0.0);
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t i = 0; i < half; ++i) {
            const float* v = &x[t * rs + h * head_dim];
            const double c = std::abs(cw[t * half + i]),
                         s = std::abs(sw[t * half + i]);
            ptol[t * rs + h * head_dim + 2 * i] =
                3 * kU * (std::abs(v[2 * i]) * c + std::abs(v[2 * i + 1]) * s);
            ptol[t * rs + h * head_dim + 2 * i + 1] =
                3 * kU * (std::abs(v[2 * i + 1]) * c + std::abs(v[2 * i]) * s);
          }
      ExpectNear("rope pairs head_dim=" + std::to_string(head_dim), pgot.data(),
                 pwant.data(), ptol, tokens * rs);
      // Untouched past the rotated part and between heads.
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t j = heads * head_dim; j < rs; ++j)
          EXPECT_EQ(pgot[t * rs + j], x[t * rs + j]);
    }
  }
}

// ---- Attention
// --------------------------------------------------------------------------

struct AttnCase {
  int64_t head_dim, ratio, window;
  float softcap;
  bool sinks = false;  // bf16 per-head sink logits (gpt-oss)
  int64_t v_dim = 0;   // v / z head width, 0 = head_dim (MLA: narrower)
  bool alibi = false;  // BLOOM's per-head ALiBi slopes
};

// BLOOM's slopes for 6 heads (not a power of two): 2^-2, 2^-4, 2^-6, 2^-8,
// then 2^-1, 2^-3 (BloomModel's build_alibi_tensor), cycled to `heads`.
std::vector<float> AlibiSlopes(int64_t heads) {
  const float six[] = {0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f};
  std::vector<float> s;
  for (int64_t h = 0; h < heads; ++h) s.push_back(six[h % 6]);
  return s;
}

class AttentionTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionTest, MatchesReference) {
  const auto [d, ratio, window, softcap, sinks, v_dim, alibi] = GetParam();
  const int64_t dv = v_dim > 0 ? v_dim : d;
  const int64_t kv_heads = 2, q_heads = kv_heads * ratio;
  const std::vector<int64_t> lens = {1, 7, 33, 300};
  std::vector<int64_t> starts = {0};
  for (int64_t l : lens) starts.push_back(starts.back() + l);
  const int64_t T = starts.back();
  // q, k, v interleaved in one fused [T, (q_heads + kv_heads) d + kv_heads dv]
  // buffer, as a fused QKV projection would leave them.
  const int64_t rs = (q_heads + kv_heads) * d + kv_heads * dv;
  std::vector<float> qkv = Random(T * rs, 51, -2.0f, 2.0f);
  AttentionArgs a;
  a.q = qkv.data(), a.q_rs = rs;
  a.k = qkv.data() + q_heads * d, a.k_rs = rs;
  a.v = qkv.data() + (q_heads + kv_heads) * d, a.v_rs = rs;
  a.seq_start = starts.data();
  a.num_seqs = static_cast<int64_t>(lens.size());
  a.q_heads = q_heads, a.kv_heads = kv_heads, a.head_dim = d;
  a.v_head_dim = v_dim;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  a.softcap = softcap;
  a.window = window;
  // Sinks from -2 to 4: from a small share of each row to most of it.
  std::vector<uint16_t> sink_bf16;
  for (float x : Random(q_heads, 52, -2.0f, 4.0f))
    sink_bf16.push_back(F32ToBf16(x));
  if (sinks) {
    a.sinks = sink_bf16.data();
    a.sinks_dtype = DType::kBF16;
  }
  const std::vector<float> slopes = AlibiSlopes(q_heads);
  if (alibi) a.alibi_slopes = slopes.data();
  const int64_t probs_seq = 3, pl = lens[probs_seq];
  std::vector<float> got(T * q_heads * dv), want(T * q_heads * dv);
  std::vector<float> pgot(q_heads * pl * pl, -1.0f), pwant(q_heads * pl * pl);
  const int64_t ws_bytes =
      AttentionWorkspaceBytes(300, q_heads, std::max(d, dv), NumThreads());
  AlignedBuf ws(ws_bytes);
  a.workspace = ws.p;
  a.z = got.data();
  a.probs = pgot.data(), a.probs_seq = probs_seq;
  GemmContext ctx;
  Attention(ctx, a);
  a.z = want.data();
  a.probs = pwant.data();
  ref::Attention(a);

  // Bounds per query row: score error ds = d u scale sum|q k| (+ softcap's few
  // u of cap); a probability then has relative error <= 2 ds + (L + 8) u
  // (exp, max shift, f32 sum of L terms, normalisation); z sums L products.
  const int64_t group = q_heads / kv_heads;
  std::vector<double> tol(got.size()), ptol(pgot.size());
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const int64_t t0 = starts[s], len = lens[s];
    for (int64_t h = 0; h < q_heads; ++h) {
      const int64_t kvh = h / group;
      for (int64_t i = 0; i < len; ++i) {
        double ds = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          double mag = 0.0;
          for (int64_t p = 0; p < d; ++p)
            mag += std::abs(qkv[(t0 + i) * rs + h * d + p] *
                            qkv[(t0 + j) * rs + (q_heads + kvh) * d + p]);
          ds = std::max(ds, (d + 2) * kU * mag * a.scale);
        }
        if (softcap > 0) ds += 8 * kU * softcap;
        // ALiBi: the bias slope * j and its addition, each rounded once.
        if (alibi) ds += 4 * kU * slopes[h] * static_cast<double>(i);
        const double rel = 2 * ds + (len + 8) * kU;
        // Probability of key j for this query, from the reference.
        std::vector<double> pj(len, 0.0);
        if (s == probs_seq) {
          for (int64_t j = 0; j < len; ++j) {
            pj[j] = pwant[(h * len + i) * len + j];
            ptol[(h * len + i) * len + j] = 2 * rel * pj[j] + 1e-30;
          }
        }
        for (int64_t p = 0; p < dv; ++p) {
          // sum_j p_j |v_j| bounded by max |v_j| over the visible keys.
          double vmax = 0.0;
          for (int64_t j = 0; j <= i; ++j)
            vmax = std::max<double>(
                vmax, std::abs(qkv[(t0 + j) * rs + (q_heads + kv_heads) * d +
                                   kvh * dv + p]));
          tol[(t0 + i) * q_heads * dv + h * dv + p] = 2 * rel * vmax + 1e-30;
        }
      }
    }
  }
  const std::string name =
      "attention d=" + std::to_string(d) + " dv=" + std::to_string(dv) +
      " ratio=" + std::to_string(ratio) + " window=" + std::to_string(window) +
      " softcap=" + std::to_string(softcap) + (sinks ? " sinks" : "");
  ExpectNear(name + " z", got.data(), want.data(), tol,
             static_cast<int64_t>(got.size()));
  ExpectNear(name + " probs", pgot.data(), pwant.data(), ptol,
             static_cast<int64_t>(pgot.size()));

  // Deterministic, and independent of the number of threads.
  std::vector<float> again(got.size()), one_thread(got.size());
  a.probs = nullptr;
  a.z = again.data();
  Attention(ctx, a);
  ExpectBitwise(name + " repeat", again.data(), got.data(),
                static_cast<int64_t>(got.size()) * 4);
  a.z = one_thread.data();
  a.workspace_bytes = AttentionWorkspaceBytes(300, q_heads, std::max(d, dv), 1);
  Attention(ctx, a);
  ExpectBitwise(name + " one thread", one_thread.data(), got.data(),
                static_cast<int64_t>(got.size()) * 4);
}

std::vector<AttnCase> AttnCases() {
  std::vector<AttnCase> cases;
  for (int64_t d : {8, 16, 64, 128})
    for (int64_t ratio : {1, 2, 4})
      for (int64_t window : {0, 40})
        for (float cap : {0.0f, 30.0f})
          cases.push_back({d, ratio, window, cap});
  cases.push_back({64, 2, 5, 0.0f});    // window shorter than a block
  cases.push_back({64, 1, 64, 50.0f});  // window == block
  cases.push_back({80, 1, 0, 0.0f});    // head_dim not a multiple of 16
  // Attention sinks: global and sliding (window shorter than, equal to and
  // longer than a block), GQA, head dims with and without a tail.
  for (int64_t d : {16, 64, 80})
    for (int64_t window : {0, 8, 64, 128})
      cases.push_back({d, d == 64 ? 4 : 2, window, 0.0f, true});
  // v heads narrower (MLA: qk 48 = nope 32 + rope 16, v 32) and wider than
  // the q/k heads.
  cases.push_back({48, 1, 0, 0.0f, false, 32});
  cases.push_back({48, 2, 40, 0.0f, false, 32});
  cases.push_back({24, 2, 0, 30.0f, false, 40});
  // ALiBi (BLOOM): global, GQA, a tail head dim.
  for (int64_t d : {16, 64, 80})
    cases.push_back({d, d == 64 ? 3 : 1, 0, 0.0f, false, 0, true});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionTest, ::testing::ValuesIn(AttnCases()),
                         [](const ::testing::TestParamInfo<AttnCase>& info) {
                           // "d64_ratio2_window40_softcap30" (a fractional
                           // softcap: 2p5).
                           const AttnCase& c = info.param;
                           std::string cap = std::to_string(c.softcap);
                           cap.erase(cap.find_last_not_of('0') + 1);
                           if (cap.back() == '.') cap.pop_back();
                           for (char& ch : cap)
                             if (ch == '.') ch = 'p';
                           return "d" + std::to_string(c.head_dim) + "_ratio" +
                                  std::to_string(c.ratio) + "_window" +
                                  std::to_string(c.window) + "_softcap" + cap +
                                  (c.sinks ? "_sinks" : "") +
                                  (c.v_dim > 0 ? "_dv" + std::to_string(c.v_dim)
                                               : "") +
                                  (c.alibi ? "_alibi" : "");
                         });

// Attention over a KV cache, prefilled chunk by chunk (decode = chunks of
// one token), equals the one-pass attention over the whole sequences: the
// kernel runs the same tiles at the same positions, so bit for bit. Sliding
// windows use a ring of `window` positions (chunks longer than the ring
// included); the reference does the same in double.
// Chunked attention over a KV cache (page_size 0: the contiguous [slots,
// cap, kvd] layout; else a paged pool whose pages are handed to the two
// sequences in a scrambled order) against the one-pass kernel, bitwise.
void KvChunksEqualOnePass(int64_t d, int64_t ratio, int64_t window,
                          float softcap, bool sinks, int64_t v_dim,
                          int64_t page_size, bool alibi) {
  const int64_t dv = v_dim > 0 ? v_dim : d;
  const int64_t kv_heads = 2, q_heads = kv_heads * ratio, kvd = kv_heads * d,
                kvv = kv_heads * dv;
  // Two sequences in slots 2 and 0 of a 3-slot cache.
  const std::vector<int64_t> lens = {300, 45};
  const std::vector<int64_t> slots = {2, 0};
  const int64_t context = 320, num_slots = 3;
  const int64_t cap = window > 0 ? std::min(window, context) : context;
  std::vector<int64_t> starts = {0};
  for (int64_t l : lens) starts.push_back(starts.back() + l);
  const int64_t T = starts.back();
  const int64_t rs = (q_heads + kv_heads) * d + kvv;
  const std::vector<float> qkv = Random(T * rs, 61, -2.0f, 2.0f);
  std::vector<uint16_t> sink_bf16;
  for (float x : Random(q_heads, 62, -2.0f, 4.0f))
    sink_bf16.push_back(F32ToBf16(x));
  AttentionArgs a;
  a.q = qkv.data(), a.q_rs = rs;
  a.k = qkv.data() + q_heads * d, a.k_rs = rs;
  a.v = qkv.data() + (q_heads + kv_heads) * d, a.v_rs = rs;
  a.seq_start = starts.data();
  a.num_seqs = 2;
  a.q_heads = q_heads, a.kv_heads = kv_heads, a.head_dim = d;
  a.v_head_dim = v_dim;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  a.softcap = softcap;
  a.window = window;
  if (sinks) {
    a.sinks = sink_bf16.data();
    a.sinks_dtype = DType::kBF16;
  }
  const std::vector<float> slopes = AlibiSlopes(q_heads);
  if (alibi) a.alibi_slopes = slopes.data();
  AlignedBuf ws(KvAttentionWorkspaceBytes(context, q_heads, kv_heads, d, dv,
                                          NumThreads()));
  a.workspace = ws.p;
  const int64_t zw = q_heads * dv;  // z row
  std::vector<float> full(T * zw), full_ref(T * zw);
  GemmContext ctx;
  a.z = full.data();
  Attention(ctx, a);
  a.z = full_ref.data();
  ref::Attention(a);

  // Paged: a pool of pages (more than the two sequences need), assigned in
  // a scrambled order; table[slot] lists a slot's pages.
  const int64_t pages_per_seq =
      page_size > 0 ? (context + page_size - 1) / page_size : 0;
  const int64_t num_pages = 2 * pages_per_seq + 3;
  std::vector<std::vector<int32_t>> table(num_slots);
  if (page_size > 0) {
    std::vector<int32_t> perm(num_pages);
    for (int64_t i = 0; i < num_pages; ++i) perm[i] = static_cast<int32_t>(i);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(1234));
    for (size_t s = 0; s < slots.size(); ++s)
      table[slots[s]].assign(perm.begin() + s * pages_per_seq,
                             perm.begin() + (s + 1) * pages_per_seq);
  }
  // [slots, cap, kvd] caches of the kernel and of the reference (paged:
  // [num_pages, page_size, kvd]).
  const int64_t cache_rows =
      page_size > 0 ? num_pages * page_size : num_slots * cap;
  std::vector<float> kc(cache_rows * kvd), vc(cache_rows * kvv);
  std::vector<float> kc_ref(kc.size()), vc_ref(vc.size());
  std::vector<float> got(T * zw), got_ref(T * zw);
  // Chunk sizes, cycled per sequence until it is consumed.
  const std::vector<int64_t> chunks = {37, 1, 64, 100, 1, 1, 70};
  std::vector<int64_t> done = {0, 0};
  for (size_t step = 0; done[0] < lens[0] || done[1] < lens[1]; ++step) {
    // This step's new rows of each unfinished sequence, packed.
    std::vector<float> rows;            // [n, rs]
    std::vector<int64_t> sub = {0};     // [S + 1]
    std::vector<int64_t> sub_slot, p0;  // [S]
    std::vector<int64_t> src_row;       // first packed token of each
    for (int s = 0; s < 2; ++s) {
      if (done[s] >= lens[s]) continue;
      const int64_t n =
          std::min(chunks[(step + s) % chunks.size()], lens[s] - done[s]);
      rows.insert(rows.end(), qkv.begin() + (starts[s] + done[s]) * rs,
                  qkv.begin() + (starts[s] + done[s] + n) * rs);
      sub.push_back(sub.back() + n);
      sub_slot.push_back(slots[s]);
      p0.push_back(done[s]);
      src_row.push_back(starts[s] + done[s]);
      done[s] += n;
    }
    const int64_t n_rows = sub.back();
    std::vector<float> z(n_rows * zw), z_ref(z.size());
    AttentionArgs c = a;
    c.q = rows.data();
    c.k = rows.data() + q_heads * d;
    c.v = rows.data() + (q_heads + kv_heads) * d;
    c.seq_start = sub.data();
    c.num_seqs = static_cast<int64_t>(sub_slot.size());
    c.kv_capacity = cap;
    std::vector<int32_t> step_table;  // [S, pages_per_seq]
    if (page_size > 0) {
      for (int64_t slot : sub_slot)
        step_table.insert(step_table.end(), table[slot].begin(),
                          table[slot].end());
      c.kv_capacity = context;
      c.kv_page_table = step_table.data();
      c.kv_pages_per_seq = pages_per_seq;
      c.kv_page_size = page_size;
    }
    c.kv_slot = sub_slot.data();
    c.q_pos0 = p0.data();
    c.k_cache = kc.data(), c.v_cache = vc.data();
    c.z = z.data();
    Attention(ctx, c);
    c.k_cache = kc_ref.data(), c.v_cache = vc_ref.data();
    c.z = z_ref.data();
    ref::KvAttention(c);
    for (int64_t s = 0; s < c.num_seqs; ++s) {
      const int64_t n = sub[s + 1] - sub[s];
      std::copy(z.begin() + sub[s] * zw, z.begin() + sub[s + 1] * zw,
                got.begin() + src_row[s] * zw);
      std::copy(z_ref.begin() + sub[s] * zw, z_ref.begin() + (sub[s] + n) * zw,
                got_ref.begin() + src_row[s] * zw);
    }
  }
  const std::string name =
      "kv attention d=" + std::to_string(d) + " dv=" + std::to_string(dv) +
      " ratio=" + std::to_string(ratio) + " window=" + std::to_string(window) +
      " page_size=" + std::to_string(page_size);
  ExpectBitwise(name + " vs one pass", got.data(), full.data(),
                static_cast<int64_t>(got.size()) * 4);
  // The two double-precision references differ only in f64 round-off.
  std::vector<double> tol(got.size(), 1e-9);
  ExpectNear(name + " reference", got_ref.data(), full_ref.data(), tol,
             static_cast<int64_t>(got.size()));
}

TEST_P(AttentionTest, KvCacheChunksEqualOnePass) {
  const auto [d, ratio, window, softcap, sinks, v_dim, alibi] = GetParam();
  KvChunksEqualOnePass(d, ratio, window, softcap, sinks, v_dim,
                       /*page_size=*/0, alibi);
}

// A paged cache (pages in a scrambled order; page sizes that do and do not
// divide the chunks and blocks) gives the one-pass z bitwise too. Window
// cases run the paged layer with the window (the kernel's gather honours it)
// and, in the same steps, a ring cache is what KvCacheChunksEqualOnePass
// checks.
TEST_P(AttentionTest, PagedKvCacheChunksEqualOnePass) {
  const auto [d, ratio, window, softcap, sinks, v_dim, alibi] = GetParam();
  for (int64_t page_size : {1, 7, 16, 64})
    KvChunksEqualOnePass(d, ratio, window, softcap, sinks, v_dim, page_size,
                         alibi);
}

// Exact math: with q = 0 every visible score is 0, so each of the n visible
// keys of query i gets 1 / (n + exp(sink)) and z is the mean of their values
// times n / (n + exp(sink)). Checks that the sink joins the normalisation
// and that its column is dropped, on a sliding window across a block edge.
TEST(AttentionSinks, UniformScoresGiveTheSinkItsShare) {
  const int64_t d = 16, heads = 2, len = 70, window = 8;
  std::vector<float> q(len * heads * d, 0.0f);
  std::vector<float> k = Random(len * d, 53, -1.0f, 1.0f);
  std::vector<float> v = Random(len * d, 54, -1.0f, 1.0f);
  const std::vector<float> sinks = {0.0f, 2.5f};
  const std::vector<int64_t> starts = {0, len};
  std::vector<float> z(len * heads * d), probs(heads * len * len);
  AlignedBuf ws(AttentionWorkspaceBytes(len, heads, d, NumThreads()));
  AttentionArgs a;
  a.q = q.data(), a.q_rs = heads * d;
  a.k = k.data(), a.k_rs = d;
  a.v = v.data(), a.v_rs = d;
  a.z = z.data();
  a.seq_start = starts.data();
  a.num_seqs = 1;
  a.q_heads = heads, a.kv_heads = 1, a.head_dim = d;
  a.scale = 0.25f;
  a.window = window;
  a.sinks = sinks.data();
  a.probs = probs.data(), a.probs_seq = 0;
  a.workspace = ws.p;
  GemmContext ctx;
  Attention(ctx, a);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < len; ++i) {
      const int64_t n = std::min<int64_t>(i + 1, window);
      const double p = 1.0 / (static_cast<double>(n) + std::exp(sinks[h]));
      for (int64_t j = 0; j < len; ++j) {
        const bool visible = j <= i && i - j < window;
        EXPECT_NEAR(probs[(h * len + i) * len + j], visible ? p : 0.0,
                    (n + 8) * kU * p)
            << "h=" << h << " i=" << i << " j=" << j;
      }
      for (int64_t c = 0; c < d; ++c) {
        double want = 0.0;
        for (int64_t j = i - n + 1; j <= i; ++j) want += p * v[j * d + c];
        EXPECT_NEAR(z[i * heads * d + h * d + c], want, (n + 8) * kU)
            << "h=" << h << " i=" << i << " c=" << c;
      }
    }
  }
}

// ---- Elementwise
// -------------------------------------------------------------------------

double ActTol(Activation act, double x, double ref) {
  switch (act) {
    case Activation::kSilu:
      return (8.0 + 2.0 * std::abs(x)) * kU * std::abs(ref) + 1e-37;
    case Activation::kGeluTanh: {
      const double arg = 2.0 * 0.7978845608028654 * (x + 0.044715 * x * x * x);
      const double sig = 1.0 / (1.0 + std::exp(-arg));
      return (8.0 + 4.0 * std::abs(arg) * (1.0 - sig)) * kU * std::abs(ref) +
             1e-37;
    }
    case Activation::kGeluExact: {
      const double z = x / std::sqrt(2.0);
      return (16.0 + 4.0 * z * z) * kU * std::abs(ref) + 1e-37;
    }
    case Activation::kRelu:
      return 0.0;
    case Activation::kReluSquared:  // one rounded product
      return kU * std::abs(ref) + 1e-37;
  }
  return 0.0;
}

TEST(Elementwise, Activations) {
  for (Activation act :
       {Activation::kSilu, Activation::kGeluTanh, Activation::kGeluExact,
        Activation::kRelu, Activation::kReluSquared}) {
    for (int64_t n :
         {int64_t{1}, int64_t{17}, int64_t{1000}, int64_t{100003}}) {
      std::vector<float> x = Random(n, 61, -12.0f, 12.0f);
      if (n > 3) x[0] = 0.0f, x[1] = -30.0f, x[2] = 30.0f;
      std::vector<float> got = x, want = x;
      ApplyActivation(act, got.data(), n);
      ref::ApplyActivation(act, want.data(), n);
      std::vector<double> tol(n);
      for (int64_t i = 0; i < n; ++i) tol[i] = ActTol(act, x[i], want[i]);
      ExpectNear("act " + std::to_string(static_cast<int>(act)) +
                     " n=" + std::to_string(n),
                 got.data(), want.data(), tol, n);
    }
  }
}

TEST(Elementwise, GatedActivation) {
  for (Activation act :
       {Activation::kSilu, Activation::kGeluTanh, Activation::kGeluExact,
        Activation::kRelu, Activation::kReluSquared}) {
    for (int64_t rows : {int64_t{1}, int64_t{3}, int64_t{129}}) {
      const int64_t n = 181;
      // Fused [gate | up] rows.
      std::vector<float> gu = Random(rows * 2 * n, 71, -6.0f, 6.0f);
      std::vector<float> got(rows * n), want(rows * n);
      GatedActivation(act, gu.data(), 2 * n, gu.data() + n, 2 * n, got.data(),
                      rows, n);
      ref::GatedActivation(act, gu.data(), 2 * n, gu.data() + n, 2 * n,
                           want.data(), rows, n);
      std::vector<double> tol(rows * n);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < n; ++i) {
          const double g = gu[r * 2 * n + i], u = gu[r * 2 * n + n + i];
          const double av = ref::ActivationScalar(act, static_cast<float>(g));
          tol[r * n + i] = ActTol(act, g, av) * std::abs(u) +
                           kU * std::abs(want[r * n + i]) + 1e-37;
        }
      ExpectNear("gated act " + std::to_string(static_cast<int>(act)) +
                     " rows=" + std::to_string(rows),
                 got.data(), want.data(), tol, rows * n);
    }
  }
}

TEST(Elementwise, Softcap) {
  for (float cap : {30.0f, 50.0f}) {
    for (int64_t n : {int64_t{5}, int64_t{1000}, int64_t{70001}}) {
      std::vector<float> x = Random(n, 81, -200.0f, 200.0f);
      for (int64_t i = 0; i < std::min<int64_t>(n, 50); ++i)
        x[i] *= 1e-4f;  // tiny values: relative accuracy
      std::vector<float> got = x, want = x;
      Softcap(got.data(), n, cap);
      ref::Softcap(want.data(), n, cap);
      std::vector<double> tol(n);
      for (int64_t i = 0; i < n; ++i)
        tol[i] = 8 * kU * std::abs(want[i]) + 1e-37;
      ExpectNear("softcap", got.data(), want.data(), tol, n);
    }
  }
}

TEST(Elementwise, AddScaleExact) {
  for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{100001}}) {
    std::vector<float> x = Random(n, 91), y = Random(n, 92);
    std::vector<float> got = y, want = y;
    Add(x.data(), got.data(), n);
    ref::Add(x.data(), want.data(), n);
    ExpectBitwise("add", got.data(), want.data(), n * 4);
    got = x, want = x;
    Scale(got.data(), n, 0.3f);
    ref::Scale(want.data(), n, 0.3f);
    ExpectBitwise("scale", got.data(), want.data(), n * 4);
  }
}

TEST(Elementwise, ConvertExact) {
  for (int64_t n : {int64_t{1}, int64_t{33}, int64_t{100003}}) {
    std::vector<float> x = Random(n, 101, -70000.0f, 70000.0f);
    if (n > 8) {
      x[0] = NAN, x[1] = INFINITY, x[2] = -INFINITY, x[3] = 0.0f, x[4] = -0.0f;
      x[5] = 1e-40f;                             // denormal
      x[6] = std::bit_cast<float>(0x3f808000u);  // bf16 tie: rounds to even
      x[7] = std::bit_cast<float>(0x3f818000u);  // bf16 tie: rounds up to even
    }
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
      const int64_t es = DTypeSize(dt);
      std::vector<uint8_t> got(n * es), want(n * es);
      ConvertFromF32(x.data(), got.data(), dt, n);
      ref::ConvertFromF32(x.data(), want.data(), dt, n);
      // NaN payloads may differ; compare NaN-ness for those.
      for (int64_t i = 0; i < n; ++i) {
        const float g = ref::LoadAsF32(got.data(), dt, i),
                    w = ref::LoadAsF32(want.data(), dt, i);
        if (std::isnan(w)) {
          EXPECT_TRUE(std::isnan(g)) << "index " << i;
          std::memcpy(&got[i * es], &want[i * es], es);
        }
      }
      ExpectBitwise("from f32 " + std::string(DTypeName(dt)), got.data(),
                    want.data(), n * es);
      std::vector<float> back(n), back_ref(n);
      ConvertToF32(want.data(), dt, back.data(), n);
      ref::ConvertToF32(want.data(), dt, back_ref.data(), n);
      for (int64_t i = 0; i < n; ++i)
        if (std::isnan(back_ref[i]) && std::isnan(back[i]))
          back[i] = back_ref[i];
      ExpectBitwise("to f32 " + std::string(DTypeName(dt)), back.data(),
                    back_ref.data(), n * 4);
    }
  }
}

TEST(Elementwise, GatherExact) {
  const int64_t vocab = 50, dim = 70, tokens = 9;
  std::vector<float> tf = Random(vocab * dim, 111);
  std::vector<int32_t> ids = {0, 49, 3, 3, 17, 8, 0, 22, 41};
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<uint16_t> t16 = To16(tf, dt == DType::kF32 ? DType::kBF16 : dt);
    const void* table =
        dt == DType::kF32 ? static_cast<const void*>(tf.data()) : t16.data();
    std::vector<float> got(tokens * dim), want(tokens * dim);
    Gather(table, dt, ids.data(), tokens, dim, got.data());
    ref::Gather(table, dt, ids.data(), tokens, dim, want.data());
    ExpectBitwise("gather " + std::string(DTypeName(dt)), got.data(),
                  want.data(), tokens * dim * 4);
  }
}

// ---- Row operations
// -----------------------------------------------------------

TEST(RowOps, RmsNormBf16IsRmsNormThenTwoBf16Roundings) {
  for (int64_t rows : {int64_t{1}, int64_t{5}, int64_t{129}}) {
    for (int64_t dim : {int64_t{7}, int64_t{2051}}) {
      const std::vector<float> x = Random(rows * dim, 31, -3.0f, 3.0f);
      const std::vector<uint16_t> w = To16(Random(dim, 32), DType::kBF16);
      std::vector<float> got(rows * dim), composed(rows * dim),
          want(rows * dim);
      RmsNormBf16(x.data(), w.data(), 1e-6f, got.data(), rows, dim);
      // The definition with the optimised RMSNorm: bit-identical.
      RmsNorm(x.data(), nullptr, DType::kBF16, 0.0f, 1e-6f, composed.data(),
              rows, dim);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < dim; ++j)
          composed[r * dim + j] =
              RoundBf16(Bf16ToF32(w[j]) * RoundBf16(composed[r * dim + j]));
      ExpectBitwise("rmsnorm bf16 vs composition", got.data(), composed.data(),
                    rows * dim * 4);
      ref::RmsNormBf16(x.data(), w.data(), 1e-6f, want.data(), rows, dim);
      // The normalised value differs from the reference by the RMSNorm bound
      // ((dim/2 + 6) u); each of the two bf16 roundings can then move it by
      // one bf16 step (2^-8 relative) more than the reference's did.
      std::vector<double> tol(rows * dim);
      for (int64_t i = 0; i < rows * dim; ++i)
        tol[i] =
            (2.0 / 256 + (0.5 * dim + 6.0) * kU) * std::abs(want[i]) + 1e-30;
      ExpectNear("rmsnorm bf16 rows=" + std::to_string(rows), got.data(),
                 want.data(), tol, rows * dim);
    }
  }
}

TEST(RowOps, LayerNormRowsIsPerTokenLayerNorm) {
  const int64_t tokens = 37, heads = 4, hd = 16, ld = heads * hd + 24;
  for (int64_t groups : {heads, int64_t{1}})
    for (bool bias : {true, false}) {
      const int64_t dim = heads * hd / groups;
      const std::vector<float> x = Random(tokens * ld, 35, -2.0f, 3.0f),
                               w = Random(dim, 36), b = Random(dim, 37);
      const float* bp = bias ? b.data() : nullptr;
      std::vector<float> got = x, per_token = x, want = x;
      LayerNormRows(got.data(), tokens, ld, groups, dim, w.data(), bp,
                    DType::kF32, 1e-5f);
      for (int64_t t = 0; t < tokens; ++t)
        LayerNorm(per_token.data() + t * ld, w.data(), bp, DType::kF32, 0.0f,
                  1e-5f, per_token.data() + t * ld, groups, dim);
      ExpectBitwise("layernorm rows", got.data(), per_token.data(),
                    tokens * ld * 4);
      ref::LayerNormRows(want.data(), tokens, ld, groups, dim, w.data(), bp,
                         DType::kF32, 1e-5f);
      std::vector<double> tol(tokens * ld);
      for (int64_t i = 0; i < tokens * ld; ++i)
        tol[i] = (dim + 8.0) * kU * (std::abs(want[i]) + 4.0) + 1e-30;
      ExpectNear("layernorm rows vs reference", got.data(), want.data(), tol,
                 tokens * ld);
    }
}

TEST(RowOps, RmsNormRowsIsPerTokenRmsNorm) {
  const int64_t tokens = 37, heads = 4, hd = 16, ld = heads * hd + 24;
  for (int64_t groups : {heads, int64_t{1}}) {
    const int64_t dim = heads * hd / groups;
    const std::vector<float> x = Random(tokens * ld, 33, -2.0f, 2.0f);
    const std::vector<uint16_t> w = To16(Random(dim, 34), DType::kBF16);
    std::vector<float> got = x, per_token = x, want = x;
    // Gemma 3's (1 + w) q/k norms on the per-head groups.
    const float offset = groups == heads ? 1.0f : 0.0f;
    RmsNormRows(got.data(), tokens, ld, groups, dim, w.data(), DType::kBF16,
                offset, 1e-6f);
    for (int64_t t = 0; t < tokens; ++t)
      RmsNorm(per_token.data() + t * ld, w.data(), DType::kBF16, offset, 1e-6f,
              per_token.data() + t * ld, groups, dim);
    ExpectBitwise("rmsnorm rows", got.data(), per_token.data(),
                  tokens * ld * 4);
    ref::RmsNormRows(want.data(), tokens, ld, groups, dim, w.data(),
                     DType::kBF16, offset, 1e-6f);
    std::vector<double> tol(tokens * ld);
    for (int64_t i = 0; i < tokens * ld; ++i)
      tol[i] = (0.5 * dim + 6.0) * kU * std::abs(want[i]) + 1e-30;
    ExpectNear("rmsnorm rows vs reference", got.data(), want.data(), tol,
               tokens * ld);
  }
}

TEST(RowOps, ClampAndRoundExact) {
  const int64_t rows = 300, cols = 70, ld = 81;  // > 16384 values: threaded
  std::vector<float> x = Random(rows * ld, 35, -4.0f, 4.0f);
  std::vector<float> got = x, want = x;
  Clamp(got.data(), rows, cols, ld, -1.5f, 2.0f);
  ref::Clamp(want.data(), rows, cols, ld, -1.5f, 2.0f);
  ExpectBitwise("clamp", got.data(), want.data(), rows * ld * 4);
  EXPECT_EQ(got[cols], x[cols]);  // the padding between rows is untouched
  got = x;
  want = x;
  RoundToBf16(got.data(), rows, cols, ld);
  ref::RoundToBf16(want.data(), rows, cols, ld);
  ExpectBitwise("round bf16", got.data(), want.data(), rows * ld * 4);
  EXPECT_EQ(got[cols], x[cols]);
  EXPECT_EQ(got[0], RoundBf16(x[0]));
}

// Per-head interleaved parts (groups x parts blocks of width) regrouped part
// by part: bit-identical to the reference, the right source block at a
// hand-computed spot, and the padding of both strides untouched.
TEST(RowOps, DeinterleaveBlocksExact) {
  struct Case {
    int64_t rows, groups, parts, width;
  };
  for (const Case c : {Case{1, 1, 1, 1}, Case{7, 4, 3, 16}, Case{9, 4, 3, 20},
                       Case{130, 8, 3, 32}}) {  // the last one threaded
    const int64_t cols = c.groups * c.parts * c.width, ldx = cols + 3,
                  ldy = cols + 5;
    const std::vector<float> x = Random(c.rows * ldx, 37);
    std::vector<float> got(c.rows * ldy, -7.0f), want = got;
    DeinterleaveBlocks(x.data(), ldx, c.rows, c.groups, c.parts, c.width,
                       got.data(), ldy);
    ref::DeinterleaveBlocks(x.data(), ldx, c.rows, c.groups, c.parts, c.width,
                            want.data(), ldy);
    ExpectBitwise("deinterleave blocks", got.data(), want.data(),
                  c.rows * ldy * 4);
    // Row r, the last group's last part, element 1 (if any).
    const int64_t r = c.rows - 1, g = c.groups - 1, p = c.parts - 1,
                  i = std::min<int64_t>(1, c.width - 1);
    EXPECT_EQ(got[r * ldy + (p * c.groups + g) * c.width + i],
              x[r * ldx + (g * c.parts + p) * c.width + i]);
    EXPECT_EQ(got[r * ldy + cols], -7.0f);  // padding untouched
  }
}

// MLA's copies: per head blocks into a wider stride, a broadcast source
// (gsx = 0) and de-interleaving (isx = 2): bit-identical to the reference,
// hand-checked spots, and the gaps between destinations untouched.
TEST(RowOps, StridedCopyExact) {
  struct Case {
    int64_t rows, groups, n, ldx, gsx, isx, ldy, gsy, isy;
  };
  for (const Case& c : {Case{3, 4, 16, 130, 32, 1, 100, 24, 1},  // k_nope
                        Case{5, 4, 4, 40, 0, 2, 96, 24, 1},      // rope bcast
                        Case{2, 1, 7, 9, 1, 1, 8, 1, 1},
                        Case{300, 16, 8, 520, 32, 2, 400, 24, 1}}) {  // threads
    const std::vector<float> x = Random(c.rows * c.ldx, 41);
    std::vector<float> got(c.rows * c.ldy, -7.0f), want = got;
    StridedCopy(x.data(), c.ldx, c.gsx, c.isx, got.data(), c.ldy, c.gsy, c.isy,
                c.rows, c.groups, c.n);
    ref::StridedCopy(x.data(), c.ldx, c.gsx, c.isx, want.data(), c.ldy, c.gsy,
                     c.isy, c.rows, c.groups, c.n);
    ExpectBitwise("strided copy", got.data(), want.data(), c.rows * c.ldy * 4);
    const int64_t r = c.rows - 1, g = c.groups - 1, i = c.n - 1;
    EXPECT_EQ(got[r * c.ldy + g * c.gsy + i * c.isy],
              x[r * c.ldx + g * c.gsx + i * c.isx]);
    if (c.gsy > c.n) {
      EXPECT_EQ(got[c.n], -7.0f);  // gap untouched
    }
  }
}

TEST(RowOps, GatherAndScatterAddRows) {
  const int64_t src_rows = 50, cols = 33, ldx = 40, n = 17;
  const std::vector<float> x = Random(src_rows * ldx, 36);
  std::vector<int32_t> rows(n);
  for (int64_t i = 0; i < n; ++i)
    rows[i] = static_cast<int32_t>((i * 7) % src_rows);
  std::vector<float> got(n * cols), want(n * cols);
  GatherRows(x.data(), ldx, rows.data(), n, cols, got.data());
  ref::GatherRows(x.data(), ldx, rows.data(), n, cols, want.data());
  ExpectBitwise("gather rows", got.data(), want.data(), n * cols * 4);
  const std::vector<float> w = Random(n, 37, 0.0f, 1.0f);
  std::vector<float> y = Random(src_rows * ldx, 38);
  std::vector<float> y_ref = y;
  ScatterAddRows(got.data(), rows.data(), w.data(), n, cols, y.data(), ldx);
  ref::ScatterAddRows(want.data(), rows.data(), w.data(), n, cols, y_ref.data(),
                      ldx);
  // One product and one sum per element, each rounded once (<= 2 u, plus
  // the product's rounding carried through the sum).
  std::vector<double> tol(src_rows * ldx);
  for (int64_t i = 0; i < src_rows * ldx; ++i)
    tol[i] = 3 * kU * (std::abs(y_ref[i]) + 1.0) + 1e-30;
  ExpectNear("scatter-add rows", y.data(), y_ref.data(), tol, src_rows * ldx);
}

TEST(LogSumExp, MatchesReference) {
  for (int64_t rows : {int64_t{1}, int64_t{3}, int64_t{17}}) {
    for (int64_t vocab :
         {int64_t{2}, int64_t{1000}, int64_t{32000}, int64_t{32003}}) {
      std::vector<float> x = Random(rows * vocab, 121, -20.0f, 25.0f);
      std::vector<double> got(rows), want(rows);
      LogSumExp(x.data(), rows, vocab, got.data());
      ref::LogSumExp(x.data(), rows, vocab, want.data());
      for (int64_t r = 0; r < rows; ++r) {
        // f32 exps (a few u each, relative) summed in double: log adds a few u
        // absolute.
        const double tol = 8 * kU + 2 * kU * std::abs(want[r]);
        EXPECT_NEAR(got[r], want[r], tol)
            << "rows=" << rows << " vocab=" << vocab << " row " << r;
      }
    }
  }
}

// Empty work is a no-op, not an error: a GEMM with m = 0, attention over no
// sequences or over a zero-length sequence between others.
TEST(EdgeCases, EmptyInputs) {
  GemmContext ctx;
  std::vector<float> w = Random(8 * 4, 141);
  GemmArgs g;
  g.w = w.data(), g.m = 0, g.n = 8, g.k = 4;
  ctx.Gemm(g);

  const int64_t d = 16, rs = 3 * d;
  std::vector<float> qkv = Random(5 * rs, 142);
  const std::vector<int64_t> starts = {0, 2, 2, 5};  // lengths 2, 0, 3
  AttentionArgs a;
  a.q = qkv.data(), a.q_rs = rs, a.k = qkv.data() + d, a.k_rs = rs;
  a.v = qkv.data() + 2 * d, a.v_rs = rs;
  a.seq_start = starts.data(), a.num_seqs = 3;
  a.q_heads = 1, a.kv_heads = 1, a.head_dim = d, a.scale = 0.25f;
  AlignedBuf ws(AttentionWorkspaceBytes(3, 1, d, NumThreads()));
  a.workspace = ws.p;
  std::vector<float> got(5 * d), want(5 * d);
  a.z = got.data();
  Attention(ctx, a);
  a.z = want.data();
  ref::Attention(a);
  std::vector<double> tol(5 * d, 1e-6);
  ExpectNear("attention with an empty sequence", got.data(), want.data(), tol,
             5 * d);
  a.num_seqs = 0;
  Attention(ctx, a);
}

TEST(Threads, SetAndGet) {
  const int before = NumThreads();
  EXPECT_EQ(SetNumThreads(1), 1);
  EXPECT_EQ(NumThreads(), 1);
  EXPECT_GE(SetNumThreads(0), 1);
  SetNumThreads(before);
}

}  // namespace
}  // namespace loom::cpu
