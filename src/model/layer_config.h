// LayerConfig: what one decoder layer computes, derived from the ModelConfig
// in one function (MakeLayerConfigs). The forward program (src/plan/program.h)
// and the executor read per-layer facts from here, never from model-wide
// flags, so a model whose layers differ (dense and MoE layers, sliding and
// global attention, per-layer RoPE) is described by data, not by code paths.
#ifndef LOOM_MODEL_LAYER_CONFIG_H_
#define LOOM_MODEL_LAYER_CONFIG_H_

#include <cstdint>
#include <vector>

#include "src/model/config.h"

namespace loom {

struct LayerConfig {
  int64_t layer = 0;

  // ---- Block shape: how the branches meet the residual stream ----
  // kParallelSharedNorm has no pre-MLP norm of its own (pre_mlp_norm false):
  // the MLP reads ln1's output. Parallel blocks have no post-branch norms.
  BlockKind block = BlockKind::kSequential;

  // ---- Norms (kind, epsilon and gain offset are shared by every norm) ----
  NormKind norm = NormKind::kRms;
  float norm_eps = 1e-5f;
  float norm_offset = 0.0f;     // 1 for Gemma's and LayerNorm1P's (1 + w)
  bool pre_attn_norm = true;    // input_layernorm / ln_1
  bool post_attn_norm = false;  // Gemma2 / OLMo2
  bool pre_mlp_norm = true;     // post_attention_layernorm / ln_2
  bool post_mlp_norm = false;   // Gemma2 / OLMo2
  // The residual adds x + residual_multiplier * branch, the branch after its
  // post norm, if any (Granite; 1 elsewhere).
  float residual_multiplier = 1.0f;

  // ---- Attention geometry: every attention width is derived from here ----
  AttentionKind attention = AttentionKind::kStandard;
  int64_t q_heads = 0;
  int64_t kv_heads = 0;  // MLA: q_heads (the latent is expanded per head)
  // q and k head width, the attention op's head_dim (MLA: qk_nope +
  // qk_rope).
  int64_t head_dim = 0;
  // v and z head width as the model defines them (MLA: v_head_dim; else
  // head_dim): the qkv buffer's v rows, the KV cache's V and the attention
  // output are this wide per head (docs/design/attention-mla.md).
  int64_t v_head_dim = 0;
  MlaConfig mla;  // kMla only
  // kMla: eps of q_a_layernorm / kv_a_layernorm (HF constructs them with
  // DeepseekV3RMSNorm's default 1e-6, not rms_norm_eps).
  float latent_norm_eps = 1e-6f;
  int64_t rope_offset = 0;  // first rotated column of a q/k head (MLA: nope)
  int64_t q_width() const { return q_heads * head_dim; }
  int64_t k_width() const { return kv_heads * head_dim; }
  // The qkv buffer's row: q | k | v (MLA: v heads of v_head_dim).
  int64_t qkv_width() const { return q_width() + k_width() + v_width(); }
  int64_t v_width() const { return kv_heads * v_head_dim; }  // hook_v
  int64_t z_width() const { return q_heads * v_head_dim; }   // o_proj input
  bool is_mla() const { return attention == AttentionKind::kMla; }

  // ---- Attention ----
  bool fused_qkv = false;                     // one [q; k; v] projection
  QkvLayout qkv_layout = QkvLayout::kConcat;  // its output columns (fused)
  QkNormKind qk_norm = QkNormKind::kNone;
  NormKind qk_norm_type = NormKind::kRms;  // kRms or kLayer
  bool qk_norm_bias = false;               // kLayer with a bias
  float clip_qkv = 0.0f;                   // 0 = none
  int64_t window = 0;  // sliding window in tokens; 0 = global
  // Multiplier of q.k (1/sqrt(head_dim) unless the config says otherwise),
  // already divided by (layer + 1) where GPT-2's option asks for it.
  float attn_scale = 0.0f;
  float attn_softcap = 0.0f;  // 0 = none
  bool attn_sinks = false;    // a learned per-head sink logit (gpt-oss)
  bool alibi = false;         // ALiBi slopes on the scores (BLOOM)
  RopeConfig rope;            // type kNone = no rotary embedding
  int64_t rope_half = 0;      // rotary_dim / 2 (0 = none)
  // Which of the forward's RoPE tables the layer reads: 0, or 1 for a
  // sliding layer of a model with ModelConfig::rope_local (Gemma 3).
  int64_t rope_table = 0;

  // ---- MLP ----
  MlpKind mlp = MlpKind::kGated;  // kMoE: routed experts
  ActKind act = ActKind::kSilu;
  // MoE only (a sparse layer: MoEConfig::IsSparseLayer; the other layers of
  // an MoE model are gated MLPs of intermediate_size).
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  int64_t expert_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;  // 0 = no shared expert
  bool shared_expert_gate = false;  // sigmoid(x . w) scales the shared expert
  bool norm_topk_prob = false;      // kSoftmaxTopK: renormalise the k weights
  RouterKind router = RouterKind::kSoftmaxTopK;
  bool router_bias = false;
  // kSigmoidGroupTopK (MoEConfig): the correction bias weight is bound, the
  // group counts and the weights' scale.
  bool router_correction_bias = false;
  int64_t router_groups = 1;       // n_group
  int64_t router_keep_groups = 1;  // topk_group
  float routed_scaling_factor = 1.0f;
  ExpertActKind expert_act = ExpertActKind::kGated;
  float swiglu_alpha = 0.0f;  // kClampedSwigluInterleaved only
  float swiglu_limit = 0.0f;
  bool expert_bias = false;  // gate_up / down biases per expert

  bool moe() const { return mlp == MlpKind::kMoE; }
  bool parallel() const { return block != BlockKind::kSequential; }
  bool shared_expert() const { return shared_expert_intermediate_size > 0; }
};

// Layer `layer` of `c` (0 <= layer < c.num_layers).
LayerConfig MakeLayerConfig(const ModelConfig& c, int64_t layer);
// Every layer of `c`, in order.
std::vector<LayerConfig> MakeLayerConfigs(const ModelConfig& c);

}  // namespace loom

#endif  // LOOM_MODEL_LAYER_CONFIG_H_
