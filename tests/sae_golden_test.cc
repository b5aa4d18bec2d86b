// SAEs and transcoders against the shared SAE goldens (golden/sae/README.md):
// each case's files loaded as published, run on HF's own activation at the
// hook (`<input>.x`), every output compared with the float64 reference at
// the README's float32 tolerance (1e-5 of the tensor's largest magnitude +
// 1e-6) and the top-16 indices exactly. Also: a row's bytes do not depend on
// the rows beside it or the thread count, the legacy SAELens TopK spelling,
// and hostile files refused with the file and field named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "src/backend/cpu/kernels.h"
#include "src/backend/cpu/sae_cpu.h"
#include "src/base/units.h"
#include "src/io/npy.h"
#include "src/io/npz.h"
#include "src/io/safetensors.h"
#include "src/io/safetensors_writer.h"
#include "src/model/sae.h"
#include "tests/golden_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string SaeGoldenRoot() {
  const std::string shared = testing::SharedGoldenDir();
  return shared.empty() ? "" : shared + "/sae";
}

#define SKIP_WITHOUT_SAE_GOLDENS(root)                                   \
  if ((root).empty() || !fs::exists(root))                               \
  GTEST_SKIP() << "SKIPPED LOUDLY: shared SAE goldens (golden/sae) not " \
                  "found"

struct SaeRun {
  std::vector<float> hidden_pre, feature_acts, recons, reconstruction, error,
      topk_values;
  std::vector<int32_t> topk_indices;
};

int64_t Bytes(const std::vector<float>& v) {
  return static_cast<int64_t>(v.size() * sizeof(float));
}

SaeRun RunOn(const Sae& sae, const std::vector<float>& x,
             const std::vector<float>& reference, int64_t rows, int64_t topk) {
  SaeRun r;
  r.hidden_pre.resize(rows * sae.d_sae);
  r.feature_acts.resize(rows * sae.d_sae);
  r.recons.resize(rows * sae.d_out);
  r.reconstruction.resize(rows * sae.d_out);
  r.error.resize(rows * sae.d_out);
  r.topk_values.resize(rows * topk);
  r.topk_indices.resize(rows * topk);
  std::vector<char> storage(cpu::SaeWorkspaceBytes(sae, rows) + 64);
  void* ws = reinterpret_cast<void*>(
      AlignUp(reinterpret_cast<intptr_t>(storage.data()), 64));
  SaeOutputs out;
  out.hidden_pre = r.hidden_pre.data();
  out.feature_acts = r.feature_acts.data();
  out.recons = r.recons.data();
  out.reconstruction = r.reconstruction.data();
  out.error = r.error.data();
  out.topk = topk;
  out.topk_indices = r.topk_indices.data();
  out.topk_values = r.topk_values.data();
  cpu::RunSae(sae, x.data(), reference.data(), rows, ws, out);
  return r;
}

// |a - b| <= 1e-5 * max|golden| + 1e-6 everywhere.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float scale = 0;
  for (float w : want) scale = std::max(scale, std::fabs(w));
  const float tol = 1e-5f * scale + 1e-6f;
  size_t worst = 0;
  float worst_diff = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float d = std::fabs(got[i] - want[i]);
    if (!(d <= worst_diff)) {
      worst_diff = d;
      worst = i;
    }
  }
  EXPECT_LE(worst_diff, tol) << what << ": element " << worst << " is "
                             << got[worst] << ", golden " << want[worst];
}

std::vector<std::string> Cases(const std::string& root) {
  std::vector<std::string> cases;
  for (const auto& e : fs::directory_iterator(root))
    if (fs::exists(e.path() / "manifest.json"))
      cases.push_back(e.path().filename().string());
  std::sort(cases.begin(), cases.end());
  return cases;
}

// Every input of the case at `dir` (its manifest `m`) through `sae`.
void ExpectMatchesCase(const std::string& dir, const nlohmann::json& m,
                       const Sae& sae) {
  auto golden = testing::GoldenFile::Open(dir + "/golden.safetensors");
  const bool transcoder = IsTranscoder(sae.architecture);
  for (const auto& [input, info] : m["inputs"].items()) {
    SCOPED_TRACE(input);
    Shape xs;
    const std::vector<float> x = golden->F32(input + ".x", &xs);
    const int64_t rows = xs[0];
    ASSERT_EQ(xs[1], sae.d_in);
    const std::vector<float> reference =
        transcoder ? golden->F32(input + ".target") : x;
    const SaeRun r = RunOn(sae, x, reference, rows, 16);
    ExpectClose(r.hidden_pre, golden->F32(input + ".hidden_pre"), "hidden_pre");
    ExpectClose(r.feature_acts, golden->F32(input + ".feature_acts"),
                "feature_acts");
    ExpectClose(r.recons, golden->F32(input + ".hook_sae_recons"),
                "hook_sae_recons");
    ExpectClose(r.reconstruction, golden->F32(input + ".reconstruction"),
                "reconstruction");
    ExpectClose(r.error, golden->F32(input + ".error"), "error");
    ExpectClose(r.topk_values, golden->F32(input + ".topk_values"),
                "topk_values");
    EXPECT_EQ(r.topk_indices, golden->Ids(input + ".topk_indices"));
  }
}

