// DeepSeek-V3 (transformers 4.55's DeepseekV3ForCausalLM): multi-head latent
// attention (AttentionKind::kMla) and, from layer first_k_dense_replace on, a
// sparse MoE with DeepSeek's group-limited sigmoid router
// (RouterKind::kSigmoidGroupTopK).
//
// Attention, per layer "model.layers.{i}.self_attn.":
//   q = q_b_proj(RMSNorm_q_a_layernorm(q_a_proj(x)))  (or q_proj(x) when
//       q_lora_rank is null), viewed [T, heads, qk_nope + qk_rope];
//   kv_a_proj_with_mqa(x) = [kv latent (kv_lora_rank) | k_rope (qk_rope)];
//   kv_b_proj(RMSNorm_kv_a_layernorm(latent)) viewed [T, heads, qk_nope + v]
//       = k_nope | v per head; k_rope is one head shared by every head;
//   rope (yarn over qk_rope_head_dim, interleaved pairs) on q's and k's rope
//   part; softmax scale qk_head_dim^-0.5 * mscale^2 (rope_scaling's
//   mscale_all_dim); o_proj [H, heads v].
// MLP: layers < first_k_dense_replace a SwiGLU of intermediate_size; the
// others a router `mlp.gate` [E, H] with `mlp.gate.e_score_correction_bias`
// [E], E SwiGLU experts `mlp.experts.{e}.{gate,up,down}_proj` of
// moe_intermediate_size and an ungated shared expert
// `mlp.shared_experts.*` of moe_intermediate_size * n_shared_experts.
#include <cmath>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"
#include "src/model/arch/moe.h"

