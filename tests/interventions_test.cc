// The intervention file parser (src/model/interventions.h): every golden
// spec.json under shared/golden/interventions that lists interventions parses
// to what it says (hooks, modes, positions, heads, rows, and the vectors equal
// to the goldens' own copies in expected.safetensors); activation_patch (a
// description of a grid, hook "blocks.L...") is refused naming the field; and
// every validation error names the entry, the field and the values involved.
#include "src/model/interventions.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "src/base/float16.h"
#include "src/io/npy.h"
#include "src/io/safetensors_writer.h"
#include "src/io/test_util.h"
#include "src/model/registry.h"
#include "tests/golden_util.h"

namespace loom {
namespace {

using ::loom::testing::TempDir;

ModelConfig Llama8B() {
  StatusOr<ModelConfig> c =
      LoadModelConfig(std::string(LOOM_TESTDATA_DIR) + "/configs/Llama-3.1-8B");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : ModelConfig();
}

std::string PositionsKind(const InterventionPositions& p) {
  switch (p.kind) {
    case InterventionPositions::Kind::kAll:
      return "all";
    case InterventionPositions::Kind::kLast:
      return "last";
    case InterventionPositions::Kind::kList:
      return "explicit";
    case InterventionPositions::Kind::kSpan:
      return "span";
  }
  return "?";
}

// Writes `v` as a [1, n] f32 .npy file.
void WriteNpy(const std::string& path, const std::vector<float>& v) {
  auto w =
      NpyWriter::Create(path, DType::kF32, {static_cast<int64_t>(v.size())});
  ASSERT_TRUE(w.ok()) << w.status().message();
  ASSERT_TRUE((*w)->AppendRows(v.data(), 1).ok());
  ASSERT_TRUE((*w)->Commit().ok());
  ASSERT_TRUE((*w)->Close().ok());
}

TEST(InterventionGoldens, EveryListCaseParsesToItsSpec) {
  const std::string shared = testing::SharedGoldenDir();
  if (shared.empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: no shared golden directory ("
                 << LOOM_SHARED_DIR << "/golden); the intervention spec.json "
                 << "files were not checked";
  const std::string root = shared + "/interventions";
  ASSERT_TRUE(std::filesystem::is_directory(root)) << root;
  int parsed = 0, refused = 0;
  for (const auto& dir : std::filesystem::directory_iterator(root)) {
    if (!dir.is_directory()) continue;
    const std::string spec_path = dir.path().string() + "/spec.json";
    SCOPED_TRACE(spec_path);
    const nlohmann::json spec = testing::ReadJson(spec_path);
    const std::string model = spec.at("model").get<std::string>();
    StatusOr<ModelConfig> config = LoadModelConfig(shared + "/tiny/" + model);
    ASSERT_TRUE(config.ok()) << config.status().message();
    StatusOr<std::vector<Intervention>> got =
        ParseInterventionFile(spec_path, *config);
    if (spec.at("case") == "activation_patch") {
      ASSERT_FALSE(got.ok());
      EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
      EXPECT_CONTAINS(got.status().message(),
                      "interventions[0].hook: hook 'blocks.L.hook_resid_pre'");
      ++refused;
      continue;
    }
    ASSERT_TRUE(got.ok()) << got.status().message();
    const nlohmann::json& list = spec.at("interventions");
    ASSERT_EQ(got->size(), list.size());
    auto expected = testing::GoldenFile::Open(dir.path().string() +
                                              "/expected.safetensors");
    ASSERT_NE(expected, nullptr);
    for (size_t i = 0; i < list.size(); ++i) {
      const nlohmann::json& want = list[i];
      const Intervention& iv = (*got)[i];
      SCOPED_TRACE(i);
      EXPECT_EQ(HookName(iv.hook), want.at("hook").get<std::string>());
      EXPECT_EQ(InterventionModeName(iv.mode),
                want.at("mode").get<std::string>());
      EXPECT_EQ(iv.scale, want.value("scale", 1.0));
      EXPECT_EQ(iv.head, want.value("head", int64_t{-1}));
      EXPECT_EQ(iv.rows, want.value("rows", std::vector<int64_t>()));
      if (want.contains("positions_rule")) {
        EXPECT_EQ(PositionsKind(iv.positions),
                  want.at("positions_rule").get<std::string>());
        if (iv.positions.kind == InterventionPositions::Kind::kList) {
          EXPECT_EQ(iv.positions.list,
                    want.at("positions").get<std::vector<int64_t>>());
        }
      } else {
        EXPECT_EQ(PositionsKind(iv.positions), "all");  // batch_mixed
      }
      if (want.contains("vector_key")) {
        const std::vector<float> v =
            expected->F32(want.at("vector_key").get<std::string>());
        ASSERT_EQ(iv.vector.size(), v.size());
        EXPECT_EQ(iv.vector, v);
        EXPECT_EQ(static_cast<int64_t>(v.size()), config->hidden_size);
      } else {
        EXPECT_TRUE(iv.vector.empty());
      }
    }
    ++parsed;
  }
  // 9 steering cases, 2 project_ablate, zero/mean/head ablation, batch_mixed;
  // 3 activation_patch.
  EXPECT_EQ(parsed, 15);
  EXPECT_EQ(refused, 3);
}

class InterventionParseTest : public ::testing::Test {
 protected:
  StatusOr<std::vector<Intervention>> Parse(const std::string& entries) {
    return ParseInterventions("{\"interventions\": [" + entries + "]}",
                              dir_.path(), config_);
  }
  // The error message of Parse(entries), "" when it succeeds.
  std::string Error(const std::string& entries) {
    StatusOr<std::vector<Intervention>> r = Parse(entries);
    return r.ok() ? "" : r.status().message();
  }
  // An inline vector of `n` values (the first one `first`).
  static std::string Vector(int64_t n, double first = 1.0) {
    std::string s = "[" + std::to_string(first);
    for (int64_t i = 1; i < n; ++i) s += ",0";
    return s + "]";
  }

  ModelConfig config_ = Llama8B();  // 32 layers, hidden 4096, 32 heads of 128
  TempDir dir_;
};

// numpy's default dtype: a float64 vector file is rounded to f32 (as the
// Python module converts its arrays); one beyond f32's range is refused.
TEST_F(InterventionParseTest, Float64VectorFilesAreConverted) {
  const auto write_f64 = [&](const std::string& name,
                             const std::vector<double>& v) {
    auto w = NpyWriter::Create(dir_.File(name), DType::kF64,
                               {static_cast<int64_t>(v.size())});
    ASSERT_TRUE(w.ok()) << w.status().message();
    ASSERT_TRUE((*w)->AppendRows(v.data(), 1).ok());
    ASSERT_TRUE((*w)->Commit().ok());
    ASSERT_TRUE((*w)->Close().ok());
  };
  std::vector<double> v(4096, 0.1);
  v[7] = -3.5;
  write_f64("f64.npy", v);
  StatusOr<std::vector<Intervention>> r =
      Parse(R"({"hook": "blocks.1.hook_resid_post", "mode": "add",
                "vector_file": "f64.npy"})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->front().vector.size(), 4096u);
  EXPECT_EQ(r->front().vector[0], static_cast<float>(0.1));
  EXPECT_EQ(r->front().vector[7], -3.5f);
  v[9] = 1e300;
  write_f64("huge.npy", v);
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.1.hook_resid_post", "mode": "add",
                            "vector_file": "huge.npy"})"),
                  "value 9 (");
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.1.hook_resid_post", "mode": "add",
                            "vector_file": "huge.npy"})"),
                  "beyond the float32 range");
}

