// Mistral: Llama layout with a sliding attention window on every layer.
#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  return ParseUniformSlidingWindow(r, c);
}

ArchWeights Declare(const ModelConfig& c) {
  return DeclareDecoderWeights(c, DecoderNames{});
}

}  // namespace

const ArchDef kMistral = {"mistral", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
