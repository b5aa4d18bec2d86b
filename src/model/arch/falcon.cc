// Falcon (tiiuae/falcon-*). With new_decoder_architecture (Falcon-40B/180B,
// 11B): one fused query_key_value in per-kv-group order
// (QkvLayout::kPerKvGroup: the group's q heads, then its k and v) and a
// parallel block with two LayerNorms (x + attn(ln_attn(x)) + mlp(ln_mlp(x)),
// BlockKind::kParallel), or one (num_ln_in_parallel_attn 1: input_layernorm
// feeds both). Without it (Falcon-7B, RW): multi_query's [q heads | k | v]
// with one kv head (QkvLayout::kConcat), or per head [q_h | k_h | v_h]
// (kPerHead), and input_layernorm feeding the parallel attention and MLP
// (kParallelSharedNorm), or, with parallel_attn false, a sequential block
// with post_attention_layernorm. Full half-split rotary, dense, an
// exact-gelu MLP dense_h_to_4h / dense_4h_to_h, biases as `bias` says, ln_f
// and a lm_head tied to word_embeddings by default. ALiBi and rope_scaling
// are refused by name.
#include <string>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

// Which norms a layer has and how its q/k/v are fused (Parse sets them).
Status ParseLayout(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(const bool new_arch,
                   r.Bool("new_decoder_architecture", false));
  ASSIGN_OR_RETURN(const bool parallel, r.Bool("parallel_attn", true));
  ASSIGN_OR_RETURN(const int64_t lns, r.Int("num_ln_in_parallel_attn", 2));
  ASSIGN_OR_RETURN(const bool multi_query, r.Bool("multi_query", true));
  ASSIGN_OR_RETURN(c->num_kv_heads, r.Int("num_kv_heads", c->num_heads));
  c->fused_qkv = true;
  if (new_arch) {
    c->qkv_layout = QkvLayout::kPerKvGroup;
    if (lns != 1 && lns != 2)
      return InvalidArgumentError(r.source() + ": num_ln_in_parallel_attn = " +
                                  std::to_string(lns) + ", expected 1 or 2");
    c->block = lns == 2 ? BlockKind::kParallel : BlockKind::kParallelSharedNorm;
  } else {
    // FalconAttention: one kv head with multi_query, else every head's own.
    c->qkv_layout = multi_query ? QkvLayout::kConcat : QkvLayout::kPerHead;
    if (multi_query) c->num_kv_heads = 1;
    c->block =
        parallel ? BlockKind::kParallelSharedNorm : BlockKind::kSequential;
    if (!multi_query && c->num_kv_heads != c->num_heads)
      return InvalidArgumentError(
          r.source() + ": num_kv_heads = " + std::to_string(c->num_kv_heads) +
          " with multi_query false and the old decoder layout: expected "
          "num_attention_heads = " +
          std::to_string(c->num_heads));
  }
  if (c->block == BlockKind::kParallelSharedNorm) c->pre_mlp_norm = false;
  if (c->num_kv_heads <= 0 || c->num_heads % c->num_kv_heads != 0)
    return InvalidArgumentError(
        r.source() + ": num_attention_heads = " + std::to_string(c->num_heads) +
        " is not a multiple of num_kv_heads = " +
        std::to_string(c->num_kv_heads));
  return Status();
}

Status Parse(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(const bool alibi, r.Bool("alibi", false));
  if (alibi)
    return UnimplementedError(r.source() +
                              ": Falcon with alibi true (ALiBi positions) is "
                              "not supported yet; rotary Falcons are");
  RETURN_IF_ERROR(ParseSizes(
      r, {"hidden_size", "num_hidden_layers", "num_attention_heads"}, c));
  RETURN_IF_ERROR(ParseLayout(r, c));
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
  ASSIGN_OR_RETURN(const bool bias, r.Bool("bias", false));
  c->qkv_bias = c->o_bias = c->mlp_bias = bias;
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
    if (c.block == BlockKind::kParallel) {  // two norms (new layout)
      specs.AddLayerNorm(p + "ln_attn", WeightRole::kAttnNorm,
                         WeightRole::kAttnNormBias, i, H);
      specs.AddLayerNorm(p + "ln_mlp", WeightRole::kMlpNorm,
                         WeightRole::kMlpNormBias, i, H);
    } else {
      specs.AddLayerNorm(p + "input_layernorm", WeightRole::kAttnNorm,
                         WeightRole::kAttnNormBias, i, H);
      if (c.block == BlockKind::kSequential)
        specs.AddLayerNorm(p + "post_attention_layernorm", WeightRole::kMlpNorm,
                           WeightRole::kMlpNormBias, i, H);
    }
    specs.Add(p + "self_attention.query_key_value.weight", WeightRole::kQkv, i,
              {QKV, H}, true);
    specs.Add(p + "self_attention.dense.weight", WeightRole::kO, i, {H, H},
              true);
    if (c.qkv_bias) {
      specs.Add(p + "self_attention.query_key_value.bias", WeightRole::kQkvBias,
                i, {QKV});
      specs.Add(p + "self_attention.dense.bias", WeightRole::kOBias, i, {H});
    }
    specs.AddPlainMlp(p + "mlp.dense_h_to_4h", p + "mlp.dense_4h_to_h", i, H, I,
                      c.mlp_bias);
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
