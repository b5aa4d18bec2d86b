// transformers 5's packed expert layout (mlp.experts.gate_up_proj [E, 2I, H],
// gate rows first, and mlp.experts.down_proj [E, H, I], under "mlp." even for
// Mixtral): a golden MoE checkpoint rewritten into it loads as the same model,
// plans the same weight bytes and gives bit-identical hooks and logits, in f32
// and bf16.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "src/io/safetensors.h"
#include "src/io/safetensors_writer.h"
#include "src/model/registry.h"
#include "src/plan/weight_table.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"
#include "tests/golden_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::CaptureSink;
using testing::GoldenFile;
using testing::SharedGoldenDir;

// How a tiny golden model names one sparse layer's experts per expert.
struct Case {
  const char* name;
  const char* block;  // inside model.layers.{l}.
  const char* gate;
  const char* up;
  const char* down;
};

// Writes `src`'s checkpoint into `dst` with every sparse layer's experts
// packed as transformers 5 stores them, the block renamed to "mlp.".
void WritePacked(const Case& k, const std::string& src, const fs::path& dst) {
  auto config = LoadModelConfig(src);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_FALSE(config->moe.packed_experts) << src;
  auto file = SafetensorsFile::Open(src + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  std::map<std::string, TensorView> tensors;
  for (const TensorInfo& t : (*file)->header().tensors)
    tensors[t.name] = (*file)->View(t);
  const int64_t E = config->moe.num_experts,
                I = config->moe.expert_intermediate_size,
                H = config->hidden_size;
  SafetensorsWriter w;
  auto take = [&](const std::string& name) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      ADD_FAILURE() << name << " missing from " << src;
      return TensorView{};
    }
    const TensorView v = it->second;
    tensors.erase(it);
    return v;
  };
  for (int64_t l = 0; l < config->num_layers; ++l) {
    if (!config->moe.IsSparseLayer(l)) continue;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string b = p + k.block, x = b + "experts.";
    const TensorView router = take(b + "gate.weight");  // [E, H]
    ASSERT_TRUE(w.Add(p + "mlp.gate.weight", router).ok());
    const int64_t row = H * int64_t{sizeof(float)};
    std::vector<uint8_t> gate_up(static_cast<size_t>(E * 2 * I * row));
    std::vector<uint8_t> down(static_cast<size_t>(E * H * I * 4));
    for (int64_t e = 0; e < E; ++e) {
      const std::string ex = x + std::to_string(e) + ".";
      const TensorView g = take(ex + k.gate + ".weight");  // [I, H]
      const TensorView u = take(ex + k.up + ".weight");    // [I, H]
      const TensorView d = take(ex + k.down + ".weight");  // [H, I]
      ASSERT_TRUE(g.data && u.data && d.data);
      ASSERT_EQ(g.dtype, DType::kF32);
      uint8_t* dst_e = gate_up.data() + e * 2 * I * row;  // [2I, H]
      std::memcpy(dst_e, g.data, static_cast<size_t>(I * row));
      std::memcpy(dst_e + I * row, u.data, static_cast<size_t>(I * row));
      std::memcpy(down.data() + e * H * I * 4, d.data,
                  static_cast<size_t>(H * I * 4));
    }
    ASSERT_TRUE(w.AddOwned(p + "mlp.experts.gate_up_proj", DType::kF32,
                           Shape({E, 2 * I, H}), std::move(gate_up))
                    .ok());
    ASSERT_TRUE(w.AddOwned(p + "mlp.experts.down_proj", DType::kF32,
                           Shape({E, H, I}), std::move(down))
                    .ok());
  }
  for (const auto& [name, view] : tensors) ASSERT_TRUE(w.Add(name, view).ok());
  ASSERT_TRUE(w.Write((dst / "model.safetensors").string()).ok());
  fs::copy_file(src + "/config.json", dst / "config.json");
}

