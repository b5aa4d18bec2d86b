// gpt-oss (planning only): attention with q/k/v/o biases and per-head
// attention sinks, alternating sliding-window / full attention (layer_types),
// YaRN RoPE, and a top-k MoE whose router has a bias. The official
// checkpoints store the experts in MXFP4 (quantization_config.quant_method
// "mxfp4"): per layer, for gate_up (out = 2 I, in = H) and down (out = H,
// in = I):
//   mlp.experts.<w>_blocks  U8   [E, out, in / 32, 16]  (two FP4 values a byte)
//   mlp.experts.<w>_scales  U8   [E, out, in / 32]      (E8M0 shared exponents)
//   mlp.experts.<w>_bias    BF16 [E, out]
// Those U8 dtypes are fixed by the format (WeightSpec::storage_dtype), so a
// plan from config.json + index alone counts them as stored, not as bf16
// parameters. Everything listed in modules_to_not_convert (attention, router,
// embeddings, lm_head) keeps the checkpoint's float dtype.
#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {

void AddSpec(std::vector<WeightSpec>* specs, std::string name, WeightRole role,
             int64_t layer, Shape shape);

namespace {

// MXFP4: 32 FP4 values share one 8-bit exponent; a block is 16 bytes.
constexpr int64_t kMxfp4Block = 32;
constexpr int64_t kMxfp4BlockBytes = 16;

Status Parse(const ConfigReader& r, ModelConfig* c) {
  // ParseDecoderBase knows no YaRN; parse the rest without rope_scaling and
  // keep YaRN's factor (the planner needs no rotary tables).
  nlohmann::json j = r.json();
  j.erase("rope_scaling");
  const ConfigReader base(r.source(), std::move(j));
  RETURN_IF_ERROR(ParseDecoderBase(base, /*tie_default=*/false, c));
  ASSIGN_OR_RETURN(std::optional<ConfigReader> scaling,
                   r.Object("rope_scaling"));
  if (scaling) {
    ASSIGN_OR_RETURN(std::string type, scaling->String("rope_type", "default"));
    if (type != "yarn" && type != "default")
      return UnimplementedError(r.source() + ": rope_scaling type '" + type +
                                "' is not supported for gpt_oss (yarn)");
    ASSIGN_OR_RETURN(c->rope.factor, scaling->Float("factor", 1.0));
    ASSIGN_OR_RETURN(c->rope.original_max_position_embeddings,
                     scaling->Int("original_max_position_embeddings",
                                  c->max_position_embeddings));
  }
  ASSIGN_OR_RETURN(c->qkv_bias, r.Bool("attention_bias", true));
  c->o_bias = c->qkv_bias;
  c->mlp = MlpKind::kMoE;
  ASSIGN_OR_RETURN(c->moe.num_experts, r.Int("num_local_experts"));
  if (r.Has("num_experts_per_tok")) {
    ASSIGN_OR_RETURN(c->moe.experts_per_token, r.Int("num_experts_per_tok"));
  } else {
    ASSIGN_OR_RETURN(c->moe.experts_per_token, r.Int("experts_per_token"));
  }
  c->moe.expert_intermediate_size = c->intermediate_size;
  c->moe.norm_topk_prob = true;
  if (c->moe.num_experts <= 0 || c->moe.experts_per_token <= 0 ||
      c->moe.experts_per_token > c->moe.num_experts)
    return InvalidArgumentError(
        r.source() +
        ": num_experts_per_tok = " + std::to_string(c->moe.experts_per_token) +
        ", num_local_experts = " + std::to_string(c->moe.num_experts) +
        ", expected 0 < num_experts_per_tok <= num_local_experts");
  if (c->hidden_size % kMxfp4Block != 0 ||
      c->intermediate_size % kMxfp4Block != 0)
    return InvalidArgumentError(
        r.source() + ": hidden_size = " + std::to_string(c->hidden_size) +
        " and intermediate_size = " + std::to_string(c->intermediate_size) +
        " must be multiples of the MXFP4 block (32)");
  // Sliding window on the layers layer_types marks "sliding_attention".
  ASSIGN_OR_RETURN(int64_t window, r.Int("sliding_window", 0));
  if (r.Has("layer_types")) {
    const nlohmann::json& types = r.json().at("layer_types");
    if (!types.is_array() ||
        static_cast<int64_t>(types.size()) != c->num_layers)
      return InvalidArgumentError(
          r.source() +
          ": layer_types must be an array of num_hidden_layers = " +
          std::to_string(c->num_layers) + " strings");
    for (int64_t i = 0; i < c->num_layers; ++i) {
      if (!types[i].is_string())
        return InvalidArgumentError(r.source() + ": layer_types[" +
                                    std::to_string(i) + "] is not a string");
      const std::string t = types[i].get<std::string>();
      if (t == "sliding_attention") {
        c->sliding_window[i] = window;
      } else if (t != "full_attention") {
        return InvalidArgumentError(
            r.source() + ": layer_types[" + std::to_string(i) + "] = '" + t +
            "', expected sliding_attention or full_attention");
      }
    }
  } else {
    for (int64_t i = 0; i < c->num_layers; i += 2)
      c->sliding_window[i] = window;
  }
  // The expert storage format.
  ASSIGN_OR_RETURN(std::optional<ConfigReader> quant,
                   r.Object("quantization_config"));
  if (!quant)
    return UnimplementedError(r.source() +
                              ": gpt_oss without quantization_config "
                              "(dequantized experts) is not supported yet; "
                              "the official MXFP4 checkpoints are");
  ASSIGN_OR_RETURN(std::string method, quant->String("quant_method"));
  if (method != "mxfp4")
    return UnimplementedError(
        quant->source() + ": quantization_config.quant_method = '" + method +
        "' is not supported for gpt_oss (mxfp4)");
  return Status();
}

ArchWeights Declare(const ModelConfig& c) {
  ArchWeights w;
  std::vector<WeightSpec>& s = w.specs;
  const int64_t H = c.hidden_size, I = c.moe.expert_intermediate_size,
                E = c.moe.num_experts;
  const int64_t Q = c.q_dim(), KV = c.kv_dim();
  AddSpec(&s, "model.embed_tokens.weight", WeightRole::kEmbed, -1,
          {c.vocab_size, H});
  auto mxfp4 = [&](const std::string& p, int64_t layer, int64_t out,
                   int64_t in) {
    AddSpec(&s, p + "_blocks", WeightRole::kExpert, layer,
            {E, out, in / kMxfp4Block, kMxfp4BlockBytes});
    s.back().storage_dtype = DType::kU8;
    AddSpec(&s, p + "_scales", WeightRole::kExpert, layer,
            {E, out, in / kMxfp4Block});
    s.back().storage_dtype = DType::kU8;
    AddSpec(&s, p + "_bias", WeightRole::kExpert, layer, {E, out});
  };
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    AddSpec(&s, p + "input_layernorm.weight", WeightRole::kAttnNorm, i, {H});
    AddSpec(&s, p + "self_attn.q_proj.weight", WeightRole::kQ, i, {Q, H});
    AddSpec(&s, p + "self_attn.k_proj.weight", WeightRole::kK, i, {KV, H});
    AddSpec(&s, p + "self_attn.v_proj.weight", WeightRole::kV, i, {KV, H});
    if (c.qkv_bias) {
      AddSpec(&s, p + "self_attn.q_proj.bias", WeightRole::kQBias, i, {Q});
      AddSpec(&s, p + "self_attn.k_proj.bias", WeightRole::kKBias, i, {KV});
      AddSpec(&s, p + "self_attn.v_proj.bias", WeightRole::kVBias, i, {KV});
    }
    AddSpec(&s, p + "self_attn.o_proj.weight", WeightRole::kO, i, {H, Q});
    if (c.o_bias)
      AddSpec(&s, p + "self_attn.o_proj.bias", WeightRole::kOBias, i, {H});
    AddSpec(&s, p + "self_attn.sinks", WeightRole::kOther, i,
            {c.num_heads});  // per-head sink logit
    AddSpec(&s, p + "post_attention_layernorm.weight", WeightRole::kMlpNorm, i,
            {H});
    AddSpec(&s, p + "mlp.router.weight", WeightRole::kRouter, i, {E, H});
    AddSpec(&s, p + "mlp.router.bias", WeightRole::kRouterBias, i, {E});
    mxfp4(p + "mlp.experts.gate_up_proj", i, 2 * I, H);
    mxfp4(p + "mlp.experts.down_proj", i, H, I);
  }
  AddSpec(&s, "model.norm.weight", WeightRole::kFinalNorm, -1, {H});
  AddSpec(&s, "lm_head.weight", WeightRole::kLmHead, -1, {c.vocab_size, H});
  if (c.tie_word_embeddings) {
    s.back().required = false;
    s.back().tied_to = "model.embed_tokens.weight";
  }
  return w;
}

}  // namespace

const ArchDef kGptOss = {"gpt_oss", Parse, Declare, /*runnable=*/false};

}  // namespace loom::arch
