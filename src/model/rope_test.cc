// RoPE inverse frequencies for each rope_scaling type, against the formulas
// HF transformers uses (computed here in double, independently of rope.cc's
// float arithmetic). llama3 scaling is also covered end to end by the golden
// parity test (tiny llama3rope_bf16 model).
#include "src/model/rope.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "src/model/config_reader.h"
#include "src/model/registry.h"

namespace loom {
namespace {

std::vector<double> Default(double theta, int64_t dim) {
  std::vector<double> f(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) f[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / dim);
  return f;
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)  // float pow/divide: a few ulp
    EXPECT_NEAR(got[i], want[i], 4e-7 * std::fabs(want[i]) + 1e-12) << "index " << i;
}

ModelConfig Parse(const nlohmann::json& rope_scaling) {
  nlohmann::json j = {{"model_type", "llama"},     {"vocab_size", 32},        {"hidden_size", 64},
                      {"num_hidden_layers", 1},    {"num_attention_heads", 4}, {"intermediate_size", 128},
                      {"max_position_embeddings", 256}, {"rope_theta", 10000.0}, {"rope_scaling", rope_scaling}};
  auto c = ParseModelConfig(ConfigReader("config.json", j));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : ModelConfig();
}

TEST(RopeTest, DefaultAndLinear) {
  ModelConfig c = Parse(nullptr);
  std::vector<float> f(8);
  ComputeInvFreq(c.rope, 256, 10, f.data());
  ExpectNear(f, Default(10000.0, 16));
  c = Parse({{"rope_type", "linear"}, {"factor", 4.0}});
  ComputeInvFreq(c.rope, 256, 10, f.data());
  std::vector<double> want = Default(10000.0, 16);
  for (double& x : want) x /= 4.0;
  ExpectNear(f, want);
}

TEST(RopeTest, DynamicRescalesTheBaseOnlyPastTheMaximum) {
  ModelConfig c = Parse({{"type", "dynamic"}, {"factor", 2.0}});  // legacy key "type"
  std::vector<float> f(8);
  ComputeInvFreq(c.rope, 256, 200, f.data());  // within max_position_embeddings: unchanged
  ExpectNear(f, Default(10000.0, 16));
  ComputeInvFreq(c.rope, 256, 1000, f.data());
  // HF: base * ((factor * L / max_pos) - (factor - 1)) ** (dim / (dim - 2))
  const double base = 10000.0 * std::pow(2.0 * 1000 / 256 - 1.0, 16.0 / 14.0);
  ExpectNear(f, Default(base, 16));
}

TEST(RopeTest, Llama3BandsAndErrors) {
  ModelConfig c = Parse({{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}});
  std::vector<float> f(8);
  ComputeInvFreq(c.rope, 256, 10, f.data());
  const std::vector<double> d = Default(10000.0, 16);
  for (size_t i = 0; i < d.size(); ++i) {
    const double wavelen = 2 * M_PI / d[i];
    double want = d[i];
    if (wavelen > 64.0) want = d[i] / 8;  // low frequencies: scaled
    else if (wavelen >= 16.0) {          // medium band: interpolated
      const double s = (64.0 / wavelen - 1.0) / 3.0;
      want = (1 - s) * d[i] / 8 + s * d[i];
    }
    EXPECT_NEAR(f[i], want, 1e-6 * want) << i;
  }
  nlohmann::json bad = {{"model_type", "llama"}, {"vocab_size", 32}, {"hidden_size", 64}, {"num_hidden_layers", 1},
                        {"num_attention_heads", 4}, {"intermediate_size", 128}, {"max_position_embeddings", 256},
                        {"rope_scaling", {{"rope_type", "longrope"}, {"factor", 4.0}}}};
  auto r = ParseModelConfig(ConfigReader("config.json", bad));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'longrope' is not supported"), std::string::npos) << r.status().message();
}

// ---- YaRN (HF 4.55 _compute_yarn_parameters), recomputed here in double.

struct YarnWant {
  double low, high, attention_factor;
  std::vector<double> inv_freq;
};

// The formulas of the golden README ("gpt_oss: the model"), in double.
YarnWant YarnInDouble(double theta, int64_t d, double max_pos, double omax, double beta_fast, double beta_slow,
                      bool truncate) {
  const double factor = max_pos / omax;
  auto corr = [&](double r) { return d * std::log(omax / (2 * M_PI * r)) / (2 * std::log(theta)); };
  YarnWant w;
  w.low = corr(beta_fast);
  w.high = corr(beta_slow);
  if (truncate) w.low = std::floor(w.low), w.high = std::ceil(w.high);
  w.low = std::max(w.low, 0.0);
  w.high = std::min(w.high, d - 1.0);
  w.attention_factor = 0.1 * std::log(factor) + 1.0;
  for (double base : Default(theta, d)) {
    const size_t i = w.inv_freq.size();
    const double ramp = std::clamp((static_cast<double>(i) - w.low) / (w.high - w.low), 0.0, 1.0);
    w.inv_freq.push_back(base / factor * ramp + base * (1.0 - ramp));
  }
  return w;
}

// The tiny gpt_oss golden's rope settings (shared/golden/tiny/gpt_oss): head_dim 16, theta 150000,
// max_position_embeddings 2048, yarn factor 32 over an original 64, beta 32 / 1, truncate false.
nlohmann::json TinyGptOssRope(bool truncate) {
  nlohmann::json scaling = {{"rope_type", "yarn"},  {"factor", 32.0},
                            {"beta_fast", 32.0},    {"beta_slow", 1.0},
                            {"original_max_position_embeddings", 64}};
  if (!truncate) scaling["truncate"] = false;
  return {{"model_type", "qwen2"},        {"vocab_size", 32},        {"hidden_size", 64},
          {"num_hidden_layers", 1},       {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"intermediate_size", 128},     {"max_position_embeddings", 2048},
          {"rope_theta", 150000},         {"rope_scaling", scaling}};
}

TEST(RopeTest, YarnTinyGptOssMatchesDoubleReference) {
  auto c = ParseModelConfig(ConfigReader("config.json", TinyGptOssRope(/*truncate=*/false)));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const RopeConfig& rope = c->rope;
  ASSERT_EQ(rope.type, RopeConfig::Type::kYarn);
  EXPECT_FALSE(rope.truncate);
  const YarnWant want = YarnInDouble(150000.0, 16, 2048, 64, 32, 1, /*truncate=*/false);
  const YarnRange r = ComputeYarnRange(rope);
  EXPECT_NEAR(r.low, want.low, 1e-12);
  EXPECT_NEAR(r.high, want.high, 1e-12);
  EXPECT_NEAR(rope.attention_scaling, want.attention_factor, 1e-7);  // f32 of the double
  std::vector<float> f(8);
  ComputeInvFreq(rope, c->max_position_embeddings, 10, f.data());
  ExpectNear(f, want.inv_freq);
  // The README's description of these numbers: low clamps to 0, high lies in (1, 2), so frequency 0 keeps its
  // value, frequency 1 is partly interpolated and 2..7 are fully interpolated (divided by the factor 32).
  const std::vector<double> base = Default(150000.0, 16);
  EXPECT_EQ(want.low, 0.0);
  EXPECT_GT(want.high, 1.0);
  EXPECT_LT(want.high, 2.0);
  EXPECT_NEAR(f[0], base[0], 4e-7 * base[0]);
  EXPECT_GT(f[1], base[1] / 32 * (1 + 1e-3));
  EXPECT_LT(f[1], base[1] * (1 - 1e-3));
  for (int i = 2; i < 8; ++i) EXPECT_NEAR(f[i], base[i] / 32, 4e-7 * base[i] / 32) << i;
}

TEST(RopeTest, YarnTruncateDefaultsToTrueAndRoundsTheRange) {
  auto c = ParseModelConfig(ConfigReader("config.json", TinyGptOssRope(/*truncate=*/true)));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->rope.truncate);
  const YarnWant want = YarnInDouble(150000.0, 16, 2048, 64, 32, 1, /*truncate=*/true);
  const YarnRange r = ComputeYarnRange(c->rope);
  EXPECT_EQ(r.low, want.low);
  EXPECT_EQ(r.high, want.high);
  std::vector<float> f(8);
  ComputeInvFreq(c->rope, c->max_position_embeddings, 10, f.data());
  ExpectNear(f, want.inv_freq);
}

