// Persimmon (adept/persimmon-8b-*; Fuyu's language model): LayerNorms with
// bias, one fused query_key_value with bias whose output is per head
// [q_h | k_h | v_h] (QkvLayout::kPerHead), one LayerNorm with weight and
// bias over head_dim shared by every head on q and on k before RoPE
// (qk_layernorm), partial rotary (partial_rotary_factor, half-split; rope
// theta 25000 by default), a dense output projection with bias and a plain
// MLP dense_4h_to_h(relu(dense_h_to_4h(x))^2) with biases.
#include <string>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  if (c->num_kv_heads != c->num_heads ||
      c->head_dim * c->num_heads != c->hidden_size)
    return InvalidArgumentError(
        r.source() +
        ": Persimmon's fused query_key_value holds q, k and v of "
        "every head: num_key_value_heads = " +
        std::to_string(c->num_kv_heads) +
        " and head_dim = " + std::to_string(c->head_dim) +
        " must be num_attention_heads = " + std::to_string(c->num_heads) +
        " and hidden_size / heads");
  // PersimmonConfig's own defaults (ParseDecoderBase read Llama's).
  ASSIGN_OR_RETURN(c->rope.theta, r.Float("rope_theta", 25000.0));
  RETURN_IF_ERROR(ParsePartialRotary(r, "partial_rotary_factor", 0.5, c));
  RETURN_IF_ERROR(ParseLayerNorm(r, "layer_norm_eps", c));
  ASSIGN_OR_RETURN(std::string act, r.String("hidden_act", "relu2"));
  ASSIGN_OR_RETURN(c->act, ParseActivation(r, "hidden_act", act));
  c->mlp = MlpKind::kPlain;
  c->mlp_bias = true;
  c->fused_qkv = true;
  c->qkv_layout = QkvLayout::kPerHead;
  c->qkv_bias = c->o_bias = true;
  ASSIGN_OR_RETURN(const bool qk_layernorm, r.Bool("qk_layernorm", true));
  if (qk_layernorm) {
    c->qk_norm = QkNormKind::kPerHead;
    c->qk_norm_type = NormKind::kLayer;
    c->qk_norm_bias = true;
  }
  return Status();
}

ArchWeights Declare(const ModelConfig& c) {
  ArchWeights w;
  SpecList specs(&w);
  const int64_t H = c.hidden_size, I = c.intermediate_size,
                QKV = c.q_dim() + 2 * c.kv_dim();
  specs.Add("model.embed_tokens.weight", WeightRole::kEmbed, -1,
            {c.vocab_size, H});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const std::string a = p + "self_attn.";
    specs.AddLayerNorm(p + "input_layernorm", WeightRole::kAttnNorm,
                       WeightRole::kAttnNormBias, i, H);
    // [3H, H] rows per head: q_h, k_h, v_h (regrouped after the GEMM).
    specs.Add(a + "query_key_value.weight", WeightRole::kQkv, i, {QKV, H},
              true);
    specs.Add(a + "query_key_value.bias", WeightRole::kQkvBias, i, {QKV});
    if (c.qk_norm == QkNormKind::kPerHead) {
      specs.AddLayerNorm(a + "q_layernorm", WeightRole::kQNorm,
                         WeightRole::kQNormBias, i, c.head_dim);
      specs.AddLayerNorm(a + "k_layernorm", WeightRole::kKNorm,
                         WeightRole::kKNormBias, i, c.head_dim);
    }
    specs.Add(a + "dense.weight", WeightRole::kO, i, {H, c.q_dim()}, true);
    specs.Add(a + "dense.bias", WeightRole::kOBias, i, {H});
    specs.AddLayerNorm(p + "post_attention_layernorm", WeightRole::kMlpNorm,
                       WeightRole::kMlpNormBias, i, H);
    specs.AddPlainMlp(p + "mlp.dense_h_to_4h", p + "mlp.dense_4h_to_h", i, H, I,
                      /*bias=*/true);
  }
  specs.AddLayerNorm("model.final_layernorm", WeightRole::kFinalNorm,
                     WeightRole::kFinalNormBias, -1, H);
  specs.AddLmHead(c, "model.embed_tokens.weight");
  w.ignored_suffixes = {"rotary_emb.inv_freq"};
  return w;
}

}  // namespace

const ArchDef kPersimmon = {"persimmon", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
