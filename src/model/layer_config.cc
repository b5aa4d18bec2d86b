#include "src/model/layer_config.h"

#include <cmath>

namespace loom {

LayerConfig MakeLayerConfig(const ModelConfig& c, int64_t layer) {
  LayerConfig l;
  l.layer = layer;
  l.norm = c.norm;
  l.norm_eps = c.norm_eps;
  l.norm_offset = c.norm_offset;
  l.pre_attn_norm = c.pre_attn_norm;
  l.post_attn_norm = c.post_attn_norm;
  l.pre_mlp_norm = c.pre_mlp_norm;
  l.post_mlp_norm = c.post_mlp_norm;

  l.fused_qkv = c.fused_qkv;
  l.qk_norm = c.qk_norm;
  l.clip_qkv = c.clip_qkv;
  l.window = layer >= 0 && layer < static_cast<int64_t>(c.sliding_window.size())
                 ? c.sliding_window[layer]
                 : 0;
  l.attn_scale = c.attn_scale;
  if (c.attn_scale_by_inverse_layer)
    l.attn_scale /= static_cast<float>(layer + 1);
  l.attn_softcap = c.attn_softcap;
  // gpt-oss declares a per-head sink logit (self_attn.sinks) in every layer.
  l.attn_sinks = c.model_type == "gpt_oss";
  l.rope = c.rope;
  l.rope_half =
      c.rope.type == RopeConfig::Type::kNone ? 0 : c.rope.rotary_dim / 2;

  l.mlp = c.mlp;
  l.act = c.act;
  if (c.mlp == MlpKind::kMoE && !c.moe.IsSparseLayer(layer)) {
    // Qwen-MoE's dense layers (decoder_sparse_step, mlp_only_layers).
    l.mlp = MlpKind::kGated;
  } else if (c.mlp == MlpKind::kMoE) {
    const MoEConfig& m = c.moe;
    l.num_experts = m.num_experts;
    l.experts_per_token = m.experts_per_token;
    l.expert_intermediate_size = m.expert_intermediate_size;
    l.shared_expert_intermediate_size = m.shared_expert_intermediate_size;
    l.shared_expert_gate = m.shared_expert_gate;
    l.norm_topk_prob = m.norm_topk_prob;
    l.router = m.router;
    l.router_bias = m.router_bias;
    l.expert_act = m.expert_act;
    l.swiglu_alpha = m.swiglu_alpha;
    l.swiglu_limit = m.swiglu_limit;
    l.expert_bias = m.expert_bias;
  }
  return l;
}

std::vector<LayerConfig> MakeLayerConfigs(const ModelConfig& c) {
  std::vector<LayerConfig> out;
  out.reserve(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l)
    out.push_back(MakeLayerConfig(c, l));
  return out;
}

}  // namespace loom
