// Lenses against the shared lens goldens (golden/lens/README.md): the logit
// lens on llama, qwen3, gemma2 (final softcap) and olmoe, and a tuned lens on
// llama, given HF's residual streams (`<seq>.resid`): logits, translated
// residuals and top-10 logits within the README's float32 tolerance (1e-5 of
// the tensor's largest magnitude + 1e-6), top-10 ids exactly. End to end
// from Loom's own residuals (`loom extract`): atol/rtol 1e-4, ids exact where
// the golden's gap decides the order; the logit lens of the last layer's
// hook_resid_post equals Loom's own logits bit for bit. Also: rows do not
// depend on the chunking or the rows beside them, and hostile tuned-lens
// files are refused naming the file and the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "src/eval/lens.h"
#include "src/io/npy.h"
#include "src/io/safetensors_writer.h"
#include "src/model/lens.h"
#include "src/runtime/model.h"
#include "tests/golden_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string LensRoot() {
  const std::string shared = testing::SharedGoldenDir();
  return shared.empty() || !fs::exists(shared + "/lens") ? ""
                                                         : shared + "/lens";
}

#define SKIP_WITHOUT_LENS_GOLDENS(root)                                    \
  if ((root).empty())                                                      \
  GTEST_SKIP() << "SKIPPED LOUDLY: shared lens goldens (golden/lens) not " \
                  "found"

constexpr int64_t kTopK = 10;

struct LensRun {
  std::vector<float> logits, translated, topk_logits;
  std::vector<int32_t> topk_ids;
};

LensRun RunLens(eval::Lens& lens, const HookPoint& hook, const float* resid,
                int64_t rows, int64_t hidden) {
  LensRun r;
  r.logits.resize(rows * lens.vocab());
  r.translated.resize(rows * hidden);
  r.topk_logits.resize(rows * kTopK);
  r.topk_ids.resize(rows * kTopK);
  eval::LensOutputs out;
  out.topk = kTopK;
  out.topk_ids = r.topk_ids.data();
  out.topk_logits = r.topk_logits.data();
  out.logits = r.logits.data();
  out.translated = r.translated.data();
  const Status s = lens.Run(hook, resid, rows, out);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return r;
}

HookPoint Hook(const std::string& name, int64_t num_layers) {
  auto h = ParseHookPattern(name, num_layers);
  EXPECT_TRUE(h.ok() && h->size() == 1) << name;
  return h.ok() && !h->empty() ? h->front() : HookPoint{};
}

// |got - want| <= 1e-5 max|want| + 1e-6 (the README's given-input bound).
void ExpectNear(const float* got, const float* want, int64_t n,
                const std::string& what) {
  float max_abs = 0;
  for (int64_t i = 0; i < n; ++i)
    max_abs = std::max(max_abs, std::fabs(want[i]));
  const double tol = 1e-5 * max_abs + 1e-6;
  for (int64_t i = 0; i < n; ++i)
    ASSERT_LE(std::fabs(got[i] - want[i]), tol)
        << what << " element " << i << ": " << got[i] << " vs " << want[i];
}

// Top-k ids equal wherever the golden's gaps decide the rank (the gap to the
// next one, and to the previous one, >= `decided`).
void ExpectIds(const int32_t* got, const int32_t* want, const float* gap,
               int64_t rows, float decided, const std::string& what) {
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t k = 0; k < kTopK; ++k) {
      const int64_t i = t * kTopK + k;
      if (gap[i] >= decided && (k == 0 || gap[i - 1] >= decided)) {
        ASSERT_EQ(got[i], want[i]) << what << " token " << t << " rank " << k;
      }
    }
}

const char* const kLogitLensCases[] = {"llama", "qwen3", "gemma2", "olmoe"};

std::unique_ptr<Model> LoadCaseModel(const nlohmann::json& m) {
  const std::string dir =
      testing::SharedGoldenDir() + "/tiny/" + m["model"].get<std::string>();
  auto model = Model::Load(dir, Precision::kF32);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return model.ok() ? std::move(*model) : nullptr;
}