TEST(RopeTest, YarnFactorAndAttentionFactorRules) {
  // original_max_position_embeddings present: the factor is max_pos / original (2048 / 64 = 32), whatever
  // rope_scaling.factor says.
  nlohmann::json j = TinyGptOssRope(false);
  j["rope_scaling"]["factor"] = 4.0;
  auto c = ParseModelConfig(ConfigReader("config.json", j));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope.factor, 2048.0 / 64.0);
  // Absent: rope_scaling.factor, original = max_position_embeddings (Qwen's legacy "type" key).
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  c = ParseModelConfig(ConfigReader("config.json", j));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope.factor, 4.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 2048);
  EXPECT_EQ(c->rope.beta_fast, 32.0);
  EXPECT_EQ(c->rope.beta_slow, 1.0);
  EXPECT_FLOAT_EQ(c->rope.attention_scaling, static_cast<float>(0.1 * std::log(4.0) + 1.0));
  // An explicit attention_factor wins.
  j["rope_scaling"]["attention_factor"] = 0.75;
  c = ParseModelConfig(ConfigReader("config.json", j));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope.attention_scaling, 0.75f);
  // mscale and mscale_all_dim both non-zero: the ratio of the two get_mscale values.
  j["rope_scaling"].erase("attention_factor");
  j["rope_scaling"]["mscale"] = 0.707;
  j["rope_scaling"]["mscale_all_dim"] = 1.0;
  c = ParseModelConfig(ConfigReader("config.json", j));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FLOAT_EQ(c->rope.attention_scaling,
                  static_cast<float>((0.1 * 0.707 * std::log(4.0) + 1) / (0.1 * std::log(4.0) + 1)));
  // factor is required.
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"original_max_position_embeddings", 64}};
  c = ParseModelConfig(ConfigReader("config.json", j));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("factor"), std::string::npos) << c.status().message();
}

}  // namespace
}  // namespace loom