TEST_F(InterventionParseTest, AllModesWithDefaultsAndAnnotationsPassedOver) {
  ASSERT_EQ(config_.hidden_size, 4096);
  WriteNpy(dir_.File("v.npy"), std::vector<float>(4096, 0.25f));
  StatusOr<std::vector<Intervention>> r = Parse(
      R"({"hook": "blocks.3.hook_resid_post", "mode": "add", "scale": -2.5,
          "vector_file": "v.npy", "positions": [0, -1], "rows": [4, 1],
          "note": "ignored", "formula": {"also": "ignored"}},
         {"hook": "blocks.-1.hook_mlp_out", "mode": "zero", "positions": "last"},
         {"hook": "blocks.0.attn.hook_z", "mode": "zero_head", "head": 31},
         {"hook": "blocks.2.mlp.hook_post", "mode": "replace",
          "vector": )" +
      Vector(14336, 0.5) + R"(},
         {"hook": "blocks.{0.5}.hook_resid_mid", "mode": "project_out",
          "vector": )" +
      Vector(4096) + "}");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 5u);
  const Intervention& add = (*r)[0];
  EXPECT_EQ(HookName(add.hook), "blocks.3.hook_resid_post");
  EXPECT_EQ(add.mode, InterventionMode::kAdd);
  EXPECT_EQ(add.scale, -2.5f);
  EXPECT_EQ(add.vector, std::vector<float>(4096, 0.25f));
  EXPECT_EQ(add.positions.list, (std::vector<int64_t>{0, -1}));
  EXPECT_EQ(add.rows, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(add.head, -1);
  EXPECT_EQ(HookName((*r)[1].hook), "blocks.31.hook_mlp_out");
  EXPECT_EQ((*r)[1].positions.kind, InterventionPositions::Kind::kLast);
  EXPECT_TRUE((*r)[1].vector.empty());
  EXPECT_TRUE((*r)[1].rows.empty());
  EXPECT_EQ((*r)[2].head, 31);
  EXPECT_EQ((*r)[2].positions.kind, InterventionPositions::Kind::kAll);
  EXPECT_EQ((*r)[3].vector.size(), 14336u);
  EXPECT_EQ((*r)[3].vector[0], 0.5f);
  EXPECT_EQ(HookName((*r)[4].hook), "blocks.16.hook_resid_mid");
}

TEST_F(InterventionParseTest, LayerPatternGivesOneInterventionPerLayer) {
  StatusOr<std::vector<Intervention>> r =
      Parse(R"({"hook": "blocks.*.hook_resid_pre", "mode": "project_out",
                "vector": )" +
            Vector(4096) + "}");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 32u);
  for (int64_t l = 0; l < 32; ++l) {
    EXPECT_EQ((*r)[l].hook.layer, l);
    EXPECT_EQ((*r)[l].vector.size(), 4096u);
  }
}