// Every input and row of a case through `lens`, given HF's residuals
// (`<seq>.resid`): the logits (`logits_key`), the top-10 logits and ids, and
// with `translated` the tuned lens's moved rows.
void CheckGivenHfResiduals(const std::string& dir, const nlohmann::json& m,
                           const ModelConfig& c, eval::Lens& lens,
                           const std::string& logits_key, bool translated) {
  auto golden = testing::GoldenFile::Open(dir + "/golden.safetensors");
  const auto& layers = m["layers"];
  for (const auto& [seq, info] : m["inputs"].items()) {
    SCOPED_TRACE(seq);
    Shape rs;
    const std::vector<float> resid = golden->F32(seq + ".resid", &rs);
    const std::vector<float> logits = golden->F32(seq + "." + logits_key);
    const std::vector<float> top = golden->F32(seq + ".top10_logits");
    const std::vector<float> gap = golden->F32(seq + ".top10_gap");
    const std::vector<int32_t> ids = golden->Ids(seq + ".top10_ids");
    const int64_t T = rs[1], H = c.hidden_size, V = c.vocab_size;
    ASSERT_EQ(rs[0], static_cast<int64_t>(layers.size()));
    for (int64_t l = 0; l < rs[0]; ++l) {
      const std::string hook_name = layers[l].get<std::string>();
      SCOPED_TRACE(hook_name);
      const LensRun r = RunLens(lens, Hook(hook_name, c.num_layers),
                                resid.data() + l * T * H, T, H);
      if (translated) {
        const std::vector<float> moved = golden->F32(seq + ".translated");
        ExpectNear(r.translated.data(), moved.data() + l * T * H, T * H,
                   "translated");
      }
      ExpectNear(r.logits.data(), logits.data() + l * T * V, T * V, "logits");
      ExpectNear(r.topk_logits.data(), top.data() + l * T * kTopK, T * kTopK,
                 "top10 logits");
      ExpectIds(r.topk_ids.data(), ids.data() + l * T * kTopK,
                gap.data() + l * T * kTopK, T, 1e-5f, "top10 ids");
    }
  }
}

TEST(LensGoldenTest, LogitLensGivenHfResiduals) {
  const std::string root = LensRoot();
  SKIP_WITHOUT_LENS_GOLDENS(root);
  for (const char* name : kLogitLensCases) {
    SCOPED_TRACE(name);
    const std::string dir = root + "/" + name;
    const nlohmann::json m = testing::ReadJson(dir + "/manifest.json");
    std::unique_ptr<Model> model = LoadCaseModel(m);
    ASSERT_NE(model, nullptr);
    const ModelConfig& c = model->config();
    auto lens = eval::Lens::Create(*model, nullptr, 5);
    ASSERT_TRUE(lens.ok()) << lens.status().ToString();
    CheckGivenHfResiduals(dir, m, c, **lens, "logits_lens", false);
  }
}

TEST(LensGoldenTest, TunedLensGivenHfResiduals) {
  const std::string root = LensRoot();
  SKIP_WITHOUT_LENS_GOLDENS(root);
  const std::string dir = root + "/llama__tuned_lens";
  const nlohmann::json m = testing::ReadJson(dir + "/manifest.json");
  std::unique_ptr<Model> model = LoadCaseModel(m);
  ASSERT_NE(model, nullptr);
  const ModelConfig& c = model->config();
  // The folder (its params.safetensors preferred), params.safetensors alone
  // and params.pt alone give the same lens.
  for (const std::string& path :
       {dir, dir + "/params.safetensors", dir + "/params.pt"}) {
    SCOPED_TRACE(path);
    auto tuned = LoadTunedLens(path);
    ASSERT_TRUE(tuned.ok()) << tuned.status().ToString();
    EXPECT_EQ(tuned->num_layers, c.num_layers);
    auto lens = eval::Lens::Create(*model, &*tuned, 4);
    ASSERT_TRUE(lens.ok()) << lens.status().ToString();
    CheckGivenHfResiduals(dir, m, c, **lens, "logits_tuned", true);
  }
}

