// One test per class of malformed model directory: each gives a clear Status
// naming the file/tensor/key and both values, never a crash; `loom inspect`
// on such a directory exits non-zero with that message. (File-level
// corruption — truncation, bad header JSON, offsets — is covered tensor by
// tensor in src/io/safetensors_test.cc; here it is checked end to end.)
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "src/io/safetensors.h"
#include "src/io/safetensors_writer.h"
#include "src/io/test_util.h"
#include "src/model/bind.h"
#include "src/model/inspect.h"
#include "src/model/registry.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
const std::string kModel = std::string(LOOM_MODELS_DIR) + "/stories260K";

class CheckpointErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("loom_ckpt_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy_file(kModel + "/config.json", dir_ / "config.json");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Rewrites the bundled checkpoint into dir_ with `edit` applied to the
  // tensor list (name -> view); the views borrow the original mapping.
  void WriteCheckpoint(
      const std::function<void(std::map<std::string, TensorView>&)>& edit) {
    auto file = SafetensorsFile::Open(kModel + "/model.safetensors");
    ASSERT_TRUE(file.ok());
    std::map<std::string, TensorView> tensors;
    for (const auto& t : (*file)->header().tensors)
      tensors[t.name] = (*file)->View(t);
    edit(tensors);
    SafetensorsWriter w;
    for (const auto& [name, view] : tensors)
      ASSERT_TRUE(w.Add(name, view).ok());
    ASSERT_TRUE(w.Write((dir_ / "model.safetensors").string()).ok());
    file_ = std::move(file).value();  // keep the borrowed views alive
  }

  void EditConfig(const std::function<void(nlohmann::json&)>& edit) {
    std::ifstream in(dir_ / "config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    edit(j);
    std::ofstream(dir_ / "config.json") << j.dump(2);
  }

  // Loads through the runtime and expects an error containing every needle;
  // then runs `loom inspect` and expects a non-zero exit and the same text.
  void ExpectError(StatusCode code, const std::vector<std::string>& needles) {
    auto m = Model::Load(dir_.string(), Precision::kF32);
    ASSERT_FALSE(m.ok()) << "loading a malformed directory succeeded";
    EXPECT_EQ(m.status().code(), code) << m.status().ToString();
    for (const auto& n : needles)
      EXPECT_NE(m.status().message().find(n), std::string::npos)
          << "message lacks '" << n << "': " << m.status().message();
    const std::string cmd =
        std::string(LOOM_BINARY) + " inspect " + dir_.string() + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    const int rc = pclose(p);
    EXPECT_NE(WEXITSTATUS(rc), 0)
        << "loom inspect exited 0 on a malformed directory:\n"
        << out;
    for (const auto& n : needles)
      EXPECT_NE(out.find(n), std::string::npos)
          << "inspect output lacks '" << n << "':\n"
          << out;
  }

  fs::path dir_;
  std::unique_ptr<SafetensorsFile> file_;
};

// Sum of the data-offset spans of the header's tensors whose name contains
// one of `needles` (every tensor when empty): the stored bytes, read
// independently of the matcher.
int64_t HeaderBytes(const std::string& path,
                    const std::vector<std::string>& needles = {}) {
  auto h = ReadSafetensorsHeader(path);
  EXPECT_TRUE(h.ok()) << h.status().ToString();
  if (!h.ok()) return -1;
  int64_t sum = 0;
  for (const TensorInfo& t : h->tensors) {
    bool match = needles.empty();
    for (const auto& n : needles) match |= t.name.find(n) != std::string::npos;
    if (match) sum += t.bytes();
  }
  return sum;
}

int64_t GroupBytes(const InspectReport& rep) {
  int64_t sum = 0;
  for (const WeightGroup& g : rep.groups) sum += g.bytes;
  return sum;
}

int64_t DtypeBytes(const InspectReport& rep) {
  int64_t sum = 0;
  for (const auto& [dtype, bytes] : rep.bytes_by_dtype) sum += bytes;
  return sum;
}

// The groups of `family` (one per format it is stored in).
std::vector<WeightGroup> GroupsOf(const InspectReport& rep,
                                  const std::string& family) {
  std::vector<WeightGroup> out;
  for (const WeightGroup& g : rep.groups)
    if (g.family == family) out.push_back(g);
  return out;
}

TEST_F(CheckpointErrorsTest, ValidCopyLoads) {
  WriteCheckpoint([](auto&) {});
  auto m = Model::Load(dir_.string(), Precision::kF32);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
}

TEST_F(CheckpointErrorsTest, MissingTensor) {
  WriteCheckpoint(
      [](auto& t) { t.erase("model.layers.3.mlp.up_proj.weight"); });
  ExpectError(StatusCode::kNotFound,
              {"model.layers.3.mlp.up_proj.weight", "missing", "[172, 64]"});
}

TEST_F(CheckpointErrorsTest, UnusedTensor) {
  WriteCheckpoint([](auto& t) {
    TensorView extra = t.at("model.norm.weight");
    t["model.layers.9.extra.weight"] = extra;
  });
  ExpectError(StatusCode::kInvalidArgument,
              {"model.layers.9.extra.weight", "not used by llama"});
}

// A stored tensor the architecture ignores (a RoPE buffer) is no weight, yet
// its bytes are stored: it forms the "unused" group, so the groups still add
// up to the dtype totals and the file.
TEST_F(CheckpointErrorsTest, IgnoredTensorFormsTheUnusedGroup) {
  WriteCheckpoint([](auto& t) {
    t["model.layers.0.self_attn.rotary_emb.inv_freq"] =
        t.at("model.norm.weight");
  });
  auto rep = InspectModel(dir_.string());
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  ASSERT_TRUE(rep->problems.empty()) << rep->problems[0];
  const std::vector<WeightGroup> unused = GroupsOf(*rep, "unused");
  ASSERT_EQ(unused.size(), 1u);
  EXPECT_EQ(unused[0].format, "F32");
  EXPECT_EQ(unused[0].weights, 0);
  EXPECT_EQ(unused[0].tensors, 1);
  EXPECT_EQ(unused[0].bytes, HeaderBytes((dir_ / "model.safetensors").string(),
                                         {"rotary_emb.inv_freq"}));
  EXPECT_EQ(GroupBytes(*rep), DtypeBytes(*rep));
  EXPECT_EQ(GroupBytes(*rep),
            HeaderBytes((dir_ / "model.safetensors").string()));
}

TEST_F(CheckpointErrorsTest, MisShapedTensor) {
  WriteCheckpoint([](auto& t) {
    TensorView v = t.at("model.layers.0.mlp.down_proj.weight");  // [64, 172]
    v.shape = Shape({172, 64});
    t["model.layers.0.mlp.down_proj.weight"] = v;
  });
  ExpectError(StatusCode::kInvalidArgument,
              {"model.layers.0.mlp.down_proj.weight", "[172, 64] in file",
               "expected [64, 172]"});
}

TEST_F(CheckpointErrorsTest, UnknownModelType) {
  WriteCheckpoint([](auto&) {});
  EditConfig([](auto& j) { j["model_type"] = "mamba9"; });
  ExpectError(StatusCode::kUnimplemented,
              {"mamba9", "supported:", "llama", "gpt2"});
}

TEST_F(CheckpointErrorsTest, ConfigMissingRequiredKey) {
  WriteCheckpoint([](auto&) {});
  EditConfig([](auto& j) { j.erase("hidden_size"); });
  ExpectError(StatusCode::kNotFound,
              {"config.json", "missing required key 'hidden_size'"});
}

TEST_F(CheckpointErrorsTest, ConfigWrongType) {
  WriteCheckpoint([](auto&) {});
  EditConfig([](auto& j) { j["num_hidden_layers"] = "five"; });
  ExpectError(StatusCode::kInvalidArgument,
              {"num_hidden_layers", "\"five\"", "expected an integer"});
}

// Found by fuzz_config: a float beyond int64 was cast (undefined behaviour).
TEST_F(CheckpointErrorsTest, ConfigIntegerOutOfRange) {
  for (const char* value : {"5.12e31", "-1e300", "18446744073709551615",
                            "9223372036854775808.0", "2.5"}) {
    WriteCheckpoint([](auto&) {});
    EditConfig([&](auto& j) {
      j["num_hidden_layers"] = nlohmann::json::parse(value);
    });
    ExpectError(StatusCode::kInvalidArgument,
                {"num_hidden_layers", "expected an integer"});
  }
}

TEST_F(CheckpointErrorsTest, ConfigNotJson) {
  WriteCheckpoint([](auto&) {});
  std::ofstream(dir_ / "config.json") << "{\"model_type\": \"llama\", ";
  ExpectError(StatusCode::kDataLoss, {"config.json", "not valid JSON"});
}

TEST_F(CheckpointErrorsTest, TruncatedFile) {
  WriteCheckpoint([](auto&) {});
  fs::resize_file(dir_ / "model.safetensors",
                  fs::file_size(dir_ / "model.safetensors") - 100);
  ExpectError(StatusCode::kDataLoss, {"model.safetensors"});
}

TEST_F(CheckpointErrorsTest, BadHeaderJson) {
  std::string header = "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], ";
  uint64_t n = header.size();
  std::ofstream out(dir_ / "model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  out.close();
  ExpectError(StatusCode::kDataLoss, {"model.safetensors"});
}

TEST_F(CheckpointErrorsTest, HeaderLengthPastEof) {
  uint64_t n = 1 << 20;
  std::ofstream out(dir_ / "model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << "{}";
  out.close();
  ExpectError(StatusCode::kDataLoss, {"model.safetensors"});
}

TEST_F(CheckpointErrorsTest, NoWeights) {
  auto m = Model::Load(dir_.string(), Precision::kF32);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound) << m.status().ToString();
  EXPECT_NE(m.status().message().find("model.safetensors"), std::string::npos)
      << m.status().message();
}

TEST_F(CheckpointErrorsTest, TokenIdOutsideVocabulary) {
  auto m = Model::Load(kModel, Precision::kF32);
  ASSERT_TRUE(m.ok());
  HookSet hooks;
  hooks.Add({HookSite::kResidPost, 0});
  auto ex = Executor::Create(**m, hooks, {.max_tokens = 8});
  ASSERT_TRUE(ex.ok());
  std::vector<int32_t> ids = {1, 2, 512};
  std::vector<int64_t> starts = {0, 3};
  Status st = (*ex)->Forward(Batch{ids, starts}, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("token id 512"), std::string::npos)
      << st.message();
  std::vector<int32_t> long_ids(9, 1);
  std::vector<int64_t> s2 = {0, 9};
  EXPECT_EQ((*ex)->Forward(Batch{long_ids, s2}, nullptr).code(),
            StatusCode::kOutOfRange);
}

TEST(InspectTest, JsonHasRequiredKeys) {
  auto rep = InspectModel(kModel);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  nlohmann::json j = rep->ToJson();
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["num_layers"], 5);
  EXPECT_EQ(j["hidden_size"], 64);
  // Parameters counted from the checkpoint: tied lm_head is not stored, so it
  // is counted once (as the embedding).
  EXPECT_EQ(j["num_parameters"], 260032);
  EXPECT_EQ(j["bytes_by_dtype"]["F32"], 260032 * 4);
  EXPECT_TRUE(j["problems"].empty());
}

// MoE and MLA structure from config.json alone (the repo's copies of the
// published configs): experts, top-k, the shared expert, the router, the
// dense layers, the MLA ranks.
TEST(InspectTest, ShowsMixtureOfExpertsAndLatentAttention) {
  const std::string configs =
      std::string(LOOM_SOURCE_DIR) + "/tests/data/configs/";
  auto ds = InspectModel(configs + "DeepSeek-V3");
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  const std::string text = ds->ToText();
  EXPECT_CONTAINS(text,
                  "attention         multi-head latent (MLA), 128 heads: q via "
                  "rank 1536, kv latent rank 512, q/k 192 (128 nope + 64 "
                  "rope, the rope key shared), v 128, scores x 0.135234\n");
  // (YaRN's mscale^2 / sqrt(192): the scale that is not 1 / sqrt(head_dim).)
  EXPECT_CONTAINS(text,
                  "experts           256 routed, top 8 per token, "
                  "intermediate 2048; shared expert of 2048\n");
  EXPECT_CONTAINS(text,
                  "router            sigmoid_group_topk, top-k renormalised, "
                  "8 groups keep 4, scaling 2.5\n");
  EXPECT_CONTAINS(text, "expert layers     3-60  (dense MLP: 0-2)\n");
  const nlohmann::json j = ds->ToJson();
  EXPECT_EQ(j["attention"], "mla");
  EXPECT_EQ(j["mla"]["kv_lora_rank"], 512);
  EXPECT_EQ(j["mla"]["q_lora_rank"], 1536);
  EXPECT_EQ(j["moe"]["num_experts"], 256);
  EXPECT_EQ(j["moe"]["experts_per_token"], 8);
  EXPECT_EQ(j["moe"]["shared_expert_intermediate_size"], 2048);
  EXPECT_EQ(j["moe"]["dense_layers"], nlohmann::json({0, 1, 2}));
  EXPECT_EQ(j["moe"]["sparse_layers"].size(), 58u);
  EXPECT_EQ(j["moe"]["n_group"], 8);

  auto qwen = InspectModel(configs + "Qwen3-30B-A3B");
  ASSERT_TRUE(qwen.ok()) << qwen.status().ToString();
  EXPECT_CONTAINS(qwen->ToText(), "expert layers     0-47\n");
  EXPECT_EQ(qwen->ToJson()["moe"]["dense_layers"], nlohmann::json::array());
  EXPECT_FALSE(qwen->ToJson()["moe"].contains("n_group"));
  auto oss = InspectModel(configs + "gpt-oss-20b");
  ASSERT_TRUE(oss.ok()) << oss.status().ToString();
  EXPECT_CONTAINS(oss->ToText(), "router            topk_softmax\n");
  auto dense = InspectModel(kModel);
  ASSERT_TRUE(dense.ok());
  EXPECT_TRUE(dense->ToJson()["moe"].is_null());
  EXPECT_TRUE(dense->ToJson()["mla"].is_null());
  EXPECT_EQ(dense->ToJson()["attention"], "standard");
  EXPECT_EQ(dense->ToText().find("experts "), std::string::npos);
}

// The tiny quantized checkpoints of the shared goldens, one per format.
const std::string kTiny = std::string(LOOM_SHARED_DIR) + "/golden/tiny";

TEST(QuantizedCheckpointTest, InspectMatchesEveryFormat) {
  if (!fs::exists(kTiny))
    GTEST_SKIP() << "SKIPPED LOUDLY: " << kTiny << " not found";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"gpt_oss_mxfp4", "mxfp4"},
      {"qwen3_fp8_block", "fp8-block[32x32]"},
      {"llama_nvfp4_modelopt", "nvfp4-modelopt"},
      {"llama_nvfp4_ct", "nvfp4-compressed-tensors"}};
  for (const auto& [name, format] : cases) {
    SCOPED_TRACE(name);
    auto rep = InspectModel(kTiny + "/" + name);
    ASSERT_TRUE(rep.ok()) << rep.status().ToString();
    EXPECT_TRUE(rep->problems.empty()) << rep->problems[0];
    // gpt-oss: gate_up and down per layer (3 layers); the dense ones: q, k,
    // v, o, gate, up, down per layer (2 layers).
    EXPECT_EQ(rep->weights_by_format[format], name == "gpt_oss_mxfp4" ? 6 : 14);
    EXPECT_EQ(rep->ToJson()["quantization"], format);
    EXPECT_EQ(GroupBytes(*rep), DtypeBytes(*rep));
  }
}

