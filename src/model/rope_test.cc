// RoPE inverse frequencies for each rope_scaling type, against the formulas
// HF transformers uses (computed here in double, independently of rope.cc's
// float arithmetic). llama3 scaling is also covered end to end by the golden
// parity test (tiny llama3rope_bf16 model).
#include "src/model/rope.h"

#include <gtest/gtest.h>

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
                        {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}};
  auto r = ParseModelConfig(ConfigReader("config.json", bad));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'yarn' is not supported"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace loom