// A row's outputs are the same bytes whatever the chunk size and whichever
// rows share the call.
TEST(LensGoldenTest, RowsAreChunkInvariant) {
  const std::string root = LensRoot();
  SKIP_WITHOUT_LENS_GOLDENS(root);
  const std::string dir = root + "/llama__tuned_lens";
  const nlohmann::json m = testing::ReadJson(dir + "/manifest.json");
  std::unique_ptr<Model> model = LoadCaseModel(m);
  ASSERT_NE(model, nullptr);
  auto tuned = LoadTunedLens(dir);
  ASSERT_TRUE(tuned.ok()) << tuned.status().ToString();
  auto golden = testing::GoldenFile::Open(dir + "/golden.safetensors");
  Shape rs;
  const std::vector<float> resid = golden->F32("seq4.resid", &rs);
  const int64_t T = rs[1], H = model->config().hidden_size;
  const HookPoint hook = Hook("blocks.1.hook_resid_pre", 3);
  const float* x = resid.data() + 1 * T * H;
  auto whole = eval::Lens::Create(*model, &*tuned, 64);
  auto single = eval::Lens::Create(*model, &*tuned, 1);
  auto seven = eval::Lens::Create(*model, &*tuned, 7);
  ASSERT_TRUE(whole.ok() && single.ok() && seven.ok());
  const LensRun a = RunLens(**whole, hook, x, T, H);
  const LensRun b = RunLens(**single, hook, x, T, H);
  const LensRun c = RunLens(**seven, hook, x, T, H);
  const LensRun tail = RunLens(**whole, hook, x + 5 * H, T - 5, H);
  for (const LensRun* r : {&b, &c}) {
    EXPECT_EQ(0, std::memcmp(r->logits.data(), a.logits.data(),
                             a.logits.size() * sizeof(float)));
    EXPECT_EQ(r->topk_ids, a.topk_ids);
  }
  EXPECT_EQ(0, std::memcmp(tail.logits.data(),
                           a.logits.data() + 5 * model->config().vocab_size,
                           tail.logits.size() * sizeof(float)));
}

class LensEndToEndTest : public testing::TempDirTest {};

// From Loom's own residuals (loom extract): every layer's lens near HF's, and
// the last layer's lens equal to Loom's logits, byte for byte.
TEST_F(LensEndToEndTest, FromLoomsOwnResiduals) {
  const std::string root = LensRoot();
  SKIP_WITHOUT_LENS_GOLDENS(root);
  for (const char* name : kLogitLensCases) {
    SCOPED_TRACE(name);
    const std::string dir = root + "/" + name;
    const nlohmann::json m = testing::ReadJson(dir + "/manifest.json");
    std::unique_ptr<Model> model = LoadCaseModel(m);
    ASSERT_NE(model, nullptr);
    const ModelConfig& c = model->config();
    std::string jsonl, hooks = "logits";
    std::vector<std::string> seqs;
    for (const auto& [seq, info] : m["inputs"].items()) {
      seqs.push_back(seq);
      jsonl += nlohmann::json{{"tokens", info["input_ids"]}}.dump() + "\n";
    }
    for (const auto& l : m["layers"]) hooks += "," + l.get<std::string>();
    WriteFile("in.jsonl", jsonl);
    const std::string out = Path(std::string(name) + "_out");
    const std::string cmd =
        std::string(LOOM_BINARY) + " extract --model " + model->dir() +
        " --input " + Path("in.jsonl") + " --out " + out +
        " --select all --precision f32 --quiet --hooks " + hooks;
    std::string log;
    ASSERT_EQ(testing::RunShell(cmd, &log), 0) << cmd << "\n" << log;
    auto lens = eval::Lens::Create(*model, nullptr, 16);
    ASSERT_TRUE(lens.ok()) << lens.status().ToString();
    auto golden = testing::GoldenFile::Open(dir + "/golden.safetensors");
    auto loom_logits = ReadNpy(out + "/logits.all.npy");
    ASSERT_TRUE(loom_logits.ok()) << loom_logits.status().ToString();
    const int64_t H = c.hidden_size, V = c.vocab_size;
    const int64_t n = static_cast<int64_t>(m["layers"].size());
    for (int64_t l = 0; l < n; ++l) {
      const std::string hook_name = m["layers"][l].get<std::string>();
      SCOPED_TRACE(hook_name);
      auto acts = ReadNpy(out + "/" + hook_name + ".all.npy");
      ASSERT_TRUE(acts.ok()) << acts.status().ToString();
      const auto* all = reinterpret_cast<const float*>(acts->data.data());
      const int64_t rows = acts->header.shape[0];
      const LensRun r =
          RunLens(**lens, Hook(hook_name, c.num_layers), all, rows, H);
      if (l == n - 1) {
        ASSERT_EQ(loom_logits->data.size(), r.logits.size() * sizeof(float));
        EXPECT_EQ(0, std::memcmp(r.logits.data(), loom_logits->data.data(),
                                 loom_logits->data.size()))
            << "the last layer's logit lens is not Loom's logits";
      }
      int64_t row0 = 0;
      for (const std::string& seq : seqs) {
        Shape rs;
        golden->F32(seq + ".resid", &rs);
        const int64_t T = rs[1];
        const std::vector<float> want = golden->F32(seq + ".logits_lens");
        const std::vector<float> gap = golden->F32(seq + ".top10_gap");
        const std::vector<int32_t> ids = golden->Ids(seq + ".top10_ids");
        const testing::CompareResult cr =
            testing::Compare(r.logits.data() + row0 * V,
                             want.data() + l * T * V, T * V, 1e-4, 1e-4);
        EXPECT_TRUE(cr.ok) << seq << ": " << cr.message;
        ExpectIds(r.topk_ids.data() + row0 * kTopK, ids.data() + l * T * kTopK,
                  gap.data() + l * T * kTopK, T, 1e-4f, seq + " top10 ids");
        row0 += T;
      }
      EXPECT_EQ(row0, rows);
    }
  }
}

