// GPTBigCode (SantaCoder, StarCoder 1): GPT-2's block (learned positions,
// LayerNorm with bias, gelu_pytorch_tanh MLP c_fc/c_proj with biases, tied
// lm_head) with nn.Linear weights ([out, in], not Conv1D) and multi-query
// attention: one fused c_attn with bias whose rows are [q (all heads) |
// k (one head) | v (one head)], every query head attending with the single
// k/v. The multi_query = false layout (per-head q|k|v) is refused.
#include <cmath>
#include <string>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->vocab_size, r.Int("vocab_size"));
  ASSIGN_OR_RETURN(c->hidden_size, r.Int("n_embd"));
  ASSIGN_OR_RETURN(c->num_layers, r.Int("n_layer"));
  ASSIGN_OR_RETURN(c->num_heads, r.Int("n_head"));
  if (c->num_heads <= 0 || c->hidden_size % c->num_heads != 0)
    return InvalidArgumentError(
        r.source() + ": n_embd = " + std::to_string(c->hidden_size) +
        " is not a multiple of n_head = " + std::to_string(c->num_heads));
  c->head_dim = c->hidden_size / c->num_heads;
  ASSIGN_OR_RETURN(const bool mqa, r.Bool("multi_query", true));
  if (!mqa)
    return UnimplementedError(r.source() +
                              ": multi_query = false (GPTBigCode's per-head "
                              "c_attn layout) is not supported yet");
  c->num_kv_heads = 1;
  ASSIGN_OR_RETURN(c->intermediate_size, r.Int("n_inner", 4 * c->hidden_size));
  ASSIGN_OR_RETURN(c->max_position_embeddings, r.Int("n_positions"));
  ASSIGN_OR_RETURN(double eps, r.Float("layer_norm_epsilon", 1e-5));
  c->norm_eps = static_cast<float>(eps);
  c->norm = NormKind::kLayer;
  ASSIGN_OR_RETURN(std::string act,
                   r.String("activation_function", "gelu_pytorch_tanh"));
  ASSIGN_OR_RETURN(c->act, ParseActivation(r, "activation_function", act));
  c->mlp = MlpKind::kPlain;
  c->fused_qkv = true;
  c->qkv_bias = c->o_bias = c->mlp_bias = true;
  c->tie_word_embeddings = true;
  c->learned_positions = true;
  c->rope.type = RopeConfig::Type::kNone;
  ASSIGN_OR_RETURN(const bool scale, r.Bool("scale_attn_weights", true));
  c->attn_scale =
      scale ? 1.0f / std::sqrt(static_cast<float>(c->head_dim)) : 1.0f;
  c->sliding_window.assign(c->num_layers, 0);
  ASSIGN_OR_RETURN(c->bos_token_id, r.Int("bos_token_id", -1));
  ASSIGN_OR_RETURN(c->eos_token_id, r.Int("eos_token_id", -1));
  ASSIGN_OR_RETURN(std::string dtype, r.String("torch_dtype", "float32"));
  if (auto d = ParseDType(dtype)) c->torch_dtype = *d;
  return ValidateDims(r.source(), *c);
}

ArchWeights Declare(const ModelConfig& c) {
  ArchWeights w;
  auto add = [&](std::string name, WeightRole role, int64_t layer, Shape shape,
                 bool linear = false) {
    AddSpec(&w.specs, std::move(name), role, layer, std::move(shape));
    w.specs.back().linear = linear;
  };
  const int64_t H = c.hidden_size, I = c.intermediate_size,
                QKV = c.q_dim() + 2 * c.kv_dim();
  add("transformer.wte.weight", WeightRole::kEmbed, -1, {c.vocab_size, H});
  add("transformer.wpe.weight", WeightRole::kPosEmbed, -1,
      {c.max_position_embeddings, H});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    add(p + "ln_1.weight", WeightRole::kAttnNorm, i, {H});
    add(p + "ln_1.bias", WeightRole::kAttnNormBias, i, {H});
    add(p + "attn.c_attn.weight", WeightRole::kQkv, i, {QKV, H}, true);
    add(p + "attn.c_attn.bias", WeightRole::kQkvBias, i, {QKV});
    add(p + "attn.c_proj.weight", WeightRole::kO, i, {H, H}, true);
    add(p + "attn.c_proj.bias", WeightRole::kOBias, i, {H});
    add(p + "ln_2.weight", WeightRole::kMlpNorm, i, {H});
    add(p + "ln_2.bias", WeightRole::kMlpNormBias, i, {H});
    add(p + "mlp.c_fc.weight", WeightRole::kUp, i, {I, H}, true);
    add(p + "mlp.c_fc.bias", WeightRole::kUpBias, i, {I});
    add(p + "mlp.c_proj.weight", WeightRole::kDown, i, {H, I}, true);
    add(p + "mlp.c_proj.bias", WeightRole::kDownBias, i, {H});
  }
  add("transformer.ln_f.weight", WeightRole::kFinalNorm, -1, {H});
  add("transformer.ln_f.bias", WeightRole::kFinalNormBias, -1, {H});
  add("lm_head.weight", WeightRole::kLmHead, -1, {c.vocab_size, H}, true);
  w.specs.back().required = false;
  w.specs.back().tied_to = "transformer.wte.weight";
  // Causal-mask buffers some checkpoints carry.
  w.ignored_suffixes = {".attn.bias", ".attn.masked_bias"};
  w.optional_prefixes = {"transformer."};
  return w;
}

}  // namespace

const ArchDef kGptBigcode = {"gpt_bigcode", Parse, Declare,
                             /*runnable=*/true};

}  // namespace loom::arch
