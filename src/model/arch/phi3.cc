// Phi-3: Llama-like with fused qkv_proj [q; k; v] and gate_up_proj
// [gate; up]; partial rotary factor; optional sliding window.
#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  c->fused_qkv = true;
  c->mlp = MlpKind::kGatedFused;
  return ParseUniformSlidingWindow(r, c);
}

ArchWeights Declare(const ModelConfig& c) {
  return DeclareDecoderWeights(c, DecoderNames{});
}

}  // namespace

const ArchDef kPhi3 = {"phi3", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