// Stored bytes per (role family, format): they cover exactly the bytes of the
// file, as the dtype totals do; the tied lm_head is counted once (with the
// embeddings, no lm_head group).
TEST(InspectTest, GroupBytesAddUpToTheStoredBytes) {
  auto rep = InspectModel(kModel);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  ASSERT_FALSE(rep->groups.empty());
  const int64_t file_bytes = HeaderBytes(kModel + "/model.safetensors");
  EXPECT_EQ(GroupBytes(*rep), DtypeBytes(*rep));
  EXPECT_EQ(GroupBytes(*rep), file_bytes);
  EXPECT_TRUE(GroupsOf(*rep, "lm_head").empty());
  int64_t weights = 0;
  for (const WeightGroup& g : rep->groups) {
    EXPECT_EQ(g.format, "F32") << g.family;
    EXPECT_FALSE(g.dtype_assumed) << g.family;
    EXPECT_EQ(g.tensors, g.weights) << g.family;  // dense: one tensor each
    weights += g.weights;
  }
  EXPECT_EQ(weights, rep->weights_by_format["F32"]);
  const nlohmann::json j = rep->ToJson();
  ASSERT_EQ(j["groups"].size(), rep->groups.size());
  EXPECT_EQ(j["groups"][0]["family"], "embeddings");
  EXPECT_EQ(j["groups"][0]["bytes"],
            HeaderBytes(kModel + "/model.safetensors", {"embed_tokens"}));
  EXPECT_NE(rep->ToText().find("attention q/k/v/o"), std::string::npos);
}

