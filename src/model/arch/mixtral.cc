// Mixtral (planning only): Llama attention with a sparse MoE feed-forward in
// every layer: a router `block_sparse_moe.gate` [E, H] and E SiLU-gated
// experts `block_sparse_moe.experts.{e}.w1` (gate) [I, H], `w3` (up) [I, H],
// `w2` (down) [H, I]; top-k routing with softmax over the chosen logits.
#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {

// Shared with the other MoE declarations (qwen2_moe.cc, qwen3_moe.cc): the
// Llama-style declaration with each layer's dense MLP replaced by what
// `moe(layer, specs)` appends.
ArchWeights ReplaceDenseMlp(const ModelConfig& c, const DecoderNames& names,
                            void (*moe)(const ModelConfig& c, int64_t layer,
                                        std::vector<WeightSpec>* specs));

ArchWeights ReplaceDenseMlp(const ModelConfig& c, const DecoderNames& names,
                            void (*moe)(const ModelConfig& c, int64_t layer,
                                        std::vector<WeightSpec>* specs)) {
  ModelConfig dense = c;
  dense.mlp = MlpKind::kGated;
  dense.mlp_bias = false;
  ArchWeights decl = DeclareDecoderWeights(dense, names);
  std::vector<WeightSpec> specs;
  specs.reserve(decl.specs.size());
  for (WeightSpec& s : decl.specs) {
    if (s.layer >= 0 && s.role == WeightRole::kGate) {
      moe(c, s.layer, &specs);
      continue;
    }
    if (s.layer >= 0 &&
        (s.role == WeightRole::kUp || s.role == WeightRole::kDown))
      continue;
    specs.push_back(std::move(s));
  }
  decl.specs = std::move(specs);
  return decl;
}

// Appends one tensor to a declaration.
void AddSpec(std::vector<WeightSpec>* specs, std::string name, WeightRole role,
             int64_t layer, Shape shape) {
  WeightSpec s;
  s.name = std::move(name);
  s.role = role;
  s.layer = layer;
  s.shape = std::move(shape);
  specs->push_back(std::move(s));
}

namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  ASSIGN_OR_RETURN(int64_t window, r.Int("sliding_window", 0));
  if (window < 0)
    return InvalidArgumentError(r.source() +
                                ": sliding_window = " + std::to_string(window) +
                                ", expected >= 0 or null");
  c->sliding_window.assign(c->num_layers, window);
  c->mlp = MlpKind::kMoE;
  ASSIGN_OR_RETURN(c->moe.num_experts, r.Int("num_local_experts"));
  ASSIGN_OR_RETURN(c->moe.experts_per_token, r.Int("num_experts_per_tok"));
  c->moe.expert_intermediate_size = c->intermediate_size;
  c->moe.norm_topk_prob = true;
  if (c->moe.num_experts <= 0 || c->moe.experts_per_token <= 0 ||
      c->moe.experts_per_token > c->moe.num_experts)
    return InvalidArgumentError(
        r.source() +
        ": num_experts_per_tok = " + std::to_string(c->moe.experts_per_token) +
        ", num_local_experts = " + std::to_string(c->moe.num_experts) +
        ", expected 0 < num_experts_per_tok <= num_local_experts");
  return Status();
}

void Moe(const ModelConfig& c, int64_t i, std::vector<WeightSpec>* specs) {
  const int64_t H = c.hidden_size, I = c.moe.expert_intermediate_size;
  const std::string p =
      "model.layers." + std::to_string(i) + ".block_sparse_moe.";
  AddSpec(specs, p + "gate.weight", WeightRole::kRouter, i,
          {c.moe.num_experts, H});
  for (int64_t e = 0; e < c.moe.num_experts; ++e) {
    const std::string x = p + "experts." + std::to_string(e) + ".";
    AddSpec(specs, x + "w1.weight", WeightRole::kExpert, i, {I, H});
    AddSpec(specs, x + "w2.weight", WeightRole::kExpert, i, {H, I});
    AddSpec(specs, x + "w3.weight", WeightRole::kExpert, i, {I, H});
  }
}

ArchWeights Declare(const ModelConfig& c) {
  return ReplaceDenseMlp(c, DecoderNames{}, Moe);
}

}  // namespace

const ArchDef kMixtral = {"mixtral", Parse, Declare, /*runnable=*/false};

}  // namespace loom::arch