TEST(SaeGoldenTest, EveryCaseMatchesGivenHfActivations) {
  const std::string root = SaeGoldenRoot();
  SKIP_WITHOUT_SAE_GOLDENS(root);
  const std::vector<std::string> cases = Cases(root);
  EXPECT_GE(cases.size(), 7u);
  for (const std::string& name : cases) {
    SCOPED_TRACE(name);
    const std::string dir = root + "/" + name;
    const nlohmann::json m = testing::ReadJson(dir + "/manifest.json");
    StatusOr<Sae> sae = LoadSae(dir + "/" + m["sae_dir"].get<std::string>());
    ASSERT_TRUE(sae.ok()) << sae.status().ToString();
    EXPECT_EQ(sae->hook, m["hook"].get<std::string>());
    EXPECT_EQ(SaeArchitectureName(sae->architecture),
              m["architecture"].get<std::string>());
    ExpectMatchesCase(dir, m, *sae);
  }
}

// A row's bytes are the same alone, in a batch, and at 1 or 2 threads.
TEST(SaeGoldenTest, RowsAreBatchAndThreadInvariant) {
  const std::string root = SaeGoldenRoot();
  SKIP_WITHOUT_SAE_GOLDENS(root);
  for (const std::string& name : Cases(root)) {
    SCOPED_TRACE(name);
    const std::string dir = root + "/" + name;
    const nlohmann::json m = testing::ReadJson(dir + "/manifest.json");
    StatusOr<Sae> sae = LoadSae(dir + "/" + m["sae_dir"].get<std::string>());
    ASSERT_TRUE(sae.ok()) << sae.status().ToString();
    auto golden = testing::GoldenFile::Open(dir + "/golden.safetensors");
    const std::string input = m["inputs"].begin().key();
    Shape xs;
    const std::vector<float> x = golden->F32(input + ".x", &xs);
    const int64_t rows = xs[0], d = xs[1];
    const int before = cpu::NumThreads();
    cpu::SetNumThreads(2);
    const SaeRun all = RunOn(*sae, x, x, rows, 8);
    cpu::SetNumThreads(1);
    const SaeRun one = RunOn(*sae, x, x, rows, 8);
    cpu::SetNumThreads(before);
    EXPECT_EQ(all.reconstruction, one.reconstruction);
    EXPECT_EQ(all.feature_acts, one.feature_acts);
    for (int64_t r : {int64_t{0}, rows - 1}) {
      const std::vector<float> xr(x.begin() + r * d, x.begin() + (r + 1) * d);
      const SaeRun alone = RunOn(*sae, xr, xr, 1, 8);
      EXPECT_TRUE(std::equal(alone.feature_acts.begin(),
                             alone.feature_acts.end(),
                             all.feature_acts.begin() + r * sae->d_sae));
      EXPECT_TRUE(std::equal(alone.reconstruction.begin(),
                             alone.reconstruction.end(),
                             all.reconstruction.begin() + r * sae->d_out));
    }
  }
}

// A copy of a golden case's SAE directory to edit.
class SaeFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = SaeGoldenRoot();
    if (root_.empty() || !fs::exists(root_)) return;
    tmp_ = fs::temp_directory_path() /
           ("loom_sae_test_" + std::to_string(::getpid()));
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
  }
  void TearDown() override {
    if (!tmp_.empty()) fs::remove_all(tmp_);
  }
  // The case's SAE directory copied to tmp_/<dest>.
  std::string CopyCase(const std::string& name, const std::string& dest) {
    const nlohmann::json m =
        testing::ReadJson(root_ + "/" + name + "/manifest.json");
    const fs::path src =
        fs::path(root_) / name / m["sae_dir"].get<std::string>();
    const fs::path to = tmp_ / dest;
    fs::copy(src, to, fs::copy_options::recursive);
    for (const auto& e : fs::directory_iterator(to))
      fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
    fs::permissions(to, fs::perms::owner_all, fs::perm_options::add);
    return to.string();
  }
  static nlohmann::json ReadCfg(const std::string& dir) {
    return testing::ReadJson(dir + "/cfg.json");
  }
  static void WriteCfg(const std::string& dir, const nlohmann::json& j) {
    std::ofstream(dir + "/cfg.json") << j.dump(1);
  }
  std::string root_;
  fs::path tmp_;
};

#define SKIP_WITHOUT_FILES() SKIP_WITHOUT_SAE_GOLDENS(root_)

