// RunSae against its scalar reference (reference/reference_sae.h) on random
// SAEs of every architecture and normalization, at widths that are no
// multiple of the GEMM tiles, weights stored as f32 or rounded to bf16; the
// top-k with ties; and bit-identical rows at any batch and thread count.
// (The published formats against HF's activations: tests/sae_golden_test.)
#include "src/backend/cpu/sae_cpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "src/backend/cpu/kernels.h"
#include "src/backend/cpu/reference/reference_sae.h"
#include "src/base/float16.h"
#include "src/base/units.h"

namespace loom::cpu {
namespace {

struct Case {
  SaeArchitecture arch;
  SaeNormalization norm;
  bool b_dec_in;
  bool rescale;
};

Sae RandomSae(const Case& c, int64_t d_in, int64_t d_sae, int64_t d_out,
              bool bf16, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0, 1);
  const auto fill = [&](int64_t n, float s) {
    std::vector<float> v(n);
    for (float& x : v) {
      x = g(rng) * s;
      if (bf16) x = RoundBf16(x);
    }
    return v;
  };
  Sae sae;
  sae.architecture = c.arch;
  sae.normalization = c.norm;
  sae.apply_b_dec_to_input = c.b_dec_in;
  sae.rescale_acts_by_decoder_norm = c.rescale;
  sae.d_in = d_in;
  sae.d_sae = d_sae;
  sae.d_out = d_out;
  sae.k = c.arch == SaeArchitecture::kTopK ? 7 : 0;
  sae.w_enc = fill(d_sae * d_in, 1 / std::sqrt(float(d_in)));
  sae.b_enc = fill(d_sae, 0.2f);
  sae.w_dec = fill(d_sae * d_out, 0.3f);
  sae.b_dec = fill(d_out, 0.1f);
  if (c.arch == SaeArchitecture::kGated) {
    sae.b_gate = fill(d_sae, 0.2f);
    sae.w_mag = sae.w_enc;
    const std::vector<float> r = fill(d_sae, 0.3f);
    for (int64_t f = 0; f < d_sae; ++f)
      for (int64_t i = 0; i < d_in; ++i)
        sae.w_mag[f * d_in + i] *= std::exp(r[f]);
  }
  if (HasThreshold(c.arch))
    sae.threshold = fill(d_sae, 0.3f);  // some below zero
  if (HasSkip(c.arch)) sae.w_skip = fill(d_out * d_in, 0.1f);
  if (c.rescale) {
    sae.dec_norm.resize(d_sae);
    for (int64_t f = 0; f < d_sae; ++f) {
      double s = 0;
      for (int64_t j = 0; j < d_out; ++j)
        s += double{sae.w_dec[f * d_out + j]} * sae.w_dec[f * d_out + j];
      sae.dec_norm[f] = static_cast<float>(std::sqrt(s));
    }
  }
  return sae;
}

struct Out {
  std::vector<float> hidden, acts, recons, rec, err, topv;
  std::vector<int32_t> topi;
};

Out RunCase(const Sae& sae, const std::vector<float>& x, int64_t rows,
            int64_t topk) {
  Out o;
  o.hidden.resize(rows * sae.d_sae);
  o.acts.resize(rows * sae.d_sae);
  o.recons.resize(rows * sae.d_out);
  o.rec.resize(rows * sae.d_out);
  o.err.resize(rows * sae.d_out);
  o.topv.resize(rows * topk);
  o.topi.resize(rows * topk);
  std::vector<char> ws(SaeWorkspaceBytes(sae, rows) + 64);
  SaeOutputs out{o.hidden.data(), o.acts.data(), o.recons.data(),
                 o.rec.data(),    o.err.data(),  topk,
                 o.topi.data(),   o.topv.data()};
  // The reference of the error is the input for an SAE (d_out = d_in here
  // for every case but the transcoders, whose reference is zeros).
  std::vector<float> ref(rows * sae.d_out, 0.0f);
  if (sae.d_out == sae.d_in) ref = x;
  RunSae(sae, x.data(), ref.data(), rows,
         reinterpret_cast<void*>(
             AlignUp(reinterpret_cast<intptr_t>(ws.data()), 64)),
         out);
  return o;
}

void ExpectNear(float got, double want, double scale, const std::string& what) {
  EXPECT_NEAR(got, want, 2e-5 * scale + 1e-6) << what;
}

const Case kCases[] = {
    {SaeArchitecture::kStandard, SaeNormalization::kNone, true, false},
    {SaeArchitecture::kStandard, SaeNormalization::kLayerNorm, true, false},
    {SaeArchitecture::kJumpRelu, SaeNormalization::kConstantNormRescale, false,
     false},
    {SaeArchitecture::kTopK, SaeNormalization::kNone, true, false},
    {SaeArchitecture::kTopK, SaeNormalization::kNone, true, true},
    {SaeArchitecture::kGated, SaeNormalization::kNone, true, false},
    {SaeArchitecture::kTranscoder, SaeNormalization::kNone, false, false},
    {SaeArchitecture::kSkipTranscoder, SaeNormalization::kNone, false, false},
    {SaeArchitecture::kJumpReluTranscoder, SaeNormalization::kLayerNorm, false,
     false},
    {SaeArchitecture::kJumpReluSkipTranscoder, SaeNormalization::kNone, false,
     false},
};

TEST(SaeCpuTest, EveryArchitectureMatchesTheReference) {
  const int64_t rows = 9, d_in = 40;
  for (bool bf16 : {false, true}) {
    for (const Case& c : kCases) {
      const std::string name = std::string(SaeArchitectureName(c.arch)) + "/" +
                               std::string(SaeNormalizationName(c.norm)) +
                               (c.rescale ? "/rescale" : "") +
                               (bf16 ? "/bf16" : "");
      SCOPED_TRACE(name);
      const int64_t d_out = IsTranscoder(c.arch) ? 24 : d_in;
      const Sae sae = RandomSae(c, d_in, 100, d_out, bf16, 7);
      std::mt19937 rng(11);
      std::normal_distribution<float> g(0, 2);
      std::vector<float> x(rows * d_in);
      for (float& v : x) v = g(rng);
      const Out o = RunCase(sae, x, rows, 5);
      for (int64_t r = 0; r < rows; ++r) {
        const ref::SaeRow want = ref::RunSaeRow(sae, x.data() + r * d_in);
        double hs = 0, rs = 0;
        for (double v : want.hidden_pre) hs = std::max(hs, std::fabs(v));
        for (double v : want.reconstruction) rs = std::max(rs, std::fabs(v));
        for (int64_t f = 0; f < sae.d_sae; ++f) {
          ExpectNear(o.hidden[r * sae.d_sae + f], want.hidden_pre[f], hs,
                     "hidden_pre");
          ExpectNear(o.acts[r * sae.d_sae + f], want.feature_acts[f], hs,
                     "feature_acts");
        }
        for (int64_t j = 0; j < d_out; ++j) {
          ExpectNear(o.recons[r * d_out + j], want.recons[j], rs, "recons");
          ExpectNear(o.rec[r * d_out + j], want.reconstruction[j], rs,
                     "reconstruction");
        }
        // The top 5 of the row's acts, descending, the lower index first.
        for (int64_t i = 0; i < 5; ++i) {
          const int32_t f = o.topi[r * 5 + i];
          EXPECT_EQ(o.topv[r * 5 + i], o.acts[r * sae.d_sae + f]);
          if (i > 0) {
            const int32_t p = o.topi[r * 5 + i - 1];
            const float a = o.acts[r * sae.d_sae + p],
                        b = o.acts[r * sae.d_sae + f];
            EXPECT_TRUE(a > b || (a == b && p < f)) << i;
          }
        }
      }
    }
  }
}

// The encoder as panels (what LoadSae keeps when d_sae is a multiple of 16)
// gives the bytes of the encoder as rows, and the reference reads it too.
TEST(SaeCpuTest, EncoderPanelsGiveTheBytesOfRows) {
  const int64_t rows = 21, d_in = 40, d_sae = 96;
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::string(SaeArchitectureName(c.arch)));
    const int64_t d_out = IsTranscoder(c.arch) ? 24 : d_in;
    const Sae as_rows = RandomSae(c, d_in, d_sae, d_out, false, 9);
    Sae panels = as_rows;
    SaeEncoderPanels(&panels);
    ASSERT_TRUE(panels.enc_panels);
    EXPECT_NE(panels.w_enc, as_rows.w_enc);  // really another layout
    for (int64_t f : {int64_t{0}, int64_t{17}, d_sae - 1})
      for (int64_t i : {int64_t{0}, int64_t{5}, d_in - 1}) {
        EXPECT_EQ(SaeEncoderWeight(panels, panels.w_enc, f, i),
                  as_rows.w_enc[f * d_in + i]);
        if (c.arch == SaeArchitecture::kGated) {
          EXPECT_EQ(SaeEncoderWeight(panels, panels.w_mag, f, i),
                    as_rows.w_mag[f * d_in + i]);
        }
      }
    std::mt19937 rng(2);
    std::normal_distribution<float> g(0, 2);
    std::vector<float> x(rows * d_in);
    for (float& v : x) v = g(rng);
    const Out a = RunCase(as_rows, x, rows, 6), b = RunCase(panels, x, rows, 6);
    EXPECT_EQ(a.hidden, b.hidden);
    EXPECT_EQ(a.acts, b.acts);
    EXPECT_EQ(a.rec, b.rec);
    EXPECT_EQ(a.err, b.err);
    EXPECT_EQ(a.topi, b.topi);
    const ref::SaeRow want = ref::RunSaeRow(panels, x.data() + 3 * d_in);
    const ref::SaeRow also = ref::RunSaeRow(as_rows, x.data() + 3 * d_in);
    EXPECT_EQ(want.hidden_pre, also.hidden_pre);
  }
  // A width that is no multiple of 16 stays as rows.
  Sae odd = RandomSae(kCases[0], d_in, 100, d_in, false, 9);
  SaeEncoderPanels(&odd);
  EXPECT_FALSE(odd.enc_panels);
}

