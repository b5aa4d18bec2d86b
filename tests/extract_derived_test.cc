// SAEs and lenses inside `loom extract` (src/eval/extract_derived.h), end to
// end through the CLI from Loom's own activations:
//   - every non-transcoder SAE golden (golden/sae) through --sae: the
//     HOOK.hook_sae_acts_pre / _acts_post / _recons / _error arrays and the
//     --sae-topk arrays within atol = rtol = 1e-4 of the goldens, the top-16
//     indices (int32 files) exact wherever the golden's gap decides;
//   - the logit lens goldens (llama, qwen3, gemma2, olmoe) and the tuned lens
//     through --lens: HOOK.hook_lens_logits within 1e-4, --lens-topk ids
//     exact where the gap decides, and the last layer's logit lens equal to
//     Loom's logits byte for byte;
//   - the read-only splice (the hooks and logits are the bytes of a run
//     without the SAE), selectors (last, pos, mean agree with all), and the
//     derived arrays' independence of the batch packing and --threads;
//   - refusals naming the option, the hook and both values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "src/eval/extract.h"
#include "src/eval/sae_dashboard.h"
#include "src/io/npy.h"
#include "src/io/safetensors.h"
#include "tests/golden_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string GoldenRoot(const char* what) {
  const std::string shared = testing::SharedGoldenDir();
  const std::string root = shared + "/" + what;
  return shared.empty() || !fs::exists(root) ? "" : root;
}

#define SKIP_WITHOUT(root, what)                                          \
  if ((root).empty())                                                     \
  GTEST_SKIP() << "SKIPPED LOUDLY: shared goldens (golden/" << (what)     \
               << ") not found"

class ExtractDerivedTest : public testing::TempDirTest {
 protected:
  // `loom extract` of the rows `jsonl` into Path(out); returns its exit code
  // (its output in *log).
  int Extract(const std::string& model, const std::string& jsonl,
              const std::string& out, const std::string& args,
              std::string* log) {
    WriteFile(out + ".jsonl", jsonl);
    const std::string cmd = std::string(LOOM_BINARY) + " extract --model " +
                            model + " --input " + Path(out + ".jsonl") +
                            " --out " + Path(out) +
                            " --precision f32 --quiet " + args;
    const int rc = testing::RunShell(cmd, log);
    *log = cmd + "\n" + *log;
    return rc;
  }
  NpyArray Read(const std::string& out, const std::string& file) {
    StatusOr<NpyArray> a = ReadNpy(Path(out) + "/" + file);
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    return a.ok() ? std::move(a).value() : NpyArray{};
  }
  static const float* F32(const NpyArray& a) {
    return reinterpret_cast<const float*>(a.data.data());
  }
  static const int32_t* I32(const NpyArray& a) {
    return reinterpret_cast<const int32_t*>(a.data.data());
  }
};

// The rows of a golden case's inputs (all but `skip`), and their names.
std::string Rows(const nlohmann::json& m, std::vector<std::string>* names,
                 const std::string& skip = "") {
  std::string jsonl;
  for (const auto& [input, info] : m["inputs"].items()) {
    if (input == skip) continue;
    names->push_back(input);
    jsonl += nlohmann::json{{"tokens", info["input_ids"]}}.dump() + "\n";
  }
  return jsonl;
}

void ExpectNear(const float* got, const std::vector<float>& want,
                const std::string& what) {
  const testing::CompareResult cr = testing::Compare(
      got, want.data(), static_cast<int64_t>(want.size()), 1e-4, 1e-4);
  EXPECT_TRUE(cr.ok) << what << ": " << cr.message;
}

// Ids equal wherever the golden's gaps on both sides of a rank are >= 1e-4.
void ExpectIds(const int32_t* got, const std::vector<int32_t>& want,
               const std::vector<float>& gap, int64_t k,
               const std::string& what) {
  for (size_t i = 0; i < want.size(); ++i) {
    const size_t r = i % static_cast<size_t>(k);
    if (gap[i] >= 1e-4f && (r == 0 || gap[i - 1] >= 1e-4f))
      EXPECT_EQ(got[i], want[i]) << what << " element " << i;
  }
}

