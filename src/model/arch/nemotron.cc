// Nemotron (nvidia/Nemotron-4-Minitron, Minitron-*): the Llama layout with
// LayerNorm1P norms (LayerNorm with bias whose gain is 1 + w: NormKind::kLayer
// with norm_offset 1, eps norm_eps), a plain MLP down(relu(up(x))^2)
// (hidden_act relu2, biases per mlp_bias), attention biases per
// attention_bias and partial rotary (partial_rotary_factor, half-split).
#include <string>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  RETURN_IF_ERROR(ParseLayerNorm(r, "norm_eps", c));
  c->norm_offset = 1.0f;
  ASSIGN_OR_RETURN(std::string act, r.String("hidden_act", "relu2"));
  ASSIGN_OR_RETURN(c->act, ParseActivation(r, "hidden_act", act));
  c->mlp = MlpKind::kPlain;
  ASSIGN_OR_RETURN(c->mlp_bias, r.Bool("mlp_bias", false));
  ASSIGN_OR_RETURN(c->qkv_bias, r.Bool("attention_bias", false));
  c->o_bias = c->qkv_bias;
  return Status();
}

ArchWeights Declare(const ModelConfig& c) {
  return DeclareDecoderWeights(c, DecoderNames{});
}

}  // namespace

const ArchDef kNemotron = {"nemotron", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
