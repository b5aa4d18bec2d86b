// Gradient capture in `loom extract` (--grad-of, HOOK.grad; issue 38), end
// to end through the CLI against the shared attribution goldens (golden/
// attribution/README.md: HF transformers + torch autograd, f32):
//   - every golden hook's d metric / d activation on the corrupted prompt, for
//     logit-diff and logprob, within the README's grad rule, and an
//     activation hook captured beside them within its act rule;
//   - selectors: last and mean agree with all; a row's gradients are the
//     same bytes alone or beside another row, at any --threads;
//   - --resume with another metric is refused by name; --show-plan states the
//     backward's bytes;
//   - bad requests exit non-zero naming the flag, nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "src/io/npy.h"
#include "tests/golden_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::RunShell;

std::string Ids(const nlohmann::json& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + std::to_string(int{x});
  return s;
}

class ExtractGradTest : public testing::TempDirTest {
 protected:
  // `loom extract` of `jsonl` into Path(out) at f32; its exit code, its
  // output in *log.
  int Extract(const std::string& model, const std::string& jsonl,
              const std::string& out, const std::string& args,
              std::string* log) {
    WriteFile(out + ".jsonl", jsonl);
    const std::string cmd = std::string(LOOM_BINARY) + " extract --model " +
                            model + " --input " + Path(out + ".jsonl") +
                            " --out " + Path(out) + " --add-bos no --quiet " +
                            args;
    const int rc = RunShell(cmd, log);
    *log = cmd + "\n" + *log;
    return rc;
  }
  std::vector<float> Read(const std::string& out, const std::string& file,
                          std::vector<int64_t>* shape = nullptr) {
    StatusOr<NpyArray> a = ReadNpy(Path(out) + "/" + file);
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    if (!a.ok()) return {};
    EXPECT_EQ(a->header.dtype, DType::kF32) << file;
    if (shape != nullptr) *shape = a->header.shape;
    std::vector<float> v(a->data.size() / 4);
    std::memcpy(v.data(), a->data.data(), v.size() * 4);
    return v;
  }
};

void ExpectRule(const std::vector<float>& got, const std::vector<float>& want,
                double atol_abs, double atol_rel, double rtol,
                const std::string& what) {
  testing::ExpectWithinAttributionRule(got, want, atol_abs, atol_rel, rtol,
                                       what);
}

std::string GoldenOrEmpty() {
  const std::string shared = testing::SharedGoldenDir();
  return shared.empty() || !fs::exists(shared + "/attribution") ? "" : shared;
}

class ExtractGradGoldenTest
    : public ExtractGradTest,
      public ::testing::WithParamInterface<std::string> {};

