// What a run will do, as far as memory is concerned: the job half of the
// planner's input (the model and the devices are the other halves).
#ifndef LOOM_PLAN_JOB_H_
#define LOOM_PLAN_JOB_H_

#include <cstdint>
#include <optional>
#include <string_view>

#include "src/base/status.h"
#include "src/core/dtype.h"
#include "src/model/config.h"
#include "src/model/hooks.h"

namespace loom {

// analysis: one forward per batch (extract, perplexity, compare); no KV cache
//   unless `kv_context` is set (extract's streamed long rows).
// generation: a KV cache for `context` tokens per sequence.
enum class JobMode { kAnalysis, kGeneration };

// Which rows of a captured activation are kept per sequence.
enum class Selector {
  kAll,   // every token: [T, width]
  kLast,  // the last token of each sequence: [S, width]
  kMean,  // the mean over each sequence's tokens: [S, width]
};

// Where captured activations are staged before they are written.
enum class CaptureTarget {
  kHost,    // host memory (pinned for a GPU): the host device's staging arena
  kDevice,  // the device that computes the hook
};

struct JobSpec {
  JobMode mode = JobMode::kAnalysis;
  int64_t batch_tokens = 2048;  // T: tokens per forward (packed sequences)
  int64_t context = 2048;       // longest sequence; generation: KV length
  // Sequences per batch (rows of last/mean selections, pattern captures);
  // 0 = ceil(batch_tokens / context), i.e. full-length sequences packed.
  int64_t seqs_per_batch = 0;
  // generation: sequences holding a KV cache; 0 = seqs_per_batch.
  // analysis with kv_context: 0 = one sequence.
  int64_t kv_seqs = 0;
  // generation: default config.json's torch_dtype; analysis: the backend's
  // activation dtype (KernelCosts::activation_dtype), as KvCache allocates.
  std::optional<DType> kv_dtype;
  // analysis: a KV cache of `kv_seqs` sequences of `kv_context` positions of
  // the layers run, through which rows longer than a batch are prefilled
  // chunk by chunk (`loom extract --streaming-chunk-size`, sized by
  // --max-row-tokens); 0 = none. Must be 0 for generation (`context` sizes
  // its cache).
  int64_t kv_context = 0;
  // generation, paged KV (src/plan/kv_layout.h KvPaging): global layers hold
  // kv_pages pages of kv_page_size positions shared by the sequences;
  // 0 = contiguous (context positions per sequence).
  int64_t kv_page_size = 0;
  int64_t kv_pages = 0;

  HookSet hooks;
  // Hooks the executor delivers to a consumer that copies them into memory
  // counted elsewhere (the backward's saved residuals, backward_bytes): in
  // the arenas' liveness like `hooks`, but no capture staging.
  HookSet tapped_hooks;
  DType capture_dtype = DType::kF32;
  Selector selector = Selector::kAll;
  CaptureTarget capture_to = CaptureTarget::kHost;
  // Staging buffers per captured hook (2 = double-buffered: the writer drains
  // one batch while the next forward fills the other).
  int64_t capture_buffers = 1;
  // Asynchronous capture (device -> host copies overlapping compute): a hooked
  // tensor is kept alive until the end of its layer, when the copy is waited
  // for. Synchronous capture (the CPU backend) copies at the hook.
  bool async_capture = false;

  // Compute the logits (perplexity / compare) even when no hook asks for them;
  // they are produced `logits_chunk_rows` rows at a time.
  bool logits = false;
  int64_t logits_chunk_rows = 256;

  // Weights whose float storage dtype differs from this are converted once
  // into an owned arena (the CPU runtime); nullopt = used as stored.
  std::optional<DType> weight_compute_dtype;

  // Interventions (docs/interventions.md): the bytes of their vectors, held
  // in host memory for the job (InterventionBytes); counted in the host's
  // staging.
  int64_t intervention_bytes = 0;

  // SAEs and lenses run on captured hooks (src/eval/extract_derived.h):
  // their f32 weights, a chunk of their outputs and the derived arrays'
  // buffers, in host memory; counted in the host's staging.
  int64_t analysis_bytes = 0;

  // Gradients (src/runtime/backward.h): the backward's own buffers (the
  // residual stream at every layer boundary, a layer's saved internals,
  // the VJPs' gradients and workspaces), in host memory beside the
  // forward's arenas; counted in the host's staging.
  int64_t backward_bytes = 0;

  // Derived: rows per batch of a per-sequence selection.
  int64_t Seqs() const {
    if (seqs_per_batch > 0) return seqs_per_batch;
    return (batch_tokens + MaxSeqLen() - 1) / MaxSeqLen();
  }
  // Longest sequence in a forward: min(context, batch_tokens).
  int64_t MaxSeqLen() const {
    return context < batch_tokens ? context : batch_tokens;
  }
  // A KV cache is held (generation, or analysis with kv_context).
  bool HasKv() const { return mode == JobMode::kGeneration || kv_context > 0; }
  // Positions per sequence of the KV cache (0 = none).
  int64_t KvContext() const {
    return mode == JobMode::kGeneration ? context : kv_context;
  }
  bool NeedsLogits() const {
    return logits || mode == JobMode::kGeneration || hooks.NeedsLogits();
  }
  bool NeedsFinalNorm() const {
    return NeedsLogits() || hooks.NeedsFinalNorm();
  }
  // Layers [0, LayersRun()) are computed.
  int64_t LayersRun(int64_t num_layers) const {
    if (NeedsFinalNorm()) return num_layers;
    return hooks.LastLayerNeeded(num_layers) + 1;
  }
};

std::string_view JobModeName(JobMode m);
std::string_view SelectorName(Selector s);
StatusOr<JobMode> ParseJobMode(std::string_view s);
StatusOr<Selector> ParseSelector(std::string_view s);
StatusOr<CaptureTarget> ParseCaptureTarget(std::string_view s);

// Bytes of one batch's capture of `hook`: rows per batch under `job`'s
// selector x HookWidth (src/model/hooks.h) x the capture dtype; the pattern
// is [heads, L, L] per sequence (one query row per head when a per-sequence
// selector keeps one row). Errors: the hook does not exist in the model
// (CheckHookExists: e.g. mlp.hook_pre/post in MoE layers).
StatusOr<int64_t> CaptureBytes(const ModelConfig& c, const JobSpec& job,
                               const HookPoint& hook);

// Checks the job against the model: positive sizes, hooks that exist.
Status ValidateJob(const ModelConfig& c, const JobSpec& job);

}  // namespace loom

#endif  // LOOM_PLAN_JOB_H_
