// Model.generate of the Python module: `loom generate`'s continuation of one
// prompt on the model the module has already loaded (no second load).
//
// Without hooks the forwards are those of `loom generate` (eval::Generator's
// Generate for one prompt: a contiguous KV cache, prefill chunks of
// `prefill_chunk` tokens, then one token per forward). With hooks they are
// those of `loom generate --hooks` (the serving engine with one slot: a KV
// cache of 16-position pages, forwards of up to prefill_chunk + 1 tokens),
// and every hook is captured at every position fed (the prompt, then each
// generated token but the last), then reduced by the row selectors as
// `loom generate --hooks --select` reduces them. Either way the token ids,
// the text and the activations are the CLI's. The loop here replaces
// Generator::Generate / the engine's scheduler only to poll `cancelled`
// (Ctrl-C) before every forward.
#ifndef LOOM_PYTHON_GENERATE_H_
#define LOOM_PYTHON_GENERATE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "src/backend/backend.h"
#include "src/base/status.h"
#include "src/eval/generate.h"
#include "src/eval/row_selector.h"
#include "src/model/hooks.h"
#include "src/model/interventions.h"
#include "src/runtime/model.h"
#include "src/tokenizer/tokenizer.h"

namespace loom::python {

struct GenerateRequest {
  std::vector<int32_t> prompt;  // token ids (not empty)
  int64_t max_new_tokens = 32;
  eval::SamplingOptions sampling;
  std::vector<int32_t> stop_ids;
  std::vector<std::string> stop_strings;
  int64_t context = 0;  // KV positions; 0 = min(2048, max positions)
  int64_t prefill_chunk = 256;
  // Captured at every position fed; empty: `loom generate`'s path.
  std::vector<HookPoint> hooks;
  std::vector<RowSelector> selectors;  // applied to each hook's rows
  // Interventions (borrowed, may be null), as `loom generate --intervene`
  // applies them: the prompt is input row 0; those that edit the prompt at
  // its positions in the prefill, those that edit generated tokens every
  // token fed back (apply_to). With hooks, the captured values are the
  // edited ones.
  const std::vector<Intervention>* interventions = nullptr;
  // Polled before every forward; true stops with Cancelled.
  std::function<bool()> cancelled;
};

// The rows `selector` keeps of one hook: [rows, cols] f32.
struct SelectedRows {
  HookPoint hook;
  RowSelector selector;
  std::vector<float> data;
  int64_t rows = 0, cols = 0;
};

struct GenerateResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> token_ids;  // generated ids only
  std::string text;                // decoded token_ids
  // "stop_id", "stop_string", "max_tokens", "context" or "prompt"
  // (max_new_tokens = 0: nothing was asked for), as `loom generate` says.
  std::string stop_reason;
  int64_t activation_rows = 0;            // positions captured (with hooks)
  std::vector<SelectedRows> activations;  // hook-major, selectors in order
};

// Generates the continuation of `r.prompt` with `model` on `segments` (a
// Session's placement; empty: a CPU backend of its own). `tokenizer` (may be
// null) decodes the text and enables stop strings. Errors: bad sampling
// options, a prompt longer than the context, a hook that is not rows of floats
// per token (attention patterns, expert ids, logits: as `loom generate --hooks`
// refuses them), a selector outside the captured rows, an intervention position
// outside the prompt, Cancelled. The generator GenerateOne runs for `r` on
// `segments` (the options before Generator::Resolve): the Python module plans
// its job from them.
eval::Generator::Options GeneratorOptionsOf(
    const ModelConfig& config, const GenerateRequest& r,
    const std::vector<ExecutorSegment>& segments);

StatusOr<GenerateResult> GenerateOne(
    const Model& model, const tok::Tokenizer* tokenizer,
    const std::vector<ExecutorSegment>& segments, const GenerateRequest& r);

}  // namespace loom::python

#endif  // LOOM_PYTHON_GENERATE_H_
