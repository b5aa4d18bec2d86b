// Starcoder2: LayerNorms with bias (eps norm_epsilon), q/k/v/o with biases
// (use_bias), a plain MLP c_proj(gelu_tanh(c_fc(x))) with biases, RoPE, a
// sliding window on every layer and a tied lm_head without bias.
#include <string>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/true, c));
  c->norm = NormKind::kLayer;
  ASSIGN_OR_RETURN(double eps, r.Float("norm_epsilon", 1e-5));
  if (!(eps > 0))
    return InvalidArgumentError(r.source() + ": norm_epsilon = " +
                                std::to_string(eps) + ", expected > 0");
  c->norm_eps = static_cast<float>(eps);
  c->mlp = MlpKind::kPlain;
  // Starcoder2Config's default activation (ParseDecoderBase's is silu).
  ASSIGN_OR_RETURN(std::string act,
                   r.String("hidden_act", "gelu_pytorch_tanh"));
  ASSIGN_OR_RETURN(c->act, ParseActivation(r, "hidden_act", act));
  ASSIGN_OR_RETURN(bool bias, r.Bool("use_bias", true));
  c->qkv_bias = c->o_bias = c->mlp_bias = bias;
  return ParseUniformSlidingWindow(r, c);
}

ArchWeights Declare(const ModelConfig& c) {
  DecoderNames n;
  n.up = "c_fc";
  n.down = "c_proj";
  return DeclareDecoderWeights(c, n);
}

}  // namespace

const ArchDef kStarcoder2 = {"starcoder2", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