// gpt-oss MXFP4: the expert projections are stored as blocks + scales; their
// groups hold exactly those tensors' bytes.
TEST(QuantizedCheckpointTest, InspectGroupsOfGptOssMxfp4) {
  const std::string dir = kTiny + "/gpt_oss_mxfp4";
  if (!fs::exists(dir))
    GTEST_SKIP() << "SKIPPED LOUDLY: " << dir << " not found";
  auto rep = InspectModel(dir);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  ASSERT_TRUE(rep->problems.empty()) << rep->problems[0];
  const std::string file = dir + "/model.safetensors";
  EXPECT_EQ(GroupBytes(*rep), DtypeBytes(*rep));
  EXPECT_EQ(GroupBytes(*rep), HeaderBytes(file));
  for (const std::string proj : {"gate_up_proj", "down_proj"}) {
    const std::string family =
        proj == "down_proj" ? "experts down" : "experts gate/up";
    SCOPED_TRACE(family);
    const std::vector<WeightGroup> gs = GroupsOf(*rep, family);
    ASSERT_EQ(gs.size(), 1u);
    EXPECT_EQ(gs[0].format, "mxfp4");
    EXPECT_EQ(gs[0].weights, rep->config.num_layers);
    EXPECT_EQ(gs[0].tensors, 2 * rep->config.num_layers);  // blocks + scales
    const int64_t expected = HeaderBytes(
        file, {"experts." + proj + "_blocks", "experts." + proj + "_scales"});
    EXPECT_GT(expected, 0);
    EXPECT_EQ(gs[0].bytes, expected);
  }
  // The expert biases stay dense.
  const std::vector<WeightGroup> biases = GroupsOf(*rep, "expert biases");
  ASSERT_EQ(biases.size(), 1u);
  EXPECT_EQ(biases[0].format, "BF16");
}

