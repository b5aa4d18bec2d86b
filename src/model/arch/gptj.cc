// GPT-J: a parallel block with one LayerNorm (x + attn(ln_1(x)) +
// mlp(ln_1(x)), BlockKind::kParallelSharedNorm), q/k/v/out_proj without
// bias, rotary embeddings on the first rotary_dim dims of each head in
// GPT-J's interleaved convention (adjacent pairs rotate in place:
// RopeConfig::rotate_pairs), a gelu_new MLP fc_in/fc_out with biases,
// ln_f, and an untied lm_head with a bias. CodeGen (codegen.cc) is this
// family with a fused qkv_proj.
#include <algorithm>
#include <string>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {

Status ParseGptjBlock(const ConfigReader& r, int64_t rotary_cap,
                      ModelConfig* c) {
  RETURN_IF_ERROR(ParseSizes(r, {"n_embd", "n_layer", "n_head"}, c));
  ASSIGN_OR_RETURN(c->intermediate_size, r.Int("n_inner", 4 * c->hidden_size));
  ASSIGN_OR_RETURN(c->max_position_embeddings, r.Int("n_positions"));
  RETURN_IF_ERROR(ParseGptNormAndMlp(r, "gelu_new", c));
  c->qkv_bias = c->o_bias = false;
  c->mlp_bias = true;
  c->block = BlockKind::kParallelSharedNorm;
  c->pre_mlp_norm = false;  // the MLP reads ln_1's output
  ASSIGN_OR_RETURN(c->tie_word_embeddings,
                   r.Bool("tie_word_embeddings", false));
  // The family's rotary: base 10000 (not configurable), rotary_dim null =
  // the whole head.
  c->rope.type = RopeConfig::Type::kDefault;
  c->rope.theta = 10000.0;
  c->rope.rotate_pairs = true;
  ASSIGN_OR_RETURN(int64_t rotary, r.Int("rotary_dim", c->head_dim));
  if (rotary_cap > 0) rotary = std::min(rotary, rotary_cap);
  if (rotary <= 0 || rotary > c->head_dim || rotary % 2 != 0)
    return InvalidArgumentError(
        r.source() + ": rotary_dim = " + std::to_string(rotary) +
        (rotary_cap > 0 ? " (capped at " + std::to_string(rotary_cap) + ")"
                        : std::string()) +
        ", expected an even value in [2, head_dim = " +
        std::to_string(c->head_dim) + "]");
  c->rope.rotary_dim = rotary;
  return FinishParse(r, c);
}

ArchWeights DeclareGptjWeights(const ModelConfig& c) {
  ArchWeights w;
  SpecList specs(&w);
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  specs.Add("transformer.wte.weight", WeightRole::kEmbed, -1,
            {c.vocab_size, H});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    specs.AddLayerNorm(p + "ln_1", WeightRole::kAttnNorm,
                       WeightRole::kAttnNormBias, i, H);
    if (c.fused_qkv) {
      specs.Add(p + "attn.qkv_proj.weight", WeightRole::kQkv, i, {3 * H, H},
                true);
    } else {
      specs.Add(p + "attn.q_proj.weight", WeightRole::kQ, i, {H, H}, true);
      specs.Add(p + "attn.k_proj.weight", WeightRole::kK, i, {H, H}, true);
      specs.Add(p + "attn.v_proj.weight", WeightRole::kV, i, {H, H}, true);
    }
    specs.Add(p + "attn.out_proj.weight", WeightRole::kO, i, {H, H}, true);
    specs.Add(p + "mlp.fc_in.weight", WeightRole::kUp, i, {I, H}, true);
    specs.Add(p + "mlp.fc_in.bias", WeightRole::kUpBias, i, {I});
    specs.Add(p + "mlp.fc_out.weight", WeightRole::kDown, i, {H, I}, true);
    specs.Add(p + "mlp.fc_out.bias", WeightRole::kDownBias, i, {H});
  }
  specs.AddLayerNorm("transformer.ln_f", WeightRole::kFinalNorm,
                     WeightRole::kFinalNormBias, -1, H);
  specs.AddLmHead(c, "transformer.wte.weight");
  specs.Add("lm_head.bias", WeightRole::kLmHeadBias, -1, {c.vocab_size});
  // Causal-mask buffers the checkpoints carry.
  w.ignored_suffixes = {".attn.bias", ".attn.masked_bias", ".attn.causal_mask"};
  w.optional_prefixes = {"transformer."};
  return w;
}

namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  return ParseGptjBlock(r, /*rotary_cap=*/0, c);
}

}  // namespace

const ArchDef kGptj = {"gptj", Parse, DeclareGptjWeights, /*runnable=*/true};

}  // namespace loom::arch
