// The backward kernels against their scalar references (reference/
// reference_backward.h), and the invariances backward_cpu.h states: a row's
// result does not depend on the other rows, sequences or the thread count.
#include "src/backend/cpu/backward_cpu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "src/backend/cpu/kernels.h"
#include "src/backend/cpu/reference/reference_backward.h"
#include "src/base/float16.h"
#include "src/core/quant_codes.h"

namespace loom::cpu {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = nd(rng);
  return v;
}

// |a - b| <= atol + rtol |b| elementwise.
void ExpectNear(const std::vector<float>& a, const std::vector<float>& b,
                double atol, double rtol, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_LE(std::fabs(a[i] - b[i]), atol + rtol * std::fabs(b[i]))
        << what << " element " << i << ": " << a[i] << " vs " << b[i];
}

std::vector<float> RunGemmBackward(const WeightRows& w, const float* dy,
                                   int64_t m) {
  std::vector<float> dx(static_cast<size_t>(m * w.k), 7.0f);
  std::vector<float> ws(
      static_cast<size_t>(GemmBackwardWorkspaceBytes(m, w.n, w.k) / 4));
  GemmContext ctx;
  GemmBackwardInput(ctx, w, dy, w.n, m, dx.data(), w.k, false, ws.data());
  return dx;
}

TEST(GemmBackwardTest, EveryLayoutMatchesTheReference) {
  const int64_t n = 96, k = 64, m = 9;
  const std::vector<float> wf = Random(n * k, 1), dy = Random(m * n, 2);
  std::vector<float> want(static_cast<size_t>(m * k));
  ref::GemmBackwardInput(wf.data(), n, k, dy.data(), m, want.data());
  // Dense [n, k] f32.
  WeightRows dense{wf.data(), DType::kF32, n, k};
  ExpectNear(RunGemmBackward(dense, dy.data(), m), want, 1e-5, 1e-5, "dense");
  // [k, n] (in_out).
  std::vector<float> t(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) t[c * n + r] = wf[r * k + c];
  WeightRows in_out{t.data(), DType::kF32, n, k, true};
  ExpectNear(RunGemmBackward(in_out, dy.data(), m), want, 1e-5, 1e-5, "in_out");
  // f32 panels (the packer's own layout; any ISA packs panels of f32 here).
  std::vector<float> panels(static_cast<size_t>(n * k));
  if (PanelsLayoutFits(n, k, DType::kF32)) {
    PackWeightPanels(wf.data(), n, k, DType::kF32, panels.data());
    WeightRows p{panels.data(), DType::kF32, n, k, false, true};
    ExpectNear(RunGemmBackward(p, dy.data(), m), want, 1e-5, 1e-5, "panels");
  }
  // bf16 dense and, where this level packs them, bf16 strips.
  std::vector<uint16_t> wb(static_cast<size_t>(n * k));
  std::vector<float> wbf(wb.size());
  for (size_t i = 0; i < wb.size(); ++i) {
    wb[i] = F32ToBf16(wf[i]);
    wbf[i] = Bf16ToF32(wb[i]);
  }
  std::vector<float> want_b(static_cast<size_t>(m * k));
  ref::GemmBackwardInput(wbf.data(), n, k, dy.data(), m, want_b.data());
  WeightRows b{wb.data(), DType::kBF16, n, k};
  ExpectNear(RunGemmBackward(b, dy.data(), m), want_b, 1e-5, 1e-5, "bf16");
  if (StripsLayoutFits(n, k, DType::kBF16)) {
    std::vector<uint16_t> strips(wb.size());
    PackWeightStrips(wb.data(), n, k, strips.data());
    WeightRows s{strips.data(), DType::kBF16, n, k, false, false, true};
    ExpectNear(RunGemmBackward(s, dy.data(), m), want_b, 1e-5, 1e-5, "strips");
  }
}

TEST(GemmBackwardTest, Mxfp4CodesMatchTheirDecode) {
  const int64_t n = 70, k = 64, m = 5;
  std::mt19937 rng(3);
  std::vector<uint8_t> codes(static_cast<size_t>(n * k / 2)),
      scales(static_cast<size_t>(n * k / 32));
  for (auto& c : codes) c = static_cast<uint8_t>(rng());
  for (auto& s : scales) s = static_cast<uint8_t>(120 + rng() % 10);
  QuantMatrix q;
  q.kind = FormatKind::kMxfp4;
  q.values = codes.data();
  q.scales = scales.data();
  q.scale_dtype = DType::kF8E8M0;
  q.n = n;
  q.k = k;
  q.block_out = 1;
  q.block_in = 32;
  std::vector<float> wf(static_cast<size_t>(n * k));
  DecodeRowsReference(q, 0, n, wf.data());
  const std::vector<float> dy = Random(m * n, 4);
  std::vector<float> want(static_cast<size_t>(m * k));
  ref::GemmBackwardInput(wf.data(), n, k, dy.data(), m, want.data());
  WeightRows w;
  w.n = n;
  w.k = k;
  w.quant = &q;
  ExpectNear(RunGemmBackward(w, dy.data(), m), want, 1e-5, 1e-5, "mxfp4");
}

