// Qwen3: Llama layout with per-head RMSNorm on q and k (before RoPE);
// attention_bias optional.
#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {

Status ParseQwen3Attention(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->qkv_bias, r.Bool("attention_bias", false));
  c->o_bias = c->qkv_bias;
  c->qk_norm = QkNormKind::kPerHead;
  return ParseQwenSlidingWindow(r, c);
}

namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  return ParseQwen3Attention(r, c);
}

ArchWeights Declare(const ModelConfig& c) {
  return DeclareDecoderWeights(c, DecoderNames{});
}

}  // namespace

const ArchDef kQwen3 = {"qwen3", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
