// `loom bench` on the bundled model: the table, the JSON fields, and the
// errors (a prompt length beyond the model's positions, a bad precision).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/golden_util.h"

namespace {

struct Result {
  int rc = -1;
  std::string out;  // stdout and stderr
};

Result Bench(const std::string& args) {
  Result r;
  r.rc = loom::testing::RunShell(std::string(LOOM_BINARY) + " bench " + args,
                                 &r.out);
  return r;
}

std::string Stories() { return std::string(LOOM_MODELS_DIR) + "/stories260K"; }

TEST(BenchCli, JsonHasEveryLengthAndACeiling) {
  const Result r =
      Bench(Stories() + " --tokens 4,32 --iterations 1 --threads 1 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("threads").get<int>(), 1);
  EXPECT_EQ(j.at("precision").get<std::string>(), "f32");
  EXPECT_FALSE(j.at("cpu").get<std::string>().empty());
  EXPECT_GE(j.at("load_seconds").get<double>(), 0.0);
  ASSERT_EQ(j.at("prefill").size(), 2u);
  const int64_t want[] = {4, 32};
  for (size_t i = 0; i < 2; ++i) {
    const nlohmann::json& p = j.at("prefill")[i];
    EXPECT_EQ(p.at("tokens").get<int64_t>(), want[i]);
    const double s = p.at("seconds").get<double>();
    EXPECT_GT(s, 0.0);
    EXPECT_NEAR(p.at("tokens_per_second").get<double>(), want[i] / s,
                1e-6 * want[i] / s);
    EXPECT_GT(p.at("gemm_flops").get<double>(), 0.0);
    EXPECT_GT(p.at("gemm_only_tokens_per_second").get<double>(), 0.0);
  }
  // FLOPs scale with the tokens.
  EXPECT_DOUBLE_EQ(j["prefill"][1]["gemm_flops"].get<double>(),
                   8 * j["prefill"][0]["gemm_flops"].get<double>());
}

TEST(BenchCli, TableNamesTheCpu) {
  const Result r = Bench(Stories() + " --tokens 8 --iterations 1");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("cpu: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gemm-only tok/s"), std::string::npos) << r.out;
}

TEST(BenchCli, ErrorsNameTheFlagAndTheBound) {
  Result r = Bench(Stories() + " --tokens 100000");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("--tokens 100000 outside [1, "), std::string::npos)
      << r.out;
  r = Bench(Stories() + " --precision f8");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("f8"), std::string::npos) << r.out;
}

}  // namespace