TEST_F(InterventionParseTest, HookErrorsNameTheFieldAndTheHook) {
  EXPECT_CONTAINS(
      Error(R"({"hook": "blocks.99.hook_resid_post",
                            "mode": "zero"})"),
      "interventions[0].hook: hook 'blocks.99.hook_resid_post': layer 99 "
      "is out of range");
  EXPECT_CONTAINS(
      Error(R"({"hook": "blocks.1.hook_nope", "mode": "zero"})"),
      "interventions[0].hook: hook 'blocks.1.hook_nope': unknown "
      "site 'hook_nope'; the hooks of this llama model that can "
      "be edited: blocks.{L}.hook_resid_pre, blocks.{L}.attn.hook_z");
  // The nearest editable hook, at the item's layer; no hook the model
  // lacks or that cannot be edited in the list.
  const std::string typo =
      Error(R"({"hook": "blocks.0.hook_resid_pots", "mode": "zero"})");
  EXPECT_CONTAINS(typo, "did you mean 'blocks.0.hook_resid_post'?");
  EXPECT_EQ(typo.find("hook_router_logits"), std::string::npos) << typo;
  EXPECT_EQ(typo.find("hook_pattern"), std::string::npos) << typo;
  EXPECT_EQ(typo.find("hook_embed"), std::string::npos) << typo;
  // The name once, not twice.
  EXPECT_EQ(typo.find("blocks.0.hook_resid_pots"),
            typo.rfind("blocks.0.hook_resid_pots"))
      << typo;
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.1.attn.hook_q", "mode": "zero"})"),
                  "'blocks.1.attn.hook_q' cannot be edited");
  EXPECT_CONTAINS(Error(R"({"hook": "logits", "mode": "zero"})"),
                  "'logits' cannot be edited; the hooks of this llama model "
                  "that can: blocks.{L}.hook_resid_pre");
  EXPECT_CONTAINS(Error(R"({"mode": "zero"})"),
                  "interventions[0].hook: missing");
  EXPECT_CONTAINS(Error(R"({"hook": 3, "mode": "zero"})"),
                  "interventions[0].hook: 3 is not a string");
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.0.hook_mlp_out", "mode": "zero"},
                           {"hook": "blocks.0.hook_resid_post",
                            "mode": "zero_head", "head": 0})"),
                  "interventions[1].hook: mode \"zero_head\" needs "
                  "attn.hook_z, not 'blocks.0.hook_resid_post'");
}

TEST_F(InterventionParseTest, VectorWidthFinitenessAndNorm) {
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.1.hook_resid_post", "mode": "add",
                            "vector": [1, 2, 3]})"),
                  "interventions[0].vector: has 3 values but "
                  "blocks.1.hook_resid_post is 4096 wide");
  WriteNpy(dir_.File("short.npy"), std::vector<float>(64, 1.0f));
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.1.hook_resid_post", "mode": "add",
                            "vector_file": "short.npy"})"),
                  "interventions[0].vector_file: has 64 values but "
                  "blocks.1.hook_resid_post is 4096 wide");
  std::vector<float> nan(4096, 0.0f);
  nan[0] = 1.0f;
  nan[5] = std::numeric_limits<float>::quiet_NaN();
  WriteNpy(dir_.File("nan.npy"), nan);
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.1.hook_resid_post", "mode": "add",
                            "vector_file": "nan.npy"})"),
                  "interventions[0].vector_file: value 5 of 4096 is nan");
  nan[5] = std::numeric_limits<float>::infinity();
  WriteNpy(dir_.File("inf.npy"), nan);
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.1.hook_resid_post",
                            "mode": "replace", "vector_file": "inf.npy"})"),
                  "value 5 of 4096 is infinite");
  // 1e39 is finite as a double but not as f32.
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.1.hook_resid_post", "mode": "add",
                            "vector": )" +
                        Vector(4096, 1e39) + "}"),
                  "value 0 of 4096 is infinite");
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.1.hook_resid_post",
                            "mode": "project_out", "vector": )" +
                        Vector(4096, 2.0) + "}"),
                  "project_out needs a unit vector; its norm is 2.0");
  EXPECT_CONTAINS(
      Error(R"({"hook": "blocks.1.hook_resid_post", "mode": "add"})"),
      "interventions[0].vector_file: missing");
  EXPECT_CONTAINS(
      Error(R"({"hook": "blocks.1.hook_resid_post", "mode": "zero",
                            "vector_file": "v.npy"})"),
      "interventions[0].vector_file: mode \"zero\" takes no vector");
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.1.hook_resid_post", "mode": "add",
                            "vector": [1], "vector_file": "v.npy"})"),
                  "give vector or vector_file, not both");
}

TEST_F(InterventionParseTest, MissingOrBadVectorFile) {
  StatusOr<std::vector<Intervention>> r =
      Parse(R"({"hook": "blocks.1.hook_resid_post", "mode": "add",
                "vector_file": "absent.npy"})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(r.status().message(), "interventions[0].vector_file: ");
  EXPECT_CONTAINS(r.status().message(), dir_.File("absent.npy"));
  { std::ofstream(dir_.File("junk.npy")) << "not an npy file"; }
  r = Parse(R"({"hook": "blocks.1.hook_resid_post", "mode": "add",
                "vector_file": "junk.npy"})");
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), "interventions[0].vector_file: ");
  auto w = NpyWriter::Create(dir_.File("i32.npy"), DType::kI32, {4096});
  ASSERT_TRUE(w.ok());
  std::vector<int32_t> ints(4096, 1);
  ASSERT_TRUE((*w)->AppendRows(ints.data(), 1).ok());
  ASSERT_TRUE((*w)->Commit().ok());
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.1.hook_resid_post", "mode": "add",
                            "vector_file": "i32.npy"})"),
                  "holds <i4 values; expected float32 ('<f4') or float64");
  w = NpyWriter::Create(dir_.File("two.npy"), DType::kF32, {4096});
  ASSERT_TRUE(w.ok());
  std::vector<float> two(2 * 4096, 0.0f);
  ASSERT_TRUE((*w)->AppendRows(two.data(), 2).ok());
  ASSERT_TRUE((*w)->Commit().ok());
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.1.hook_resid_post", "mode": "add",
                            "vector_file": "two.npy"})"),
                  "has shape [2, 4096] but blocks.1.hook_resid_post needs "
                  "[4096]");
}