TEST(SaeCpuTest, RowsAreBitIdenticalAtAnyBatchAndThreadCount) {
  const Sae sae =
      RandomSae({SaeArchitecture::kTopK, SaeNormalization::kNone, true, false},
                48, 96, 48, false, 3);
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0, 1);
  const int64_t rows = 37;
  std::vector<float> x(rows * 48);
  for (float& v : x) v = g(rng);
  const int before = NumThreads();
  SetNumThreads(1);
  const Out one = RunCase(sae, x, rows, 4);
  SetNumThreads(2);
  const Out two = RunCase(sae, x, rows, 4);
  SetNumThreads(before);
  EXPECT_EQ(one.rec, two.rec);
  EXPECT_EQ(one.hidden, two.hidden);
  for (int64_t r : {int64_t{0}, int64_t{17}, rows - 1}) {
    const std::vector<float> xr(x.begin() + r * 48, x.begin() + (r + 1) * 48);
    const Out alone = RunCase(sae, xr, 1, 4);
    EXPECT_TRUE(std::equal(alone.rec.begin(), alone.rec.end(),
                           two.rec.begin() + r * 48));
    EXPECT_TRUE(std::equal(alone.hidden.begin(), alone.hidden.end(),
                           two.hidden.begin() + r * 96));
  }
}

}  // namespace
}  // namespace loom::cpu