namespace loom::arch {
namespace {

// A positive integer key (or its default when absent).
StatusOr<int64_t> PositiveInt(const ConfigReader& r, const std::string& key,
                              int64_t def) {
  ASSIGN_OR_RETURN(int64_t v, r.Int(key, def));
  if (v <= 0)
    return InvalidArgumentError(r.source() + ": " + key + " = " +
                                std::to_string(v) + ", expected > 0");
  return v;
}

Status ParseMla(const ConfigReader& r, ModelConfig* c) {
  MlaConfig& m = c->mla;
  c->attention = AttentionKind::kMla;
  // Absent: HF's default 1536; null: no q compression (q_proj).
  if (!r.json().contains("q_lora_rank") || r.Has("q_lora_rank")) {
    ASSIGN_OR_RETURN(m.q_lora_rank, PositiveInt(r, "q_lora_rank", 1536));
  }
  ASSIGN_OR_RETURN(m.kv_lora_rank, PositiveInt(r, "kv_lora_rank", 512));
  ASSIGN_OR_RETURN(m.qk_nope_head_dim, PositiveInt(r, "qk_nope_head_dim", 128));
  ASSIGN_OR_RETURN(m.qk_rope_head_dim, PositiveInt(r, "qk_rope_head_dim", 64));
  ASSIGN_OR_RETURN(m.v_head_dim, PositiveInt(r, "v_head_dim", 128));
  if (m.qk_rope_head_dim % 2 != 0)
    return InvalidArgumentError(r.source() + ": qk_rope_head_dim = " +
                                std::to_string(m.qk_rope_head_dim) +
                                ", expected even");
  if (c->num_kv_heads != c->num_heads)
    return InvalidArgumentError(
        r.source() +
        ": num_key_value_heads = " + std::to_string(c->num_kv_heads) +
        ", num_attention_heads = " + std::to_string(c->num_heads) +
        ", expected equal (MLA expands the latent to every head)");
  ASSIGN_OR_RETURN(bool bias, r.Bool("attention_bias", false));
  if (bias)
    return UnimplementedError(r.source() +
                              ": attention_bias = true is not supported for "
                              "deepseek_v3 (q_a_proj / kv_a_proj_with_mqa / "
                              "o_proj biases); expected false");
  // HF's DeepseekV3Config sets head_dim = qk_rope_head_dim: RoPE acts on the
  // qk_rope part of each head. The engine's head_dim is the q/k head width.
  c->head_dim = m.qk_head_dim();
  if (c->rope.type == RopeConfig::Type::kNone)
    return InvalidArgumentError(r.source() +
                                ": deepseek_v3 without rotary embedding");
  c->rope.rotary_dim = m.qk_rope_head_dim;
  ASSIGN_OR_RETURN(c->rope.interleaved, r.Bool("rope_interleave", true));
  // scaling = qk_head_dim^-0.5 * mscale^2, mscale = get_mscale(
  // rope_scaling.factor (as written, not recomputed), mscale_all_dim).
  double scale = 1.0 / std::sqrt(static_cast<double>(m.qk_head_dim()));
  if (r.Has("rope_scaling") && r.json().at("rope_scaling").is_object()) {
    const nlohmann::json& s = r.json().at("rope_scaling");
    const double all = s.value("mscale_all_dim", 0.0);
    const double factor = s.value("factor", 1.0);
    if (all != 0.0 && factor > 1.0) {
      const double ms = 0.1 * all * std::log(factor) + 1.0;  // get_mscale
      scale *= ms * ms;
    }
  }
  c->attn_scale = static_cast<float>(scale);
  return Status();
}

Status ParseRouter(const ConfigReader& r, ModelConfig* c) {
  MoeKeys keys;
  keys.num_experts = "n_routed_experts";
  keys.expert_intermediate_size = "moe_intermediate_size";
  RETURN_IF_ERROR(ParseMoe(r, keys, c));
  MoEConfig& m = c->moe;
  ASSIGN_OR_RETURN(m.norm_topk_prob, r.Bool("norm_topk_prob", true));
  m.router = RouterKind::kSigmoidGroupTopK;
  m.router_correction_bias = true;
  ASSIGN_OR_RETURN(m.n_group, PositiveInt(r, "n_group", 8));
  ASSIGN_OR_RETURN(m.topk_group, PositiveInt(r, "topk_group", 4));
  ASSIGN_OR_RETURN(double scale, r.Float("routed_scaling_factor", 2.5));
  m.routed_scaling_factor = static_cast<float>(scale);
  const int64_t E = m.num_experts, G = m.n_group;
  if (E % G != 0 || E / G < 2 || m.topk_group > G)
    return InvalidArgumentError(
        r.source() + ": n_routed_experts = " + std::to_string(E) +
        ", n_group = " + std::to_string(G) +
        ", topk_group = " + std::to_string(m.topk_group) +
        ", expected n_group dividing the experts into groups of >= 2 and "
        "topk_group <= n_group");
  ASSIGN_OR_RETURN(int64_t shared, r.Int("n_shared_experts", 1));
  if (shared < 0)
    return InvalidArgumentError(r.source() + ": n_shared_experts = " +
                                std::to_string(shared) + ", expected >= 0");
  m.shared_expert_intermediate_size = m.expert_intermediate_size * shared;
  ASSIGN_OR_RETURN(int64_t dense, r.Int("first_k_dense_replace", 3));
  if (dense < 0)
    return InvalidArgumentError(r.source() + ": first_k_dense_replace = " +
                                std::to_string(dense) + ", expected >= 0");
  for (int64_t l = 0; l < dense && l < c->num_layers; ++l)
    m.mlp_only_layers.push_back(l);
  return Status();
}

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  RETURN_IF_ERROR(ParseMla(r, c));
  return ParseRouter(r, c);
}

// Self-attention's MLA weights of layer i, in HF's module order.
void DeclareMla(const ModelConfig& c, int64_t i, std::vector<WeightSpec>* s) {
  const MlaConfig& m = c.mla;
  const int64_t H = c.hidden_size, heads = c.num_heads;
  const std::string p = "model.layers." + std::to_string(i) + ".self_attn.";
  auto linear = [&](std::string name, WeightRole role, Shape shape) {
    AddSpec(s, std::move(name), role, i, std::move(shape));
    s->back().linear = true;
  };
  if (m.q_lora_rank > 0) {
    linear(p + "q_a_proj.weight", WeightRole::kQA, {m.q_lora_rank, H});
    AddSpec(s, p + "q_a_layernorm.weight", WeightRole::kQANorm, i,
            {m.q_lora_rank});
    linear(p + "q_b_proj.weight", WeightRole::kQB,
           {heads * m.qk_head_dim(), m.q_lora_rank});
  } else {
    linear(p + "q_proj.weight", WeightRole::kQ, {heads * m.qk_head_dim(), H});
  }
  linear(p + "kv_a_proj_with_mqa.weight", WeightRole::kKvA,
         {m.kv_lora_rank + m.qk_rope_head_dim, H});
  AddSpec(s, p + "kv_a_layernorm.weight", WeightRole::kKvANorm, i,
          {m.kv_lora_rank});
  linear(p + "kv_b_proj.weight", WeightRole::kKvB,
         {heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank});
  linear(p + "o_proj.weight", WeightRole::kO, {H, heads * m.v_head_dim});
}

ArchWeights Declare(const ModelConfig& c) {
  MoeNames moe;
  moe.shared = "shared_experts";
  ArchWeights decl = DeclareMoeDecoder(c, DecoderNames{}, moe);
  // The Llama attention declared there is replaced by MLA's.
  std::vector<WeightSpec> specs;
  specs.reserve(decl.specs.size());
  for (WeightSpec& s : decl.specs) {
    const WeightRole r = s.role;
    if (r == WeightRole::kQ) DeclareMla(c, s.layer, &specs);
    if (r == WeightRole::kQ || r == WeightRole::kK || r == WeightRole::kV ||
        r == WeightRole::kO)
      continue;
    specs.push_back(std::move(s));
  }
  decl.specs = std::move(specs);
  return decl;
}

}  // namespace

const ArchDef kDeepseekV3 = {"deepseek_v3", Parse, Declare,
                             /*runnable=*/true};

}  // namespace loom::arch