// `loom lens --json` on a golden prompt: the grid's hooks are the goldens'
// rows, its top-10 logits HF's within 1e-4 and its ids HF's where the gap
// decides; with --tuned, the tuned lens's goldens.
// `loom lens --json` of golden case `dir` (manifest `m`) on input `seq`
// at the golden's hooks (its tuned lens for the tuned case), plus `extra`.
std::string GridCommand(const std::string& dir, const nlohmann::json& m,
                        const std::string& seq, const std::string& extra) {
  std::string ids, hooks;
  for (const auto& id : m["inputs"][seq]["input_ids"])
    ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
  for (const auto& l : m["layers"])
    hooks += (hooks.empty() ? "" : ",") + l.get<std::string>();
  const bool tuned = m["kind"] == "tuned_lens";
  return std::string(LOOM_BINARY) + " lens --model " +
         testing::SharedGoldenDir() + "/tiny/" + m["model"].get<std::string>() +
         " --prompt-tokens " + ids + " --hooks " + hooks +
         " --precision f32 --json --quiet" + (tuned ? " --tuned " + dir : "") +
         extra;
}

TEST(LensCliTest, GridMatchesTheGoldens) {
  const std::string root = LensRoot();
  SKIP_WITHOUT_LENS_GOLDENS(root);
  std::vector<std::string> cases(std::begin(kLogitLensCases),
                                 std::end(kLogitLensCases));
  cases.push_back("llama__tuned_lens");
  for (const std::string& name : cases) {
    SCOPED_TRACE(name);
    const std::string dir = root + "/" + name;
    const nlohmann::json m = testing::ReadJson(dir + "/manifest.json");
    const bool tuned = name == "llama__tuned_lens";
    const std::string seq = "seq4";
    const std::string cmd = GridCommand(dir, m, seq, "");
    std::string out;
    ASSERT_EQ(testing::RunShell(cmd + " 2>/dev/null", &out), 0) << cmd;
    const nlohmann::json j = nlohmann::json::parse(out);
    ASSERT_EQ(j["hooks"], m["layers"]);
    EXPECT_EQ(j["lens"], tuned ? "tuned" : "logit");
    auto golden = testing::GoldenFile::Open(dir + "/golden.safetensors");
    Shape ts;
    const std::vector<float> top = golden->F32(seq + ".top10_logits", &ts);
    const std::vector<float> gap = golden->F32(seq + ".top10_gap");
    const std::vector<int32_t> want = golden->Ids(seq + ".top10_ids");
    const int64_t L = ts[0], T = ts[1];
    for (int64_t l = 0; l < L; ++l)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t at = (l * T + t) * kTopK;
        const std::vector<float> got_logits =
            j["topk_logits"][l][t].get<std::vector<float>>();
        const std::vector<int32_t> got_ids =
            j["topk_ids"][l][t].get<std::vector<int32_t>>();
        ASSERT_EQ(got_ids.size(), static_cast<size_t>(kTopK));
        const testing::CompareResult cr = testing::Compare(
            got_logits.data(), top.data() + at, kTopK, 1e-4, 1e-4);
        EXPECT_TRUE(cr.ok) << "hook " << l << " token " << t << ": "
                           << cr.message;
        ExpectIds(got_ids.data(), want.data() + at, gap.data() + at, 1, 1e-4f,
                  "hook " + std::to_string(l) + " token " + std::to_string(t));
      }
  }
}