TEST_F(ExtractDerivedTest, SaeInTheForwardMatchesTheGoldens) {
  const std::string root = GoldenRoot("sae");
  SKIP_WITHOUT(root, "sae");
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string dir = entry.path().string();
    if (!fs::exists(dir + "/manifest.json")) continue;
    const nlohmann::json m = testing::ReadJson(dir + "/manifest.json");
    if (m["architecture"].get<std::string>().find("transcoder") !=
        std::string::npos)
      continue;  // reads the pre-gain norm: refused below
    const std::string name = m["case"], hook = m["hook"];
    SCOPED_TRACE(name);
    ++checked;
    std::vector<std::string> inputs;
    const std::string jsonl = Rows(m, &inputs, "steer_all");
    const std::string h = hook + ".hook_sae_";
    std::string log;
    ASSERT_EQ(Extract(testing::SharedGoldenDir() + "/tiny/" +
                          m["model"].get<std::string>(),
                      jsonl, name,
                      "--select all --sae " + dir + "/" +
                          m["sae_dir"].get<std::string>() +
                          " --sae-topk 16 --hooks " + h + "acts_pre," + h +
                          "acts_post," + h + "recons," + h + "error",
                      &log),
              0)
        << log;
    const NpyArray pre = Read(name, h + "acts_pre.all.npy");
    const NpyArray post = Read(name, h + "acts_post.all.npy");
    const NpyArray recons = Read(name, h + "recons.all.npy");
    const NpyArray error = Read(name, h + "error.all.npy");
    const NpyArray ids = Read(name, h + "acts_post.topk_indices.all.npy");
    const NpyArray values = Read(name, h + "acts_post.topk_values.all.npy");
    ASSERT_EQ(ids.header.dtype, DType::kI32);
    auto golden = testing::GoldenFile::Open(dir + "/golden.safetensors");
    const int64_t d_sae = m["dims"]["d_sae"], d_out = m["dims"]["d_out"];
    int64_t row0 = 0;
    for (const std::string& input : inputs) {
      SCOPED_TRACE(input);
      Shape xs;
      golden->F32(input + ".x", &xs);
      ExpectNear(F32(pre) + row0 * d_sae, golden->F32(input + ".hidden_pre"),
                 "hidden_pre");
      ExpectNear(F32(post) + row0 * d_sae,
                 golden->F32(input + ".feature_acts"), "feature_acts");
      ExpectNear(F32(recons) + row0 * d_out,
                 golden->F32(input + ".hook_sae_recons"), "hook_sae_recons");
      ExpectNear(F32(error) + row0 * d_out, golden->F32(input + ".error"),
                 "error");
      ExpectNear(F32(values) + row0 * 16, golden->F32(input + ".topk_values"),
                 "topk_values");
      ExpectIds(I32(ids) + row0 * 16, golden->Ids(input + ".topk_indices"),
                golden->F32(input + ".topk_gap"), 16, "topk_indices");
      row0 += xs[0];
    }
    EXPECT_EQ(row0, post.header.shape[0]);
  }
  EXPECT_EQ(checked, 6);
}