TEST_F(SaeFilesTest, LegacyTopKSpellingAndHookOverride) {
  SKIP_WITHOUT_FILES();
  // The 6.x TopK case rewritten as SAELens <= 5 writes it: flat keys,
  // activation_fn_str topk with activation_fn_kwargs.k.
  const std::string dir = CopyCase("qwen3__saelens_topk", "legacy_topk");
  nlohmann::json c = ReadCfg(dir);
  nlohmann::json legacy = {{"d_in", c["d_in"]},
                           {"d_sae", c["d_sae"]},
                           {"activation_fn_str", "topk"},
                           {"activation_fn_kwargs", {{"k", c["k"]}}},
                           {"apply_b_dec_to_input", c["apply_b_dec_to_input"]},
                           {"normalize_activations", false},
                           {"hook_point", c["metadata"]["hook_name"]},
                           {"dtype", "torch.float32"}};
  WriteCfg(dir, legacy);
  StatusOr<Sae> sae = LoadSae(dir);
  ASSERT_TRUE(sae.ok()) << sae.status().ToString();
  EXPECT_EQ(sae->format, SaeFormat::kSaeLensLegacy);
  EXPECT_EQ(sae->architecture, SaeArchitecture::kTopK);
  EXPECT_EQ(sae->k, c["k"].get<int64_t>());
  EXPECT_EQ(sae->hook, "blocks.0.hook_resid_post");
  // @HOOK that disagrees with the file is refused, naming both.
  const Status bad = LoadSae(dir, "blocks.1.hook_resid_post").status();
  EXPECT_NE(bad.message().find("blocks.1.hook_resid_post"), std::string::npos)
      << bad.ToString();
  EXPECT_NE(bad.message().find("blocks.0.hook_resid_post"), std::string::npos)
      << bad.ToString();
  // sparsify's hookpoint is its folder, or the @HOOK given.
  const std::string sp = CopyCase("qwen3_moe__sparsify_topk", "layers.3");
  StatusOr<Sae> s = LoadSae(sp);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->hook, "blocks.3.hook_resid_post");
  s = LoadSae(sp + "/sae.safetensors", "layers.1.mlp");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->hook, "blocks.1.hook_mlp_out");
}

TEST_F(SaeFilesTest, HostileFilesAreRefusedNamingFileAndField) {
  SKIP_WITHOUT_FILES();
  const std::string dir = CopyCase("gemma2__saelens_jumprelu", "hostile");
  const nlohmann::json good = ReadCfg(dir);
  const auto error_of = [&](const nlohmann::json& cfg) {
    WriteCfg(dir, cfg);
    return LoadSae(dir).status();
  };
  nlohmann::json c = good;
  c["architecture"] = "crosscoder";
  Status s = error_of(c);
  EXPECT_NE(s.message().find("architecture 'crosscoder'"), std::string::npos)
      << s.ToString();
  c = good;
  c["d_in"] = 65;
  s = error_of(c);
  EXPECT_NE(s.message().find("sae_weights.safetensors: tensor 'W_enc' is "
                             "[64, 512], expected [65, 512]"),
            std::string::npos)
      << s.ToString();
  c = good;
  c["d_sae"] = -3;
  s = error_of(c);
  EXPECT_NE(s.message().find("d_sae is -3"), std::string::npos) << s.ToString();
  c = good;
  c["normalize_activations"] = "whiten";
  s = error_of(c);
  EXPECT_NE(s.message().find("normalize_activations 'whiten'"),
            std::string::npos)
      << s.ToString();
  WriteCfg(dir, good);
  // A missing tensor and a NaN, written over the weights.
  const std::string weights = dir + "/sae_weights.safetensors";
  fs::remove(weights);
  std::vector<float> w_enc(64 * 512, 0.1f), w_dec(512 * 64, 0.1f),
      b_enc(512, 0.f), b_dec(64, 0.f), thr(512, 0.f);
  thr[7] = std::nanf("");
  SafetensorsWriter wr;
  ASSERT_TRUE(
      wr.Add("W_enc", DType::kF32, Shape{64, 512}, w_enc.data(), Bytes(w_enc))
          .ok());
  ASSERT_TRUE(
      wr.Add("W_dec", DType::kF32, Shape{512, 64}, w_dec.data(), Bytes(w_dec))
          .ok());
  ASSERT_TRUE(
      wr.Add("b_enc", DType::kF32, Shape{512}, b_enc.data(), Bytes(b_enc))
          .ok());
  ASSERT_TRUE(
      wr.Add("b_dec", DType::kF32, Shape{64}, b_dec.data(), Bytes(b_dec)).ok());
  ASSERT_TRUE(wr.Write(weights).ok());
  s = LoadSae(dir).status();
  EXPECT_NE(s.message().find("no tensor 'threshold'"), std::string::npos)
      << s.ToString();
  ASSERT_TRUE(
      wr.Add("threshold", DType::kF32, Shape{512}, thr.data(), Bytes(thr))
          .ok());
  ASSERT_TRUE(wr.Write(weights).ok());
  s = LoadSae(dir).status();
  EXPECT_NE(s.message().find("tensor 'threshold' holds nan at element 7"),
            std::string::npos)
      << s.ToString();
  // No format: a directory without the files.
  s = LoadSae(tmp_.string()).status();
  EXPECT_NE(s.message().find("not a format Loom reads"), std::string::npos)
      << s.ToString();
  EXPECT_EQ(LoadSae((tmp_ / "absent").string()).status().code(),
            StatusCode::kNotFound);
}

