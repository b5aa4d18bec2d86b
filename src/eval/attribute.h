// Attribution patching (`loom attribute`, issue 38's AtP): the (hook x
// position) grid of `loom patch` estimated from one backward instead of one
// forward per cell.
//
// One job, one backward (src/runtime/backward.h):
//   1. the clean prompt's forward captures every grid hook (and its metric);
//   2. the corrupted prompt's forward captures them again, and the backward
//      gives d metric / d activation at each;
//   3. atp[h][t] = sum over the hook's width of (clean - corrupted)[t, :] .
//      grad[t, :], in double from the f32 values; per head (attn.hook_z,
//      per_head) the sum over that head's columns.
// With check_top N, `loom patch`'s true effect of the N cells of largest
// |atp| among the patchable hooks (IsInterventionSite) is run (logit-diff:
// patched - corrupted logit difference) and reported beside them.
//
// The metric and its defaults follow `loom patch`: logit-diff of the answer A
// (default: the clean argmax) and the wrong token B (default: the corrupted
// argmax, or its runner-up when that is A); or logprob, the corrupted
// sequence's log-likelihood (the clean run's with the clean ids).
#ifndef LOOM_EVAL_ATTRIBUTE_H_
#define LOOM_EVAL_ATTRIBUTE_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/model/interventions.h"
#include "src/runtime/backward.h"
#include "src/runtime/model.h"

namespace loom::eval {

// `loom attribute --method` (the route's `method`, Model.attribute's):
// atp, atp-star (AtP and GradDrop) or ig (integrated gradients);
// InvalidArgument naming `flag` otherwise.
enum class AttributeMethod { kAtp, kAtpStar, kIg };
StatusOr<AttributeMethod> ParseAttributeMethod(std::string_view text,
                                               std::string_view flag);

struct AttributeOptions {
  // Hook patterns as extract's; every one a gradient site (IsGradientSite).
  std::vector<std::string> hooks = {"blocks.*.hook_resid_pre"};
  std::vector<std::string> layers;  // for bare sites, as extract's --layers
  InterventionPositions positions;  // the grid's columns (all)
  bool per_head = false;            // attn.hook_z: atp_head per head
  GradMetricKind metric = GradMetricKind::kLogitDiff;
  int64_t answer = -1, wrong = -1;  // -1: loom patch's defaults
  bool freeze_attn_pattern = false;
  bool freeze_norm_scale = false;
  // Run the true patch of the N largest |atp| cells (logit-diff only).
  int64_t check_top = 0;
  // method atp-star: AtP*'s GradDrop besides AtP (one more backward per
  // layer): atp_star[h][t] = 1/(L - 1) sum over layers l of |atp_l[h][t]|,
  // atp_l the AtP with layer l's branches given no gradient
  // (Backward::Run's drop_layer); L = 1: |atp|. The per-head sums likewise.
  bool grad_drop = false;
};

struct AttributeCheck {
  std::string hook;
  int64_t position = 0;
  double atp = 0, true_patch = 0;
};

struct AttributeResult {
  std::vector<std::string> hooks;  // the grid's rows, as expanded
  std::vector<int64_t> positions;  // the grid's columns, ascending
  int32_t answer = 0, wrong = 0;   // logit-diff
  double metric_clean = 0, metric_corrupted = 0;
  std::vector<std::vector<double>> atp;  // [hooks][P]
  // per_head: for each attn.hook_z row, [P][heads]; other rows empty.
  std::vector<std::vector<std::vector<double>>> atp_head;
  // grad_drop: the GradDrop estimates, shaped as atp and atp_head.
  std::vector<std::vector<double>> atp_star;
  std::vector<std::vector<std::vector<double>>> atp_star_head;
  std::vector<AttributeCheck> checks;  // check_top cells, largest |atp| first
  // The last position's logits [V] of each prompt (logit-diff; the
  // corrupted one empty for logprob).
  std::vector<float> clean_logits_last, corrupted_logits_last;
  double seconds = 0;
};

// InvalidArgument for prompts of different lengths, an empty grid, a hook
// without a gradient, check_top with the logprob metric, A/B outside the
// vocabulary; the backward's Unimplemented for a model it does not cover.
StatusOr<AttributeResult> RunAttribute(const Model& model,
                                       std::span<const int32_t> clean,
                                       std::span<const int32_t> corrupted,
                                       const AttributeOptions& options);

// Integrated gradients over one prompt's tokens (`loom attribute --method
// ig`; Backward::IntegratedGradients): the metric is `options.metric` on the
// prompt, A / B default to its last position's argmax and runner-up.
struct IgOptions {
  GradMetricKind metric = GradMetricKind::kLogitDiff;
  int64_t answer = -1, wrong = -1;
  int64_t steps = 32;
  int64_t baseline_token = 0;
  bool freeze_attn_pattern = false, freeze_norm_scale = false;
};
struct IgAttribution {
  std::vector<double> per_token;  // [T]
  int32_t answer = 0, wrong = 0;
  double metric_input = 0, metric_baseline = 0;
  double seconds = 0;
};
// The IG job of an attribute request: its metric, A / B and linearization.
IgOptions IgOptionsOf(const AttributeOptions& o, int64_t steps,
                      int64_t baseline_token);
StatusOr<IgAttribution> RunIntegratedGradients(const Model& model,
                                               std::span<const int32_t> ids,
                                               const IgOptions& options);
// attribution.json of an ig job: method, steps, baseline_token, metric,
// answer_token_ids, positions, ig [position], metric_input, metric_baseline,
// completeness_error (sum of ig - (metric_input - metric_baseline)),
// seconds.
nlohmann::json IgJson(const IgAttribution& r, const IgOptions& options);

// The forward part of the job the planner sizes (the executor the backward
// runs: T tokens, the grid hooks and every layer boundary, the logits); the
// backward's own buffers are BackwardBytes beside it.
StatusOr<JobSpec> AttributeJob(const ModelConfig& config, int64_t tokens,
                               const AttributeOptions& options);

// attribution.json: hooks, positions, metric, answer_token_ids (logit-diff),
// method (atp | atp-star), freeze, metric_clean, metric_corrupted, atp
// [hook][position], atp_head (per_head: [hook][position][head], [] for hooks
// other than attn.hook_z), atp_star and atp_star_head (atp-star), checks,
// seconds.
nlohmann::json AttributionJson(const AttributeResult& r,
                               const AttributeOptions& options);

}  // namespace loom::eval

#endif  // LOOM_EVAL_ATTRIBUTE_H_