// ModelOpt NVFP4: every attention and MLP projection is nvfp4-modelopt (with
// its scales, global scales, input scales and the KV-cache scales), lm_head
// and the embeddings are dense BF16.
TEST(QuantizedCheckpointTest, InspectGroupsOfNvfp4ModelOpt) {
  const std::string dir = kTiny + "/llama_nvfp4_modelopt";
  if (!fs::exists(dir))
    GTEST_SKIP() << "SKIPPED LOUDLY: " << dir << " not found";
  auto rep = InspectModel(dir);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  ASSERT_TRUE(rep->problems.empty()) << rep->problems[0];
  const std::string file = dir + "/model.safetensors";
  EXPECT_EQ(GroupBytes(*rep), DtypeBytes(*rep));
  EXPECT_EQ(GroupBytes(*rep), HeaderBytes(file));
  const auto expect_one = [&](const std::string& family,
                              const std::string& format,
                              const std::vector<std::string>& needles) {
    SCOPED_TRACE(family);
    const std::vector<WeightGroup> gs = GroupsOf(*rep, family);
    ASSERT_EQ(gs.size(), 1u);
    EXPECT_EQ(gs[0].format, format);
    EXPECT_EQ(gs[0].bytes, HeaderBytes(file, needles));
  };
  expect_one("attention q/k/v/o", "nvfp4-modelopt", {".self_attn."});
  expect_one("mlp gate/up/down", "nvfp4-modelopt", {".mlp."});
  expect_one("lm_head", "BF16", {"lm_head."});
  expect_one("embeddings", "BF16", {"embed_tokens."});
}

