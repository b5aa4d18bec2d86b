// OLMo2: no pre-norms; RMSNorm on the attention and MLP outputs
// (post_attention_layernorm, post_feedforward_layernorm) before the residual
// add; RMSNorm q_norm / k_norm over the whole q and k projections.
#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  ASSIGN_OR_RETURN(c->qkv_bias, r.Bool("attention_bias", false));
  c->o_bias = c->qkv_bias;
  c->qk_norm = QkNormKind::kFull;
  c->pre_attn_norm = false;
  c->pre_mlp_norm = false;
  c->post_attn_norm = true;
  c->post_mlp_norm = true;
  return Status();
}

ArchWeights Declare(const ModelConfig& c) {
  DecoderNames n;
  n.attn_norm = "";
  n.mlp_norm = "";
  n.post_attn_norm = "post_attention_layernorm";
  n.post_mlp_norm = "post_feedforward_layernorm";
  return DeclareDecoderWeights(c, n);
}

}  // namespace

const ArchDef kOlmo2 = {"olmo2", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