TEST_F(ExtractDerivedTest, LensInTheForwardMatchesTheGoldens) {
  const std::string root = GoldenRoot("lens");
  SKIP_WITHOUT(root, "lens");
  for (const char* name :
       {"llama", "qwen3", "gemma2", "olmoe", "llama__tuned_lens"}) {
    SCOPED_TRACE(name);
    const std::string dir = root + "/" + name;
    const nlohmann::json m = testing::ReadJson(dir + "/manifest.json");
    const bool tuned = m["kind"] == "tuned_lens";
    std::vector<std::string> seqs;
    const std::string jsonl = Rows(m, &seqs);
    std::string hooks = "logits";
    for (const auto& l : m["layers"])
      hooks += "," + l.get<std::string>() + ".hook_lens_logits";
    std::string log;
    ASSERT_EQ(Extract(testing::SharedGoldenDir() + "/tiny/" +
                          m["model"].get<std::string>(),
                      jsonl, name,
                      std::string("--select all --lens-topk 10 --lens ") +
                          (tuned ? "tuned:" + dir : "logit") + " --hooks " +
                          hooks,
                      &log),
              0)
        << log;
    auto golden = testing::GoldenFile::Open(dir + "/golden.safetensors");
    const NpyArray logits = Read(name, "logits.all.npy");
    const int64_t V = logits.header.shape[1];
    const int64_t n = static_cast<int64_t>(m["layers"].size());
    for (int64_t l = 0; l < n; ++l) {
      const std::string hook = m["layers"][l];
      SCOPED_TRACE(hook);
      const NpyArray lens = Read(name, hook + ".hook_lens_logits.all.npy");
      const NpyArray ids = Read(name, hook + ".lens_topk_ids.all.npy");
      const NpyArray values = Read(name, hook + ".lens_topk_values.all.npy");
      ASSERT_EQ(ids.header.dtype, DType::kI32);
      if (!tuned && l == n - 1) {
        ASSERT_EQ(lens.data.size(), logits.data.size());
        EXPECT_EQ(0, std::memcmp(lens.data.data(), logits.data.data(),
                                 logits.data.size()))
            << "the last layer's logit lens is not Loom's logits";
      }
      int64_t row0 = 0;
      for (const std::string& seq : seqs) {
        Shape rs;
        golden->F32(seq + ".resid", &rs);
        const int64_t T = rs[1];
        const std::vector<float> all =
            golden->F32(seq + (tuned ? ".logits_tuned" : ".logits_lens"));
        const std::vector<float> want(all.begin() + l * T * V,
                                      all.begin() + (l + 1) * T * V);
        ExpectNear(F32(lens) + row0 * V, want, seq + " logits");
        const std::vector<float> top = golden->F32(seq + ".top10_logits");
        ExpectNear(F32(values) + row0 * 10,
                   {top.begin() + l * T * 10, top.begin() + (l + 1) * T * 10},
                   seq + " top10 logits");
        const std::vector<int32_t> gid = golden->Ids(seq + ".top10_ids");
        const std::vector<float> gap = golden->F32(seq + ".top10_gap");
        ExpectIds(I32(ids) + row0 * 10,
                  {gid.begin() + l * T * 10, gid.begin() + (l + 1) * T * 10},
                  {gap.begin() + l * T * 10, gap.begin() + (l + 1) * T * 10},
                  10, seq + " top10 ids");
        row0 += T;
      }
      EXPECT_EQ(row0, lens.header.shape[0]);
    }
  }
}

// Three prompts of different lengths through the llama standard SAE and the
// logit lens.
class ExtractDerivedSpliceTest : public ExtractDerivedTest {
 protected:
  void SetUp() override {
    ExtractDerivedTest::SetUp();
    root_ = GoldenRoot("sae");
    if (root_.empty()) return;
    model_ = testing::SharedGoldenDir() + "/tiny/llama";
    sae_ = root_ + "/llama__saelens_standard_relu/blocks.1.hook_resid_post";
  }
  std::string root_, model_, sae_;
  const std::string jsonl_ =
      "{\"tokens\":[499,240,77,154,197,405,448]}\n"
      "{\"tokens\":[278,209,81,210,14,220,68,174,432,189,145,425,222]}\n"
      "{\"tokens\":[147,140,48]}\n";
  const std::string hook_ = "blocks.1.hook_resid_post";
};