// `loom lens --kl`: KL(final || lens) per hook and position equals the
// golden logits' (softmax of the final distribution against each hook's,
// in f64), atol = rtol = 1e-4 (the logits' end-to-end tolerance carries
// through); 0 at the final hook. The tuned lens's too: its hooks are
// blocks.i.hook_resid_pre, the grid adds the last hook_resid_post, whose
// distribution is the llama logit-lens golden's last layer (the same
// model and input).
TEST(LensCliTest, KlToTheFinalDistributionMatchesTheGoldens) {
  const std::string root = LensRoot();
  SKIP_WITHOUT_LENS_GOLDENS(root);
  std::vector<std::string> cases(std::begin(kLogitLensCases),
                                 std::end(kLogitLensCases));
  cases.push_back("llama__tuned_lens");
  const std::string seq = "seq4";
  for (const std::string& name : cases) {
    SCOPED_TRACE(name);
    const std::string dir = root + "/" + name;
    const nlohmann::json m = testing::ReadJson(dir + "/manifest.json");
    const bool tuned = name == "llama__tuned_lens";
    std::string out;
    const std::string cmd = GridCommand(dir, m, seq, " --kl --chunk-rows 3");
    ASSERT_EQ(testing::RunShell(cmd + " 2>/dev/null", &out), 0) << cmd;
    const nlohmann::json j = nlohmann::json::parse(out);
    nlohmann::json hooks = m["layers"];
    if (tuned) hooks.push_back("blocks.2.hook_resid_post");
    ASSERT_EQ(j["hooks"], hooks);
    Shape shape, final_shape;
    const std::vector<float> logits =
        testing::GoldenFile::Open(dir + "/golden.safetensors")
            ->F32(seq + (tuned ? ".logits_tuned" : ".logits_lens"), &shape);
    const std::vector<float> final_logits =
        testing::GoldenFile::Open(root + "/" + (tuned ? "llama" : name) +
                                  "/golden.safetensors")
            ->F32(seq + ".logits_lens", &final_shape);
    const int64_t L = shape[0], T = shape[1], V = shape[2];
    auto log_softmax = [&](const std::vector<float>& all, int64_t l,
                           int64_t t) {
      const float* row = all.data() + (l * T + t) * V;
      const double max = *std::max_element(row, row + V);
      double z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - max);
      std::vector<double> lp(static_cast<size_t>(V));
      for (int64_t v = 0; v < V; ++v) lp[v] = row[v] - max - std::log(z);
      return lp;
    };
    ASSERT_EQ(j["kl_to_final"].size(), hooks.size());
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<double> f = log_softmax(final_logits,
                                                final_shape[0] - 1, t);
      for (int64_t l = 0; l < L; ++l) {
        const std::vector<double> lp = log_softmax(logits, l, t);
        double want = 0;
        for (int64_t v = 0; v < V; ++v)
          want += std::exp(f[v]) * (f[v] - lp[v]);
        const double got = j["kl_to_final"][l][t];
        EXPECT_NEAR(got, want, 1e-4 + 1e-4 * want)
            << "hook " << l << " token " << t;
      }
      const double last = j["kl_to_final"][hooks.size() - 1][t];
      EXPECT_EQ(last, 0.0);
    }
  }
}