// Every residual, router and MoE hook and the logits of seq4 and of the
// golden batch's rows packed together.
std::vector<CaptureSink> RunHooks(const std::string& dir, Precision precision,
                                  const std::string& golden_dir) {
  auto model = Model::Load(dir, precision);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  if (!model.ok()) return {};
  const ModelConfig& c = (*model)->config();
  HookSet hooks;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    hooks.Add({HookSite::kResidPost, l});
    hooks.Add({HookSite::kMlpOut, l});
    if (c.moe.IsSparseLayer(l)) {
      hooks.Add({HookSite::kRouterLogits, l});
      hooks.Add({HookSite::kExpertIds, l});
      hooks.Add({HookSite::kExpertWeights, l});
    }
  }
  hooks.Add({HookSite::kLogits, -1});
  auto ex = Executor::Create(**model, hooks, {.max_tokens = 64});
  EXPECT_TRUE(ex.ok()) << ex.status().ToString();
  if (!ex.ok()) return {};
  auto golden = GoldenFile::Open(golden_dir + "/goldens_f32.safetensors");
  std::vector<CaptureSink> out(2);
  const std::vector<int32_t> seq4 = golden->Ids("seq4.input_ids");
  const std::vector<int64_t> one = {0, static_cast<int64_t>(seq4.size())};
  EXPECT_TRUE((*ex)->Forward(Batch{seq4, one}, &out[0]).ok());
  // The padded batch's rows, concatenated whole (pads included: any ids do).
  Shape shape;
  const std::vector<int32_t> batch = golden->Ids("batch.input_ids", &shape);
  std::vector<int64_t> starts = {0};
  for (int64_t r = 0; r < shape[0]; ++r) starts.push_back((r + 1) * shape[1]);
  EXPECT_TRUE((*ex)->Forward(Batch{batch, starts}, &out[1]).ok());
  return out;
}

class PackedExpertsTest : public ::testing::TestWithParam<Case> {};

TEST_P(PackedExpertsTest, PackedLayoutGivesBitIdenticalResults) {
  const Case& k = GetParam();
  if (SharedGoldenDir().empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared golden directory not found; the "
                    "packed expert layout is not checked";
  const std::string src = SharedGoldenDir() + "/tiny/" + k.name;
  const fs::path dst =
      fs::temp_directory_path() /
      ("loom_packed_" + std::to_string(::getpid()) + "_" + std::string(k.name));
  fs::remove_all(dst);
  fs::create_directories(dst);
  WritePacked(k, src, dst);
  auto packed = LoadModelConfig(dst.string());
  ASSERT_TRUE(packed.ok()) << packed.status().ToString();
  EXPECT_TRUE(packed->moe.packed_experts);
  // The planner counts the same bytes from either layout's headers.
  auto original = LoadModelConfig(src);
  ASSERT_TRUE(original.ok());
  auto table = [](const std::string& dir, const ModelConfig& c) {
    auto t = BuildWeightTable(dir, c,
                              FindArch(c.model_type)->declare_weights(c), {});
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? t->total_bytes() : -1;
  };
  EXPECT_EQ(table(dst.string(), *packed), table(src, *original));
  std::vector<Precision> precisions = {Precision::kF32};
  if (CpuSupportsComputeDType(DType::kBF16))
    precisions.push_back(Precision::kBF16);
  for (Precision p : precisions) {
    SCOPED_TRACE(p == Precision::kF32 ? "f32" : "bf16");
    const std::vector<CaptureSink> want = RunHooks(src, p, src);
    const std::vector<CaptureSink> got = RunHooks(dst.string(), p, src);
    ASSERT_EQ(want.size(), 2u);
    ASSERT_EQ(got.size(), 2u);
    int64_t compared = 0;
    for (size_t r = 0; r < want.size(); ++r) {
      for (const HookSite s :
           {HookSite::kResidPost, HookSite::kMlpOut, HookSite::kRouterLogits,
            HookSite::kExpertIds, HookSite::kExpertWeights, HookSite::kLogits})
        for (int64_t l = -1; l < packed->num_layers; ++l) {
          if (!want[r].Has({s, l})) continue;
          const std::vector<float>& a = want[r].Get({s, l}).data;
          const std::vector<float>& b = got[r].Get({s, l}).data;
          ASSERT_EQ(a.size(), b.size());
          EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)),
                    0)
              << HookName({s, l}) << " differs (run " << r << ")";
          ++compared;
        }
    }
    EXPECT_GT(compared, 2 * 3) << "too few hooks compared";
  }
  // Packed quantized experts are refused when the config is read, naming the
  // tensor and the scheme.
  nlohmann::json config = testing::ReadJson(src + "/config.json");
  config["quantization_config"] = {{"quant_method", "fp8"},
                                   {"weight_block_size", {32, 32}}};
  std::ofstream(dst / "config.json") << config.dump();
  auto refused = LoadModelConfig(dst.string());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(refused.status().message().find(".mlp.experts.gate_up_proj"),
            std::string::npos)
      << refused.status().message();
  fs::remove_all(dst);
}

INSTANTIATE_TEST_SUITE_P(
    Models, PackedExpertsTest,
    ::testing::Values(
        Case{"mixtral", "block_sparse_moe.", "w1", "w3", "w2"},
        Case{"qwen2_moe", "mlp.", "gate_proj", "up_proj", "down_proj"},
        Case{"qwen3_moe", "mlp.", "gate_proj", "up_proj", "down_proj"},
        Case{"olmoe", "mlp.", "gate_proj", "up_proj", "down_proj"}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace loom
