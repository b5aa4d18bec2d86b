// GPT-2: learned absolute positions (wpe), LayerNorm with bias, multi-head
// attention through one fused c_attn, GELU (tanh) MLP, tied lm_head. Its
// Conv1D weights are stored [in, out].
#include <cmath>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->vocab_size, r.Int("vocab_size"));
  ASSIGN_OR_RETURN(c->hidden_size, r.Int("n_embd"));
  ASSIGN_OR_RETURN(c->num_layers, r.Int("n_layer"));
  ASSIGN_OR_RETURN(c->num_heads, r.Int("n_head"));
  c->num_kv_heads = c->num_heads;
  if (c->num_heads <= 0 || c->hidden_size % c->num_heads != 0)
    return InvalidArgumentError(
        r.source() + ": n_embd = " + std::to_string(c->hidden_size) +
        " is not a multiple of n_head = " + std::to_string(c->num_heads));
  c->head_dim = c->hidden_size / c->num_heads;
  ASSIGN_OR_RETURN(c->intermediate_size, r.Int("n_inner", 4 * c->hidden_size));
  ASSIGN_OR_RETURN(c->max_position_embeddings, r.Int("n_positions"));
  RETURN_IF_ERROR(ParseGptNormAndMlp(r, "gelu_new", c));
  c->fused_qkv = true;
  c->qkv_bias = c->o_bias = c->mlp_bias = true;
  c->tie_word_embeddings = true;
  c->learned_positions = true;
  c->rope.type = RopeConfig::Type::kNone;
  ASSIGN_OR_RETURN(bool scale, r.Bool("scale_attn_weights", true));
  c->attn_scale =
      scale ? 1.0f / std::sqrt(static_cast<float>(c->head_dim)) : 1.0f;
  ASSIGN_OR_RETURN(c->attn_scale_by_inverse_layer,
                   r.Bool("scale_attn_by_inverse_layer_idx", false));
  ASSIGN_OR_RETURN(int64_t bos, r.Int("bos_token_id", -1));
  ASSIGN_OR_RETURN(int64_t eos, r.Int("eos_token_id", -1));
  c->bos_token_id = bos;
  c->eos_token_id = eos;
  ASSIGN_OR_RETURN(std::string dtype, r.String("torch_dtype", "float32"));
  if (auto d = ParseDType(dtype)) c->torch_dtype = *d;
  c->sliding_window.assign(c->num_layers, 0);
  return ValidateDims(r.source(), *c);
}

ArchWeights Declare(const ModelConfig& c) {
  ArchWeights w;
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  auto add = [&](std::string name, WeightRole role, int64_t layer, Shape shape,
                 MatrixLayout layout = MatrixLayout::kOutIn) {
    WeightSpec s;
    s.name = std::move(name);
    s.role = role;
    s.layer = layer;
    s.shape = std::move(shape);
    s.layout = layout;
    w.specs.push_back(std::move(s));
  };
  add("transformer.wte.weight", WeightRole::kEmbed, -1, {c.vocab_size, H});
  add("transformer.wpe.weight", WeightRole::kPosEmbed, -1,
      {c.max_position_embeddings, H});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    add(p + "ln_1.weight", WeightRole::kAttnNorm, i, {H});
    add(p + "ln_1.bias", WeightRole::kAttnNormBias, i, {H});
    add(p + "attn.c_attn.weight", WeightRole::kQkv, i, {H, 3 * H},
        MatrixLayout::kInOut);
    add(p + "attn.c_attn.bias", WeightRole::kQkvBias, i, {3 * H});
    add(p + "attn.c_proj.weight", WeightRole::kO, i, {H, H},
        MatrixLayout::kInOut);
    add(p + "attn.c_proj.bias", WeightRole::kOBias, i, {H});
    add(p + "ln_2.weight", WeightRole::kMlpNorm, i, {H});
    add(p + "ln_2.bias", WeightRole::kMlpNormBias, i, {H});
    add(p + "mlp.c_fc.weight", WeightRole::kUp, i, {H, I},
        MatrixLayout::kInOut);
    add(p + "mlp.c_fc.bias", WeightRole::kUpBias, i, {I});
    add(p + "mlp.c_proj.weight", WeightRole::kDown, i, {I, H},
        MatrixLayout::kInOut);
    add(p + "mlp.c_proj.bias", WeightRole::kDownBias, i, {H});
  }
  add("transformer.ln_f.weight", WeightRole::kFinalNorm, -1, {H});
  add("transformer.ln_f.bias", WeightRole::kFinalNormBias, -1, {H});
  add("lm_head.weight", WeightRole::kLmHead, -1, {c.vocab_size, H});
  w.specs.back().required = false;
  w.specs.back().tied_to = "transformer.wte.weight";
  // Causal-mask buffers some GPT-2 checkpoints carry.
  w.ignored_suffixes = {".attn.bias", ".attn.masked_bias"};
  w.optional_prefixes = {"transformer."};
  return w;
}

}  // namespace

const ArchDef kGpt2 = {"gpt2", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
