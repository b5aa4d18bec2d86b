// BLOOM (bigscience/bloom-560m ... bloom, bloomz-*): no rotary but ALiBi
// (ModelConfig::alibi: head h's scores get slope_h * key position, the
// slopes of build_alibi_tensor, head counts that are not a power of two
// included), a LayerNorm of the embeddings (word_embeddings_layernorm:
// ModelConfig::embed_norm), LayerNorms with bias, one fused
// query_key_value with bias in per-head order [q_h | k_h | v_h]
// (QkvLayout::kPerHead), dense with bias, a gelu (tanh) MLP of 4 hidden with
// biases, ln_f and a head tied to word_embeddings. Tensor names with and
// without "transformer.".
#include <string>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

// BLOOM was trained on 2048 tokens; ALiBi sets no hard limit, the config
// names none, and the plan needs one.
constexpr int64_t kBloomPositions = 2048;

Status Parse(const ConfigReader& r, ModelConfig* c) {
  const char* hidden = r.Has("hidden_size") ? "hidden_size" : "n_embed";
  RETURN_IF_ERROR(ParseSizes(r, {hidden, "n_layer", "n_head"}, c));
  ASSIGN_OR_RETURN(const bool post_ln_residual,
                   r.Bool("apply_residual_connection_post_layernorm", false));
  ASSIGN_OR_RETURN(const int64_t tp, r.Int("pretraining_tp", 1));
  ASSIGN_OR_RETURN(const bool slow_but_exact, r.Bool("slow_but_exact", false));
  if (post_ln_residual || (tp > 1 && slow_but_exact))
    return UnimplementedError(
        r.source() +
        ": apply_residual_connection_post_layernorm true, or pretraining_tp "
        "> 1 with slow_but_exact true, is not supported");
  c->intermediate_size = 4 * c->hidden_size;
  ASSIGN_OR_RETURN(c->max_position_embeddings,
                   r.Int("seq_length", kBloomPositions));
  RETURN_IF_ERROR(ParseLayerNorm(r, "layer_norm_epsilon", c));
  c->act = ActKind::kGeluTanh;  // bloom_gelu_forward
  c->mlp = MlpKind::kPlain;
  c->mlp_bias = c->qkv_bias = c->o_bias = true;
  c->fused_qkv = true;
  c->qkv_layout = QkvLayout::kPerHead;
  c->rope.type = RopeConfig::Type::kNone;
  c->alibi = true;
  c->embed_norm = true;
  ASSIGN_OR_RETURN(c->tie_word_embeddings, r.Bool("tie_word_embeddings", true));
  return FinishParse(r, c);
}

ArchWeights Declare(const ModelConfig& c) {
  ArchWeights w;
  SpecList specs(&w);
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const std::string m = "transformer.";
  specs.Add(m + "word_embeddings.weight", WeightRole::kEmbed, -1,
            {c.vocab_size, H});
  specs.AddLayerNorm(m + "word_embeddings_layernorm", WeightRole::kEmbedNorm,
                     WeightRole::kEmbedNormBias, -1, H);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = m + "h." + std::to_string(i) + ".";
    specs.AddLayerNorm(p + "input_layernorm", WeightRole::kAttnNorm,
                       WeightRole::kAttnNormBias, i, H);
    // [3H, H] rows per head: q_h, k_h, v_h (regrouped after the GEMM).
    specs.Add(p + "self_attention.query_key_value.weight", WeightRole::kQkv, i,
              {3 * H, H}, true);
    specs.Add(p + "self_attention.query_key_value.bias", WeightRole::kQkvBias,
              i, {3 * H});
    specs.Add(p + "self_attention.dense.weight", WeightRole::kO, i, {H, H},
              true);
    specs.Add(p + "self_attention.dense.bias", WeightRole::kOBias, i, {H});
    specs.AddLayerNorm(p + "post_attention_layernorm", WeightRole::kMlpNorm,
                       WeightRole::kMlpNormBias, i, H);
    specs.AddPlainMlp(p + "mlp.dense_h_to_4h", p + "mlp.dense_4h_to_h", i, H, I,
                      /*bias=*/true);
  }
  specs.AddLayerNorm(m + "ln_f", WeightRole::kFinalNorm,
                     WeightRole::kFinalNormBias, -1, H);
  specs.AddLmHead(c, m + "word_embeddings.weight");
  w.optional_prefixes = {"transformer."};
  return w;
}

}  // namespace

const ArchDef kBloom = {"bloom", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