TEST_F(InterventionParseTest, ModeScaleHeadPositionsAndRowsErrors) {
  const std::string hook = R"("hook": "blocks.0.attn.hook_z", )";
  EXPECT_CONTAINS(Error("{" + hook + R"("mode": "steer"})"),
                  "interventions[0].mode: \"steer\" is not one of add, "
                  "project_out, zero, replace, zero_head, patch, patch_head, "
                  "feature_add, feature_clamp, feature_ablate, "
                  "sae_reconstruct");
  EXPECT_CONTAINS(Error("{" + hook + R"("mode": "zero_head", "head": 32})"),
                  "interventions[0].head: 32 is outside [0, 32)");
  EXPECT_CONTAINS(Error("{" + hook + R"("mode": "zero_head", "head": -1})"),
                  "interventions[0].head: -1 is outside [0, 32)");
  EXPECT_CONTAINS(Error("{" + hook + R"("mode": "zero_head", "head": 1.5})"),
                  "interventions[0].head: 1.5 is not an integer");
  EXPECT_CONTAINS(Error("{" + hook + R"("mode": "zero_head"})"),
                  "interventions[0].head: missing");
  EXPECT_CONTAINS(Error("{" + hook + R"("mode": "zero", "head": 1})"),
                  "interventions[0].head: applies to modes zero_head and "
                  "patch_head only");
  EXPECT_CONTAINS(Error("{" + hook + R"("mode": "zero", "scale": 2})"),
                  "interventions[0].scale: applies to mode \"add\" only");
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.0.hook_resid_pre", "mode": "add",
                            "scale": 1e39, "vector": )" +
                        Vector(4096) + "}"),
                  "interventions[0].scale: 1e+39 is not a finite f32 value");
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.0.hook_resid_pre", "mode": "add",
                            "scale": "4", "vector": )" +
                        Vector(4096) + "}"),
                  "interventions[0].scale: \"4\" is not a number");
  EXPECT_CONTAINS(Error("{" + hook + R"("mode": "zero", "positions": []})"),
                  "interventions[0].positions: empty list");
  EXPECT_CONTAINS(Error("{" + hook + R"("mode": "zero", "positions": [1, 1]})"),
                  "interventions[0].positions: position 1 is listed twice");
  EXPECT_CONTAINS(Error("{" + hook + R"("mode": "zero", "positions": [0.5]})"),
                  "entry 0 (0.5) is not a 32-bit integer position");
  EXPECT_CONTAINS(
      Error("{" + hook + R"("mode": "zero", "positions": "first"})"),
      "interventions[0].positions: \"first\" is not \"all\", "
      "\"last\", a list");
  EXPECT_CONTAINS(
      Error("{" + hook + R"("mode": "zero", "positions_rule": "every"})"),
      "interventions[0].positions_rule: \"every\" is not one of");
  EXPECT_CONTAINS(Error("{" + hook + R"("mode": "zero", "rows": [2, 2]})"),
                  "interventions[0].rows: row 2 is listed twice");
  EXPECT_CONTAINS(Error("{" + hook + R"("mode": "zero", "rows": [-1]})"),
                  "interventions[0].rows: -1 is not a row index");
  EXPECT_CONTAINS(Error("{" + hook + R"("mode": "zero", "rows": []})"),
                  "interventions[0].rows: [] is not a non-empty list");
  EXPECT_CONTAINS(
      Error(R"({"hook": "blocks.0.hook_resid_pre", "mode": "patch"})"),
      "interventions[0].positions: a patch names its positions (a list or a "
      "span), not \"all\"");
}