TEST_F(ExtractDerivedSpliceTest, ReadOnlyAndIndependentOfBatchAndThreads) {
  SKIP_WITHOUT(root_, "sae");
  std::string log;
  const std::string plain = "--select all --select last --hooks " + hook_ +
                            ",blocks.2.hook_resid_post,logits";
  ASSERT_EQ(Extract(model_, jsonl_, "plain", plain, &log), 0) << log;
  const std::string derived = hook_ + ".hook_sae_acts_post," + hook_ +
                              ".hook_sae_error," + hook_ + ".hook_lens_logits";
  const std::string with = plain + "," + derived + " --sae " + sae_ +
                           " --sae-topk 8 --lens logit --lens-topk 5";
  ASSERT_EQ(Extract(model_, jsonl_, "with", with, &log), 0) << log;
  ASSERT_EQ(Extract(model_, jsonl_, "small",
                    with + " --batch-tokens 16 --threads 1", &log),
            0)
      << log;
  for (const std::string sel : {"all", "last"}) {
    for (const std::string h : {hook_, std::string("blocks.2.hook_resid_post"),
                                std::string("logits")}) {
      const std::string f = h + "." + sel + ".npy";
      EXPECT_EQ(Read("plain", f).data, Read("with", f).data) << f;
    }
    for (const std::string d :
         {".hook_sae_acts_post", ".hook_sae_error", ".hook_lens_logits",
          ".hook_sae_acts_post.topk_indices", ".hook_sae_acts_post.topk_values",
          ".lens_topk_ids", ".lens_topk_values"}) {
      const std::string f = hook_ + d + "." + sel + ".npy";
      const NpyArray a = Read("with", f);
      EXPECT_FALSE(a.data.empty()) << f;
      EXPECT_EQ(a.data, Read("small", f).data) << f << " batch / threads";
    }
  }
  // `last` holds the last row of each prompt's `all` rows.
  const NpyArray all = Read("with", hook_ + ".hook_sae_acts_post.all.npy");
  const NpyArray last = Read("with", hook_ + ".hook_sae_acts_post.last.npy");
  const int64_t w = all.header.shape[1];
  const int64_t ends[] = {7, 20, 23};
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(0, std::memcmp(F32(last) + r * w, F32(all) + (ends[r] - 1) * w,
                             w * sizeof(float)))
        << "prompt " << r;
}

TEST_F(ExtractDerivedSpliceTest, MeanAndPositionsOfDerivedOutputs) {
  SKIP_WITHOUT(root_, "sae");
  std::string log;
  const std::string h = hook_ + ".hook_sae_recons";
  ASSERT_EQ(Extract(model_, jsonl_, "sel",
                    "--select all --select mean --select pos:0,-1 --sae " +
                        sae_ + " --hooks " + h,
                    &log),
            0)
      << log;
  const NpyArray all = Read("sel", h + ".all.npy");
  const NpyArray mean = Read("sel", h + ".mean.npy");
  const NpyArray pos = Read("sel", h + ".pos_0_-1.npy");
  const int64_t w = all.header.shape[1];
  const int64_t begin[] = {0, 7, 20}, end[] = {7, 20, 23};
  for (int r = 0; r < 3; ++r) {
    for (int64_t j = 0; j < w; ++j) {
      double sum = 0;
      for (int64_t t = begin[r]; t < end[r]; ++t) sum += F32(all)[t * w + j];
      EXPECT_EQ(F32(mean)[r * w + j],
                static_cast<float>(sum / static_cast<double>(end[r] - begin[r])))
          << "prompt " << r << " column " << j;
    }
    EXPECT_EQ(F32(pos)[(2 * r) * w], F32(all)[begin[r] * w]);
    EXPECT_EQ(F32(pos)[(2 * r + 1) * w + 3], F32(all)[(end[r] - 1) * w + 3]);
  }
}

