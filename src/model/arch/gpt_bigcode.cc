// GPTBigCode (SantaCoder, StarCoder 1): GPT-2's block (learned positions,
// LayerNorm with bias, gelu_pytorch_tanh MLP c_fc/c_proj with biases, tied
// lm_head) with nn.Linear weights ([out, in], not Conv1D) and multi-query
// attention: one fused c_attn with bias whose rows are [q (all heads) |
// k (one head) | v (one head)], every query head attending with the single
// k/v. The multi_query = false layout (per-head q|k|v) is refused.
#include <string>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseSizes(r, {"n_embd", "n_layer", "n_head"}, c));
  ASSIGN_OR_RETURN(const bool mqa, r.Bool("multi_query", true));
  if (!mqa)
    return UnimplementedError(r.source() +
                              ": multi_query = false (GPTBigCode's per-head "
                              "c_attn layout) is not supported yet");
  c->num_kv_heads = 1;
  ASSIGN_OR_RETURN(c->intermediate_size, r.Int("n_inner", 4 * c->hidden_size));
  ASSIGN_OR_RETURN(c->max_position_embeddings, r.Int("n_positions"));
  RETURN_IF_ERROR(ParseGptNormAndMlp(r, "gelu_pytorch_tanh", c));
  c->fused_qkv = true;
  c->qkv_bias = c->o_bias = c->mlp_bias = true;
  c->tie_word_embeddings = true;
  c->learned_positions = true;
  c->rope.type = RopeConfig::Type::kNone;
  ASSIGN_OR_RETURN(const bool scale, r.Bool("scale_attn_weights", true));
  c->attn_scale = scale ? 0.0f : 1.0f;  // 0: 1/sqrt(head_dim)
  return FinishParse(r, c);
}

ArchWeights Declare(const ModelConfig& c) {
  ArchWeights w;
  SpecList specs(&w);
  const int64_t H = c.hidden_size, I = c.intermediate_size,
                QKV = c.q_dim() + 2 * c.kv_dim();
  specs.Add("transformer.wte.weight", WeightRole::kEmbed, -1,
            {c.vocab_size, H});
  specs.Add("transformer.wpe.weight", WeightRole::kPosEmbed, -1,
            {c.max_position_embeddings, H});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    specs.AddLayerNorm(p + "ln_1", WeightRole::kAttnNorm,
                       WeightRole::kAttnNormBias, i, H);
    specs.Add(p + "attn.c_attn.weight", WeightRole::kQkv, i, {QKV, H}, true);
    specs.Add(p + "attn.c_attn.bias", WeightRole::kQkvBias, i, {QKV});
    specs.Add(p + "attn.c_proj.weight", WeightRole::kO, i, {H, H}, true);
    specs.Add(p + "attn.c_proj.bias", WeightRole::kOBias, i, {H});
    specs.AddLayerNorm(p + "ln_2", WeightRole::kMlpNorm,
                       WeightRole::kMlpNormBias, i, H);
    specs.Add(p + "mlp.c_fc.weight", WeightRole::kUp, i, {I, H}, true);
    specs.Add(p + "mlp.c_fc.bias", WeightRole::kUpBias, i, {I});
    specs.Add(p + "mlp.c_proj.weight", WeightRole::kDown, i, {H, I}, true);
    specs.Add(p + "mlp.c_proj.bias", WeightRole::kDownBias, i, {H});
  }
  specs.AddLayerNorm("transformer.ln_f", WeightRole::kFinalNorm,
                     WeightRole::kFinalNormBias, -1, H);
  specs.AddLmHead(c, "transformer.wte.weight");
  // Causal-mask buffers some checkpoints carry.
  w.ignored_suffixes = {".attn.bias", ".attn.masked_bias"};
  w.optional_prefixes = {"transformer."};
  return w;
}

}  // namespace

const ArchDef kGptBigcode = {"gpt_bigcode", Parse, Declare,
                             /*runnable=*/true};

}  // namespace loom::arch