TEST_F(InterventionParseTest, MalformedDocuments) {
  auto error = [&](const std::string& text) {
    StatusOr<std::vector<Intervention>> r =
        ParseInterventions(text, dir_.path(), config_);
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_CONTAINS(error(R"({"interventions": [)"), "not valid JSON at line 1");
  EXPECT_CONTAINS(error("[1, 2]"), "the top level is array");
  EXPECT_CONTAINS(error(R"({"steer": []})"),
                  "expected a non-empty list under \"interventions\"");
  EXPECT_CONTAINS(error(R"({"interventions": []})"), "non-empty list");
  EXPECT_CONTAINS(error(R"({"interventions": [3]})"),
                  "interventions[0]: 3 is not an object");
}

TEST_F(InterventionParseTest, FileResolvesVectorsBesideItAndNamesItself) {
  std::filesystem::create_directory(dir_.File("sub"));
  std::vector<float> v(4096, 0.0f);
  v[7] = 1.0f;
  WriteNpy(dir_.File("sub/dir.npy"), v);
  std::ofstream(dir_.File("sub/iv.json"))
      << R"({"interventions": [{"hook": "blocks.2.hook_resid_pre",
            "mode": "project_out", "vector_file": "dir.npy"}]})";
  StatusOr<std::vector<Intervention>> r =
      ParseInterventionFile(dir_.File("sub/iv.json"), config_);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].vector, v);
  std::ofstream(dir_.File("bad.json")) << "{";
  r = ParseInterventionFile(dir_.File("bad.json"), config_);
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), dir_.File("bad.json") + ": ");
  r = ParseInterventionFile(dir_.File("none.json"), config_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

TEST(ResolvePositionsTest, AllLastAndListsWithNegatives) {
  using Kind = InterventionPositions::Kind;
  EXPECT_EQ(*ResolvePositions({Kind::kAll, {}}, 3),
            (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(*ResolvePositions({Kind::kLast, {}}, 9), (std::vector<int64_t>{8}));
  EXPECT_TRUE(ResolvePositions({Kind::kLast, {}}, 0)->empty());
  EXPECT_EQ(*ResolvePositions({Kind::kList, {3, -1, 1}}, 9),
            (std::vector<int64_t>{1, 3, 8}));
  StatusOr<std::vector<int64_t>> r = ResolvePositions({Kind::kList, {9}}, 9);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_CONTAINS(r.status().message(),
                  "position 9 is outside a sequence of 9 tokens");
  r = ResolvePositions({Kind::kList, {-10}}, 9);
  EXPECT_FALSE(r.ok());
  r = ResolvePositions({Kind::kList, {8, -1}}, 9);
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), "name token 8 twice");
}

// CheckIntervention: what every forward that applies an intervention needs
// (the executor and the server check it), each error naming the entry.
TEST(CheckInterventionTest, EveryRuleOnItsOwn) {
  const ModelConfig c = Llama8B();
  Intervention ok;
  ok.hook = {HookSite::kResidPost, 3};
  ok.mode = InterventionMode::kAdd;
  ok.vector.assign(4096, 0.5f);
  EXPECT_TRUE(CheckIntervention(ok, c, "iv").ok());
  auto message = [&](const Intervention& iv, bool elsewhere = false) {
    const Status st = CheckIntervention(iv, c, "iv 7", elsewhere);
    EXPECT_FALSE(st.ok());
    return std::string(st.message());
  };
  Intervention bad = ok;
  bad.vector.resize(64);
  EXPECT_EQ(message(bad),
            "iv 7: blocks.3.hook_resid_post needs 4096 values, got 64");
  bad = ok;
  bad.vector[17] = std::nanf("");
  EXPECT_EQ(message(bad), "iv 7: value 17 of the vector is not finite");
  bad = ok;
  bad.hook = {HookSite::kQ, 3};
  EXPECT_NE(message(bad).find("iv 7: 'blocks.3.attn.hook_q' cannot be edited"),
            std::string::npos);
  bad = ok;
  bad.hook = {HookSite::kResidPost, 32};
  EXPECT_NE(message(bad).find("iv 7"), std::string::npos);
  Intervention head;
  head.hook = {HookSite::kZ, 0};
  head.mode = InterventionMode::kZeroHead;
  head.head = 32;
  EXPECT_EQ(message(head),
            "iv 7: head 32 of blocks.0.attn.hook_z outside [0, 32)");
  head.head = 31;
  EXPECT_TRUE(CheckIntervention(head, c, "iv").ok());
  Intervention patch;
  patch.hook = {HookSite::kResidPre, 1};
  patch.mode = InterventionMode::kPatch;
  patch.positions.kind = InterventionPositions::Kind::kList;
  patch.positions.list = {3, 1};
  EXPECT_EQ(message(patch, true),
            "iv 7: a patch's positions must be ascending and >= 0");
  patch.positions.list = {1, 3};
  EXPECT_TRUE(CheckIntervention(patch, c, "iv", true).ok());
  EXPECT_EQ(message(patch),
            "iv 7: blocks.1.hook_resid_pre needs 8192 values, got 0");
  patch.positions.kind = InterventionPositions::Kind::kAll;
  EXPECT_CONTAINS(message(patch, true), "iv 7: a patch names its positions");
  patch.positions.kind = InterventionPositions::Kind::kSpan;
  patch.positions.span_begin = 2;
  patch.positions.span_end = 5;
  EXPECT_TRUE(CheckIntervention(patch, c, "iv", true).ok());
  patch.vector.assign(3 * 4096, 1.0f);
  EXPECT_TRUE(CheckIntervention(patch, c, "iv").ok());
  patch.positions.span_to_end = true;
  EXPECT_CONTAINS(message(patch), "a patch's span needs 0 <= begin < end");
  Intervention ph = patch;
  ph.positions.span_to_end = false;
  ph.mode = InterventionMode::kPatchHead;
  ph.hook = {HookSite::kZ, 1};
  ph.head = 32;
  EXPECT_EQ(message(ph),
            "iv 7: head 32 of blocks.1.attn.hook_z outside [0, 32)");
  ph.head = 5;
  EXPECT_TRUE(CheckIntervention(ph, c, "iv").ok());
}

TEST(ResolvePositionsTest, Spans) {
  InterventionPositions p;
  p.kind = InterventionPositions::Kind::kSpan;
  p.span_begin = 2;
  p.span_end = 5;
  EXPECT_EQ(*ResolvePositions(p, 9), (std::vector<int64_t>{2, 3, 4}));
  p.span_begin = -3;
  p.span_to_end = true;
  EXPECT_EQ(*ResolvePositions(p, 9), (std::vector<int64_t>{6, 7, 8}));
  p.span_begin = 0;
  p.span_to_end = false;
  p.span_end = -1;  // all but the last
  EXPECT_EQ(*ResolvePositions(p, 4), (std::vector<int64_t>{0, 1, 2}));
  p.span_end = 10;
  StatusOr<std::vector<int64_t>> r = ResolvePositions(p, 9);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(r.status().message(),
            "span [0, 10) is outside a sequence of 9 tokens");
  p.span_begin = -2;
  p.span_end = 1;
  r = ResolvePositions(p, 9);  // [7, 1): empty here
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "span [-2, 1) is empty in a sequence of 9 tokens");
}

