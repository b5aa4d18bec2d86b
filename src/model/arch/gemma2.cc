// Gemma2: Gemma plus post-attention / post-feedforward norms, attention and
// final logit softcapping, query_pre_attn_scalar, and a sliding window on
// even layers (0, 2, ...) with global attention on odd ones.
#include <cmath>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {

// Shared with Gemma 3: attention scale from query_pre_attn_scalar, and the
// names of the four norms around attention and MLP.
Status ParseQueryPreAttnScalar(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(double scalar, r.Float("query_pre_attn_scalar",
                                          static_cast<double>(c->head_dim)));
  if (!(scalar > 0))
    return InvalidArgumentError(r.source() + ": query_pre_attn_scalar = " +
                                std::to_string(scalar) + ", expected > 0");
  c->attn_scale = static_cast<float>(1.0 / std::sqrt(scalar));
  return Status();
}

DecoderNames Gemma2Names() {
  DecoderNames n;
  n.post_attn_norm = "post_attention_layernorm";
  n.mlp_norm = "pre_feedforward_layernorm";
  n.post_mlp_norm = "post_feedforward_layernorm";
  return n;
}

namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseGemmaCommon(r, c));
  c->post_attn_norm = true;
  c->post_mlp_norm = true;
  ASSIGN_OR_RETURN(double softcap, r.Float("attn_logit_softcapping", 0.0));
  c->attn_softcap = static_cast<float>(softcap);
  ASSIGN_OR_RETURN(double final_softcap,
                   r.Float("final_logit_softcapping", 0.0));
  c->final_softcap = static_cast<float>(final_softcap);
  RETURN_IF_ERROR(ParseQueryPreAttnScalar(r, c));
  ASSIGN_OR_RETURN(int64_t window, r.Int("sliding_window", 4096));
  for (int64_t i = 0; i < c->num_layers; i += 2) c->sliding_window[i] = window;
  return Status();
}

ArchWeights Declare(const ModelConfig& c) {
  DecoderNames n = Gemma2Names();
  return DeclareDecoderWeights(c, n);
}

}  // namespace

const ArchDef kGemma2 = {"gemma2", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