// Without the shared goldens: a hook that is no residual stream and a tuned
// lens that is not there are refused, naming them, before any output.
TEST(LensCliTest, RefusesWhatALensCannotRead) {
  const std::string model = std::string(LOOM_MODELS_DIR) + "/stories260K";
  for (const auto& [args, want] :
       {std::pair<std::string, std::string>{
            "--hooks blocks.0.hook_attn_out",
            "blocks.0.hook_attn_out: a lens reads a residual stream"},
        {"--tuned /nonexistent/lens", "--tuned: /nonexistent/lens: no such"},
        {"--hooks blocks.1.hook_resid_mid --tuned " + model,
         "no params.safetensors or params.pt"},
        {"--topk 0", "--topk: got 0, expected an integer >= 1"}}) {
    SCOPED_TRACE(args);
    std::string out;
    const int rc =
        testing::RunShell(std::string(LOOM_BINARY) + " lens --model " + model +
                              " --prompt-tokens 1,403,407 " + args,
                          &out);
    EXPECT_NE(rc, 0);
    EXPECT_NE(out.find(want), std::string::npos) << out;
  }
  std::string out;
  ASSERT_EQ(testing::RunShell(std::string(LOOM_BINARY) + " lens --model " +
                                  model + " --prompt-tokens 1,403,407 --quiet",
                              &out),
            0)
      << out;
  EXPECT_NE(out.find("blocks.4.hook_resid_post"), std::string::npos) << out;
}

// The grid's bytes do not depend on --threads.
TEST(LensCliTest, GridIsThreadInvariant) {
  const std::string model = std::string(LOOM_MODELS_DIR) + "/stories260K";
  nlohmann::json grids[2];
  for (int threads : {1, 2}) {
    std::string out;
    const std::string cmd = std::string(LOOM_BINARY) + " lens --model " +
                            model +
                            " --prompt-tokens 1,403,407,261,378,27,471 "
                            "--topk 5 --json --quiet --precision f32 "
                            "--threads " +
                            std::to_string(threads);
    ASSERT_EQ(testing::RunShell(cmd + " 2>/dev/null", &out), 0) << cmd;
    grids[threads - 1] = nlohmann::json::parse(out);
  }
  for (const char* key : {"topk_ids", "topk_logits", "hooks"})
    EXPECT_EQ(grids[0][key], grids[1][key]) << key;
}

class TunedLensFilesTest : public testing::TempDirTest {
 protected:
  // A translators file of n layers of width d (bias on layers < with_bias).
  void WriteLens(const std::string& path, int64_t n, int64_t d,
                 int64_t with_bias, const std::string& prefix = "") {
    SafetensorsWriter w;
    std::vector<float> weight(d * d, 0.01f), bias(d, 0.5f);
    for (int64_t i = 0; i < n; ++i) {
      const std::string p = prefix + std::to_string(i);
      ASSERT_TRUE(w.Add(p + ".weight", DType::kF32, Shape({d, d}),
                        weight.data(), d * d * 4)
                      .ok());
      if (i < with_bias) {
        ASSERT_TRUE(
            w.Add(p + ".bias", DType::kF32, Shape({d}), bias.data(), d * 4)
                .ok());
      }
    }
    ASSERT_TRUE(w.Write(path).ok());
  }
  std::string Error(const std::string& path) {
    auto l = LoadTunedLens(path);
    return l.ok() ? "(loaded)" : l.status().ToString();
  }
};

