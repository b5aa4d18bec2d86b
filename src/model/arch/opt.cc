// OPT (facebook/opt-*): a pre-LN decoder (do_layer_norm_before) with
// LayerNorms with bias (self_attn_layer_norm before the attention, the
// layer's final_layer_norm before the MLP), biased q/k/v/out_proj and
// fc1/fc2, ReLU, learned positions read at p + 2 (embed_positions holds
// max_position_embeddings + 2 rows), the model's final_layer_norm and a
// lm_head tied to embed_tokens. The post-LN layout (OPT-350m:
// do_layer_norm_before false, with project_in/project_out) is refused.
#include <string>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

constexpr int64_t kOptPositionOffset = 2;  // OPTLearnedPositionalEmbedding

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseSizes(
      r, {"hidden_size", "num_hidden_layers", "num_attention_heads"}, c));
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
  return FinishParse(r, c);
}

ArchWeights Declare(const ModelConfig& c) {
  ArchWeights w;
  SpecList specs(&w);
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const std::string m = "model.decoder.";
  specs.Add(m + "embed_tokens.weight", WeightRole::kEmbed, -1,
            {c.vocab_size, H});
  specs.Add(m + "embed_positions.weight", WeightRole::kPosEmbed, -1,
            {c.max_position_embeddings + c.position_offset, H});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = m + "layers." + std::to_string(i) + ".";
    specs.AddLayerNorm(p + "self_attn_layer_norm", WeightRole::kAttnNorm,
                       WeightRole::kAttnNormBias, i, H);
    specs.Add(p + "self_attn.q_proj.weight", WeightRole::kQ, i, {H, H}, true);
    specs.Add(p + "self_attn.q_proj.bias", WeightRole::kQBias, i, {H});
    specs.Add(p + "self_attn.k_proj.weight", WeightRole::kK, i, {H, H}, true);
    specs.Add(p + "self_attn.k_proj.bias", WeightRole::kKBias, i, {H});
    specs.Add(p + "self_attn.v_proj.weight", WeightRole::kV, i, {H, H}, true);
    specs.Add(p + "self_attn.v_proj.bias", WeightRole::kVBias, i, {H});
    specs.Add(p + "self_attn.out_proj.weight", WeightRole::kO, i, {H, H}, true);
    specs.Add(p + "self_attn.out_proj.bias", WeightRole::kOBias, i, {H});
    specs.AddLayerNorm(p + "final_layer_norm", WeightRole::kMlpNorm,
                       WeightRole::kMlpNormBias, i, H);
    specs.AddPlainMlp(p + "fc1", p + "fc2", i, H, I, /*bias=*/true);
  }
  specs.AddLayerNorm(m + "final_layer_norm", WeightRole::kFinalNorm,
                     WeightRole::kFinalNormBias, -1, H);
  specs.AddLmHead(c, m + "embed_tokens.weight");
  return w;
}

}  // namespace

const ArchDef kOpt = {"opt", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
