// CodeGen (Salesforce codegen-*-{mono,multi,nl}): GPT-J's block (one
// LayerNorm feeding the parallel attention and MLP, interleaved partial
// rotary: RopeConfig::rotate_pairs, gelu_new fc_in/fc_out with biases, ln_f,
// an untied lm_head with a bias) with one fused qkv_proj in CodeGen's
// mp_num = 4 layout: 4 chunks of [q | v | k] (QkvLayout::kGroupedQvk). The
// rotary dimension is min(rotary_dim, n_ctx / n_head), as CodeGenModel
// computes it.
#include <algorithm>
#include <cmath>
#include <string>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

constexpr int64_t kCodeGenMpNum = 4;  // CodeGenAttention's mp_num

Status Parse(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->vocab_size, r.Int("vocab_size"));
  ASSIGN_OR_RETURN(c->hidden_size, r.Int("n_embd"));
  ASSIGN_OR_RETURN(c->num_layers, r.Int("n_layer"));
  ASSIGN_OR_RETURN(c->num_heads, r.Int("n_head"));
  c->num_kv_heads = c->num_heads;
  if (c->num_heads <= 0 || c->hidden_size % c->num_heads != 0 ||
      c->num_heads % kCodeGenMpNum != 0)
    return InvalidArgumentError(
        r.source() + ": n_embd = " + std::to_string(c->hidden_size) +
        " and n_head = " + std::to_string(c->num_heads) +
        " must divide into heads, and n_head into CodeGen's 4 qkv chunks");
  c->head_dim = c->hidden_size / c->num_heads;
  ASSIGN_OR_RETURN(c->intermediate_size, r.Int("n_inner", 4 * c->hidden_size));
  ASSIGN_OR_RETURN(c->max_position_embeddings, r.Int("n_positions"));
  ASSIGN_OR_RETURN(const int64_t n_ctx,
                   r.Int("n_ctx", c->max_position_embeddings));
  ASSIGN_OR_RETURN(double eps, r.Float("layer_norm_epsilon", 1e-5));
  c->norm_eps = static_cast<float>(eps);
  c->norm = NormKind::kLayer;
  ASSIGN_OR_RETURN(std::string act,
                   r.String("activation_function", "gelu_new"));
  ASSIGN_OR_RETURN(c->act, ParseActivation(r, "activation_function", act));
  c->mlp = MlpKind::kPlain;
  c->fused_qkv = true;
  c->qkv_layout = QkvLayout::kGroupedQvk;
  c->qkv_groups = kCodeGenMpNum;
  c->qkv_bias = c->o_bias = false;
  c->mlp_bias = true;
  c->block = BlockKind::kParallelSharedNorm;
  c->pre_mlp_norm = false;  // the MLP reads ln_1's output
  ASSIGN_OR_RETURN(c->tie_word_embeddings,
                   r.Bool("tie_word_embeddings", false));
  c->rope.type = RopeConfig::Type::kDefault;
  c->rope.theta = 10000.0;
  c->rope.rotate_pairs = true;
  ASSIGN_OR_RETURN(int64_t rotary, r.Int("rotary_dim", c->head_dim));
  rotary = std::min(rotary, n_ctx / c->num_heads);
  if (rotary <= 0 || rotary > c->head_dim || rotary % 2 != 0)
    return InvalidArgumentError(
        r.source() + ": rotary_dim = " + std::to_string(rotary) +
        " (min(rotary_dim, n_ctx / n_head)), expected an even value in [2, "
        "head_dim = " +
        std::to_string(c->head_dim) + "]");
  c->rope.rotary_dim = rotary;
  c->attn_scale = 1.0f / std::sqrt(static_cast<float>(c->head_dim));
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
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  add("transformer.wte.weight", WeightRole::kEmbed, -1, {c.vocab_size, H});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    add(p + "ln_1.weight", WeightRole::kAttnNorm, i, {H});
    add(p + "ln_1.bias", WeightRole::kAttnNormBias, i, {H});
    add(p + "attn.qkv_proj.weight", WeightRole::kQkv, i, {3 * H, H}, true);
    add(p + "attn.out_proj.weight", WeightRole::kO, i, {H, H}, true);
    add(p + "mlp.fc_in.weight", WeightRole::kUp, i, {I, H}, true);
    add(p + "mlp.fc_in.bias", WeightRole::kUpBias, i, {I});
    add(p + "mlp.fc_out.weight", WeightRole::kDown, i, {H, I}, true);
    add(p + "mlp.fc_out.bias", WeightRole::kDownBias, i, {H});
  }
  add("transformer.ln_f.weight", WeightRole::kFinalNorm, -1, {H});
  add("transformer.ln_f.bias", WeightRole::kFinalNormBias, -1, {H});
  add("lm_head.weight", WeightRole::kLmHead, -1, {c.vocab_size, H}, true);
  if (c.tie_word_embeddings) {
    w.specs.back().required = false;
    w.specs.back().tied_to = "transformer.wte.weight";
  }
  add("lm_head.bias", WeightRole::kLmHeadBias, -1, {c.vocab_size});
  // Causal-mask buffers CodeGen checkpoints carry.
  w.ignored_suffixes = {".attn.causal_mask", ".attn.bias", ".attn.masked_bias"};
  w.optional_prefixes = {"transformer."};
  return w;
}

}  // namespace

const ArchDef kCodegen = {"codegen", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