TEST_P(ExtractGradGoldenTest, GradientsMatchTheGoldens) {
  const std::string shared = GoldenOrEmpty();
  if (shared.empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared attribution goldens not found";
  const std::string dir = shared + "/attribution/" + GetParam();
  const nlohmann::json m = testing::ReadJson(dir + "/manifest.json");
  auto golden = testing::GoldenFile::Open(dir + "/golden.safetensors");
  std::vector<std::string> hooks = m["hooks"];
  for (const auto& e : m["extra_hooks"]) hooks.push_back(e);
  std::string list;
  for (const std::string& h : hooks)
    list += (list.empty() ? "" : ",") + h + ".grad";
  const std::string act = "blocks.1.hook_resid_post";
  list += "," + act;
  const std::string model = shared + "/tiny/" + std::string(m["model"]);
  const std::string row = "{\"id\": \"corrupted\", \"tokens\": [" +
                          Ids(m["corrupted_input_ids"]) + "]}\n";
  const int64_t answer = m["answer_token_ids"]["answer"];
  const int64_t wrong = m["answer_token_ids"]["wrong"];
  for (const bool logprob : {false, true}) {
    const std::string out = logprob ? "lp" : "ld";
    const std::string metric =
        logprob ? "--grad-of logprob"
                : "--grad-of logit-diff --answer " + std::to_string(answer) +
                      " --wrong " + std::to_string(wrong);
    std::string log;
    ASSERT_EQ(Extract(model, row, out,
                      "--hooks " + list + " --select all " + metric, &log),
              0)
        << log;
    const std::string p = logprob ? "seq_logprob." : "";
    for (const std::string& h : hooks) {
      SCOPED_TRACE(GetParam() + " " + p + "grad." + h);
      std::vector<int64_t> shape;
      const std::vector<float> got = Read(out, h + ".grad.all.npy", &shape);
      const std::vector<float> want = golden->F32(p + "grad." + h);
      ASSERT_EQ(shape.size(), 2u);
      EXPECT_EQ(shape[0], int64_t{m["T"]});
      ExpectRule(got, want, 1e-7, 1e-4, 1e-3, h);
    }
    ExpectRule(Read(out, act + ".all.npy"), golden->F32("act_corrupted." + act),
               1e-4, 0, 1e-4, act);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ExtractGradGoldenTest,
                         ::testing::Values("llama__single_diff",
                                           "gemma2__two_diffs",
                                           "gpt_neox__single_diff",
                                           "qwen3_moe__two_diffs"));

// Selectors, batch and thread invariance, resume and the plan on one model.
TEST_F(ExtractGradTest, SelectorsRowsThreadsResumeAndPlan) {
  const std::string shared = GoldenOrEmpty();
  if (shared.empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared attribution goldens not found";
  const std::string model = shared + "/tiny/llama";
  const std::string a = "{\"id\": 0, \"tokens\": [5, 17, 99, 3, 250, 41]}\n";
  const std::string b =
      "{\"id\": 1, \"tokens\": [7, 8, 9, 10, 11, 12, 13, 14, 15]}\n";
  const std::string hooks =
      "--hooks blocks.0.hook_resid_pre.grad,blocks.1.attn.hook_z.grad "
      "--grad-of logit-diff --answer 11 --wrong 12 ";
  std::string log;
  ASSERT_EQ(Extract(model, a, "alone",
                    hooks + "--select all --select last --select mean", &log),
            0)
      << log;
  ASSERT_EQ(
      Extract(model, b + a, "pair",
              hooks + "--select all --select last --select mean --threads 1 "
                      "--commit-every 1",
              &log),
      0)
      << log;
  for (const char* h : {"blocks.0.hook_resid_pre", "blocks.1.attn.hook_z"}) {
    SCOPED_TRACE(h);
    const std::string g = std::string(h) + ".grad.";
    std::vector<int64_t> shape;
    const std::vector<float> all = Read("alone", g + "all.npy", &shape);
    ASSERT_EQ(shape.size(), 2u);
    const int64_t T = shape[0], W = shape[1];
    ASSERT_EQ(T, 6);
    const std::vector<float> last = Read("alone", g + "last.npy");
    const std::vector<float> mean = Read("alone", g + "mean.npy");
    ASSERT_EQ(last.size(), static_cast<size_t>(W));
    for (int64_t j = 0; j < W; ++j) {
      EXPECT_EQ(last[j], all[(T - 1) * W + j]);
      double s = 0;
      for (int64_t t = 0; t < T; ++t) s += all[t * W + j];
      EXPECT_NEAR(mean[j], s / T, 1e-6 * (1 + std::fabs(s / T)));
    }
    // Row 1 of the pair is the row run alone: the same bytes.
    const std::vector<float> pair = Read("pair", g + "all.npy");
    ASSERT_EQ(pair.size(), static_cast<size_t>((9 + T) * W));
    EXPECT_EQ(std::memcmp(pair.data() + 9 * W, all.data(), all.size() * 4), 0);
  }
  // Another metric on --resume: refused by name.
  EXPECT_NE(
      Extract(
          model, b + a, "pair",
          "--hooks blocks.0.hook_resid_pre.grad,blocks.1.attn."
          "hook_z.grad --grad-of logit-diff --answer 11 --wrong 13 "
          "--select all --select last --select mean --commit-every 1 --resume",
          &log),
      0);
  EXPECT_NE(log.find("grad_of"), std::string::npos) << log;
  // The plan states the backward's buffers.
  ASSERT_EQ(
      Extract(model, a, "plan", hooks + "--select last --show-plan", &log), 0)
      << log;
  EXPECT_NE(log.find("backward: "), std::string::npos) << log;
}

TEST_F(ExtractGradTest, BadRequestsExitNonZeroNamingTheFlag) {
  const std::string shared = GoldenOrEmpty();
  if (shared.empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared attribution goldens not found";
  const std::string model = shared + "/tiny/llama";
  const std::string row = "{\"id\": 0, \"tokens\": [5, 17, 99]}\n";
  struct Bad {
    std::string args, says;
  };
  const Bad bad[] = {
      {"--hooks blocks.0.hook_resid_pre.grad", "needs --grad-of"},
      {"--hooks blocks.0.hook_resid_pre --grad-of logprob",
       "no gradient is asked"},
      {"--hooks blocks.0.hook_resid_pre.grad --grad-of logit-diff",
       "--answer A and --wrong B"},
      {"--hooks blocks.0.hook_resid_pre.grad --grad-of kl", "--grad-of: 'kl'"},
      {"--hooks blocks.0.hook_resid_pre.grad --grad-of logprob --answer 3",
       "takes no answer"},
      {"--hooks blocks.0.hook_resid_pre --answer 3", "only with --grad-of"},
      {"--hooks blocks.0.attn.hook_pattern.grad --grad-of logprob",
       "has no gradient"},
      {"--hooks blocks.0.hook_resid_pre.grad --grad-of logprob --precision "
       "bf16",
       "--precision f32"},
      {"--hooks blocks.0.hook_resid_pre.grad --grad-of logprob "
       "--streaming-chunk-size 2",
       "--streaming-chunk-size"},
      {"--hooks blocks.0.hook_resid_pre.grad --grad-of logit-diff --answer "
       "999999 --wrong 2",
       "vocabulary"},
  };
  for (const Bad& x : bad) {
    std::string log;
    EXPECT_NE(Extract(model, row, "bad", x.args, &log), 0) << log;
    EXPECT_NE(log.find(x.says), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(Path("bad") + "/manifest.json")) << log;
  }
}

}  // namespace
}  // namespace loom