TEST(GemmBackwardTest, ARowIsTheSameInAnyBatchAndThreadCount) {
  const int64_t n = 600, k = 48, m = 33;  // three blocks of weight rows
  const std::vector<float> wf = Random(n * k, 5), dy = Random(m * n, 6);
  WeightRows w{wf.data(), DType::kF32, n, k};
  const std::vector<float> all = RunGemmBackward(w, dy.data(), m);
  const int before = SetNumThreads(1);
  const std::vector<float> one = RunGemmBackward(w, dy.data() + 17 * n, 1);
  SetNumThreads(before);
  EXPECT_EQ(0, std::memcmp(one.data(), all.data() + 17 * k, k * 4));
  std::vector<float> want(static_cast<size_t>(m * k));
  ref::GemmBackwardInput(wf.data(), n, k, dy.data(), m, want.data());
  // 600 f32 products of order 1 per element: atol ~ n eps.
  ExpectNear(all, want, 1e-4, 1e-5, "blocks");
}

struct NormCase {
  bool layer_norm, freeze, has_w;
  float offset;
};

class NormBackwardTest : public ::testing::TestWithParam<NormCase> {};

TEST_P(NormBackwardTest, MatchesTheJacobian) {
  const NormCase c = GetParam();
  const int64_t rows = 6, dim = 40;
  std::vector<float> x = Random(rows * dim, 7, 2.0f),
                     dy = Random(rows * dim, 8);
  for (int64_t i = 0; i < dim; ++i) x[i] += 3.0f;  // a row with a mean
  const std::vector<float> w = Random(dim, 9);
  std::vector<float> got(x.size()), want(x.size());
  NormBackward(x.data(), dy.data(), got.data(), rows, dim,
               c.has_w ? w.data() : nullptr, DType::kF32, c.offset, 1e-5f,
               c.layer_norm, c.freeze, false);
  ref::NormBackward(x.data(), dy.data(), want.data(), rows, dim,
                    c.has_w ? w.data() : nullptr, c.offset, 1e-5f, c.layer_norm,
                    c.freeze);
  ExpectNear(got, want, 1e-6, 1e-5, "norm");
  // accumulate adds to what is there.
  std::vector<float> acc(x.size(), 1.0f);
  NormBackward(x.data(), dy.data(), acc.data(), rows, dim,
               c.has_w ? w.data() : nullptr, DType::kF32, c.offset, 1e-5f,
               c.layer_norm, c.freeze, true);
  for (size_t i = 0; i < acc.size(); ++i)
    ASSERT_FLOAT_EQ(acc[i], 1.0f + got[i]);
}

INSTANTIATE_TEST_SUITE_P(Kinds, NormBackwardTest,
                         ::testing::Values(NormCase{false, false, true, 0.0f},
                                           NormCase{false, true, true, 0.0f},
                                           NormCase{false, false, true, 1.0f},
                                           NormCase{false, false, false, 0.0f},
                                           NormCase{true, false, true, 0.0f},
                                           NormCase{true, true, true, 0.0f},
                                           NormCase{true, false, false, 0.0f}));

struct AttnCase {
  int64_t window;
  float softcap;
  bool sinks, freeze;
  int64_t kv_heads;
};

class AttentionBackwardTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionBackwardTest, MatchesTheReferenceAndIsPerSequence) {
  const AttnCase c = GetParam();
  const int64_t hq = 4, hkv = c.kv_heads, d = 8;
  const std::vector<int64_t> starts = {0, 5, 14};
  const int64_t T = starts.back();
  const std::vector<float> q = Random(T * hq * d, 10),
                           k = Random(T * hkv * d, 11),
                           v = Random(T * hkv * d, 12),
                           dz = Random(T * hq * d, 13);
  const std::vector<float> sinks = Random(hq, 14);
  AttentionArgs a{};
  a.q = q.data();
  a.q_rs = hq * d;
  a.k = k.data();
  a.k_rs = hkv * d;
  a.v = v.data();
  a.v_rs = hkv * d;
  a.seq_start = starts.data();
  a.num_seqs = 2;
  a.q_heads = hq;
  a.kv_heads = hkv;
  a.head_dim = d;
  a.scale = 0.35f;
  a.softcap = c.softcap;
  a.window = c.window;
  a.sinks = c.sinks ? sinks.data() : nullptr;
  auto run = [&](const AttentionArgs& args, int64_t tokens, const float* gz) {
    std::vector<float> dq(static_cast<size_t>(tokens * hq * d), 9.0f),
        dk(static_cast<size_t>(tokens * hkv * d), 9.0f), dv(dk.size(), 9.0f);
    std::vector<float> ws(static_cast<size_t>(
        AttentionBackwardWorkspaceBytes(tokens, NumThreads()) / 4));
    AttentionBackward(args, gz, dq.data(), dk.data(), dv.data(), c.freeze,
                      ws.data());
    std::vector<float> out = dq;
    out.insert(out.end(), dk.begin(), dk.end());
    out.insert(out.end(), dv.begin(), dv.end());
    return out;
  };
  const std::vector<float> got = run(a, T, dz.data());
  std::vector<float> rq(static_cast<size_t>(T * hq * d)),
      rk(static_cast<size_t>(T * hkv * d)), rv(rk.size());
  ref::AttentionBackward(a, dz.data(), rq.data(), rk.data(), rv.data(),
                         c.freeze);
  std::vector<float> want = rq;
  want.insert(want.end(), rk.begin(), rk.end());
  want.insert(want.end(), rv.begin(), rv.end());
  ExpectNear(got, want, 1e-5, 1e-4, "attention");
  // The second sequence alone gives its rows' bytes.
  AttentionArgs b = a;
  const std::vector<int64_t> one = {0, 9};
  b.q += 5 * hq * d;
  b.k += 5 * hkv * d;
  b.v += 5 * hkv * d;
  b.seq_start = one.data();
  b.num_seqs = 1;
  const std::vector<float> alone = run(b, 9, dz.data() + 5 * hq * d);
  EXPECT_EQ(0,
            std::memcmp(alone.data(), got.data() + 5 * hq * d, 9 * hq * d * 4));
}

