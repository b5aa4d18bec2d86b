// OLMo (1): parameter-free LayerNorm (eps 1e-5), optional clip_qkv, RoPE,
// SiLU-gated MLP.
#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  c->norm = NormKind::kLayerNoAffine;
  c->norm_eps = 1e-5f;  // OlmoLayerNorm's fixed epsilon
  ASSIGN_OR_RETURN(c->qkv_bias, r.Bool("attention_bias", false));
  c->o_bias = c->qkv_bias;
  ASSIGN_OR_RETURN(double clip, r.Float("clip_qkv", 0.0));
  if (clip < 0)
    return InvalidArgumentError(r.source() +
                                ": clip_qkv = " + std::to_string(clip) +
                                ", expected > 0 or null");
  c->clip_qkv = static_cast<float>(clip);
  return Status();
}

ArchWeights Declare(const ModelConfig& c) {
  DecoderNames n;
  n.attn_norm = "";  // norms have no parameters
  n.mlp_norm = "";
  return DeclareDecoderWeights(c, n);
}

}  // namespace

const ArchDef kOlmo = {"olmo", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