// config.json alone: the groups come from the declared shapes with the
// config's dtype, flagged as assumed; for a checkpoint stored in that dtype
// they equal the groups read from the file.
TEST_F(CheckpointErrorsTest, InspectGroupsFromConfigOnlyAreAssumed) {
  auto from_file = InspectModel(kModel);
  auto from_config = InspectModel(dir_.string());
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  ASSERT_TRUE(from_config.ok()) << from_config.status().ToString();
  ASSERT_EQ(from_config->groups.size(), from_file->groups.size());
  for (size_t i = 0; i < from_file->groups.size(); ++i) {
    const WeightGroup& a = from_config->groups[i];
    const WeightGroup& b = from_file->groups[i];
    SCOPED_TRACE(b.family);
    EXPECT_TRUE(a.dtype_assumed);
    EXPECT_EQ(a.family, b.family);
    EXPECT_EQ(a.format, b.format);
    EXPECT_EQ(a.weights, b.weights);
    EXPECT_EQ(a.tensors, b.tensors);
    EXPECT_EQ(a.bytes, b.bytes);
  }
  EXPECT_NE(from_config->ToText().find("dtype assumed"), std::string::npos);
  EXPECT_EQ(from_config->ToJson()["groups"][0]["dtype_assumed"], true);
}

// Loading keeps quantized weights in their stored format: every quantized
// Linear is bound in place (a view of the stored codes), and only the dense
// bf16 tensors are converted to the f32 compute dtype.
TEST(QuantizedCheckpointTest, LoadingKeepsTheStoredFormat) {
  const std::string dir = kTiny + "/llama_nvfp4_modelopt";
  if (!fs::exists(dir))
    GTEST_SKIP() << "SKIPPED LOUDLY: " << dir << " not found";
  auto m = Model::Load(dir, Precision::kF32);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const BoundWeights& w = (*m)->weights();
  int quantized = 0;
  for (const WeightSpec& spec : (*m)->declaration().specs) {
    const BoundWeights::Quantized* q = w.GetQuantized(spec.role, spec.layer);
    if (!spec.linear || spec.role == WeightRole::kLmHead) {
      EXPECT_EQ(q, nullptr) << spec.name;
      continue;
    }
    ASSERT_NE(q, nullptr) << spec.name;
    EXPECT_EQ(q->format.kind, FormatKind::kNvfp4ModelOpt);
    EXPECT_EQ(q->values.dtype, DType::kU8) << spec.name;
    EXPECT_EQ(w.Get(spec.role, spec.layer)->data, q->values.data);
    ++quantized;
  }
  EXPECT_EQ(quantized, 14);
  int64_t bf16_numel = 0;
  for (const auto& e : (*m)->checkpoint().entries())
    if (e.info.dtype == DType::kBF16) bf16_numel += e.info.shape.numel();
  EXPECT_EQ(w.converted_bytes(), bf16_numel * 4);
}