INSTANTIATE_TEST_SUITE_P(Variants, AttentionBackwardTest,
                         ::testing::Values(AttnCase{0, 0.0f, false, false, 2},
                                           AttnCase{0, 0.0f, false, true, 2},
                                           AttnCase{3, 0.0f, false, false, 2},
                                           AttnCase{0, 5.0f, false, false, 4},
                                           AttnCase{0, 0.0f, true, false, 1},
                                           AttnCase{4, 2.0f, true, false, 2}));

TEST(ActivationBackwardTest, DerivativesMatchFiniteDifferences) {
  const std::vector<float> x = Random(200, 15, 3.0f);
  for (Activation act :
       {Activation::kSilu, Activation::kGeluTanh, Activation::kGeluExact,
        Activation::kRelu, Activation::kReluSquared}) {
    std::vector<float> dx(x.size()), ones(x.size(), 1.0f);
    ActivationBackward(act, x.data(), ones.data(), dx.data(),
                       static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(dx[i], ref::ActivationDerivative(act, x[i]), 2e-4)
          << static_cast<int>(act) << " at " << x[i];
  }
}

TEST(ActivationBackwardTest, GatedSplitsIntoGateAndUp) {
  const int64_t rows = 3, n = 20;
  const std::vector<float> gu = Random(rows * 2 * n, 16),
                           dout = Random(rows * n, 17);
  std::vector<float> dgu(gu.size());
  GatedActivationBackward(Activation::kSilu, gu.data(), 2 * n, gu.data() + n,
                          2 * n, dout.data(), dgu.data(), 2 * n, dgu.data() + n,
                          2 * n, rows, n);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      const double g = gu[r * 2 * n + i], u = gu[r * 2 * n + n + i];
      const double d = dout[r * n + i];
      EXPECT_NEAR(dgu[r * 2 * n + i],
                  d * u * ref::ActivationDerivative(Activation::kSilu, g),
                  1e-4);
      EXPECT_NEAR(dgu[r * 2 * n + n + i], d * g / (1 + std::exp(-g)), 1e-5);
    }
}

TEST(ActivationBackwardTest, ClampedSwigluMatchesFiniteDifferences) {
  const int64_t rows = 4, n = 50;
  const float alpha = 1.702f, limit = 7.0f;
  std::vector<float> gu = Random(rows * 2 * n, 18, 6.0f);  // some past limit
  const std::vector<float> dout = Random(rows * n, 19);
  std::vector<float> dgu(gu.size(), 5.0f);
  ClampedSwigluBackward(gu.data(), 2 * n, dout.data(), dgu.data(), 2 * n, rows,
                        n, alpha, limit);
  int clamped = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      const double g = gu[r * 2 * n + 2 * i], u = gu[r * 2 * n + 2 * i + 1];
      double dg = 0, du = 0;
      ref::ClampedSwigluDerivatives(g, u, alpha, limit, &dg, &du);
      const double d = dout[r * n + i];
      EXPECT_NEAR(dgu[r * 2 * n + 2 * i], d * dg,
                  1e-3 * (1 + std::fabs(d * dg)));
      EXPECT_NEAR(dgu[r * 2 * n + 2 * i + 1], d * du,
                  1e-3 * (1 + std::fabs(d * du)));
      clamped += (g > limit) + (std::fabs(u) > limit);
    }
  EXPECT_GT(clamped, 0);  // the clamps' zero gradients were exercised
}

}  // namespace
}  // namespace loom::cpu