// Gemma Scope 2's layout (params.safetensors with lowercase names, a
// config.json with HF hook points; SAELens' gemma_3 loader's conventions),
// built from the golden cases' own weights, gives the goldens: the JumpReLU
// SAE at model.layers.1.output, and the relu transcoder (a JumpReLU one with
// threshold 0) from pre_ to post_feedforward_layernorm, also with an
// all-zero affine skip; and, without a config.json, the hook from the folder
// names.
TEST_F(SaeFilesTest, GemmaScope2LayoutGivesTheGoldens) {
  SKIP_WITHOUT_FILES();
  struct Case {
    std::string name, in, out, folder;
    bool affine;
    std::string want_hook, want_arch;
  };
  const Case cases[] = {
      {"gemma2__saelens_jumprelu", "model.layers.1.output",
       "model.layers.1.output", "gs2_res", false, "blocks.1.hook_resid_post",
       "jumprelu"},
      {"gemma2__saelens_jumprelu", "", "",
       "resid_post/layer_1_width_16k_l0_small", false,
       "blocks.1.hook_resid_post", "jumprelu"},
      {"llama__saelens_transcoder",
       "model.layers.1.pre_feedforward_layernorm.output",
       "model.layers.1.post_feedforward_layernorm.output", "gs2_tc", false,
       "blocks.1.ln2.hook_normalized", "jumprelu_transcoder"},
      {"llama__saelens_transcoder",
       "model.layers.1.pre_feedforward_layernorm.output",
       "model.layers.1.post_feedforward_layernorm.output", "gs2_affine", true,
       "blocks.1.ln2.hook_normalized", "jumprelu_skip_transcoder"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.folder);
    const std::string case_dir = root_ + "/" + c.name;
    const nlohmann::json m = testing::ReadJson(case_dir + "/manifest.json");
    auto src =
        SafetensorsFile::Open(case_dir + "/" + m["sae_dir"].get<std::string>() +
                              "/sae_weights.safetensors");
    ASSERT_TRUE(src.ok()) << src.status().ToString();
    const int64_t d_sae = m["dims"]["d_sae"], d_in = m["dims"]["d_in"],
                  d_out = m["dims"]["d_out"];
    std::vector<float> zeros_thr(d_sae, 0.0f), zeros_skip(d_out * d_in, 0.0f);
    SafetensorsWriter w;
    for (const auto& [from, to] :
         std::vector<std::pair<std::string, std::string>>{
             {"W_enc", "w_enc"},
             {"W_dec", "w_dec"},
             {"b_enc", "b_enc"},
             {"b_dec", "b_dec"},
             {"threshold", "threshold"}}) {
      const TensorInfo* t = (*src)->Find(from);
      if (t == nullptr) {
        ASSERT_EQ(from, "threshold");
        ASSERT_TRUE(w.Add(to, DType::kF32, Shape{d_sae}, zeros_thr.data(),
                          Bytes(zeros_thr))
                        .ok());
        continue;
      }
      ASSERT_TRUE(w.Add(to, (*src)->View(*t)).ok());
    }
    if (c.affine) {
      ASSERT_TRUE(w.Add("affine_skip_connection", DType::kF32,
                        Shape{d_out, d_in}, zeros_skip.data(),
                        Bytes(zeros_skip))
                      .ok());
    }
    const fs::path dir = tmp_ / c.folder;
    fs::create_directories(dir);
    ASSERT_TRUE(w.Write((dir / "params.safetensors").string()).ok());
    if (!c.in.empty())
      std::ofstream(dir / "config.json") << nlohmann::json{
          {"architecture", "jump_relu"},
          {"hf_hook_point_in", c.in},
          {"hf_hook_point_out", c.out},
          {"affine_connection", c.affine}}.dump();
    StatusOr<Sae> sae = LoadSae(dir.string());
    ASSERT_TRUE(sae.ok()) << sae.status().ToString();
    EXPECT_EQ(sae->format, SaeFormat::kGemmaScope2);
    EXPECT_EQ(sae->hook, c.want_hook);
    EXPECT_EQ(SaeArchitectureName(sae->architecture), c.want_arch);
    ExpectMatchesCase(case_dir, m, *sae);
  }
}