TEST(PositionsTextTest, AllLastListsAndSpans) {
  using Kind = InterventionPositions::Kind;
  EXPECT_EQ(ParsePositionsText("all")->kind, Kind::kAll);
  EXPECT_EQ(ParsePositionsText("last")->kind, Kind::kLast);
  EXPECT_EQ(ParsePositionsText("1,-1")->list, (std::vector<int64_t>{1, -1}));
  StatusOr<InterventionPositions> s = ParsePositionsText("2:5");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->kind, Kind::kSpan);
  EXPECT_EQ(s->span_begin, 2);
  EXPECT_EQ(s->span_end, 5);
  EXPECT_FALSE(s->span_to_end);
  s = ParsePositionsText("-3:");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->span_begin, -3);
  EXPECT_TRUE(s->span_to_end);
  s = ParsePositionsText(":-1");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->span_begin, 0);
  EXPECT_EQ(s->span_end, -1);
  s = ParsePositionsText("1:x");
  ASSERT_FALSE(s.ok());
  EXPECT_CONTAINS(s.status().message(), "span '1:x' is not A:B");
  // The shorthand writes the span into the document, and it parses back.
  StatusOr<std::string> doc =
      ShorthandInterventions({"blocks.0.hook_resid_pre=v.npy*2@1:3"}, {});
  ASSERT_TRUE(doc.ok());
  EXPECT_CONTAINS(*doc, R"("positions":{"span":[1,3]})");
  doc = ShorthandInterventions({"blocks.0.hook_resid_pre=v.st#dir.4*2@-2:"},
                               {"blocks.1.hook_resid_pre=d.gguf#direction.1"});
  ASSERT_TRUE(doc.ok());
  EXPECT_CONTAINS(*doc, R"("positions":{"span":[-2,null]})");
  EXPECT_CONTAINS(*doc, R"("tensor":"dir.4","vector_file":"v.st")");
  EXPECT_CONTAINS(*doc, R"("tensor":"direction.1","vector_file":"d.gguf")");
}

// A scale that is not a finite f32 number is refused by the flag's name (it
// used to be written as JSON null and read as the default scale, 1), and an
// explicit null scale in a document is refused by its field.
TEST_F(InterventionParseTest, NonFiniteScalesAreRefused) {
  for (const std::string scale : {"nan", "inf", "-inf", "NaN", "1e39"}) {
    const std::string flag = "blocks.0.hook_resid_pre=v.npy*" + scale;
    StatusOr<std::string> doc = ShorthandInterventions({flag}, {});
    ASSERT_FALSE(doc.ok()) << scale << ": " << *doc;
    EXPECT_CONTAINS(doc.status().message(), "--steer " + flag);
    EXPECT_CONTAINS(doc.status().message(),
                    "scale '" + scale + "' is not a finite f32 number");
    EXPECT_EQ(doc.status().message().find("interventions["), std::string::npos);
  }
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.0.hook_resid_pre", "mode": "add",
                            "scale": null, "vector": )" +
                        Vector(4096) + "}"),
                  "interventions[0].scale: null is not a number");
}

// A misspelt field is refused with the nearest field name (it used to be
// passed over: "scal": 5 ran with scale 1); the goldens' annotations and
// notes are passed over.
TEST_F(InterventionParseTest, MisspeltFieldsAreRefusedWithTheNearestName) {
  const std::string v = Vector(4096);
  EXPECT_CONTAINS(
      Error(R"({"hook": "blocks.0.hook_resid_pre", "mode": "add", "scal": 5,
                "vector": )" +
            v + "}"),
      "interventions[0]: unknown field \"scal\" (did you mean \"scale\"?); "
      "the fields: hook, mode, scale, norm_match, vector_file, tensor, "
      "vector, sae, feature, head, positions, positions_rule, rows, apply_to, "
      "value");
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.0.hook_resid_pre", "mode": "zero"},
                           {"hook": "blocks.0.hook_resid_pre", "mode": "zero",
                            "postions": "last"})"),
                  "interventions[1]: unknown field \"postions\" (did you "
                  "mean \"positions\"?)");
  const std::string far =
      Error(R"({"hook": "blocks.0.hook_resid_pre", "mode": "zero",
                "temperature": 0.5})");
  EXPECT_CONTAINS(far,
                  "interventions[0]: unknown field \"temperature\"; the "
                  "fields: hook");
  EXPECT_EQ(far.find("did you mean"), std::string::npos) << far;
  EXPECT_EQ(Error(R"({"hook": "blocks.0.hook_resid_pre", "mode": "zero",
                      "note": "x", "hf_module": "model.layers[0]",
                      "vector_is_unit": false, "comment": 1})"),
            "");
}

// The shorthand flags' entries are named by their flag, not as
// interventions[i], with the editable hooks' nearest spelling.
TEST_F(InterventionParseTest, ShorthandErrorsNameTheFlag) {
  StatusOr<std::string> doc = ShorthandInterventions(
      {"blocks.0.hook_resid_pots=v.npy*2"}, {"blocks.1.hook_resid_pre=d.npy"});
  ASSERT_TRUE(doc.ok()) << doc.status().message();
  StatusOr<std::vector<Intervention>> r =
      ParseInterventions(*doc, dir_.path(), config_);
  ASSERT_FALSE(r.ok());
  const std::string m(r.status().message());
  EXPECT_EQ(m.rfind("--steer blocks.0.hook_resid_pots=v.npy*2 (hook): ", 0), 0u)
      << m;
  EXPECT_CONTAINS(m, "did you mean 'blocks.0.hook_resid_post'?");
  EXPECT_EQ(m.find("interventions["), std::string::npos) << m;
  doc = ShorthandInterventions({}, {"blocks.1.hook_resid_pre=missing.npy"});
  ASSERT_TRUE(doc.ok());
  r = ParseInterventions(*doc, dir_.path(), config_);
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(),
                  "--ablate-direction blocks.1.hook_resid_pre=missing.npy "
                  "(vector_file): ");
}

