// Qwen3-MoE (planning only): Qwen3 attention (per-head q/k RMSNorm) with a
// sparse MoE feed-forward: router `mlp.gate` [E, H] and E SiLU-gated experts
// `mlp.experts.{e}.{gate,up}_proj` [I_e, H], `down_proj` [H, I_e]
// (I_e = moe_intermediate_size).
#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {

Status ParseQwenSlidingWindow(const ConfigReader& r, ModelConfig* c);
ArchWeights ReplaceDenseMlp(const ModelConfig& c, const DecoderNames& names,
                            void (*moe)(const ModelConfig& c, int64_t layer,
                                        std::vector<WeightSpec>* specs));
void AddSpec(std::vector<WeightSpec>* specs, std::string name, WeightRole role,
             int64_t layer, Shape shape);

// Shared with qwen2_moe.cc: num_experts, num_experts_per_tok,
// moe_intermediate_size, norm_topk_prob; every layer must be sparse
// (decoder_sparse_step 1, mlp_only_layers empty) until ModelConfig can say
// which layers are dense.
Status ParseQwenMoe(const ConfigReader& r, ModelConfig* c) {
  c->mlp = MlpKind::kMoE;
  ASSIGN_OR_RETURN(c->moe.num_experts, r.Int("num_experts"));
  ASSIGN_OR_RETURN(c->moe.experts_per_token, r.Int("num_experts_per_tok"));
  ASSIGN_OR_RETURN(c->moe.expert_intermediate_size,
                   r.Int("moe_intermediate_size"));
  ASSIGN_OR_RETURN(c->moe.norm_topk_prob, r.Bool("norm_topk_prob", false));
  if (c->moe.num_experts <= 0 || c->moe.experts_per_token <= 0 ||
      c->moe.experts_per_token > c->moe.num_experts)
    return InvalidArgumentError(
        r.source() +
        ": num_experts_per_tok = " + std::to_string(c->moe.experts_per_token) +
        ", num_experts = " + std::to_string(c->moe.num_experts) +
        ", expected 0 < num_experts_per_tok <= num_experts");
  if (c->moe.expert_intermediate_size <= 0)
    return InvalidArgumentError(
        r.source() + ": moe_intermediate_size = " +
        std::to_string(c->moe.expert_intermediate_size) + ", expected > 0");
  ASSIGN_OR_RETURN(int64_t step, r.Int("decoder_sparse_step", 1));
  const bool dense_layers = r.Has("mlp_only_layers") &&
                            r.json().at("mlp_only_layers").is_array() &&
                            !r.json().at("mlp_only_layers").empty();
  if (step != 1 || dense_layers)
    return UnimplementedError(
        r.source() + ": decoder_sparse_step = " + std::to_string(step) +
        (dense_layers ? " with non-empty mlp_only_layers" : "") +
        ": MoE models with dense layers are not supported yet (every layer "
        "must be sparse)");
  return Status();
}

namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  ASSIGN_OR_RETURN(c->qkv_bias, r.Bool("attention_bias", false));
  c->o_bias = c->qkv_bias;
  c->qk_norm = QkNormKind::kPerHead;
  RETURN_IF_ERROR(ParseQwenSlidingWindow(r, c));
  return ParseQwenMoe(r, c);
}

void Moe(const ModelConfig& c, int64_t i, std::vector<WeightSpec>* specs) {
  const int64_t H = c.hidden_size, I = c.moe.expert_intermediate_size;
  const std::string p = "model.layers." + std::to_string(i) + ".mlp.";
  AddSpec(specs, p + "gate.weight", WeightRole::kRouter, i,
          {c.moe.num_experts, H});
  for (int64_t e = 0; e < c.moe.num_experts; ++e) {
    const std::string x = p + "experts." + std::to_string(e) + ".";
    AddSpec(specs, x + "gate_proj.weight", WeightRole::kExpert, i, {I, H});
    AddSpec(specs, x + "up_proj.weight", WeightRole::kExpert, i, {I, H});
    AddSpec(specs, x + "down_proj.weight", WeightRole::kExpert, i, {H, I});
  }
}

ArchWeights Declare(const ModelConfig& c) {
  return ReplaceDenseMlp(c, DecoderNames{}, Moe);
}

}  // namespace

const ArchDef kQwen3Moe = {"qwen3_moe", Parse, Declare, /*runnable=*/false};

}  // namespace loom::arch
