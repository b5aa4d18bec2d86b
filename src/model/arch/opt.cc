// OPT (facebook/opt-*): a pre-LN decoder (do_layer_norm_before) with
// LayerNorms with bias (self_attn_layer_norm before the attention, the
// layer's final_layer_norm before the MLP), biased q/k/v/out_proj and
// fc1/fc2, ReLU, learned positions read at p + 2 (embed_positions holds
// max_position_embeddings + 2 rows), the model's final_layer_norm and a
// lm_head tied to embed_tokens. The post-LN layout (OPT-350m:
// do_layer_norm_before false, with project_in/project_out) is refused.
#include <cmath>
#include <string>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

constexpr int64_t kOptPositionOffset = 2;  // OPTLearnedPositionalEmbedding

Status Parse(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->vocab_size, r.Int("vocab_size"));
  ASSIGN_OR_RETURN(c->hidden_size, r.Int("hidden_size"));
  ASSIGN_OR_RETURN(c->num_layers, r.Int("num_hidden_layers"));
  ASSIGN_OR_RETURN(c->num_heads, r.Int("num_attention_heads"));
  c->num_kv_heads = c->num_heads;
  if (c->num_heads <= 0 || c->hidden_size % c->num_heads != 0)
    return InvalidArgumentError(
        r.source() + ": hidden_size = " + std::to_string(c->hidden_size) +
        " is not a multiple of num_attention_heads = " +
        std::to_string(c->num_heads));
  c->head_dim = c->hidden_size / c->num_heads;
  ASSIGN_OR_RETURN(c->intermediate_size, r.Int("ffn_dim"));
  ASSIGN_OR_RETURN(c->max_position_embeddings,
                   r.Int("max_position_embeddings"));
  ASSIGN_OR_RETURN(const bool pre_ln, r.Bool("do_layer_norm_before", true));
  ASSIGN_OR_RETURN(const int64_t proj,
                   r.Int("word_embed_proj_dim", c->hidden_size));
  if (!pre_ln || proj != c->hidden_size)
    return UnimplementedError(
        r.source() +
        ": OPT's post-LN layout (do_layer_norm_before = false, "
        "word_embed_proj_dim " +
        std::to_string(proj) +
        " with project_in/project_out, as in "
        "OPT-350m) is not supported yet");
  ASSIGN_OR_RETURN(const bool bias, r.Bool("enable_bias", true));
  ASSIGN_OR_RETURN(const bool affine,
                   r.Bool("layer_norm_elementwise_affine", true));
  ASSIGN_OR_RETURN(const bool no_final_norm,
                   r.Bool("_remove_final_layer_norm", false));
  if (!bias || !affine || no_final_norm)
    return UnimplementedError(
        r.source() +
        ": enable_bias false, layer_norm_elementwise_affine false or "
        "_remove_final_layer_norm true are not supported");
  c->norm = NormKind::kLayer;
  c->norm_eps = 1e-5f;  // nn.LayerNorm's default: OPT does not set one
  ASSIGN_OR_RETURN(std::string act, r.String("activation_function", "relu"));
  ASSIGN_OR_RETURN(c->act, ParseActivation(r, "activation_function", act));
  c->mlp = MlpKind::kPlain;
  c->qkv_bias = c->o_bias = c->mlp_bias = true;
  ASSIGN_OR_RETURN(c->tie_word_embeddings, r.Bool("tie_word_embeddings", true));
  c->learned_positions = true;
  c->position_offset = kOptPositionOffset;
  c->rope.type = RopeConfig::Type::kNone;
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
  const std::string m = "model.decoder.";
  add(m + "embed_tokens.weight", WeightRole::kEmbed, -1, {c.vocab_size, H});
  add(m + "embed_positions.weight", WeightRole::kPosEmbed, -1,
      {c.max_position_embeddings + c.position_offset, H});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = m + "layers." + std::to_string(i) + ".";
    add(p + "self_attn_layer_norm.weight", WeightRole::kAttnNorm, i, {H});
    add(p + "self_attn_layer_norm.bias", WeightRole::kAttnNormBias, i, {H});
    add(p + "self_attn.q_proj.weight", WeightRole::kQ, i, {H, H}, true);
    add(p + "self_attn.q_proj.bias", WeightRole::kQBias, i, {H});
    add(p + "self_attn.k_proj.weight", WeightRole::kK, i, {H, H}, true);
    add(p + "self_attn.k_proj.bias", WeightRole::kKBias, i, {H});
    add(p + "self_attn.v_proj.weight", WeightRole::kV, i, {H, H}, true);
    add(p + "self_attn.v_proj.bias", WeightRole::kVBias, i, {H});
    add(p + "self_attn.out_proj.weight", WeightRole::kO, i, {H, H}, true);
    add(p + "self_attn.out_proj.bias", WeightRole::kOBias, i, {H});
    add(p + "final_layer_norm.weight", WeightRole::kMlpNorm, i, {H});
    add(p + "final_layer_norm.bias", WeightRole::kMlpNormBias, i, {H});
    add(p + "fc1.weight", WeightRole::kUp, i, {I, H}, true);
    add(p + "fc1.bias", WeightRole::kUpBias, i, {I});
    add(p + "fc2.weight", WeightRole::kDown, i, {H, I}, true);
    add(p + "fc2.bias", WeightRole::kDownBias, i, {H});
  }
  add(m + "final_layer_norm.weight", WeightRole::kFinalNorm, -1, {H});
  add(m + "final_layer_norm.bias", WeightRole::kFinalNormBias, -1, {H});
  add("lm_head.weight", WeightRole::kLmHead, -1, {c.vocab_size, H}, true);
  if (c.tie_word_embeddings) {
    w.specs.back().required = false;
    w.specs.back().tied_to = m + "embed_tokens.weight";
  }
  return w;
}

}  // namespace

const ArchDef kOpt = {"opt", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
