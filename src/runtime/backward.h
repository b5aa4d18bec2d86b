// Backward: gradients of a scalar metric of the logits with respect to the
// activations at hook points (vector-Jacobian products; weights are
// constants), for attribution (src/eval/attribute.h).
//
// One sequence per run, in bounded memory by per-layer recompute:
//   1. The forward runs once (an Executor), keeping only the residual stream
//      at every layer boundary ([layers + 1, T, H]).
//   2. The metric's gradient with respect to the logits is formed chunk by
//      chunk (never [T, vocab] at once) and carried through lm_head (the
//      transposed product, GemmBackwardInput) and the final norm.
//   3. For each layer from the last: the layer's forward runs again from its
//      saved input (Executor::ForwardLayer), a StepTap copying the few
//      buffers its backward needs (rotated q/k and v, the MLP's
//      pre-activations, the residual after attention, the branch outputs
//      before a post-norm), then the layer's VJPs run in reverse through the
//      Backend's backward ops, delivering gradients at requested hooks.
// Every buffer is sized at Create for max_tokens (BackwardBytes); Run
// allocates nothing.
//
// Gradients are total derivatives (every downstream path), taken where the
// hook's tensor flows: d/d hook_mlp_out is before any post-MLP norm, d/d
// attn.hook_q before RoPE, d/d hook_embed after Gemma's scale.
//
// Linearization (circuit-tracer's): freeze_attn_pattern makes the attention
// probabilities constants (q and k receive no gradient); freeze_norm_scale
// the 1/rms (LayerNorm: 1/std) factor of every norm, final norm included.
//
// What it runs: f32 (precision f32; the checkpoint's weights in any stored
// format, decoded on the fly), dense MLPs (gated or plain), sequential and
// parallel blocks, mixture-of-experts layers with a softmax top-k router
// (gradients through the chosen experts and the routing weights), per-head or
// whole-row q/k norms after separate projections, RMSNorm/LayerNorm with
// offsets and post-branch norms,
// standard attention (GQA, sliding windows, softcap, sinks, RoPE of either
// layout, partial rotary), fused per-head or concatenated qkv, logit softcap
// and scaling. CheckBackwardSupported names what it does not (
// MLA, clip_qkv, other fused layouts, other routers, shared experts) before
// anything runs.
#ifndef LOOM_RUNTIME_BACKWARD_H_
#define LOOM_RUNTIME_BACKWARD_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/model/hooks.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"