// Gemma Scope (1)'s params.npz (SAELens' gemma_2 loader's conventions),
// built from the JumpReLU golden case's weights, gives its goldens, with the
// hook read from the Hub's repo and folder names; stored or deflated, W_ or
// w_ spellings. An embedding SAE's encoder and decoder are rescaled by
// sqrt(d_in); a path that names no hook needs @HOOK.
TEST_F(SaeFilesTest, GemmaScopeNpzGivesTheGoldens) {
  SKIP_WITHOUT_FILES();
  const std::string case_dir = root_ + "/gemma2__saelens_jumprelu";
  const nlohmann::json m = testing::ReadJson(case_dir + "/manifest.json");
  auto src =
      SafetensorsFile::Open(case_dir + "/" + m["sae_dir"].get<std::string>() +
                            "/sae_weights.safetensors");
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  const auto member = [&](const std::string& from, const std::string& to) {
    const TensorView v = (*src)->View(*(*src)->Find(from));
    return NpzMember{to, v.dtype, v.shape.dims(), v.data, v.bytes()};
  };
  for (const bool deflate : {false, true}) {
    SCOPED_TRACE(deflate);
    const std::string w = deflate ? "w" : "W";
    const fs::path dir = tmp_ / (deflate ? "z" : "s") /
                         "models--google--gemma-scope-2b-pt-res" / "layer_1" /
                         "width_16k" / "average_l0_71";
    fs::create_directories(dir);
    ASSERT_TRUE(
        WriteNpz((dir / "params.npz").string(),
                 {member("W_enc", w + "_enc"), member("W_dec", w + "_dec"),
                  member("b_enc", "b_enc"), member("b_dec", "b_dec"),
                  member("threshold", "threshold")},
                 deflate)
            .ok());
    StatusOr<Sae> sae = LoadSae(dir.string());
    ASSERT_TRUE(sae.ok()) << sae.status().ToString();
    EXPECT_EQ(sae->format, SaeFormat::kGemmaScope);
    EXPECT_EQ(sae->hook, "blocks.1.hook_resid_post");
    EXPECT_EQ(sae->architecture, SaeArchitecture::kJumpRelu);
    ExpectMatchesCase(case_dir, m, *sae);
  }
  const fs::path embed = tmp_ / "gemma-scope-2b-pt-res" / "embedding" /
                         "width_4k" / "average_l0_6";
  const fs::path plain = tmp_ / "elsewhere";
  for (const fs::path& dir : {embed, plain}) {
    fs::create_directories(dir);
    ASSERT_TRUE(WriteNpz((dir / "params.npz").string(),
                         {member("W_enc", "W_enc"), member("W_dec", "W_dec"),
                          member("b_enc", "b_enc"), member("b_dec", "b_dec"),
                          member("threshold", "threshold")},
                         false)
                    .ok());
  }
  StatusOr<Sae> e = LoadSae(embed.string());
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->hook, "hook_embed");
  StatusOr<Sae> p = LoadSae(plain.string(), "blocks.1.hook_resid_post");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_FLOAT_EQ(e->w_enc[5] * 8.0f, p->w_enc[5]);  // sqrt(64) = 8
  EXPECT_FLOAT_EQ(e->w_dec[5], p->w_dec[5] * 8.0f);
  const Status none = LoadSae(plain.string()).status();
  EXPECT_NE(none.message().find("name no hook; give one as PATH@HOOK"),
            std::string::npos)
      << none.ToString();
}

