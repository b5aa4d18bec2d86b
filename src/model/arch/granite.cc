// Granite: the Llama layout with four multipliers: the token embeddings are
// scaled by embedding_multiplier, every residual add is
// x + residual_multiplier * sublayer(x), q.k is scaled by
// attention_multiplier (instead of 1/sqrt(head_dim)), and the logits are
// divided by logits_scaling.
#include <cmath>
#include <string>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

// config.json's `key` (default 1) as a finite float, > 0 when `positive`.
StatusOr<float> Multiplier(const ConfigReader& r, const std::string& key,
                           bool positive) {
  ASSIGN_OR_RETURN(double v, r.Float(key, 1.0));
  if (!std::isfinite(v) || (positive && !(v > 0)))
    return InvalidArgumentError(r.source() + ": " + key + " = " +
                                std::to_string(v) + ", expected a finite " +
                                (positive ? "number > 0" : "number"));
  return static_cast<float>(v);
}

}  // namespace

Status ParseGraniteMultipliers(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->qkv_bias, r.Bool("attention_bias", false));
  c->o_bias = c->qkv_bias;
  ASSIGN_OR_RETURN(c->embedding_scale,
                   Multiplier(r, "embedding_multiplier", false));
  ASSIGN_OR_RETURN(c->residual_multiplier,
                   Multiplier(r, "residual_multiplier", false));
  ASSIGN_OR_RETURN(c->attn_scale, Multiplier(r, "attention_multiplier", true));
  ASSIGN_OR_RETURN(c->logits_scaling, Multiplier(r, "logits_scaling", true));
  return Status();
}

namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  RETURN_IF_ERROR(ParseGraniteMultipliers(r, c));
  ASSIGN_OR_RETURN(c->mlp_bias, r.Bool("mlp_bias", false));
  return Status();
}

ArchWeights Declare(const ModelConfig& c) {
  return DeclareDecoderWeights(c, DecoderNames{});
}

}  // namespace

const ArchDef kGranite = {"granite", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
