#include "src/model/layer_config.h"

#include <cmath>

#include "src/base/check.h"

namespace loom {

LayerConfig MakeLayerConfig(const ModelConfig& c, int64_t layer) {
  LayerConfig l;
  l.layer = layer;
  l.block = c.block;
  l.norm = c.norm;
  l.norm_eps = c.norm_eps;
  l.norm_offset = c.norm_offset;
  l.pre_attn_norm = c.pre_attn_norm;
  l.post_attn_norm = c.post_attn_norm;
  l.pre_mlp_norm = c.pre_mlp_norm;
  l.post_mlp_norm = c.post_mlp_norm;
  if (l.block == BlockKind::kParallelSharedNorm) l.pre_mlp_norm = false;
  // An architecture's declaration error, not a checkpoint's: no model has
  // both (the parallel residual add has no post-branch norm step).
  LOOM_CHECK(!l.parallel() || !(l.post_attn_norm || l.post_mlp_norm))
      << c.model_type << ": a parallel block with post-branch norms";
  l.residual_multiplier = c.residual_multiplier;

  l.attention = c.attention;
  l.q_heads = c.num_heads;
  l.kv_heads = c.num_kv_heads;
  l.head_dim = c.head_dim;  // MLA: qk_head_dim (the arch sets it)
  l.v_head_dim = c.head_dim;
  if (c.attention == AttentionKind::kMla) {
    LOOM_CHECK(c.head_dim == c.mla.qk_head_dim() &&
               c.num_kv_heads == c.num_heads)
        << c.model_type << ": MLA head_dim " << c.head_dim << " vs "
        << c.mla.qk_head_dim() << ", kv heads " << c.num_kv_heads;
    l.mla = c.mla;
    l.v_head_dim = c.mla.v_head_dim;
    l.rope_offset = c.mla.qk_nope_head_dim;
  }
  l.fused_qkv = c.fused_qkv;
  l.qkv_layout = c.fused_qkv ? c.qkv_layout : QkvLayout::kConcat;
  l.qk_norm = c.qk_norm;
  l.qk_norm_type = c.qk_norm_type;
  l.qk_norm_bias = c.qk_norm_bias;
  l.clip_qkv = c.clip_qkv;
  l.window = layer >= 0 && layer < static_cast<int64_t>(c.sliding_window.size())
                 ? c.sliding_window[layer]
                 : 0;
  // 0 (unset by the architecture): the usual 1 / sqrt(head_dim) of the
  // layer's q/k heads.
  l.attn_scale = c.attn_scale > 0
                     ? c.attn_scale
                     : 1.0f / std::sqrt(static_cast<float>(l.head_dim));
  if (c.attn_scale_by_inverse_layer)
    l.attn_scale /= static_cast<float>(layer + 1);
  l.attn_softcap = c.attn_softcap;
  // gpt-oss declares a per-head sink logit (self_attn.sinks) in every layer.
  l.attn_sinks = c.model_type == "gpt_oss";
  l.alibi = c.alibi;
  l.rope = c.rope;
  l.rope_half =
      c.rope.type == RopeConfig::Type::kNone ? 0 : c.rope.rotary_dim / 2;
  if (c.rope_local.type != RopeConfig::Type::kNone && l.window > 0) {
    // Same rotary width (the tables share their shape), another base.
    l.rope = c.rope_local;
    l.rope_table = 1;
  }

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
    l.router_correction_bias = m.router_correction_bias;
    l.router_groups = m.n_group;
    l.router_keep_groups = m.topk_group;
    l.routed_scaling_factor = m.routed_scaling_factor;
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
