// GLM (THUDM/glm-4-9b-hf, glm-4-9b-chat-hf; model_type "glm"): the Llama
// layout with q/k/v biases (attention_bias, default true; o_proj has
// none), one fused gate_up_proj [2 I, H] (gate rows first:
// MlpKind::kGatedFused) and a partial rotary (partial_rotary_factor, default
// 0.5) on adjacent pairs of the first rotary dims (the frequencies
// repeat_interleave'd: RopeConfig::rotate_pairs).
#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  // GlmConfig's default factor is 0.5 (ParseDecoderBase read Llama's 1).
  RETURN_IF_ERROR(ParsePartialRotary(r, "partial_rotary_factor", 0.5, c));
  c->rope.rotate_pairs = true;
  ASSIGN_OR_RETURN(c->qkv_bias, r.Bool("attention_bias", true));
  c->o_bias = false;
  c->mlp = MlpKind::kGatedFused;
  return Status();
}

ArchWeights Declare(const ModelConfig& c) {
  return DeclareDecoderWeights(c, DecoderNames{});
}

}  // namespace

const ArchDef kGlm = {"glm", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