TEST_F(ExtractDerivedSpliceTest, RefusalsNameTheOptionAndTheValues) {
  SKIP_WITHOUT(root_, "sae");
  const std::string transcoder =
      root_ + "/llama__saelens_transcoder/" +
      testing::ReadJson(root_ + "/llama__saelens_transcoder/manifest.json")
          ["sae_dir"]
              .get<std::string>();
  const struct {
    std::string args, message;
  } cases[] = {
      {"--hooks " + hook_ + ".hook_sae_acts_post",
       "no --sae reads blocks.1.hook_resid_post (no --sae given)"},
      {"--hooks " + hook_ + " --sae-topk 4", "--sae-topk needs an --sae"},
      {"--hooks " + hook_ + " --lens-topk 4", "--lens-topk needs --lens"},
      {"--hooks " + hook_ + " --lens bogus",
       "--lens 'bogus': expected logit or tuned:FILE"},
      {"--hooks blocks.0.attn.hook_q.hook_lens_logits --lens logit",
       "a lens reads a residual stream"},
      {"--hooks " + hook_ + ".hook_lens_logits --lens logit --lens-topk 9999",
       "--lens-topk: 9999 is outside [0, 512] (the vocabulary)"},
      {"--hooks " + hook_ + " --sae " + root_ +
           "/qwen3_moe__sparsify_topk/layers.1@blocks.1.mlp.hook_post",
       "reads blocks.1.mlp.hook_post of width 128, the SAE's d_in is 64"},
      {"--hooks " + hook_ + " --sae " + sae_ + "@blocks.0.hook_resid_post",
       "names hook blocks.0.hook_resid_post, but its config reads "
       "blocks.1.hook_resid_post"},
      {"--hooks " + hook_ + " --sae " + sae_,
       "nothing is computed from it"},
      {"--hooks " + hook_ + " --lens logit", "--lens: nothing is computed"},
      {"--hooks " + hook_ + " --sae " + sae_ + " --sae-topk 4 --select mean",
       "holds indices, which have no mean"},
      {"--hooks " + hook_ + " --sae " + sae_ + " --sae-topk 300",
       "--sae-topk 300 exceeds"},
      {"--hooks " + hook_ + ".hook_sae_acts_post --sae " + sae_ + " --sae " +
           sae_,
       "is already read by --sae"},
      {"--hooks blocks.1.hook_mlp_out --sae " + transcoder,
       "reads the norm's pre-gain value"},
  };
  for (const auto& c : cases) {
    std::string log;
    EXPECT_EQ(Extract(model_, jsonl_, "bad", c.args, &log), 1) << log;
    EXPECT_NE(log.find(c.message), std::string::npos)
        << "expected: " << c.message << "\n" << log;
    EXPECT_FALSE(fs::exists(Path("bad/manifest.json"))) << c.args;
  }
}