// An edit a job cannot apply anywhere is refused before it runs: rows past
// the job's rows, or generated tokens only in a job that generates none.
TEST(InterventionApplyTest, EditsThatWouldEditNothingAreRefused) {
  Intervention iv;
  iv.hook = {HookSite::kResidPost, 0};
  iv.mode = InterventionMode::kZero;
  iv.rows = {0, 7};
  Status s = CheckInterventionsApply({iv}, 2, "input rows", false);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(s.message(),
                  "interventions: the zero at blocks.0.hook_resid_post lists "
                  "row 7 in `rows`, but this job has 2 input rows (rows count "
                  "from 0): it would edit nothing");
  EXPECT_CONTAINS(CheckInterventionsApply({iv}, 1, "prompts", true).message(),
                  "this job has 1 prompt (rows");
  EXPECT_TRUE(CheckInterventionsApply({iv}, 8, "windows", false).ok());
  iv.rows.clear();
  iv.apply_to = InterventionApplyTo::kGenerated;
  EXPECT_CONTAINS(CheckInterventionsApply({iv}, 1, "windows", false).message(),
                  "has apply_to \"generated\", but this job generates no "
                  "tokens");
  EXPECT_TRUE(CheckInterventionsApply({iv}, 1, "prompts", true).ok());
}

TEST_F(InterventionParseTest, SpansNormMatchAndPatches) {
  const std::string v = Vector(4096);
  StatusOr<std::vector<Intervention>> r =
      Parse(R"({"hook": "blocks.0.hook_resid_pre", "mode": "add",
                "norm_match": true, "positions": {"span": [1, null]},
                "vector": )" +
            v + "}");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE((*r)[0].norm_match);
  EXPECT_EQ((*r)[0].positions.kind, InterventionPositions::Kind::kSpan);
  EXPECT_EQ((*r)[0].positions.span_begin, 1);
  EXPECT_TRUE((*r)[0].positions.span_to_end);
  EXPECT_EQ((*r)[0].apply_to, InterventionApplyTo::kPrompt);
  const nlohmann::json record = InterventionsJson(*r);
  EXPECT_EQ(record[0]["positions"],
            nlohmann::json::parse(R"({"span": [1, null]})"));
  EXPECT_EQ(record[0]["norm_match"], true);
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.0.hook_resid_pre", "mode": "zero",
                            "norm_match": true})"),
                  "interventions[0].norm_match: applies to mode \"add\" only");
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.0.hook_resid_pre", "mode": "zero",
                            "norm_match": 1})"),
                  "interventions[0].norm_match: 1 is not true or false");
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.0.hook_resid_pre", "mode": "zero",
                            "positions": {"span": [3, 3]}})"),
                  "interventions[0].positions: span [3,3] is empty");
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.0.hook_resid_pre", "mode": "zero",
                            "positions": {"from": 3}})"),
                  "interventions[0].positions: {\"from\":3} is not {\"span\"");
  // A patch: one row per position, inline (flat or as rows) or from a file.
  const std::string row = Vector(4096, 2.0);
  r = Parse(R"({"hook": "blocks.0.hook_resid_pre", "mode": "patch",
                "positions": [1, 3], "vector": [)" +
            row + "," + row + "]}");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)[0].vector.size(), 2u * 4096);
  EXPECT_EQ((*r)[0].vector[4096], 2.0f);
  EXPECT_TRUE(CheckIntervention((*r)[0], config_, "iv").ok());
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.0.hook_resid_pre", "mode": "patch",
                            "positions": [1, 3], "vector": )" +
                        row + "}"),
                  "interventions[0].vector: has shape [4096] but "
                  "blocks.0.hook_resid_pre needs [2, 4096] (one row per "
                  "position)");
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.0.hook_resid_pre", "mode": "patch",
                            "positions": [3, 1], "vector": )" +
                        row + "}"),
                  "interventions[0].positions: a patch's positions must be "
                  "ascending");
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.0.hook_resid_pre", "mode": "patch",
                            "positions": [1], "apply_to": "both",
                            "vector": )" +
                        row + "}"),
                  "interventions[0].apply_to: a patch edits prompt positions "
                  "only");
  r = Parse(R"({"hook": "blocks.2.attn.hook_z", "mode": "patch_head",
                "head": 7, "positions": {"span": [4, 5]}, "vector": )" +
            row + "}");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)[0].mode, InterventionMode::kPatchHead);
  EXPECT_EQ((*r)[0].head, 7);
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.2.hook_resid_pre",
                            "mode": "patch_head", "head": 7, "positions": [4],
                            "vector": )" +
                        row + "}"),
                  "mode \"patch_head\" needs attn.hook_z");
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.2.attn.hook_z",
                            "mode": "patch_head", "positions": [4],
                            "vector": )" +
                        row + "}"),
                  "interventions[0].head: missing (patch_head needs it)");
}

