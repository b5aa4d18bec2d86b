// Qwen2-MoE (planning only): Qwen2 attention (q/k/v biases) with a sparse MoE
// feed-forward: router `mlp.gate` [E, H], E SiLU-gated experts
// `mlp.experts.{e}.{gate,up,down}_proj` (I_e = moe_intermediate_size), and a
// shared expert `mlp.shared_expert.{gate,up,down}_proj`
// (I_s = shared_expert_intermediate_size) scaled by
// sigmoid(`mlp.shared_expert_gate` [1, H] x).
#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {

Status ParseQwenSlidingWindow(const ConfigReader& r, ModelConfig* c);
Status ParseQwenMoe(const ConfigReader& r, ModelConfig* c);
ArchWeights ReplaceDenseMlp(const ModelConfig& c, const DecoderNames& names,
                            void (*moe)(const ModelConfig& c, int64_t layer,
                                        std::vector<WeightSpec>* specs));
void AddSpec(std::vector<WeightSpec>* specs, std::string name, WeightRole role,
             int64_t layer, Shape shape);

namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  c->qkv_bias = true;
  RETURN_IF_ERROR(ParseQwenSlidingWindow(r, c));
  RETURN_IF_ERROR(ParseQwenMoe(r, c));
  ASSIGN_OR_RETURN(c->moe.shared_expert_intermediate_size,
                   r.Int("shared_expert_intermediate_size"));
  if (c->moe.shared_expert_intermediate_size <= 0)
    return InvalidArgumentError(
        r.source() + ": shared_expert_intermediate_size = " +
        std::to_string(c->moe.shared_expert_intermediate_size) +
        ", expected > 0");
  return Status();
}

void Moe(const ModelConfig& c, int64_t i, std::vector<WeightSpec>* specs) {
  const int64_t H = c.hidden_size, I = c.moe.expert_intermediate_size,
                S = c.moe.shared_expert_intermediate_size;
  const std::string p = "model.layers." + std::to_string(i) + ".mlp.";
  AddSpec(specs, p + "gate.weight", WeightRole::kRouter, i,
          {c.moe.num_experts, H});
  for (int64_t e = 0; e < c.moe.num_experts; ++e) {
    const std::string x = p + "experts." + std::to_string(e) + ".";
    AddSpec(specs, x + "gate_proj.weight", WeightRole::kExpert, i, {I, H});
    AddSpec(specs, x + "up_proj.weight", WeightRole::kExpert, i, {I, H});
    AddSpec(specs, x + "down_proj.weight", WeightRole::kExpert, i, {H, I});
  }
  AddSpec(specs, p + "shared_expert.gate_proj.weight",
          WeightRole::kSharedExpert, i, {S, H});
  AddSpec(specs, p + "shared_expert.up_proj.weight", WeightRole::kSharedExpert,
          i, {S, H});
  AddSpec(specs, p + "shared_expert.down_proj.weight",
          WeightRole::kSharedExpert, i, {H, S});
  AddSpec(specs, p + "shared_expert_gate.weight", WeightRole::kSharedExpertGate,
          i, {1, H});
}

ArchWeights Declare(const ModelConfig& c) {
  return ReplaceDenseMlp(c, DecoderNames{}, Moe);
}

}  // namespace

const ArchDef kQwen2Moe = {"qwen2_moe", Parse, Declare, /*runnable=*/false};

}  // namespace loom::arch