// Feature edits and the reconstruction splice (interventions through an SAE
// at its hook): feature_add is the decoder-row `add` of the same SAE, byte
// for byte (no normalization: the decoded factor is 1); sae_reconstruct
// writes the SAE's reconstruction (here = HOOK.hook_sae_recons of the
// unedited run, bytes); feature_ablate / feature_clamp move each row by
// (v - f) W_dec[f], the product rounded to f32, then added; later layers see
// the edit. Refusals name the field.
TEST_F(ExtractDerivedSpliceTest, FeatureEditsAndTheReconstructionSplice) {
  SKIP_WITHOUT(root_, "sae");
  auto edit = [&](const std::string& name, const std::string& fields) {
    WriteFile(name + ".json", "{\"interventions\": [{\"sae\": \"" + sae_ +
                                  "\", \"positions\": \"all\", " + fields +
                                  "}]}");
    return " --intervene " + Path(name + ".json");
  };
  const std::string hooks =
      "--select all --hooks " + hook_ + ",blocks.2.hook_resid_post,logits";
  std::string log;
  ASSERT_EQ(Extract(model_, jsonl_, "base",
                    hooks + "," + hook_ + ".hook_sae_recons," + hook_ +
                        ".hook_sae_acts_post --sae " + sae_,
                    &log),
            0)
      << log;
  const struct {
    std::string name, fields;
  } runs[] = {
      {"fadd", R"("mode": "feature_add", "feature": 37, "value": 8.0)"},
      {"steer", R"("mode": "add", "feature": 37, "scale": 8.0)"},
      {"recon", R"("mode": "sae_reconstruct")"},
      {"ablate", R"("mode": "feature_ablate", "feature": 37)"},
      {"clamp", R"("mode": "feature_clamp", "feature": 37, "value": 2.5)"},
  };
  for (const auto& r : runs)
    ASSERT_EQ(Extract(model_, jsonl_, r.name, hooks + edit(r.name, r.fields),
                      &log),
              0)
        << log;
  const std::string all = hook_ + ".all.npy";
  for (const std::string f : {all, std::string("logits.all.npy")})
    EXPECT_EQ(Read("fadd", f).data, Read("steer", f).data) << f;
  EXPECT_EQ(Read("recon", all).data,
            Read("base", hook_ + ".hook_sae_recons.all.npy").data);
  EXPECT_NE(Read("recon", "logits.all.npy").data,
            Read("base", "logits.all.npy").data);
  // The decoder row of feature 37 from the SAE's own file.
  const NpyArray x = Read("base", all);
  const NpyArray acts = Read("base", hook_ + ".hook_sae_acts_post.all.npy");
  const int64_t rows = x.header.shape[0], d = x.header.shape[1];
  const int64_t d_sae = acts.header.shape[1];
  WriteFile("row.json",
            "{\"interventions\": [{\"mode\": \"add\", \"sae\": \"" + sae_ +
                "\", \"feature\": 37, \"scale\": 1.0, \"positions\": "
                "\"all\"}]}");
  ASSERT_EQ(Extract(model_, jsonl_, "unit",
                    "--select all --hooks " + hook_ + " --intervene " +
                        Path("row.json"),
                    &log),
            0)
      << log;
  const NpyArray unit = Read("unit", all);  // x + 1 * W_dec[37]
  std::vector<float> w(static_cast<size_t>(d));
  for (int64_t j = 0; j < d; ++j) w[j] = F32(unit)[j] - F32(x)[j];
  for (const char* name : {"ablate", "clamp"}) {
    const NpyArray got = Read(name, all);
    for (int64_t t = 0; t < rows; ++t) {
      const float f = F32(acts)[t * d_sae + 37];
      const float c = std::string(name) == "ablate" ? -f : 2.5f - f;
      for (int64_t j = 0; j < d; j += 7) {
        // W_dec[37][j] recovered from (x + w) - x: exact only where that
        // difference is; compare within an ulp of the row's values.
        const float want = F32(x)[t * d + j] + c * w[j];
        EXPECT_NEAR(F32(got)[t * d + j], want,
                    1e-6f * (1 + std::fabs(want)))
            << name << " row " << t << " column " << j;
      }
    }
  }
  // Refusals.
  const struct {
    std::string fields, message;
  } bad[] = {
      {R"("mode": "feature_add", "feature": 37)",
       "interventions[0].value: missing (feature_add needs it)"},
      {R"("mode": "feature_clamp", "feature": 999, "value": 1)",
       "interventions[0].feature: 999 is not a feature of"},
      {R"("mode": "feature_ablate", "feature": 1, "value": 1)",
       "mode \"feature_ablate\" takes no value"},
      {R"("mode": "sae_reconstruct", "feature": 1)",
       "mode \"sae_reconstruct\" takes no feature"},
      {R"("mode": "feature_ablate", "feature": 1, "hook": "blocks.0.hook_resid_post")",
       "interventions[0].hook: 'blocks.0.hook_resid_post', but"},
  };
  for (const auto& b : bad) {
    EXPECT_EQ(Extract(model_, jsonl_, "bad", hooks + edit("bad", b.fields),
                      &log),
              1)
        << log;
    EXPECT_NE(log.find(b.message), std::string::npos)
        << "expected: " << b.message << "\n" << log;
  }
}

