// `loom attribute` against the shared attribution goldens (golden/
// attribution/README.md): the AtP grid (atp [hook][position], both metrics,
// exact and with --freeze attn_pattern,norm_scale) and atp_head for
// attn.hook_z, the metric values, and the true patch of the checked top cells
// (--check-top, through loom patch) against the golden's true_patch, within
// the README's f32 rules. Bad requests exit non-zero naming the flag.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/golden_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::RunShell;

std::string Ids(const nlohmann::json& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + std::to_string(int{x});
  return s;
}

void ExpectRule(const std::vector<double>& got, const std::vector<float>& want,
                double atol_abs, double atol_rel, double rtol,
                const std::string& what) {
  testing::ExpectWithinAttributionRule(got, want, atol_abs, atol_rel, rtol,
                                       what);
}

class AttributeCliTest : public testing::TempDirTest,
                         public ::testing::WithParamInterface<std::string> {};

TEST_P(AttributeCliTest, AtpMatchesTheGoldens) {
  const std::string shared = testing::SharedGoldenDir();
  if (shared.empty() || !fs::exists(shared + "/attribution"))
    GTEST_SKIP() << "SKIPPED LOUDLY: shared attribution goldens not found";
  const std::string name = GetParam();
  const std::string dir = shared + "/attribution/" + name;
  const nlohmann::json m = testing::ReadJson(dir + "/manifest.json");
  auto golden = testing::GoldenFile::Open(dir + "/golden.safetensors");
  std::vector<std::string> hooks = m["hooks"];
  for (const auto& e : m["extra_hooks"]) hooks.push_back(e);
  std::string hook_list;
  for (const std::string& h : hooks)
    hook_list += (hook_list.empty() ? "" : ",") + h;
  const std::string model = shared + "/tiny/" + std::string(m["model"]);
  for (const bool linear : {false, true}) {
    for (const bool logprob : {false, true}) {
      const std::string out = Path(std::string(linear ? "lin" : "exact") +
                                   (logprob ? "_lp" : "_ld"));
      std::string cmd = std::string(LOOM_BINARY) + " attribute --model " +
                        model + " --clean-tokens " + Ids(m["clean_input_ids"]) +
                        " --corrupted-tokens " + Ids(m["corrupted_input_ids"]) +
                        " --hooks " + hook_list +
                        " --positions all --precision f32 " +
                        "--per-head --quiet --out " + out;
      if (linear) cmd += " --freeze attn_pattern,norm_scale";
      if (logprob) cmd += " --metric logprob";
      if (!logprob) cmd += " --check-top 3";
      std::string log;
      ASSERT_EQ(RunShell(cmd, &log), 0) << cmd << "\n" << log;
      const nlohmann::json j = testing::ReadJson(out + "/attribution.json");
      const std::string p = logprob ? "seq_logprob." : "";
      const std::string kind = linear ? "lin_atp" : "atp";
      SCOPED_TRACE(name + " " + p + kind);
      ASSERT_EQ(j["hooks"].get<std::vector<std::string>>().size(),
                hooks.size());
      EXPECT_NEAR(j["metric_clean"].get<double>(),
                  golden->F32(p + "metric.clean").front(),
                  logprob ? 3e-4 : 1e-4);
      EXPECT_NEAR(j["metric_corrupted"].get<double>(),
                  golden->F32(p + "metric.corrupted").front(),
                  logprob ? 3e-4 : 1e-4);
      if (!logprob) {
        EXPECT_EQ(j["answer_token_ids"][0], m["answer_token_ids"]["answer"]);
        EXPECT_EQ(j["answer_token_ids"][1], m["answer_token_ids"]["wrong"]);
      }
      for (size_t i = 0; i < j["hooks"].size(); ++i) {
        const std::string h = j["hooks"][i];
        ExpectRule(j["atp"][i].get<std::vector<double>>(),
                   golden->F32(p + kind + "." + h), 1e-4, 1e-3, 1e-3, h);
        if (h.find("attn.hook_z") == std::string::npos) continue;
        std::vector<double> heads;
        for (const auto& row : j["atp_head"][i])
          for (double v : row) heads.push_back(v);
        ExpectRule(heads, golden->F32(p + kind + "_head." + h), 1e-4, 1e-3,
                   1e-3, h + " per head");
      }
      for (const auto& c : j["checks"]) {  // loom patch's true effect
        const std::vector<float> tp =
            golden->F32("true_patch." + std::string(c["hook"]));
        const double want = tp[static_cast<size_t>(int64_t{c["position"]})];
        EXPECT_NEAR(c["true_patch"].get<double>(), want,
                    1e-4 + 1e-3 * std::fabs(want))
            << c.dump();
      }
      if (!logprob) {
        EXPECT_EQ(j["checks"].size(), 3u);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, AttributeCliTest,
                         ::testing::Values("llama__single_diff",
                                           "llama__two_diffs",
                                           "gemma2__two_diffs",
                                           "gpt_neox__single_diff",
                                           "qwen3_moe__two_diffs",
                                           // B is the corrupted runner-up
                                           "qwen3_moe__single_diff"));

class AttributeCliErrorsTest : public testing::TempDirTest {};

TEST_F(AttributeCliErrorsTest, BadRequestsExitNonZeroNamingTheFlag) {
  const std::string shared = testing::SharedGoldenDir();
  if (shared.empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared goldens not found";
  const std::string base = std::string(LOOM_BINARY) + " attribute --model " +
                           shared + "/tiny/llama --out " + Path("o") + " ";
  struct Bad {
    std::string args, says;
  };
  const Bad bad[] = {
      {"--clean-tokens 1,2,3 --corrupted-tokens 1,2", "one length"},
      {"--clean-tokens 1,2 --corrupted-tokens 1,3 --metric kl", "--metric"},
      {"--clean-tokens 1,2 --corrupted-tokens 1,3 --freeze mlp", "--freeze"},
      {"--clean-tokens 1,2 --corrupted-tokens 1,3 --method gradcam",
       "--method"},
      {"--clean-tokens 1,2 --corrupted-tokens 1,3 --precision bf16",
       "--precision"},
      {"--clean-tokens 1,2 --corrupted-tokens 1,3 --hooks "
       "blocks.0.attn.hook_pattern",
       "gradient"},
      {"--clean-tokens 1,2 --corrupted-tokens 1,3 --metric logprob "
       "--check-top 2",
       "--check-top"},
      {"--clean-tokens 1,2 --corrupted-tokens 1,3 --answer 999999",
       "vocabulary"},
  };
  for (const Bad& b : bad) {
    std::string log;
    EXPECT_NE(RunShell(base + b.args, &log), 0) << b.args;
    EXPECT_NE(log.find(b.says), std::string::npos) << b.args << "\n" << log;
  }
  // Layers without a backward (Qwen2-MoE's shared expert): refused by name,
  // nothing
  // written.
  std::string log;
  EXPECT_NE(RunShell(std::string(LOOM_BINARY) + " attribute --model " + shared +
                         "/tiny/qwen2_moe --clean-tokens 1,2 "
                         "--corrupted-tokens 1,3 --out " +
                         Path("moe"),
                     &log),
            0);
  EXPECT_NE(log.find("mixture-of-experts"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(Path("moe") + "/attribution.json"));
}

// --method ig: per-token integrated gradients whose sum is the metric's
// change from the baseline (completeness) on dense models (a mixture of
// experts' routing is piecewise constant along the path, so completeness
// does not hold there), the default A/B the prompt's argmax and runner-up;
// no corrupted prompt needed.
TEST_F(AttributeCliErrorsTest, IntegratedGradientsAreComplete) {
  const std::string shared = testing::SharedGoldenDir();
  if (shared.empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared goldens not found";
  for (const char* model : {"llama", "gemma2", "gpt_neox"}) {
    const std::string out = Path(std::string("ig_") + model);
    std::string log;
    ASSERT_EQ(RunShell(std::string(LOOM_BINARY) + " attribute --model " +
                           shared + "/tiny/" + model +
                           " --clean-tokens 115,483,139,330,406,320,38,90 "
                           "--method ig --steps 32 --quiet --out " +
                           out,
                       &log),
              0)
        << log;
    const nlohmann::json j = testing::ReadJson(out + "/attribution.json");
    ASSERT_EQ(j["ig"].size(), 8u);
    double sum = 0;
    for (double v : j["ig"]) sum += v;
    const double change =
        j["metric_input"].get<double>() - j["metric_baseline"].get<double>();
    EXPECT_NEAR(sum, change, 1e-4 + 1e-3 * std::fabs(change)) << model;
    EXPECT_NE(j["answer_token_ids"][0], j["answer_token_ids"][1]);
  }
  std::string log;
  EXPECT_NE(RunShell(std::string(LOOM_BINARY) + " attribute --model " + shared +
                         "/tiny/llama --clean-tokens 1,2 --method ig "
                         "--baseline-token 999999 --out " +
                         Path("bad"),
                     &log),
            0);
  EXPECT_NE(log.find("--baseline-token"), std::string::npos) << log;
}

}  // namespace
}  // namespace loom
