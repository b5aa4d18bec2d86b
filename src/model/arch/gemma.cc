// Gemma: RMSNorm with (1 + w), embeddings scaled by sqrt(hidden_size),
// GELU(tanh)-gated MLP, tied embeddings.
#include <cmath>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {

// Shared with Gemma2: activation from hidden_activation (else hidden_act),
// (1 + w) norms, sqrt(H) embedding scale.
Status ParseGemmaCommon(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/true, c));
  ASSIGN_OR_RETURN(std::string act,
                   r.String("hidden_act", "gelu_pytorch_tanh"));
  std::string key = "hidden_act";
  if (r.Has("hidden_activation")) {
    ASSIGN_OR_RETURN(act, r.String("hidden_activation"));
    key = "hidden_activation";
  }
  ASSIGN_OR_RETURN(c->act, ParseActivation(r, key, act));
  ASSIGN_OR_RETURN(c->qkv_bias, r.Bool("attention_bias", false));
  c->o_bias = c->qkv_bias;
  c->norm_offset = 1.0f;
  c->embedding_scale = std::sqrt(static_cast<float>(c->hidden_size));
  return Status();
}

namespace {

ArchWeights Declare(const ModelConfig& c) {
  return DeclareDecoderWeights(c, DecoderNames{});
}

}  // namespace

const ArchDef kGemma = {"gemma", ParseGemmaCommon, Declare, /*runnable=*/true};

}  // namespace loom::arch
