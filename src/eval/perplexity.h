// Perplexity of a model over a token stream, window by window, under one of
// the protocols of src/eval/windows.h (specified in docs/eval/perplexity.md).
//
// Memory: the executor captures only ln_final.hook_normalized [T, hidden];
// logits are computed for the scored rows only, logits_chunk_rows at a time,
// fused with the log-softmax (per-row logsumexp + the target's logit), so the
// logits never take more than [chunk, vocab] floats. NLL accumulates in
// double. All buffers are allocated before the first window.
#ifndef LOOM_EVAL_PERPLEXITY_H_
#define LOOM_EVAL_PERPLEXITY_H_

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/eval/windows.h"
#include "src/model/interventions.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"

namespace loom::eval {

struct EvalOptions {
  int64_t logits_chunk_rows = 256;
  // Called after every window with (windows done, windows total).
  std::function<void(int64_t, int64_t)> progress;
  // Asked before every window's forward: true stops the evaluation with
  // Cancelled (the Python module's Ctrl-C).
  std::function<bool()> cancelled;
  // Keep every scored token's log-prob (PerplexityResult::token_logprob).
  bool keep_token_logprobs = false;
  // Round activations to bf16 where HF's bf16 forward does (bf16 models
  // only; see ExecutorOptions::hf_bf16_activations).
  bool hf_bf16_activations = false;
  // Placement (CreateJobBackends): the layers' segments; empty = every layer
  // on a host backend of the executor's own. When the final norm is
  // computed on a device, the head runs on that device too (a second
  // backend instance there, reading the device's copy of lm_head).
  std::vector<ExecutorSegment> segments;
  // Interventions (borrowed, may be null; docs/interventions.md): each
  // window is one sequence, its positions counted from the window's first
  // token; `rows` are window indices.
  const std::vector<Intervention>* interventions = nullptr;
};

struct PerplexityResult {
  Protocol protocol = Protocol::kHfStride;
  int64_t ctx = 0, stride = 0;
  int64_t windows = 0;
  int64_t tokens_scored = 0;
  int64_t tokens_evaluated =
      0;               // tokens run through the model (sum of window lengths)
  double nll_sum = 0;  // - sum of log p over scored tokens
  double nll_mean = 0;
  double perplexity = 0;  // exp(nll_mean)
  double seconds = 0;
  double tokens_per_second = 0;        // tokens_evaluated / seconds
  std::vector<double> window_nll_sum;  // per window
  // With keep_token_logprobs: per scored token in plan order, its absolute
  // position in the stream and log p(ids[position] | context).
  std::vector<int64_t> token_position;
  std::vector<float> token_logprob;
  // Memory planned before the first window: the executor's arena and the
  // evaluation buffers (logits chunk, hidden copies, ...).
  int64_t executor_bytes = 0;
  int64_t eval_bytes = 0;
};

// Errors when the plan's windows exceed the model's max_position_embeddings
// or an id is outside its vocabulary.
Status CheckPlanFitsModel(const Model& model, std::span<const int32_t> ids,
                          const WindowPlan& plan, std::string_view model_name);

// `loom perplexity --json`'s object (also the Python module's result):
// `model_name` as given, the compute dtype, whether a BOS was added and the
// stream's token count, then the result's fields; "interventions"
// (InterventionsJson) when the forwards were edited.
nlohmann::json PerplexityJson(
    const std::string& model_name, DType precision, bool bos, int64_t tokens,
    const PerplexityResult& r,
    const std::vector<Intervention>& interventions = {});

// Refuses options.interventions that would edit nothing in the plan's
// windows (CheckInterventionsApply: rows are windows here).
Status CheckWindowInterventions(const EvalOptions& options,
                                const WindowPlan& plan);

// The edits of window `wi` of `length` tokens under options.interventions
// (none when null) into *edits (cleared first).
void WindowEdits(const EvalOptions& options, size_t wi, int64_t length,
                 std::vector<SequenceEdit>* edits);

StatusOr<PerplexityResult> EvaluatePerplexity(const Model& model,
                                              std::span<const int32_t> ids,
                                              const WindowPlan& plan,
                                              const EvalOptions& options);

}  // namespace loom::eval

#endif  // LOOM_EVAL_PERPLEXITY_H_
