// gpt-oss: attention with q/k/v/o
// biases and per-head attention sinks, sliding-window / full attention per
// layer (layer_types), YaRN RoPE (rotate-half), and a top-k MoE whose router
// has a bias. The experts are stacked tensors in HF's parameter layout, x @ W:
// `mlp.experts.gate_up_proj` [E, H, 2I] (gate/up columns interleaved) and
// `down_proj` [E, I, H], with biases [E, 2I] / [E, H]. The official checkpoints
// store them in MXFP4 (quantization_config.quant_method "mxfp4",
// src/core/format.h):
// `<w>_blocks` U8 [E, out, in / 32, 16] and `<w>_scales` U8 (E8M0)
// [E, out, in / 32]; everything in modules_to_not_convert (attention, router,
// embeddings, lm_head) keeps the float dtype.
#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"
#include "src/model/arch/moe.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  // rope_scaling (YaRN in every release) is parsed by ParseDecoderBase.
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  ASSIGN_OR_RETURN(c->qkv_bias, r.Bool("attention_bias", true));
  c->o_bias = c->qkv_bias;
  MoeKeys keys;
  keys.num_experts = "num_local_experts";
  keys.norm_topk_prob = true;
  keys.router_bias = true;
  RETURN_IF_ERROR(ParseMoe(r, keys, c));
  c->moe.router = RouterKind::kTopKSoftmax;
  c->moe.expert_act = ExpertActKind::kClampedSwigluInterleaved;
  c->moe.expert_bias = true;
  ASSIGN_OR_RETURN(double limit, r.Float("swiglu_limit", 7.0));
  if (!(limit > 0))
    return InvalidArgumentError(r.source() + ": swiglu_limit = " +
                                std::to_string(limit) + ", expected > 0");
  c->moe.swiglu_limit = static_cast<float>(limit);
  // Sliding window on the layers layer_types marks "sliding_attention"
  // (HF GptOssConfig defaults: sliding_window 128; without layer_types, layer
  // i slides iff (i + 1) % 2 == 1, i.e. layers 0, 2, 4, ...).
  ASSIGN_OR_RETURN(int64_t window, r.Int("sliding_window", 128));
  if (window <= 0)
    return InvalidArgumentError(r.source() + ": sliding_window = " +
                                std::to_string(window) + ", expected > 0");
  ASSIGN_OR_RETURN(bool typed, ParseLayerTypes(r, window, c));
  if (!typed) {
    for (int64_t i = 0; i < c->num_layers; ++i)
      c->sliding_window[i] = (i + 1) % 2 != 0 ? window : 0;
  }
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
  // Stacked experts in the [in, out] layout (x @ W), Linear weights the
  // quantization scheme converts.
  auto experts = [&](const std::string& p, WeightRole role, WeightRole bias,
                     int64_t layer, int64_t out, int64_t in) {
    AddSpec(&s, p, role, layer, {E, in, out});
    s.back().expert = kAllExperts;
    s.back().layout = MatrixLayout::kInOut;
    s.back().linear = true;
    AddSpec(&s, p + "_bias", bias, layer, {E, out});
    s.back().expert = kAllExperts;
  };
  auto linear = [&](std::string name, WeightRole role, int64_t layer,
                    Shape shape) {
    AddSpec(&s, std::move(name), role, layer, std::move(shape));
    s.back().linear = true;
  };
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    AddSpec(&s, p + "input_layernorm.weight", WeightRole::kAttnNorm, i, {H});
    linear(p + "self_attn.q_proj.weight", WeightRole::kQ, i, {Q, H});
    linear(p + "self_attn.k_proj.weight", WeightRole::kK, i, {KV, H});
    linear(p + "self_attn.v_proj.weight", WeightRole::kV, i, {KV, H});
    if (c.qkv_bias) {
      AddSpec(&s, p + "self_attn.q_proj.bias", WeightRole::kQBias, i, {Q});
      AddSpec(&s, p + "self_attn.k_proj.bias", WeightRole::kKBias, i, {KV});
      AddSpec(&s, p + "self_attn.v_proj.bias", WeightRole::kVBias, i, {KV});
    }
    linear(p + "self_attn.o_proj.weight", WeightRole::kO, i, {H, Q});
    if (c.o_bias)
      AddSpec(&s, p + "self_attn.o_proj.bias", WeightRole::kOBias, i, {H});
    AddSpec(&s, p + "self_attn.sinks", WeightRole::kAttnSinks, i,
            {c.num_heads});
    AddSpec(&s, p + "post_attention_layernorm.weight", WeightRole::kMlpNorm, i,
            {H});
    linear(p + "mlp.router.weight", WeightRole::kRouter, i, {E, H});
    AddSpec(&s, p + "mlp.router.bias", WeightRole::kRouterBias, i, {E});
    experts(p + "mlp.experts.gate_up_proj", WeightRole::kExpertGateUp,
            WeightRole::kExpertGateUpBias, i, 2 * I, H);
    experts(p + "mlp.experts.down_proj", WeightRole::kExpertDown,
            WeightRole::kExpertDownBias, i, H, I);
  }
  AddSpec(&s, "model.norm.weight", WeightRole::kFinalNorm, -1, {H});
  linear("lm_head.weight", WeightRole::kLmHead, -1, {c.vocab_size, H});
  if (c.tie_word_embeddings) {
    s.back().required = false;
    s.back().tied_to = "model.embed_tokens.weight";
  }
  return w;
}

}  // namespace

const ArchDef kGptOss = {"gpt_oss", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