// A config whose quantization scheme disagrees with the stored tensors: the
// error names the physical tensor, its role in the format and both shapes.
TEST(QuantizedCheckpointTest, SchemeThatDisagreesWithTheTensorsIsAnError) {
  const std::string src = kTiny + "/qwen3_fp8_block";
  if (!fs::exists(src))
    GTEST_SKIP() << "SKIPPED LOUDLY: " << src << " not found";
  const fs::path dir = fs::temp_directory_path() /
                       ("loom_fp8_scheme_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ifstream in(src + "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["quantization_config"]["weight_block_size"] = {64, 64};
  std::ofstream(dir / "config.json") << j.dump();
  fs::create_symlink(src + "/model.safetensors", dir / "model.safetensors");
  auto rep = InspectModel(dir.string());
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  ASSERT_EQ(rep->problems.size(), 1u);
  const std::string& p = rep->problems[0];
  EXPECT_NE(p.find("weight_scale_inv"), std::string::npos) << p;
  EXPECT_NE(p.find("in file, expected"), std::string::npos) << p;
  EXPECT_NE(p.find("block scales of"), std::string::npos) << p;
  EXPECT_NE(p.find("fp8-block[64x64]"), std::string::npos) << p;

  j["quantization_config"]["quant_method"] = "awq";
  std::ofstream(dir / "config.json") << j.dump();
  auto bad = InspectModel(dir.string());
  fs::remove_all(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(bad.status().message().find("quant_method 'awq'"),
            std::string::npos)
      << bad.status().message();
}

// Expert weights bind by (role, layer, expert): per-expert tensors (Qwen3-MoE)
// and one stacked [E, in, out] tensor (gpt-oss, kAllExperts); dense roles keep
// their (role, layer) accessors.
TEST(BindTest, ExpertWeightsByRoleLayerExpert) {
  for (const std::string name : {"qwen3_moe", "gpt_oss"}) {
    const std::string dir = kTiny + "/" + name;
    if (!fs::exists(dir))
      GTEST_SKIP() << "SKIPPED LOUDLY: " << dir << " not found";
    SCOPED_TRACE(name);
    auto config = LoadModelConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    const ArchWeights decl =
        FindArch(config->model_type)->declare_weights(*config);
    auto ckpt = Checkpoint::Open(dir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    auto w = BoundWeights::Bind(*config, decl, **ckpt, DType::kF32);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const int64_t H = config->hidden_size, E = config->moe.num_experts;
    const int64_t I = config->moe.expert_intermediate_size;
    EXPECT_EQ(w->Require(WeightRole::kQ, 1).shape, Shape({config->q_dim(), H}));
    EXPECT_EQ(w->Require(WeightRole::kRouter, 1).shape, Shape({E, H}));
    if (name == "qwen3_moe") {
      EXPECT_EQ(w->Require(WeightRole::kExpertUp, 1, E - 1).shape,
                Shape({I, H}));
      EXPECT_EQ(w->Require(WeightRole::kExpertDown, 0, 0).shape, Shape({H, I}));
      EXPECT_EQ(w->Get(WeightRole::kExpertUp, 1, E), nullptr);
      EXPECT_EQ(w->Get(WeightRole::kExpertUp, 1), nullptr);  // not dense
    } else {
      EXPECT_EQ(w->Require(WeightRole::kExpertGateUp, 1, kAllExperts).shape,
                Shape({E, H, 2 * I}));
      EXPECT_EQ(w->Layout(WeightRole::kExpertGateUp, 1, kAllExperts),
                MatrixLayout::kInOut);
      EXPECT_EQ(w->Require(WeightRole::kExpertGateUpBias, 1, kAllExperts).shape,
                Shape({E, 2 * I}));
      EXPECT_EQ(w->Require(WeightRole::kAttnSinks, 0).shape,
                Shape({config->num_heads}));
    }
  }
}

}  // namespace
}  // namespace loom