// End to end: the hook captured by `loom extract` from the golden inputs'
// token ids (Loom's own activations, not HF's) through each SAE: every output
// within atol = rtol = 1e-4 of the golden, and the top-16 indices identical
// wherever the golden's gaps decide the order (>= 1e-4 on both sides of a
// rank). The transcoder is left out: it reads TransformerLens' pre-gain
// ln2.hook_normalized, which Loom's hook of that name is not (docs/saes.md).
TEST_F(SaeFilesTest, EndToEndFromLoomsOwnActivations) {
  SKIP_WITHOUT_FILES();
  int checked = 0;
  for (const std::string& name : Cases(root_)) {
    const std::string dir = root_ + "/" + name;
    const nlohmann::json m = testing::ReadJson(dir + "/manifest.json");
    StatusOr<Sae> sae = LoadSae(dir + "/" + m["sae_dir"].get<std::string>());
    ASSERT_TRUE(sae.ok()) << sae.status().ToString();
    if (IsTranscoder(sae->architecture)) continue;
    SCOPED_TRACE(name);
    ++checked;
    std::vector<std::string> inputs;
    std::string jsonl;
    for (const auto& [input, info] : m["inputs"].items()) {
      if (input == "steer_all") continue;  // after an intervention
      inputs.push_back(input);
      jsonl += nlohmann::json{{"tokens", info["input_ids"]}}.dump() + "\n";
    }
    const fs::path in = tmp_ / (name + ".jsonl"), out = tmp_ / (name + "_out");
    std::ofstream(in) << jsonl;
    const std::string model_dir =
        testing::SharedGoldenDir() + "/tiny/" + m["model"].get<std::string>();
    const std::string cmd = std::string(LOOM_BINARY) + " extract --model " +
                            model_dir + " --input " + in.string() + " --out " +
                            out.string() + " --select all --precision f32 " +
                            "--quiet --hooks " + sae->hook;
    std::string log;
    ASSERT_EQ(testing::RunShell(cmd, &log), 0) << cmd << "\n" << log;
    auto acts = ReadNpy((out / (sae->hook + ".all.npy")).string());
    ASSERT_TRUE(acts.ok()) << acts.status().ToString();
    const float* all = reinterpret_cast<const float*>(acts->data.data());
    auto golden = testing::GoldenFile::Open(dir + "/golden.safetensors");
    int64_t row0 = 0;
    for (const std::string& input : inputs) {
      SCOPED_TRACE(input);
      Shape xs;
      golden->F32(input + ".x", &xs);
      const int64_t rows = xs[0], d = sae->d_in;
      const std::vector<float> x(all + row0 * d, all + (row0 + rows) * d);
      row0 += rows;
      const SaeRun r = RunOn(*sae, x, x, rows, 16);
      const auto near = [&](const std::vector<float>& got,
                            const std::string& key) {
        const std::vector<float> want = golden->F32(input + "." + key);
        ASSERT_EQ(got.size(), want.size()) << key;
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 1e-4 + 1e-4 * std::fabs(want[i]))
              << key << " element " << i;
      };
      near(r.hidden_pre, "hidden_pre");
      near(r.feature_acts, "feature_acts");
      near(r.reconstruction, "reconstruction");
      near(r.topk_values, "topk_values");
      const std::vector<int32_t> want = golden->Ids(input + ".topk_indices");
      const std::vector<float> gap = golden->F32(input + ".topk_gap");
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t k = 0; k < 16; ++k) {
          const int64_t i = t * 16 + k;
          if (gap[i] >= 1e-4f && (k == 0 || gap[i - 1] >= 1e-4f)) {
            EXPECT_EQ(r.topk_indices[i], want[i])
                << "token " << t << " rank " << k;
          }
        }
    }
  }
  EXPECT_EQ(checked, 6);
}