namespace loom {

enum class GradMetricKind {
  // logits[T - 1, answer] - logits[T - 1, wrong].
  kLogitDiff,
  // sum over t < T - 1 of log_softmax(logits[t])[ids[t + 1]] (the
  // sequence's log-likelihood).
  kLogProb,
};

struct GradMetric {
  GradMetricKind kind = GradMetricKind::kLogitDiff;
  int32_t answer = 0, wrong = 0;  // kLogitDiff
  // kLogitDiff: `wrong` is resolved by the run itself as its last position's
  // argmax, or the runner-up when that is `answer` (ties to the lower id;
  // loom patch's default B), without a forward of its own
  // (Backward::resolved_metric).
  bool wrong_from_argmax = false;
};

// "logit-diff" | "logprob"; InvalidArgument naming `flag` and the word.
StatusOr<GradMetricKind> ParseGradMetric(std::string_view text,
                                         std::string_view flag);
std::string_view GradMetricName(GradMetricKind kind);

// The linearization's items ("attn_pattern", "norm_scale") into the two
// flags; InvalidArgument naming `flag` and an unknown item.
Status ParseFreeze(const std::vector<std::string>& items, std::string_view flag,
                   bool* attn_pattern, bool* norm_scale);

// Where gradients may be taken: every token-major float hook but logits,
// the router's and the pattern.
bool IsGradientSite(HookSite site);

struct BackwardOptions {
  int64_t max_tokens = 0;  // the longest sequence a Run takes
  bool freeze_attn_pattern = false;
  bool freeze_norm_scale = false;
  HookSet grad_hooks;  // gradients delivered (IsGradientSite)
  HookSet act_hooks;   // the forward's activations delivered too
  int64_t logits_chunk_rows = 256;
};

// Receives d metric / d activation at a hook: rows [T, width] dense, valid
// during the call.
class GradientSink {
 public:
  virtual ~GradientSink() = default;
  virtual Status OnGradient(const HookPoint& hook, const float* rows,
                            int64_t tokens, int64_t width) = 0;
};

// A gradient injected into the backward (the custom-gradient API that
// circuit-tracer's backends implement): d objective / d `hook` = `rows`
// [T, width] for an objective linear in the hook's value, e.g. a feature's
// encoder row at one position (zero rows elsewhere).
struct GradInjection {
  HookPoint hook;
  std::vector<float> rows;  // [T, width]
};

// Unimplemented naming the layer and the feature the backward lacks;
// InvalidArgument for a gradient hook that is not a gradient site.
Status CheckBackwardSupported(const ModelConfig& c, const BackwardOptions& o);

// Bytes of the backward's own buffers for sequences of up to `tokens`, its
// workspaces as `be` sizes them (beside the forward executor's arenas, which
// the planner sizes as a forward's).
int64_t BackwardBytes(const ModelConfig& c, int64_t tokens,
                      int64_t logits_chunk_rows, const Backend& be);
// BackwardBytes as the host backend the backward runs on sizes them (what a
// job's plan counts as its `backward` bytes, JobSpec::backward_bytes).
int64_t PlannedBackwardBytes(const ModelConfig& c, int64_t tokens,
                             int64_t logits_chunk_rows);

// The hooks the backward's forward delivers to itself (every layer's
// hook_resid_pre and the last hook_resid_post, copied into its saved
// residuals): a job's tapped_hooks, less those it also captures.
HookSet BackwardTappedHooks(const ModelConfig& c, const HookSet& captured);

class Backward {
 public:
  // The model at f32 compute precision, on the host (a CPU backend of its
  // own).
  static StatusOr<std::unique_ptr<Backward>> Create(
      const Model& model, const BackwardOptions& options);
  ~Backward();

  // Forward of `ids` (acts receives the act_hooks), the metric, the
  // backward (grads receives the grad_hooks, deepest layer first). Returns
  // the metric's value (double from the f32 logits).
  // With drop_layer >= 0 (AtP*'s GradDrop), layer drop_layer's branches get
  // no gradient: d metric / d its output is taken as 0, so gradients reach
  // earlier hooks only through its skip connection (its own hooks inside
  // the branches receive zeros).
  StatusOr<double> Run(std::span<const int32_t> ids, const GradMetric& metric,
                       GradientSink* grads, HookSink* acts,
                       int64_t drop_layer = -1);

  // The custom-gradient backward: one forward of `ids`, then for each entry
  // i of `batches` one backward with no metric, seeded only by its
  // injections (added to the gradient where the backward meets their hooks;
  // several in one entry sum), grads[i] receiving d objective / d each
  // grad_hook (zeros at hooks the seeds do not reach). InvalidArgument for
  // an injection at a hook without a gradient or of the wrong size.
  Status Inject(std::span<const int32_t> ids,
                const std::vector<std::vector<GradInjection>>& batches,
                std::span<GradientSink* const> grads);

  // The forward of `ids` alone (acts receives the act_hooks): the last
  // position's logits [V] and, with_logprob, the sequence's log-likelihood
  // (kLogProb's value). No gradient.
  struct Evaluation {
    std::vector<float> last_logits;
    double logprob = 0;
  };
  StatusOr<Evaluation> Evaluate(std::span<const int32_t> ids, bool with_logprob,
                                HookSink* acts);

  // Integrated gradients of `metric` with respect to the block input x
  // (blocks.0.hook_resid_pre: the embeddings after Gemma's scale and the
  // learned positions) from the baseline x' (the block input of the prompt
  // with every token replaced by `baseline_id`, positions kept):
  // attributions = (x - x') * the integral over alpha in [0, 1] of d metric
  // / d x at x' + alpha (x - x'), by `steps`-point Gauss-Legendre quadrature
  // (Captum's default method), one forward and backward per node. (A zero
  // baseline is not offered: a pre-norm model is scale-invariant away from
  // 0, so the whole integral sits in a spike of width ~sqrt(eps) at 0 that
  // no quadrature resolves.)
  struct IgResult {
    std::vector<float> attributions;  // [T, H]
    std::vector<double> per_token;    // [T] the rows' sums
    double metric_input = 0, metric_baseline = 0;
  };
  StatusOr<IgResult> IntegratedGradients(std::span<const int32_t> ids,
                                         const GradMetric& metric,
                                         int64_t steps, int32_t baseline_id);

