// Llama (1/2/3, incl. rope_scaling linear/dynamic/llama3): RMSNorm, RoPE,
// GQA, SiLU-gated MLP; optional attention/MLP biases.
#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  ASSIGN_OR_RETURN(c->qkv_bias, r.Bool("attention_bias", false));
  c->o_bias = c->qkv_bias;
  ASSIGN_OR_RETURN(c->mlp_bias, r.Bool("mlp_bias", false));
  return Status();
}

ArchWeights Declare(const ModelConfig& c) {
  return DeclareDecoderWeights(c, DecoderNames{});
}

}  // namespace

const ArchDef kLlama = {"llama", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