// Llama Scope's layout (hyperparams.json + checkpoints/final.safetensors,
// OpenMOSS lm_saes' conventions: docs/saes.md) built from a golden case's
// weights: encoder.weight = W_enc^T / s_in, encoder.bias = b_enc - W_enc^T
// b_dec (SAELens' apply_b_dec_to_input folded in), decoder.weight = W_dec^T
// s_out, decoder.bias = b_dec s_out, a threshold of 0 (JumpReLU at 0 is
// ReLU), s_in = sqrt(d) / a_in and s_out = sqrt(d) / a_out powers of two
// (exact). lm_saes' inference then reconstructs exactly the golden's
// reconstruction, and its feature activations are the golden's times
// ||W_dec row i|| (its unit-decoder-norm transform), or over s_in without
// sparsity_include_decoder_norm.
TEST_F(SaeFilesTest, LlamaScopeLayoutGivesTheGoldens) {
  SKIP_WITHOUT_FILES();
  struct Variant {
    std::string name;
    std::string norm;  // norm_activation
    bool dec_norm;     // sparsity_include_decoder_norm
    double a_in, a_out;
    bool give_weights_file;  // the path given: .../checkpoints/final...
  };
  const Variant variants[] = {
      {"dataset-wise", "dataset-wise", true, 4.0, 16.0, false},
      {"no decoder norm", "dataset-wise", false, 4.0, 16.0, true},
      {"inference", "inference", true, 8.0, 8.0, false},
  };
  int checked = 0;
  for (const std::string& name : {std::string("llama__saelens_standard_relu"),
                                  std::string("llama__saelens_transcoder")}) {
    const std::string case_dir = root_ + "/" + name;
    const nlohmann::json m = testing::ReadJson(case_dir + "/manifest.json");
    StatusOr<Sae> golden_sae =
        LoadSae(case_dir + "/" + m["sae_dir"].get<std::string>());
    ASSERT_TRUE(golden_sae.ok()) << golden_sae.status().ToString();
    const Sae& g = *golden_sae;
    const int64_t d = g.d_in, n = g.d_sae;
    ASSERT_EQ(g.d_out, d);
    std::vector<double> row_norm(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      double ss = 0;
      for (int64_t j = 0; j < d; ++j)
        ss += double{g.w_dec[i * d + j]} * g.w_dec[i * d + j];
      row_norm[i] = std::sqrt(ss);
    }
    for (const Variant& v : variants) {
      SCOPED_TRACE(name + ", " + v.name);
      const double s_in = v.norm == "inference" ? 1 : std::sqrt(d) / v.a_in;
      const double s_out = v.norm == "inference" ? 1 : std::sqrt(d) / v.a_out;
      std::vector<float> enc(n * d), enc_b(n), dec(d * n), dec_b(d);
      for (int64_t i = 0; i < n; ++i) {
        double b = g.b_enc[i];
        for (int64_t j = 0; j < d; ++j) {
          const float w = SaeEncoderWeight(g, g.w_enc, i, j);
          enc[i * d + j] = static_cast<float>(w / s_in);
          if (g.apply_b_dec_to_input) b -= double{w} * g.b_dec[j];
          dec[j * n + i] = static_cast<float>(g.w_dec[i * d + j] * s_out);
        }
        enc_b[i] = static_cast<float>(b);
      }
      for (int64_t j = 0; j < d; ++j)
        dec_b[j] = static_cast<float>(g.b_dec[j] * s_out);
      const fs::path dir =
          tmp_ / ("ls_" + name + "_" + std::to_string(checked));
      fs::create_directories(dir / "checkpoints");
      SafetensorsWriter w;
      ASSERT_TRUE(w.Add("encoder.weight", DType::kF32, Shape{n, d}, enc.data(),
                        Bytes(enc))
                      .ok());
      ASSERT_TRUE(w.Add("encoder.bias", DType::kF32, Shape{n}, enc_b.data(),
                        Bytes(enc_b))
                      .ok());
      ASSERT_TRUE(w.Add("decoder.weight", DType::kF32, Shape{d, n}, dec.data(),
                        Bytes(dec))
                      .ok());
      ASSERT_TRUE(w.Add("decoder.bias", DType::kF32, Shape{d}, dec_b.data(),
                        Bytes(dec_b))
                      .ok());
      ASSERT_TRUE(
          w.Write((dir / "checkpoints" / "final.safetensors").string()).ok());
      nlohmann::json hp = {
          {"d_model", d},
          {"expansion_factor", n / d},
          {"act_fn", "jumprelu"},
          {"jump_relu_threshold", 0.0},
          {"norm_activation", v.norm},
          {"dataset_average_activation_norm",
           {{"in", v.a_in}, {"out", v.a_out}}},
          {"sparsity_include_decoder_norm", v.dec_norm},
          {"use_decoder_bias", true},
          {"apply_decoder_bias_to_pre_encoder", false},
          {"top_k", 50},
          {"hook_point_in", g.hook},
          {"hook_point_out", g.hook_out.empty() ? g.hook : g.hook_out},
          {"dtype", "torch.float32"}};
      std::ofstream(dir / "hyperparams.json") << hp.dump(1);
      StatusOr<Sae> sae = LoadSae(
          (v.give_weights_file ? dir / "checkpoints" / "final.safetensors"
                               : dir)
              .string());
      ASSERT_TRUE(sae.ok()) << sae.status().ToString();
      ++checked;
      EXPECT_EQ(sae->format, SaeFormat::kLlamaScope);
      EXPECT_EQ(sae->hook, g.hook);
      EXPECT_EQ(sae->hook_out, g.hook_out);
      EXPECT_EQ(IsTranscoder(sae->architecture), IsTranscoder(g.architecture));
      auto golden = testing::GoldenFile::Open(case_dir + "/golden.safetensors");
      for (const auto& [input, info] : m["inputs"].items()) {
        SCOPED_TRACE(input);
        Shape xs;
        const std::vector<float> x = golden->F32(input + ".x", &xs);
        const int64_t rows = xs[0];
        const std::vector<float> reference =
            IsTranscoder(g.architecture) ? golden->F32(input + ".target") : x;
        const SaeRun r = RunOn(*sae, x, reference, rows, 16);
        ExpectClose(r.recons, golden->F32(input + ".hook_sae_recons"),
                    "hook_sae_recons");
        ExpectClose(r.reconstruction, golden->F32(input + ".reconstruction"),
                    "reconstruction");
        ExpectClose(r.error, golden->F32(input + ".error"), "error");
        // lm_saes' activations: the golden's scaled per feature.
        for (const char* key : {"hidden_pre", "feature_acts"}) {
          std::vector<float> want = golden->F32(input + "." + key);
          for (int64_t t = 0; t < rows; ++t)
            for (int64_t i = 0; i < n; ++i) {
              const double c = v.dec_norm ? row_norm[i] : 1.0 / s_in;
              float& x_ti = want[t * n + i];
              x_ti = static_cast<float>(x_ti * c);
            }
          ExpectClose(
              std::string(key) == "hidden_pre" ? r.hidden_pre : r.feature_acts,
              want, key);
        }
      }
    }
  }
  EXPECT_EQ(checked, 6);
}

