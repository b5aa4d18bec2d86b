// GPT-NeoX (Pythia): LayerNorms with bias, one fused query_key_value whose
// output is per head [q_h | k_h | v_h] (QkvLayout::kPerHead), partial rotary
// embeddings on the first rotary_pct of each head, a plain exact-gelu MLP
// with biases, the parallel residual x + attn(ln1(x)) + mlp(ln2(x)) (or the
// sequential one with use_parallel_residual false) and an untied embed_out.
#include <string>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  if (c->hidden_size % c->num_heads != 0)
    return InvalidArgumentError(
        r.source() + ": hidden_size = " + std::to_string(c->hidden_size) +
        " is not a multiple of num_attention_heads = " +
        std::to_string(c->num_heads));
  // Multi-head attention only: the fused rows hold q, k, v of every head.
  c->num_kv_heads = c->num_heads;
  RETURN_IF_ERROR(ParseLayerNorm(r, "layer_norm_eps", c));
  ASSIGN_OR_RETURN(std::string act, r.String("hidden_act", "gelu"));
  ASSIGN_OR_RETURN(c->act, ParseActivation(r, "hidden_act", act));
  c->mlp = MlpKind::kPlain;
  c->mlp_bias = true;
  c->fused_qkv = true;
  c->qkv_layout = QkvLayout::kPerHead;
  ASSIGN_OR_RETURN(bool bias, r.Bool("attention_bias", true));
  c->qkv_bias = c->o_bias = bias;
  ASSIGN_OR_RETURN(bool parallel, r.Bool("use_parallel_residual", true));
  c->block = parallel ? BlockKind::kParallel : BlockKind::kSequential;
  // GPTNeoXConfig sets partial_rotary_factor = rotary_pct and rope_theta =
  // rotary_emb_base after reading the rest: these keys (or their defaults)
  // decide, whatever partial_rotary_factor / rope_theta say.
  ASSIGN_OR_RETURN(c->rope.theta, r.Float("rotary_emb_base", 10000.0));
  RETURN_IF_ERROR(ParsePartialRotary(r, "rotary_pct", 0.25, c));
  return Status();
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
  add("gpt_neox.embed_in.weight", WeightRole::kEmbed, -1, {c.vocab_size, H});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "gpt_neox.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", WeightRole::kAttnNorm, i, {H});
    add(p + "input_layernorm.bias", WeightRole::kAttnNormBias, i, {H});
    add(p + "post_attention_layernorm.weight", WeightRole::kMlpNorm, i, {H});
    add(p + "post_attention_layernorm.bias", WeightRole::kMlpNormBias, i, {H});
    // [3H, H] rows per head: q_h, k_h, v_h (kept as stored; the output is
    // regrouped after the GEMM).
    add(p + "attention.query_key_value.weight", WeightRole::kQkv, i, {QKV, H},
        true);
    if (c.qkv_bias)
      add(p + "attention.query_key_value.bias", WeightRole::kQkvBias, i, {QKV});
    add(p + "attention.dense.weight", WeightRole::kO, i, {H, c.q_dim()}, true);
    if (c.o_bias) add(p + "attention.dense.bias", WeightRole::kOBias, i, {H});
    add(p + "mlp.dense_h_to_4h.weight", WeightRole::kUp, i, {I, H}, true);
    add(p + "mlp.dense_h_to_4h.bias", WeightRole::kUpBias, i, {I});
    add(p + "mlp.dense_4h_to_h.weight", WeightRole::kDown, i, {H, I}, true);
    add(p + "mlp.dense_4h_to_h.bias", WeightRole::kDownBias, i, {H});
  }
  add("gpt_neox.final_layer_norm.weight", WeightRole::kFinalNorm, -1, {H});
  add("gpt_neox.final_layer_norm.bias", WeightRole::kFinalNormBias, -1, {H});
  add("embed_out.weight", WeightRole::kLmHead, -1, {c.vocab_size, H}, true);
  if (c.tie_word_embeddings) {
    w.specs.back().required = false;
    w.specs.back().tied_to = "gpt_neox.embed_in.weight";
  }
  // Buffers older checkpoints carry: the causal mask and the rotary table.
  w.ignored_suffixes = {".attention.bias", ".attention.masked_bias",
                        "rotary_emb.inv_freq"};
  return w;
}

}  // namespace

const ArchDef kGptNeox = {"gpt_neox", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