// --sae-dashboard N: count, max, sum and the top-N (row, position) of every
// feature over the job, equal to what the job's own acts_post rows give;
// the same bytes at another batch packing, --threads and commit size, and
// after an interrupted job is resumed.
TEST_F(ExtractDerivedSpliceTest, DashboardsAreExactAndResumable) {
  SKIP_WITHOUT(root_, "sae");
  const std::string h = hook_ + ".hook_sae_acts_post";
  const std::string file = h + ".dashboard.safetensors";
  const std::string args = "--select all --sae " + sae_ +
                           " --sae-dashboard 4 --hooks " + h;
  std::string log;
  ASSERT_EQ(Extract(model_, jsonl_, "a", args, &log), 0) << log;
  ASSERT_EQ(Extract(model_, jsonl_, "b",
                    args + " --batch-tokens 16 --threads 1 --commit-every 1",
                    &log),
            0)
      << log;
  EXPECT_EQ(testing::Slurp(Path("a/" + file)), testing::Slurp(Path("b/" + file)));
  // Interrupted after one commit of one row, then resumed.
  ExtractOptions o;
  o.model_dir = model_;
  o.input_path = Path("a.jsonl");
  o.out_dir = Path("c");
  o.hooks = {h};
  o.selectors = {"all"};
  o.analysis.sae = {sae_};
  o.analysis.sae_dashboard = 4;
  o.commit_every = 1;
  o.stop_after_commits = 1;
  auto first = RunExtract(o);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  o.stop_after_commits = 0;
  o.resume = true;
  auto rest = RunExtract(o);
  ASSERT_TRUE(rest.ok()) << rest.status().ToString();
  EXPECT_EQ(testing::Slurp(Path("a/" + file)), testing::Slurp(Path("c/" + file)));
  // Against the acts themselves.
  const NpyArray acts = Read("a", h + ".all.npy");
  const int64_t rows = acts.header.shape[0], F = acts.header.shape[1];
  const int64_t begin[] = {0, 7, 20, 23};
  auto d = SafetensorsFile::Open(Path("a/" + file));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  auto view = [&](const char* name) { return (*d)->View(*(*d)->Find(name)); };
  const int64_t* count = view("count").as<int64_t>();
  const float* max = view("max").as<float>();
  const float* top = view("top_values").as<float>();
  const int64_t* top_rows = view("top_rows").as<int64_t>();
  const int64_t* top_pos = view("top_positions").as<int64_t>();
  int64_t fired = 0;
  for (int64_t f = 0; f < F; ++f) {
    std::vector<std::tuple<float, int64_t, int64_t>> all;
    float m = 0;
    for (int64_t t = 0; t < rows; ++t) {
      const float a = F32(acts)[t * F + f];
      if (!(a > 0)) continue;
      const int64_t r = t < 7 ? 0 : t < 20 ? 1 : 2;
      all.emplace_back(-a, r, t - begin[r]);
      m = std::max(m, a);
    }
    std::sort(all.begin(), all.end());
    ASSERT_EQ(count[f], static_cast<int64_t>(all.size())) << f;
    EXPECT_EQ(max[f], m) << f;
    for (int64_t k = 0; k < 4; ++k) {
      if (k < static_cast<int64_t>(all.size())) {
        EXPECT_EQ(top[f * 4 + k], -std::get<0>(all[k])) << f;
        EXPECT_EQ(top_rows[f * 4 + k], std::get<1>(all[k])) << f;
        EXPECT_EQ(top_pos[f * 4 + k], std::get<2>(all[k])) << f;
      } else {
        EXPECT_EQ(top_rows[f * 4 + k], -1) << f;
      }
    }
    fired += count[f] > 0;
  }
  EXPECT_GT(fired, F / 4);
}

// A kill between a dashboard's write and the manifest's commit: the file
// holds the uncommitted rows, its .prev the committed ones, which --resume
// reads (and restores under the file's name); any other count is DataLoss.
TEST_F(ExtractDerivedTest, DashboardResumesFromThePreviousCommit) {
  const float one[] = {0.5f, 0.0f, 2.0f}, two[] = {1.5f, 3.0f, 0.0f};
  SaeDashboard d(3, 2);
  d.Add(0, 0, one);
  const std::string path = Path("d.safetensors");
  ASSERT_TRUE(d.Write(path, 1).ok());
  const std::string committed = testing::Slurp(path);
  d.Add(1, 4, two);
  ASSERT_TRUE(d.Write(path, 2).ok());  // the manifest still says 1 row
  SaeDashboard r(3, 2);
  ASSERT_TRUE(r.Load(path, 1, /*check_only=*/true).ok());
  EXPECT_NE(testing::Slurp(path), committed);
  ASSERT_TRUE(r.Load(path, 1).ok());
  EXPECT_EQ(testing::Slurp(path), committed);
  ASSERT_TRUE(r.Write(path, 1).ok());
  EXPECT_EQ(testing::Slurp(path), committed);
  const Status lost = r.Load(path, 3);
  EXPECT_EQ(lost.code(), StatusCode::kDataLoss) << lost.ToString();
  EXPECT_NE(lost.message().find("holds no dashboard of the 3 committed rows"),
            std::string::npos)
      << lost.ToString();
}

}  // namespace
}  // namespace loom