// Hostile Llama Scope files: every field named with its value.
TEST_F(SaeFilesTest, LlamaScopeHostileFilesNameTheField) {
  const fs::path dir = fs::temp_directory_path() /
                       ("loom_llama_scope_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "checkpoints");
  const int64_t d = 4, n = 8;
  std::vector<float> enc(n * d, 0.5f), enc_b(n, 0.0f), dec(d * n, 0.25f),
      dec_b(d, 0.0f);
  auto write = [&](const Shape& dec_shape) {
    SafetensorsWriter w;
    ASSERT_TRUE(w.Add("encoder.weight", DType::kF32, Shape{n, d}, enc.data(),
                      Bytes(enc))
                    .ok());
    ASSERT_TRUE(
        w.Add("encoder.bias", DType::kF32, Shape{n}, enc_b.data(), Bytes(enc_b))
            .ok());
    ASSERT_TRUE(
        w.Add("decoder.weight", DType::kF32, dec_shape, dec.data(), Bytes(dec))
            .ok());
    ASSERT_TRUE(
        w.Add("decoder.bias", DType::kF32, Shape{d}, dec_b.data(), Bytes(dec_b))
            .ok());
    ASSERT_TRUE(
        w.Write((dir / "checkpoints" / "final.safetensors").string()).ok());
  };
  const nlohmann::json good = {
      {"d_model", d},
      {"d_sae", n},
      {"act_fn", "jumprelu"},
      {"jump_relu_threshold", 0.25},
      {"norm_activation", "dataset-wise"},
      {"dataset_average_activation_norm", {{"in", 2.0}, {"out", 2.0}}},
      {"hook_point_in", "blocks.1.hook_resid_post"},
      {"hook_point_out", "blocks.1.hook_resid_post"}};
  write(Shape{d, n});
  std::ofstream(dir / "hyperparams.json") << good.dump();
  StatusOr<Sae> ok = LoadSae(dir.string());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->hook, "blocks.1.hook_resid_post");
  EXPECT_EQ(ok->threshold, std::vector<float>(n, 0.25f));
  struct Case {
    std::string key;
    nlohmann::json value;  // null: the key removed
    std::string want;
  };
  const Case cases[] = {
      {"act_fn", "topk", "act_fn 'topk'"},
      {"jump_relu_threshold", -0.5, "jump_relu_threshold is -0.5"},
      {"jump_relu_threshold", nullptr, "jump_relu_threshold"},
      {"norm_activation", "token-wise", "norm_activation 'token-wise'"},
      {"dataset_average_activation_norm", nullptr,
       "dataset_average_activation_norm is missing"},
      {"dataset_average_activation_norm",
       {{"in", 0.0}},
       "dataset_average_activation_norm.in is 0"},
      {"apply_decoder_bias_to_pre_encoder", true,
       "apply_decoder_bias_to_pre_encoder"},
      {"d_model", 5, "encoder.weight"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    nlohmann::json j = good;
    if (c.value.is_null()) {
      j.erase(c.key);
    } else {
      j[c.key] = c.value;
    }
    std::ofstream(dir / "hyperparams.json") << j.dump();
    StatusOr<Sae> sae = LoadSae(dir.string());
    ASSERT_FALSE(sae.ok());
    EXPECT_NE(sae.status().message().find(c.want), std::string::npos)
        << sae.status().message();
    EXPECT_NE(
        sae.status().message().find(c.key == "d_model" ? "final.safetensors"
                                                       : "hyperparams.json"),
        std::string::npos)
        << sae.status().message();
  }
  // Finite stored values whose folded scale overflows float32.
  {
    nlohmann::json j = good;
    j["dataset_average_activation_norm"] = {{"in", 1e-39}, {"out", 2.0}};
    std::ofstream(dir / "hyperparams.json") << j.dump();
    StatusOr<Sae> sae = LoadSae(dir.string());
    ASSERT_FALSE(sae.ok());
    EXPECT_NE(sae.status().message().find("overflows float32"),
              std::string::npos)
        << sae.status().message();
    EXPECT_NE(sae.status().message().find("final.safetensors"),
              std::string::npos)
        << sae.status().message();
  }
  // A decoder stored the other way round is refused naming the tensor.
  std::ofstream(dir / "hyperparams.json") << good.dump();
  write(Shape{n, d});
  StatusOr<Sae> flipped = LoadSae(dir.string());
  ASSERT_FALSE(flipped.ok());
  EXPECT_NE(flipped.status().message().find("decoder.weight"),
            std::string::npos)
      << flipped.status().message();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom
