#include "src/model/synth.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "src/base/float16.h"
#include "src/io/safetensors_writer.h"
#include "src/model/match.h"
#include "src/model/mxfp4_encode.h"
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

// U(-1, 1) value of element i of a tensor: counter-based, so any pass over
// any subset of the elements sees the same values.
float UniformAt(uint64_t seed, int64_t i) {
  uint64_t s = seed ^ (static_cast<uint64_t>(i) * 0xd1b54a32d192ed03ull);
  const double u = static_cast<double>(SplitMix(s) >> 11) * 0x1.0p-53;
  return static_cast<float>(2.0 * u - 1.0);
}

// A stacked expert matrix in MXFP4: the logical W [E, out, in] (x @ W^T per
// expert, HF's gate_up_proj / down_proj transposed) with W ~ U(-a, a),
// encoded block by block. Fills the `_blocks` [E, out, in/32, 16] or the
// `_scales` [E, out, in/32] tensor (one pass each; both encode the same
// values).
void FillMxfp4(uint8_t* dst, int64_t rows, int64_t in, float a, uint64_t seed,
               bool scales) {
  const int64_t groups = in / kMxfp4Block;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float x[kMxfp4Block];
    uint8_t codes[kMxfp4Block / 2];
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t i = 0; i < kMxfp4Block; ++i)
        x[i] = a * UniformAt(seed, r * in + g * kMxfp4Block + i);
      const uint8_t scale = EncodeMxfp4Block(x, codes);
      if (scales) {
        dst[r * groups + g] = scale;
      } else {
        std::memcpy(dst + (r * groups + g) * (kMxfp4Block / 2), codes,
                    kMxfp4Block / 2);
      }
    }
  }
}

// Per-layer "sliding_attention" / "full_attention", sliding first (gpt-oss).
nlohmann::json AlternatingLayerTypes(int64_t layers) {
  nlohmann::json t = nlohmann::json::array();
  for (int64_t i = 0; i < layers; ++i)
    t.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  return t;
}

