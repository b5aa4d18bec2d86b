#include "src/model/synth.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "src/base/float16.h"
#include "src/io/safetensors_writer.h"
#include "src/model/registry.h"

namespace loom {
namespace {

uint64_t SplitMix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t HashName(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

// Fills `bytes` of dtype values: center + U(-a, a); element i depends only on
// (seed, i), so the result does not depend on the thread count.
void Fill(uint8_t* dst, int64_t n, DType dtype, float center, float a,
          uint64_t seed) {
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < (n + 4095) / 4096; ++blk) {
    uint64_t s = seed ^ (static_cast<uint64_t>(blk) * 0x632be59bd9b4e019ull);
    const int64_t end = std::min(n, (blk + 1) * 4096);
    for (int64_t i = blk * 4096; i < end; ++i) {
      const double u =
          static_cast<double>(SplitMix(s) >> 11) * 0x1.0p-53;  // [0, 1)
      const float v = center + a * static_cast<float>(2.0 * u - 1.0);
      if (dtype == DType::kF32)
        std::memcpy(dst + 4 * i, &v, 4);
      else if (dtype == DType::kBF16) {
        const uint16_t h = F32ToBf16(v);
        std::memcpy(dst + 2 * i, &h, 2);
      } else {
        const uint16_t h = F32ToF16(v);
        std::memcpy(dst + 2 * i, &h, 2);
      }
    }
  }
}

}  // namespace

StatusOr<int64_t> WriteSyntheticModel(const std::string& out_dir,
                                      const SynthOptions& o) {
  nlohmann::json cfg = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_act", "silu"},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", 10000.0},
      {"tie_word_embeddings", false},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
  };
  if (o.preset == "tinyllama-1.1b") {
    cfg.update({{"hidden_size", 2048},
                {"intermediate_size", 5632},
                {"num_hidden_layers", 22},
                {"num_attention_heads", 32},
                {"num_key_value_heads", 4},
                {"vocab_size", 32000},
                {"max_position_embeddings", 2048}});
  } else if (o.preset == "small") {
    cfg.update({{"hidden_size", 256},
                {"intermediate_size", 688},
                {"num_hidden_layers", 4},
                {"num_attention_heads", 8},
                {"num_key_value_heads", 2},
                {"vocab_size", 4096},
                {"max_position_embeddings", 2048}});
  } else if (o.preset == "qwen3-30b-a3b") {
    // Qwen3-30B-A3B's real layer shapes (128 experts, 8 per token, expert
    // intermediate 768), reduced depth and vocabulary.
    cfg.update({{"architectures", {"Qwen3MoeForCausalLM"}},
                {"model_type", "qwen3_moe"},
                {"hidden_size", 2048},
                {"intermediate_size", 6144},
                {"moe_intermediate_size", 768},
                {"num_experts", 128},
                {"num_experts_per_tok", 8},
                {"norm_topk_prob", true},
                {"decoder_sparse_step", 1},
                {"mlp_only_layers", nlohmann::json::array()},
                {"num_hidden_layers", 2},
                {"num_attention_heads", 32},
                {"num_key_value_heads", 4},
                {"head_dim", 128},
                {"rms_norm_eps", 1e-6},
                {"rope_theta", 1000000.0},
                {"vocab_size", 32000},
                {"max_position_embeddings", 4096}});
  } else {
    return InvalidArgumentError(
        "--preset '" + o.preset +
        "': expected tinyllama-1.1b, small or qwen3-30b-a3b");
  }
  if (o.num_layers > 0) cfg["num_hidden_layers"] = o.num_layers;
  if (o.vocab_size > 0) cfg["vocab_size"] = o.vocab_size;
  if (!IsComputeDType(o.dtype))
    return InvalidArgumentError("--dtype must be f32, bf16 or f16");
  cfg["torch_dtype"] = std::string(DTypeLongName(o.dtype));

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec)
    return IoError(out_dir + ": cannot create directory: " + ec.message());
  {
    std::ofstream out(out_dir + "/config.json");
    out << cfg.dump(2) << "\n";
    if (!out) return IoError(out_dir + "/config.json: write failed");
  }
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(out_dir));
  const ArchWeights decl =
      FindArch(cfg["model_type"].get<std::string>())->declare_weights(config);
  SafetensorsWriter writer;
  writer.SetMetadata("format", "pt");
  int64_t params = 0;
  for (const WeightSpec& s : decl.specs) {
    if (!s.required) continue;
    const int64_t n = s.shape.numel();
    params += n;
    float center = 0, a;
    if (s.shape.rank() == 1) {
      center = 1.0f;
      a = 0.1f;
    } else if (s.role == WeightRole::kEmbed) {
      a = 0.02f * std::sqrt(3.0f);
    } else {
      a = std::sqrt(3.0f / static_cast<float>(s.shape[1]));
    }
    const uint64_t seed = o.seed * 0x9e3779b97f4a7c15ull ^ HashName(s.name);
    const DType dtype = o.dtype;
    RETURN_IF_ERROR(
        writer.AddFill(s.name, dtype, s.shape, [=](uint8_t* dst, int64_t) {
          Fill(dst, n, dtype, center, a, seed);
          return Status();
        }));
  }
  RETURN_IF_ERROR(writer.Write(out_dir + "/model.safetensors"));
  return params;
}

}  // namespace loom