  // The metric of the last Run as scored (wrong_from_argmax resolved).
  const GradMetric& resolved_metric() const { return resolved_; }
  // The last position's logits [V] of the last logit-diff Run.
  std::span<const float> last_logits() const;

  int64_t buffer_bytes() const;
  const Executor& executor() const { return *executor_; }

 private:
  struct Buffers;
  class Tape;
  Backward(const Model& model, const BackwardOptions& options);
  // The forward (residuals saved, acts delivered) and the final norm.
  Status ForwardAndNorm(std::span<const int32_t> ids, HookSink* acts);
  // sum over t < T - 1 of log_softmax(logits[t])[ids[t + 1]]; with `grad`,
  // its gradient with respect to the final-norm rows is written to d_hidden
  // [T, H] (row T - 1 zero).
  StatusOr<double> LogProb(std::span<const int32_t> ids, float* d_hidden);
  // The layers' forward from saved[0] (the block input), layer by layer
  // through ForwardLayer, then the final norm.
  Status ForwardFromBlockInput(std::span<const int32_t> ids);
  // The metric, its seed and every layer's backward on the saved forward
  // (buf_->g ends as d metric / d block input).
  StatusOr<double> BackwardFromSaved(std::span<const int32_t> ids,
                                     const GradMetric& metric,
                                     GradientSink* grads);
  StatusOr<double> SeedFromMetric(std::span<const int32_t> ids,
                                  const GradMetric& metric,
                                  GradientSink* grads);
  Status LayerBackward(const Batch& batch, int64_t layer, GradientSink* grads);
  // d_in [T, H] (+)= the branch's VJP from d_out [T, H] (accumulate: adds,
  // the shared-norm parallel block).
  Status AttentionBranch(const Batch& batch, int64_t layer, const float* d_out,
                         float* d_in, GradientSink* grads, bool accumulate);
  Status MlpBranch(int64_t layer, const float* d_out, float* d_in,
                   GradientSink* grads);
  // A mixture-of-experts MLP's VJP: the chosen experts' rows and the routing
  // weights (the choice itself is piecewise constant).
  Status MoeBranch(const LayerConfig& lc, const float* d_out, float* d_in);
  // dq, dk in the d q | d k | d v buffer through the q/k norms (in place).
  Status QkNormBack(const LayerConfig& lc);
  // dx (+)= the VJP of the norm (kind of the layer or model, gain `w` of
  // `layer`) at input x, from dy; all [T, H].
  Status NormBack(NormKind kind, float eps, float offset, WeightRole w,
                  int64_t layer, const float* x, const float* dy, float* dx,
                  bool accumulate);
  // dx [m, k] (+)= dy [m, n] W for the weight `w` of `layer`.
  Status LinearBack(WeightRole w, int64_t layer, int64_t m, const float* dy,
                    int64_t ldy, float* dx, int64_t ldx, bool accumulate);
  Status Emit(GradientSink* grads, HookSite site, int64_t layer,
              const float* rows, int64_t width, int64_t ld);

  const Model& model_;
  const ModelConfig& c_;
  BackwardOptions options_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Backend> be_;  // the backward ops' instance (host)
  std::unique_ptr<Buffers> buf_;
  int64_t T_ = 0;            // the current Run's tokens
  int64_t drop_layer_ = -1;  // the current Run's GradDrop layer (-1: none)
  GradMetric resolved_;      // the last Run's metric as scored
  // Inject's seeds for the backward in progress (null: the metric's).
  const std::vector<GradInjection>* seeds_ = nullptr;
  int64_t seq_start_[2] = {0, 0};
  std::vector<double> route_sums_;  // [max_tokens] MoeBranch's
};

}  // namespace loom

#endif  // LOOM_RUNTIME_BACKWARD_H_