// Vectors from .safetensors (F32, F16, BF16; `tensor` picks one) read as the
// same values as an f32 .npy.
TEST_F(InterventionParseTest, SafetensorsVectors) {
  std::vector<float> v(4096);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  std::vector<uint16_t> bf16(v.size()), f16(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    bf16[i] = F32ToBf16(v[i]);  // exact: these values fit bf16 and f16
    f16[i] = F32ToF16(v[i]);
  }
  std::vector<float> rows(2 * 4096, 1.0f);
  SafetensorsWriter w;
  ASSERT_TRUE(w.Add("a", DType::kF32, {4096}, v.data(), 4 * 4096).ok());
  ASSERT_TRUE(w.Add("b", DType::kBF16, {1, 4096}, bf16.data(), 2 * 4096).ok());
  ASSERT_TRUE(w.Add("c", DType::kF16, {4096}, f16.data(), 2 * 4096).ok());
  ASSERT_TRUE(
      w.Add("rows", DType::kF32, {2, 4096}, rows.data(), 8 * 4096).ok());
  ASSERT_TRUE(w.Write(dir_.File("v.safetensors")).ok());
  SafetensorsWriter one;
  ASSERT_TRUE(
      one.Add("only", DType::kBF16, {4096}, bf16.data(), 2 * 4096).ok());
  ASSERT_TRUE(one.Write(dir_.File("one.safetensors")).ok());
  for (const char* t : {"a", "b", "c"}) {
    StatusOr<std::vector<Intervention>> r =
        Parse(std::string(R"({"hook": "blocks.1.hook_resid_post", "mode": "add",
                        "vector_file": "v.safetensors", "tensor": ")") +
              t + "\"}");
    ASSERT_TRUE(r.ok()) << t << ": " << r.status().message();
    EXPECT_EQ((*r)[0].vector, v) << t;
  }
  StatusOr<std::vector<Intervention>> r =
      Parse(R"({"hook": "blocks.1.hook_resid_post", "mode": "add",
                "vector_file": "one.safetensors"})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)[0].vector, v);
  r = Parse(R"({"hook": "blocks.1.hook_resid_post", "mode": "patch",
                "positions": [0, 5], "vector_file": "v.safetensors",
                "tensor": "rows"})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)[0].vector, rows);
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.1.hook_resid_post", "mode": "add",
                            "vector_file": "v.safetensors"})"),
                  "interventions[0].vector_file: '" +
                      dir_.File("v.safetensors") +
                      "' holds 4 tensors; name one with `tensor`");
  StatusOr<std::vector<Intervention>> missing =
      Parse(R"({"hook": "blocks.1.hook_resid_post", "mode": "add",
                "vector_file": "v.safetensors", "tensor": "z"})");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(missing.status().message(), "has no tensor 'z' (it has 4)");
  EXPECT_CONTAINS(
      Error(R"({"hook": "blocks.1.hook_resid_post", "mode": "add",
                            "vector_file": "v.safetensors", "tensor": "rows"})"),
      "has shape [2, 4096] but blocks.1.hook_resid_post needs [4096]");
  EXPECT_CONTAINS(Error(R"({"hook": "blocks.1.hook_resid_post", "mode": "add",
                            "vector": )" +
                        Vector(4096) + R"(, "tensor": "a"})"),
                  "interventions[0].tensor: needs a vector_file");
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// "sae" + "feature": the vector is the feature's decoder row, widened from
// the file's dtype, at the SAE's hook unless the entry names another.
TEST_F(InterventionParseTest, SaeFeatureDirections) {
  const int64_t d = 4096, n = 8;
  std::vector<uint16_t> w_enc(d * n), w_dec(n * d), b_enc(n), b_dec(d);
  std::vector<float> row5(d);
  for (int64_t i = 0; i < d; ++i) {
    w_dec[5 * d + i] = F32ToBf16(0.5f * static_cast<float>(i % 5) - 1.0f);
    row5[i] = Bf16ToF32(w_dec[5 * d + i]);
  }
  std::filesystem::create_directories(dir_.File("sae"));
  SafetensorsWriter w;
  ASSERT_TRUE(
      w.Add("W_enc", DType::kBF16, {d, n}, w_enc.data(), 2 * d * n).ok());
  ASSERT_TRUE(
      w.Add("W_dec", DType::kBF16, {n, d}, w_dec.data(), 2 * d * n).ok());
  ASSERT_TRUE(w.Add("b_enc", DType::kBF16, {n}, b_enc.data(), 2 * n).ok());
  ASSERT_TRUE(w.Add("b_dec", DType::kBF16, {d}, b_dec.data(), 2 * d).ok());
  ASSERT_TRUE(w.Write(dir_.File("sae/sae_weights.safetensors")).ok());
  std::ofstream(dir_.File("sae/cfg.json"))
      << R"({"architecture": "standard", "d_in": 4096, "d_sae": 8,
             "dtype": "bfloat16", "apply_b_dec_to_input": false,
             "metadata": {"sae_lens_version": "6.18.0",
                          "hook_name": "blocks.3.hook_resid_post"}})";
  StatusOr<std::vector<Intervention>> r =
      Parse(R"({"mode": "add", "sae": "sae", "feature": 5, "scale": 2})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(HookName((*r)[0].hook), "blocks.3.hook_resid_post");
  EXPECT_EQ((*r)[0].vector, row5);
  EXPECT_EQ((*r)[0].scale, 2.0f);
  r = Parse(R"({"hook": "blocks.7.hook_resid_pre", "mode": "add",
                "sae": "sae", "feature": 5})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(HookName((*r)[0].hook), "blocks.7.hook_resid_pre");
  EXPECT_EQ((*r)[0].vector, row5);
  EXPECT_EQ(Error(R"({"mode": "add", "sae": "sae", "feature": 8})"),
            "interventions[0].feature: 8 is not a feature of " +
                dir_.File("sae") + " (0 .. 7)");
  EXPECT_EQ(Error(R"({"mode": "add", "sae": "sae"})"),
            "interventions[0].sae: needs a feature (the decoder row to use)");
  EXPECT_EQ(Error(R"({"mode": "add", "hook": "blocks.1.hook_resid_post",
                      "feature": 1})"),
            "interventions[0].feature: needs an sae");
  EXPECT_EQ(Error(R"({"mode": "add", "sae": "sae", "feature": 1,
                      "vector": [1]})"),
            "interventions[0].sae: give sae + feature or a vector, not both");
  EXPECT_EQ(Error(R"({"mode": "zero", "sae": "sae", "feature": 1})"),
            "interventions[0].sae: mode \"zero\" takes no SAE feature");
  EXPECT_EQ(Error(R"({"hook": "blocks.1.mlp.hook_post", "mode": "add",
                      "sae": "sae", "feature": 1})"),
            "interventions[0].sae: has 4096 values but blocks.1.mlp.hook_post "
            "is 14336 wide");
  EXPECT_NE(Error(R"({"mode": "add", "sae": "nope", "feature": 1})")
                .find("interventions[0].sae: SAE " + dir_.File("nope") +
                      ": no such file or directory"),
            std::string::npos);
}

}  // namespace
}  // namespace loom
