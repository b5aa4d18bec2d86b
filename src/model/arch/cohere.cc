// Cohere (CohereForAI/c4ai-command-r-v01, c4ai-command-r-plus, aya-23): the
// Llama layout with Phi's parallel block sharing one norm
// (x + attn(ln(x)) + mlp(ln(x))), LayerNorms without bias (CohereLayerNorm:
// mean subtracted, gain only, eps layer_norm_eps) for the block and the
// final norm, rotary on adjacent pairs (repeat_interleave'd frequencies:
// RopeConfig::rotate_pairs), with use_qk_norm a LayerNorm without bias over
// each head with its own gain row of q_norm / k_norm [heads, head_dim]
// (QkNormKind::kPerHeadOwn), attention biases per attention_bias, a tied
// head and logits multiplied by logit_scale.
#include <cmath>
#include <string>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/true, c));
  RETURN_IF_ERROR(ParseLayerNorm(r, "layer_norm_eps", c));
  c->norm_bias = false;
  c->block = BlockKind::kParallelSharedNorm;
  c->pre_mlp_norm = false;
  c->rope.rotate_pairs = true;
  ASSIGN_OR_RETURN(c->qkv_bias, r.Bool("attention_bias", false));
  c->o_bias = c->qkv_bias;
  ASSIGN_OR_RETURN(const bool qk_norm, r.Bool("use_qk_norm", false));
  if (qk_norm) {
    c->qk_norm = QkNormKind::kPerHeadOwn;
    c->qk_norm_type = NormKind::kLayer;
  }
  ASSIGN_OR_RETURN(const double scale, r.Float("logit_scale", 0.0625));
  if (!std::isfinite(scale) || !(scale > 0))
    return InvalidArgumentError(r.source() +
                                ": logit_scale = " + std::to_string(scale) +
                                ", expected a finite number > 0");
  // ComputeLogits multiplies by 1 / logits_scaling: logit_scale itself.
  c->logits_scaling = static_cast<float>(1.0 / scale);
  return Status();
}

ArchWeights Declare(const ModelConfig& c) {
  DecoderNames names;
  names.mlp_norm.clear();  // the MLP reads input_layernorm's output
  return DeclareDecoderWeights(c, names);
}

}  // namespace

const ArchDef kCohere = {"cohere", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
