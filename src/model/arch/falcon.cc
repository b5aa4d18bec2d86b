// Falcon with new_decoder_architecture (Falcon-40B/180B, and the 7B-style
// configs that set it): a parallel block with two LayerNorms (x +
// attn(ln_attn(x)) + mlp(ln_mlp(x)), BlockKind::kParallel), one fused
// query_key_value in per-kv-group order (QkvLayout::kPerKvGroup: the
// group's q heads, then its k and v), full half-split rotary, dense,
// an exact-gelu MLP dense_h_to_4h / dense_4h_to_h, biases as `bias` says,
// ln_f and a lm_head tied to word_embeddings by default. The older layout
// (new_decoder_architecture false: Falcon-7B's one LayerNorm and
// multi-query concat) and ALiBi are refused by name.
#include <string>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(const bool new_arch,
                   r.Bool("new_decoder_architecture", false));
  ASSIGN_OR_RETURN(const bool alibi, r.Bool("alibi", false));
  ASSIGN_OR_RETURN(const bool parallel, r.Bool("parallel_attn", true));
  ASSIGN_OR_RETURN(const int64_t lns, r.Int("num_ln_in_parallel_attn", 2));
  if (!new_arch || alibi || !parallel || lns != 2)
    return UnimplementedError(
        r.source() +
        ": only Falcon's new_decoder_architecture with two LayerNorms and "
        "rotary positions is supported (new_decoder_architecture false, "
        "alibi true, parallel_attn false or num_ln_in_parallel_attn 1 are "
        "not yet)");
  RETURN_IF_ERROR(ParseSizes(
      r, {"hidden_size", "num_hidden_layers", "num_attention_heads"}, c));
  ASSIGN_OR_RETURN(c->num_kv_heads, r.Int("num_kv_heads", c->num_heads));
  if (c->num_kv_heads <= 0 || c->num_heads % c->num_kv_heads != 0)
    return InvalidArgumentError(
        r.source() + ": num_attention_heads = " + std::to_string(c->num_heads) +
        " is not a multiple of num_kv_heads = " +
        std::to_string(c->num_kv_heads));
  ASSIGN_OR_RETURN(c->intermediate_size,
                   r.Int("ffn_hidden_size", 4 * c->hidden_size));
  ASSIGN_OR_RETURN(c->max_position_embeddings,
                   r.Int("max_position_embeddings", 2048));
  ASSIGN_OR_RETURN(double eps, r.Float("layer_norm_epsilon", 1e-5));
  c->norm_eps = static_cast<float>(eps);
  c->norm = NormKind::kLayer;
  ASSIGN_OR_RETURN(std::string act, r.String("activation", "gelu"));
  ASSIGN_OR_RETURN(c->act, ParseActivation(r, "activation", act));
  c->mlp = MlpKind::kPlain;
  c->fused_qkv = true;
  c->qkv_layout = QkvLayout::kPerKvGroup;
  ASSIGN_OR_RETURN(const bool bias, r.Bool("bias", false));
  c->qkv_bias = c->o_bias = c->mlp_bias = bias;
  c->block = BlockKind::kParallel;
  ASSIGN_OR_RETURN(c->tie_word_embeddings, r.Bool("tie_word_embeddings", true));
  if (r.Has("rope_scaling"))
    return UnimplementedError(r.source() +
                              ": Falcon's rope_scaling is not supported yet");
  c->rope.type = RopeConfig::Type::kDefault;
  ASSIGN_OR_RETURN(c->rope.theta, r.Float("rope_theta", 10000.0));
  c->rope.rotary_dim = c->head_dim;
  return FinishParse(r, c);
}

ArchWeights Declare(const ModelConfig& c) {
  ArchWeights w;
  SpecList specs(&w);
  const int64_t H = c.hidden_size, I = c.intermediate_size,
                QKV = c.q_dim() + 2 * c.kv_dim();
  specs.Add("transformer.word_embeddings.weight", WeightRole::kEmbed, -1,
            {c.vocab_size, H});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    specs.AddLayerNorm(p + "ln_attn", WeightRole::kAttnNorm,
                       WeightRole::kAttnNormBias, i, H);
    specs.AddLayerNorm(p + "ln_mlp", WeightRole::kMlpNorm,
                       WeightRole::kMlpNormBias, i, H);
    specs.Add(p + "self_attention.query_key_value.weight", WeightRole::kQkv, i,
              {QKV, H}, true);
    specs.Add(p + "self_attention.dense.weight", WeightRole::kO, i, {H, H},
              true);
    specs.Add(p + "mlp.dense_h_to_4h.weight", WeightRole::kUp, i, {I, H}, true);
    specs.Add(p + "mlp.dense_4h_to_h.weight", WeightRole::kDown, i, {H, I},
              true);
    if (c.qkv_bias) {
      specs.Add(p + "self_attention.query_key_value.bias", WeightRole::kQkvBias,
                i, {QKV});
      specs.Add(p + "self_attention.dense.bias", WeightRole::kOBias, i, {H});
      specs.Add(p + "mlp.dense_h_to_4h.bias", WeightRole::kUpBias, i, {I});
      specs.Add(p + "mlp.dense_4h_to_h.bias", WeightRole::kDownBias, i, {H});
    }
  }
  specs.AddLayerNorm("transformer.ln_f", WeightRole::kFinalNorm,
                     WeightRole::kFinalNormBias, -1, H);
  specs.AddLmHead(c, "transformer.word_embeddings.weight");
  w.optional_prefixes = {"transformer."};
  return w;
}

}  // namespace

const ArchDef kFalcon = {"falcon", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