bool IsBias(WeightRole r) {
  switch (r) {
    case WeightRole::kQBias:
    case WeightRole::kKBias:
    case WeightRole::kVBias:
    case WeightRole::kOBias:
    case WeightRole::kRouterBias:
    case WeightRole::kRouterCorrectionBias:
    case WeightRole::kExpertGateUpBias:
    case WeightRole::kExpertDownBias:
      return true;
    default:
      return false;
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
  } else if (o.preset == "llama-3.1-8b") {
    // meta-llama/Llama-3.1-8B's config.json values (llama3 RoPE scaling, the
    // full 128256-token vocabulary).
    cfg.update({{"hidden_size", 4096},
                {"intermediate_size", 14336},
                {"num_hidden_layers", 32},
                {"num_attention_heads", 32},
                {"num_key_value_heads", 8},
                {"head_dim", 128},
                {"vocab_size", 128256},
                {"max_position_embeddings", 131072},
                {"rope_theta", 500000.0},
                {"rope_scaling",
                 {{"rope_type", "llama3"},
                  {"factor", 8.0},
                  {"low_freq_factor", 1.0},
                  {"high_freq_factor", 4.0},
                  {"original_max_position_embeddings", 8192}}},
                {"attention_bias", false},
                {"mlp_bias", false},
                {"bos_token_id", 128000},
                {"eos_token_id", 128001}});
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
  } else if (o.preset == "gpt-oss-20b") {
    // openai/gpt-oss-20b's config.json values, 2 layers and a 32768-token
    // vocabulary (201088 would add 2.1 GB of embeddings and lm_head);
    // experts in MXFP4 as in the released checkpoint.
    cfg = {{"architectures", {"GptOssForCausalLM"}},
           {"model_type", "gpt_oss"},
           {"attention_bias", true},
           {"attention_dropout", 0.0},
           {"experts_per_token", 4},
           {"num_experts_per_tok", 4},
           {"num_local_experts", 32},
           {"head_dim", 64},
           {"hidden_act", "silu"},
           {"hidden_size", 2880},
           {"intermediate_size", 2880},
           {"initial_context_length", 4096},
           {"max_position_embeddings", 131072},
           {"num_attention_heads", 64},
           {"num_key_value_heads", 8},
           {"num_hidden_layers", 2},
           {"rms_norm_eps", 1e-5},
           {"rope_theta", 150000},
           {"rope_scaling",
            {{"rope_type", "yarn"},
             {"factor", 32.0},
             {"beta_fast", 32.0},
             {"beta_slow", 1.0},
             {"original_max_position_embeddings", 4096},
             {"truncate", false}}},
           {"sliding_window", 128},
           {"swiglu_limit", 7.0},
           {"router_aux_loss_coef", 0.9},
           {"output_router_logits", false},
           {"tie_word_embeddings", false},
           {"vocab_size", 32768},
           {"eos_token_id", 2},
           {"pad_token_id", 0},
           {"quantization_config",
            {{"modules_to_not_convert",
              {"model.layers.*.self_attn", "model.layers.*.mlp.router",
               "model.embed_tokens", "lm_head"}},
             {"quant_method", "mxfp4"}}}};
  } else if (o.preset == "deepseek-v3") {
    // deepseek-ai/DeepSeek-V3's layer shapes (MLA with q/kv LoRA ranks 1536
    // and 512, 128 heads of 128 + 64 rope dims; 256 routed experts of 2048
    // in 8 groups, top-8 of the best 4 groups, one shared expert), 2 layers
    // (layer 0 dense, layer 1 MoE: first_k_dense_replace 1 instead of 3)
    // and a 32000-token vocabulary; bf16 instead of the released FP8.
    cfg = {{"architectures", {"DeepseekV3ForCausalLM"}},
           {"model_type", "deepseek_v3"},
           {"hidden_act", "silu"},
           {"hidden_size", 7168},
           {"intermediate_size", 18432},
           {"moe_intermediate_size", 2048},
           {"n_routed_experts", 256},
           {"n_shared_experts", 1},
           {"num_experts_per_tok", 8},
           {"n_group", 8},
           {"topk_group", 4},
           {"routed_scaling_factor", 2.5},
           {"norm_topk_prob", true},
           {"scoring_func", "sigmoid"},
           {"topk_method", "noaux_tc"},
           {"first_k_dense_replace", 1},
           {"moe_layer_freq", 1},
           {"num_hidden_layers", 2},
           {"num_attention_heads", 128},
           {"num_key_value_heads", 128},
           {"q_lora_rank", 1536},
           {"kv_lora_rank", 512},
           {"qk_nope_head_dim", 128},
           {"qk_rope_head_dim", 64},
           {"v_head_dim", 128},
           {"attention_bias", false},
           {"rms_norm_eps", 1e-6},
           {"rope_theta", 10000.0},
           {"rope_scaling",
            {{"type", "yarn"},
             {"factor", 40.0},
             {"beta_fast", 32.0},
             {"beta_slow", 1.0},
             {"mscale", 1.0},
             {"mscale_all_dim", 1.0},
             {"original_max_position_embeddings", 4096}}},
           {"max_position_embeddings", 163840},
           {"tie_word_embeddings", false},
           {"vocab_size", 32000},
           {"bos_token_id", 0},
           {"eos_token_id", 1}};
  } else {
    return InvalidArgumentError(
        "--preset '" + o.preset +
        "': expected tinyllama-1.1b, small, llama-3.1-8b, qwen3-30b-a3b, "
        "gpt-oss-20b or deepseek-v3");
  }
  if (o.num_layers > 0) cfg["num_hidden_layers"] = o.num_layers;
  if (o.vocab_size > 0) cfg["vocab_size"] = o.vocab_size;
  if (cfg["model_type"] == "gpt_oss")
    cfg["layer_types"] =
        AlternatingLayerTypes(cfg["num_hidden_layers"].get<int64_t>());
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
  const ArchWeights decl = FindArch(config.model_type)->declare_weights(config);
  // The storage format of every weight (quantized where config.json's
  // quantization_config says so), and its physical tensors.
  MatchOptions match_options;
  match_options.source = out_dir + "/config.json";
  match_options.assumed_dense_dtype = o.dtype;
  ASSIGN_OR_RETURN(std::vector<MatchedWeight> matched,
                   MatchCheckpoint(config, decl, nullptr, match_options));
  SafetensorsWriter writer;
  writer.SetMetadata("format", "pt");
  int64_t params = 0;
  for (size_t wi = 0; wi < decl.specs.size(); ++wi) {
    const WeightSpec& s = decl.specs[wi];
    if (!s.required) continue;
    const int64_t n = s.shape.numel();
    params += n;
    const uint64_t seed = o.seed * 0x9e3779b97f4a7c15ull ^ HashName(s.name);
    if (matched[wi].format.kind == FormatKind::kMxfp4) {
      // Logical [..., out, in]: rows = everything but `in`.
      const int64_t in =
          s.layout == MatrixLayout::kInOut ? s.shape.dim(-2) : s.shape.dim(-1);
      const int64_t rows = n / in;
      const float a = std::sqrt(3.0f / static_cast<float>(in));
      for (const MatchedTensor& mt : matched[wi].tensors) {
        const PhysicalTensor& t = mt.tensor;
        if (t.component != ComponentKind::kValues &&
            t.component != ComponentKind::kBlockScales)
          return InternalError("synth: unexpected MXFP4 component of " +
                               t.name);
        const bool scales = t.component == ComponentKind::kBlockScales;
        RETURN_IF_ERROR(writer.AddFill(
            t.name, t.dtype, t.shape, [=](uint8_t* dst, int64_t) {
              FillMxfp4(dst, rows, in, a, seed, scales);
              return Status();
            }));
      }
      continue;
    }
    if (matched[wi].format.quantized())
      return UnimplementedError("synth: weight " + s.name + " in format " +
                                matched[wi].format.ToString() +
                                " (only MXFP4 is written)");
    float center = 0, a;
    if (IsBias(s.role)) {
      a = 0.1f * std::sqrt(3.0f);  // std 0.1
    } else if (s.role == WeightRole::kAttnSinks) {
      a = std::sqrt(3.0f);  // std 1
    } else if (s.shape.rank() == 1) {
      center = 1.0f;
      a = 0.1f;
    } else if (s.role == WeightRole::kEmbed) {
      a = 0.02f * std::sqrt(3.0f);
    } else {
      // fan_in: the last dimension, or the one before it for [in, out].
      a = std::sqrt(3.0f / static_cast<float>(s.layout == MatrixLayout::kInOut
                                                  ? s.shape.dim(-2)
                                                  : s.shape.dim(-1)));
    }
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
