// The extraction job behind `loom extract`: prompts in, selected activations
// out, as append-only .npy (or safetensors shards) with exact resume.
//
// Parts: extract_settings (options -> resolved settings), extract_manifest
// (the commit record, checked on --resume), extract_rows (reading and
// preparing input rows), extract_batches (token-budget packing),
// extract_outputs (the hook sink, staging, the array files and the commit).
//
// Flow per window of `commit_every` input rows: read and tokenize the rows,
// validate them (bad rows fail the job or are recorded as skipped), sort by
// length and pack into batches of at most `batch_tokens` tokens, run the
// forward with the requested hooks (with --streaming-chunk-size, each row
// longer than a batch then runs alone, chunk by chunk through a KV cache of
// one sequence: exact, docs/design/generation.md), apply the selectors to the
// compute buffers (only the selected rows are copied out, converted to the
// output dtype), then append the window's rows in input order and commit: data
// and .npy headers are synced first, then rows.jsonl, then manifest.json (the
// commit record). A kill at any moment loses at most the uncommitted window;
// --resume checks rows.jsonl's committed lines against the manifest, and
// reopens the arrays at the manifest's row count without reading their rows.
#ifndef LOOM_EVAL_EXTRACT_H_
#define LOOM_EVAL_EXTRACT_H_

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "src/backend/backend.h"
#include "src/base/status.h"
#include "src/core/dtype.h"
#include "src/eval/extract_settings.h"
#include "src/eval/input.h"
#include "src/eval/job_plan.h"
#include "src/eval/row_selector.h"
#include "src/eval/session.h"
#include "src/eval/shard.h"
#include "src/io/file_util.h"
#include "src/model/control_vectors.h"
#include "src/model/hooks.h"
#include "src/runtime/backward.h"
#include "src/runtime/model.h"

namespace loom {

struct ExtractOptions {
  std::string model_dir;
  std::string input_path;
  std::string out_dir;
  std::vector<std::string> hooks;  // patterns: "blocks.{0.5}.hook_resid_post",
                                   // "hook_resid_post" with layers
  std::vector<std::string>
      layers;  // "0.25", "-1", "*": combined with bare site names in `hooks`
  std::vector<std::string> selectors = {"last"};  // ParseRowSelector specs
  std::string template_text;  // "{text}" placeholder; empty = none
  eval::AddBos add_bos = eval::AddBos::kAuto;
  std::optional<DType> dtype;  // f32 | bf16 | f16; none = the compute dtype
  OutputFormat format = OutputFormat::kNpy;
  Precision precision = Precision::kAuto;
  int threads = 0;
  // 0 = min(4096, max_position_embeddings), or a short input's own tokens
  // (ShortInputBatchTokens).
  int64_t batch_tokens = 0;
  // Exact streaming of long rows (TheLoom's streaming_chunk_size, except that
  // the chunks carry the KV cache, so the hidden states are a full pass's):
  // a row of batch_tokens < n <= max_row_tokens tokens runs alone, prefilled
  // in chunks of this many tokens (<= batch_tokens) through a KV cache of one
  // sequence. 0 = off: such a row is a row error.
  int64_t streaming_chunk_size = 0;
  // The longest row streamed (sizes the planned KV cache); 0 = min(32768,
  // max_position_embeddings). Only with streaming_chunk_size.
  int64_t max_row_tokens = 0;
  int64_t commit_every = 256;
  // --shard I/N: this process runs the commit windows w with w mod N == I
  // (window w = input rows [w * commit_every, (w + 1) * commit_every)),
  // into an output of its own that `loom merge` joins (src/eval/shard.h).
  ShardSpec shard;
  OnError on_error = OnError::kFail;
  bool resume = false;
  bool replace_invalid_utf8 = false;  // else invalid UTF-8 is a row error
  JobPlanOptions plan;  // devices, caps, --show-plan, --verify-plan
  // --intervene FILE (docs/interventions.md): edits applied in the forward;
  // or the same document inline (the Python module), vector files resolved
  // against interventions_dir. At most one of the two.
  std::string interventions_file;
  std::string interventions_json;
  std::string interventions_dir = ".";
  // --control-vector / --control-vector-scaled / --control-vector-layer-range
  // (src/model/control_vectors.h): appended after the interventions above.
  std::vector<ControlVectorFile> control_vectors;
  std::optional<ControlVectorLayerRange> control_vector_layer_range;
  // --sae, --sae-topk, --lens, --lens-topk: SAE and lens outputs computed
  // from the hooks the forward delivers (src/eval/extract_derived.h).
  eval::AnalysisParams analysis;
  // --grad-of logit-diff|logprob (with --answer / --wrong): HOOK.grad is
  // then a hook (src/eval/extract_derived.h), d metric / d HOOK per row, by
  // the backward (src/runtime/backward.h): f32 compute, each row alone, no
  // interventions, no streaming.
  std::optional<GradMetric> grad_of;
  // Round activations to bf16 where HF's bf16 forward does (bf16 compute
  // only), to reproduce HF's bf16 hidden states.
  bool hf_bf16_activations = false;
  // Called after every committed window: rows committed in total, tokens run
  // by this invocation, its seconds, and the fraction of the input read.
  std::function<void(int64_t rows, int64_t tokens, double seconds,
                     double fraction)>
      progress;
  // Test hook: stop (as if killed) after this many commits; 0 = never.
  int64_t stop_after_commits = 0;
  // Test hook: every layer runs on this backend (not owned) instead of the
  // plan's devices, e.g. a host-memory stand-in that reports itself as a GPU
  // so that the device paths (weights upload, selection on the device) run
  // where there is no GPU.
  Backend* compute_backend_for_tests = nullptr;
};

struct ExtractSummary {
  int64_t rows = 0;  // rows committed in total (ok + skipped)
  int64_t rows_ok = 0;
  int64_t rows_skipped = 0;
  int64_t tokens = 0;  // tokens run in this invocation
  double seconds = 0;  // wall time of this invocation
  std::vector<std::string> resolved_hooks;
  std::vector<std::string> files;
  bool complete = false;
  int64_t planned_bytes = 0;   // the plan's host total
  nlohmann::json verify_plan;  // with --verify-plan: resident vs planned
  DType dtype = DType::kF32;   // of the arrays written
  bool npy = false;            // written as .npy files (bf16: uint16 bits)
  nlohmann::json ToJson() const;
};

// The session of an extraction: the options' model, precision, placement,
// threads and interventions; the tokenizer optional (token-id rows need
// none).
SessionParams ExtractSessionParams(const ExtractOptions& options);

StatusOr<ExtractSummary> RunExtract(const ExtractOptions& options);

// The lock file of an output directory: held (flock) by the process writing
// the job (extract, or merge), from before it reads anything there for
// writing until it ends.
inline constexpr char kLockFile[] = ".lock";
// Takes the lock on `out_dir`; FailedPrecondition naming the directory when
// another process holds it.
StatusOr<FileLock> LockOutDir(const std::string& out_dir);

// Resolves hook patterns and --layers into the set of hooks to capture
// (deduplicated, in layer order), each checked to exist in the architecture.
// `streaming`: --streaming-chunk-size is on (named in the refusal of
// attention patterns).
StatusOr<HookSet> ResolveExtractHooks(const std::vector<std::string>& hooks,
                                      const std::vector<std::string>& layers,
                                      const ModelConfig& config,
                                      bool streaming = false);

}  // namespace loom

#endif  // LOOM_EVAL_EXTRACT_H_
