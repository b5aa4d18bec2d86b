// Qwen2 / Qwen2.5: Llama layout with q/k/v biases; the sliding window applies
// only when use_sliding_window is set, to layers >= max_window_layers.
#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {

// Shared with Qwen3 (same sliding-window rule).
Status ParseQwenSlidingWindow(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(bool use, r.Bool("use_sliding_window", false));
  if (!use) return Status();
  ASSIGN_OR_RETURN(int64_t window, r.Int("sliding_window", 0));
  ASSIGN_OR_RETURN(int64_t first, r.Int("max_window_layers", 0));
  for (int64_t i = first; i < c->num_layers; ++i) c->sliding_window[i] = window;
  return Status();
}

namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  c->qkv_bias = true;
  return ParseQwenSlidingWindow(r, c);
}

ArchWeights Declare(const ModelConfig& c) {
  return DeclareDecoderWeights(c, DecoderNames{});
}

}  // namespace

const ArchDef kQwen2 = {"qwen2", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
