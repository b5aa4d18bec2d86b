// `loom bench` on the bundled model: the table, the JSON fields, and the
// errors (a prompt length beyond the model's positions, a bad precision).
#include <gtest/gtest.h>

#include <map>
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
    // The ceiling is the forward's own GEMMs, timed in the forward: never
    // below the forward's speed (it was a dense reference GEMM's rate,
    // which a small model's forward beat by 1.1-1.33x).
    const double gemm_s = p.at("forward_gemm_seconds").get<double>();
    EXPECT_GT(gemm_s, 0.0);
    EXPECT_LE(gemm_s, s);
    EXPECT_NEAR(p.at("gemm_only_tokens_per_second").get<double>(),
                want[i] / gemm_s, 1e-6 * want[i] / gemm_s);
    EXPECT_GE(p.at("gemm_only_tokens_per_second").get<double>(),
              p.at("tokens_per_second").get<double>());
    EXPECT_GT(p.at("dense_reference_tokens_per_second").get<double>(), 0.0);
  }
  // FLOPs scale with the tokens.
  EXPECT_DOUBLE_EQ(j["prefill"][1]["gemm_flops"].get<double>(),
                   8 * j["prefill"][0]["gemm_flops"].get<double>());
  // The GEMM path and its peak: FLOP per cycle of the path x the measured
  // clock x the threads, and each rate as a fraction of it.
  const std::string path = j.at("gemm_path").get<std::string>();
  const std::map<std::string, int64_t> per_cycle = {
      {"avx512", 64}, {"avx2", 32}, {"baseline", 8}};  // f32: the fma family
  ASSERT_TRUE(per_cycle.count(path)) << path;
  EXPECT_EQ(j.at("peak_flops_per_cycle").get<int64_t>(), per_cycle.at(path));
  const double hz = j.at("clock_hz").get<double>();
  EXPECT_GT(hz, 2e8);
  EXPECT_LT(hz, 1e10);
  EXPECT_DOUBLE_EQ(j.at("peak_flops_per_second").get<double>(),
                   per_cycle.at(path) * hz * 1);
  for (const nlohmann::json& p : j.at("prefill")) {
    const double peak = j.at("peak_flops_per_second").get<double>();
    EXPECT_NEAR(
        p.at("forward_of_peak").get<double>(),
        p.at("gemm_flops").get<double>() / p.at("seconds").get<double>() / peak,
        1e-9);
    EXPECT_NEAR(p.at("gemm_of_peak").get<double>(),
                p.at("gemm_flops").get<double>() /
                    p.at("forward_gemm_seconds").get<double>() / peak,
                1e-9);
    EXPECT_NEAR(p.at("dense_reference_of_peak").get<double>(),
                p.at("dense_gemm_flops_per_second").get<double>() / peak, 1e-9);
    EXPECT_GT(p.at("gemm_of_peak").get<double>(), 0.0);
  }
}

TEST(BenchCli, TableNamesTheCpu) {
  const Result r = Bench(Stories() + " --tokens 8 --iterations 1");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("cpu: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gemm-only tok/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gemm path: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FLOP/cycle x "), std::string::npos) << r.out;
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
