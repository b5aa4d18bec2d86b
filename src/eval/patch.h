// Activation patching (`loom patch`, the Python module's Model.patch): the
// (hook x position) grid of a clean and a corrupted prompt of equal length.
//
// One job: the clean prompt runs once, capturing every grid hook at every
// position, and the corrupted prompt once; then each cell (hook h, position
// p) is the corrupted prompt with h[p] replaced by the clean run's h[p]
// (Intervention mode kPatch), run as one sequence of a packed batch: as many
// cells per forward as the token budget holds, each with its own edit (no
// edit reaches a neighbour). Only the last position's logits are computed
// per sequence (final norm of the last row, then lm_head).
//
// With per_head, each attn.hook_z hook of the grid gives one row per head:
// the cell patches only that head's columns (Intervention mode kPatchHead).
//
// Metric (the goldens' definitions): ld(x) = logits_last[A] -
// logits_last[B]; recovery[h][p] = (ld(patched) - ld(corrupted)) /
// (ld(clean) - ld(corrupted)), in double from the f32 logits. A (answer) is
// the argmax of the clean last logits and B (wrong) the argmax of the
// corrupted ones, or their runner-up when that is A, unless given.
#ifndef LOOM_EVAL_PATCH_H_
#define LOOM_EVAL_PATCH_H_

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/model/interventions.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"

namespace loom::eval {

// The two un-patched runs of a job, which a later job with the same model,
// prompts, grid hooks and rounding can reuse instead of running them again
// (the server's patching cache).
struct PatchBaselines {
  std::vector<int32_t> clean_ids, corrupted_ids;
  std::vector<std::string> hooks;  // the grid's hooks, in layer order
  bool hf_bf16_activations = false;
  // [hooks][T, hook width]: the clean run's captures (empty: not kept).
  std::vector<std::vector<float>> clean_rows;
  std::vector<float> clean_logits_last;      // [V] (empty: not kept)
  std::vector<float> corrupted_logits_last;  // [V] (empty: not kept)

  bool has_clean() const { return !clean_logits_last.empty(); }
  bool has_corrupted() const { return !corrupted_logits_last.empty(); }
  int64_t clean_bytes() const;      // the clean rows and logits
  int64_t corrupted_bytes() const;  // the corrupted logits
};

struct PatchOptions {
  // Hook patterns as extract's (blocks.*.hook_resid_pre, ...); every one an
  // intervention site (IsInterventionSite). The grid's rows, in layer order.
  std::vector<std::string> hooks = {"blocks.*.hook_resid_pre"};
  // Layers for bare sites in `hooks` (hook_resid_pre with 0,-1), as
  // extract's --layers.
  std::vector<std::string> layers;
  // The grid's columns: all, last, a list (negatives from the end) or a span.
  InterventionPositions positions;
  // attn.hook_z hooks: one grid row per head (patch_head) instead of one.
  bool per_head = false;
  int64_t answer = -1;       // A; -1 = the clean argmax
  int64_t wrong = -1;        // B; -1 = the corrupted argmax (runner-up if == A)
  int64_t batch_tokens = 0;  // tokens per forward; 0 = min(4096, max pos)
  bool hf_bf16_activations = false;
  // Placement; empty = every layer on a host backend of the executor's own.
  std::vector<ExecutorSegment> segments;
  // Asked before every forward: true ends the job with Cancelled (the Python
  // module's Ctrl-C).
  std::function<bool()> cancelled;
  // Called with (cells done, cells) after each forward of the grid (a
  // progress bar: MakeProgressBar); may be null.
  std::function<void(int64_t, int64_t)> progress;
  // Un-patched runs to reuse (borrowed): used when they hold both runs and
  // their prompts, hooks and hf_bf16 equal this job's; ignored otherwise.
  const PatchBaselines* reuse = nullptr;
};

struct PatchResult {
  // [n_rows] the grid's rows: a hook, and the head it patches (-1: the
  // whole hook; per_head rows of attn.hook_z: 0 .. heads - 1).
  std::vector<std::string> hooks;
  std::vector<int64_t> heads;
  std::vector<int64_t> positions;  // [P] the grid's columns, ascending
  int32_t answer = 0, wrong = 0;
  double clean_logit_diff = 0, corrupted_logit_diff = 0;
  std::vector<double> logit_diff;            // [n_rows, P]
  std::vector<double> recovery;              // [n_rows, P]
  std::vector<float> patched_logits_last;    // [n_rows, P, V]
  std::vector<float> clean_logits_last;      // [V]
  std::vector<float> corrupted_logits_last;  // [V]
  int64_t forwards = 0;  // executor forwards, the two un-patched included
  double seconds = 0;
  bool reused = false;  // the un-patched runs came from options.reuse
  // This job's un-patched runs (the clean captures moved here at the end);
  // empty when they were reused (options.reuse holds them).
  PatchBaselines baselines;
};

// What `loom patch` and Model.patch check before anything is planned: two
// non-empty prompts of one length that differ, and (when both are given) an
// answer and a wrong token that differ (else every recovery is 0/0);
// InvalidArgument saying why otherwise. (Serve's /api/patching/run follows
// TheLoom's contract, which runs such grids.)
Status CheckPatchInputs(std::span<const int32_t> clean,
                        std::span<const int32_t> corrupted,
                        const PatchOptions& options);

// InvalidArgument for prompts of different lengths (naming both), an empty
// grid, a hook that cannot be patched, or A/B outside the vocabulary.
StatusOr<PatchResult> RunPatch(const Model& model,
                               std::span<const int32_t> clean,
                               std::span<const int32_t> corrupted,
                               const PatchOptions& options);

// The job the planner sizes for RunPatch over prompts of `prompt_tokens`
// tokens (and `corrupted_tokens`, which must be as many): its executor's
// forwards (the grid's hooks and the final norm) and the logits of each
// forward's sequences. InvalidArgument as RunPatch.
StatusOr<JobSpec> PatchJob(const ModelConfig& config, int64_t clean_tokens,
                           int64_t corrupted_tokens,
                           const PatchOptions& options);

// The argmax of logits [V], skipping `skip` (-1: none); the first maximum
// (the default answer and wrong tokens).
int32_t ArgmaxLogit(const float* logits, int64_t V, int64_t skip);

// patch.json: hooks (and heads, with per_head), positions, answer_token_ids {A,
// B}, clean_logit_diff, corrupted_logit_diff, logit_diff [h][p], recovery
// [h][p], forwards, seconds.
nlohmann::json PatchJson(const PatchResult& r);

}  // namespace loom::eval

#endif  // LOOM_EVAL_PATCH_H_