TEST_F(TunedLensFilesTest, HostileFilesAreRefusedNamingFileAndField) {
  // A params.pt that is no torch zip.
  fs::create_directories(Path("pickle"));
  WriteFile("pickle/params.pt", "PK not really");
  EXPECT_NE(Error(Path("pickle")).find("not a readable torch (zip) archive"),
            std::string::npos)
      << Error(Path("pickle"));
  EXPECT_NE(Error(Path("nowhere")).find("no such tuned lens"),
            std::string::npos);
  // Not translators at all.
  WriteLens(Path("other.safetensors"), 2, 4, 2, "w.");
  EXPECT_NE(Error(Path("other.safetensors")).find("layer_translators.0.weight"),
            std::string::npos);
  // A bias on translator 0 only.
  WriteLens(Path("bias.safetensors"), 3, 4, 1, "layer_translators.");
  EXPECT_NE(Error(Path("bias.safetensors"))
                .find("translator 1 has no tensor 'layer_translators.1.bias'"),
            std::string::npos)
      << Error(Path("bias.safetensors"));
  // config.json disagreeing with the tensors, and another lens type.
  fs::create_directories(Path("dir"));
  WriteLens(Path("dir/params.safetensors"), 3, 4, 3, "layer_translators.");
  WriteFile("dir/config.json", R"({"d_model": 8, "num_hidden_layers": 3})");
  EXPECT_NE(Error(Path("dir"))
                .find("d_model is 8, but the weights are "
                      "d_model 4"),
            std::string::npos)
      << Error(Path("dir"));
  WriteFile("dir/config.json", R"({"lens_type": "jacobian"})");
  EXPECT_NE(Error(Path("dir")).find("lens_type is 'jacobian'"),
            std::string::npos);
  WriteFile("dir/config.json",
            R"({"d_model": 4, "num_hidden_layers": 3, "bias": true})");
  auto ok = LoadTunedLens(Path("dir"));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->num_layers, 3);
  EXPECT_EQ(ok->b(2)[3], 0.5f);
  // Unprefixed keys (params.pt's) are read as well.
  WriteLens(Path("bare.safetensors"), 2, 4, 0);
  auto bare = LoadTunedLens(Path("bare.safetensors"));
  ASSERT_TRUE(bare.ok()) << bare.status().ToString();
  EXPECT_EQ(bare->b(1)[0], 0.0f);
}

// The folder as tuned-lens saves it (config.json + params.pt, no
// safetensors): params.pt read by the restricted unpickler gives the
// translators of params.safetensors bit for bit.
TEST_F(TunedLensFilesTest, ParamsPtAloneGivesTheSameTranslators) {
  const std::string root = LensRoot();
  SKIP_WITHOUT_LENS_GOLDENS(root);
  const std::string src = root + "/llama__tuned_lens";
  fs::create_directories(Path("saved"));
  for (const char* f : {"config.json", "params.pt"})
    fs::copy_file(src + "/" + f, Path("saved") + "/" + f);
  auto pt = LoadTunedLens(Path("saved"));
  ASSERT_TRUE(pt.ok()) << pt.status().ToString();
  auto st = LoadTunedLens(src + "/params.safetensors");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(pt->path, Path("saved") + "/params.pt");
  EXPECT_EQ(pt->num_layers, st->num_layers);
  EXPECT_EQ(pt->weight, st->weight);
  EXPECT_EQ(pt->bias, st->bias);
}

TEST_F(TunedLensFilesTest, ALensForAnotherModelIsRefused) {
  const std::string root = LensRoot();
  SKIP_WITHOUT_LENS_GOLDENS(root);
  auto model =
      Model::Load(testing::SharedGoldenDir() + "/tiny/llama", Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const int64_t d = (*model)->config().hidden_size;
  WriteLens(Path("wide.safetensors"), 3, d + 1, 3, "layer_translators.");
  WriteLens(Path("deep.safetensors"), 5, d, 5, "layer_translators.");
  for (const auto& [file, want] :
       {std::pair<std::string, std::string>{"wide.safetensors",
                                            "the model's hidden size is"},
        {"deep.safetensors", "has 5 translators, the model 3 layers"}}) {
    auto tuned = LoadTunedLens(Path(file));
    ASSERT_TRUE(tuned.ok()) << tuned.status().ToString();
    auto lens = eval::Lens::Create(**model, &*tuned, 4);
    ASSERT_FALSE(lens.ok());
    EXPECT_NE(lens.status().message().find(want), std::string::npos)
        << lens.status().ToString();
  }
  // A lens reads residual streams only; a tuned lens where it has a
  // translator.
  auto logit = eval::Lens::Create(**model, nullptr, 4);
  ASSERT_TRUE(logit.ok());
  std::vector<float> x(d, 1.0f);
  const Status s = (*logit)->Run(HookPoint{HookSite::kAttnOut, 0}, x.data(), 1,
                                 eval::LensOutputs{});
  EXPECT_NE(s.message().find("a lens reads a residual stream"),
            std::string::npos)
      << s.ToString();
}

}  // namespace
}  // namespace loom
