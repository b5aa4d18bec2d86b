// Phi (phi-1, phi-1.5, phi-2): one LayerNorm per layer feeding both the
// attention and the MLP (x + attn(ln(x)) + mlp(ln(x)),
// BlockKind::kParallelSharedNorm), biased q/k/v/dense, partial rotary
// embeddings (partial_rotary_factor), a plain gelu_new MLP fc1/fc2 with
// biases, final_layernorm with bias and an lm_head with a bias.
#include <string>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  // PhiConfig's defaults where ParseDecoderBase's differ.
  if (!r.Has("partial_rotary_factor")) {  // PhiConfig's default 0.5
    c->rope.rotary_dim = c->head_dim / 2;
    if (c->rope.rotary_dim % 2 != 0 || c->rope.rotary_dim == 0)
      return InvalidArgumentError(
          r.source() + ": rotary dimension " +
          std::to_string(c->rope.rotary_dim) + " (head_dim " +
          std::to_string(c->head_dim) +
          " x the default partial_rotary_factor 0.5) must be even and "
          "positive");
  }
  ASSIGN_OR_RETURN(std::string act, r.String("hidden_act", "gelu_new"));
  ASSIGN_OR_RETURN(c->act, ParseActivation(r, "hidden_act", act));
  ASSIGN_OR_RETURN(bool qk_layernorm, r.Bool("qk_layernorm", false));
  if (qk_layernorm)
    return UnimplementedError(r.source() +
                              ": qk_layernorm = true (per-head LayerNorm of q "
                              "and k) is not supported");
  c->norm = NormKind::kLayer;
  ASSIGN_OR_RETURN(double eps, r.Float("layer_norm_eps", 1e-5));
  if (!(eps > 0))
    return InvalidArgumentError(r.source() + ": layer_norm_eps = " +
                                std::to_string(eps) + ", expected > 0");
  c->norm_eps = static_cast<float>(eps);
  c->mlp = MlpKind::kPlain;
  c->qkv_bias = c->o_bias = c->mlp_bias = true;
  c->block = BlockKind::kParallelSharedNorm;
  c->pre_mlp_norm = false;  // the MLP reads input_layernorm's output
  return Status();
}

ArchWeights Declare(const ModelConfig& c) {
  ArchWeights w;
  auto add = [&](std::string name, WeightRole role, int64_t layer, Shape shape,
                 bool linear = false) {
    AddSpec(&w.specs, std::move(name), role, layer, std::move(shape));
    w.specs.back().linear = linear;
  };
  const int64_t H = c.hidden_size, I = c.intermediate_size, Q = c.q_dim(),
                KV = c.kv_dim();
  add("model.embed_tokens.weight", WeightRole::kEmbed, -1, {c.vocab_size, H});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", WeightRole::kAttnNorm, i, {H});
    add(p + "input_layernorm.bias", WeightRole::kAttnNormBias, i, {H});
    add(p + "self_attn.q_proj.weight", WeightRole::kQ, i, {Q, H}, true);
    add(p + "self_attn.q_proj.bias", WeightRole::kQBias, i, {Q});
    add(p + "self_attn.k_proj.weight", WeightRole::kK, i, {KV, H}, true);
    add(p + "self_attn.k_proj.bias", WeightRole::kKBias, i, {KV});
    add(p + "self_attn.v_proj.weight", WeightRole::kV, i, {KV, H}, true);
    add(p + "self_attn.v_proj.bias", WeightRole::kVBias, i, {KV});
    add(p + "self_attn.dense.weight", WeightRole::kO, i, {H, Q}, true);
    add(p + "self_attn.dense.bias", WeightRole::kOBias, i, {H});
    add(p + "mlp.fc1.weight", WeightRole::kUp, i, {I, H}, true);
    add(p + "mlp.fc1.bias", WeightRole::kUpBias, i, {I});
    add(p + "mlp.fc2.weight", WeightRole::kDown, i, {H, I}, true);
    add(p + "mlp.fc2.bias", WeightRole::kDownBias, i, {H});
  }
  add("model.final_layernorm.weight", WeightRole::kFinalNorm, -1, {H});
  add("model.final_layernorm.bias", WeightRole::kFinalNormBias, -1, {H});
  add("lm_head.weight", WeightRole::kLmHead, -1, {c.vocab_size, H}, true);
  if (c.tie_word_embeddings) {
    w.specs.back().required = false;
    w.specs.back().tied_to = "model.embed_tokens.weight";
  }
  add("lm_head.bias", WeightRole::kLmHeadBias, -1, {c.vocab_size});
  w.ignored_suffixes = {"rotary_emb.inv_freq"};
  return w;
}

}  // namespace

const ArchDef kPhi = {"phi", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
