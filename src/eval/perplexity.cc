#include "src/eval/perplexity.h"

#include <chrono>
#include <cmath>
#include <string>

#include "src/backend/registry.h"
#include "src/base/check.h"
#include "src/eval/logits_head.h"
#include "src/runtime/executor.h"

namespace loom::eval {
namespace {

// Scores one window from its final-norm rows as the executor delivers them.
class ScoringSink : public HookSink {
 public:
  // `producer`: the backend that computes the final-norm rows (synchronised
  // before the head, which may run on another instance, reads them).
  ScoringSink(LogitsHead* head, double* lse, Backend* producer)
      : head_(head), lse_(lse), producer_(producer) {}

  void SetWindow(std::span<const int32_t> window_ids, int64_t row_begin,
                 int64_t row_end, float* logprob_out) {
    ids_ = window_ids;
    row_begin_ = row_begin;
    row_end_ = row_end;
    out_ = logprob_out;
    nll_ = 0;
  }
  double nll() const { return nll_; }

  Status OnActivation(const HookPoint& hook, const Batch& batch, int64_t seq,
                      int64_t row_begin, const ActivationView& view) override {
    if (hook.site != HookSite::kFinalNorm) return Status();
    const int64_t rows = view.rows, cols = view.cols, ld = view.ld;
    LOOM_CHECK(view.dtype == DType::kF32 && row_begin == 0 &&
               rows == static_cast<int64_t>(ids_.size()) && ld == cols &&
               cols == head_->hidden());
    if (!(view.device == DeviceRef{}))
      RETURN_IF_ERROR(producer_->Synchronize());
    const float* data = static_cast<const float*>(view.data);
    for (int64_t r0 = row_begin_; r0 < row_end_; r0 += head_->chunk_rows()) {
      const int64_t n = std::min(head_->chunk_rows(), row_end_ - r0);
      head_->Compute(data + r0 * ld, n);
      // log p(ids[t + 1] | ids[..t]) = logit[target] - logsumexp, in double.
      head_->TargetLogProbs(n, ids_.data() + r0 + 1, lse_);
      for (int64_t i = 0; i < n; ++i) {
        nll_ -= lse_[i];
        if (out_ != nullptr)
          out_[r0 - row_begin_ + i] = static_cast<float>(lse_[i]);
      }
    }
    return head_->backend().Synchronize();
  }

 private:
  LogitsHead* head_;
  double* lse_;
  Backend* producer_;
  std::span<const int32_t> ids_;
  int64_t row_begin_ = 0, row_end_ = 0;
  float* out_ = nullptr;
  double nll_ = 0;
};

}  // namespace

Status CheckPlanFitsModel(const Model& model, std::span<const int32_t> ids,
                          const WindowPlan& plan, std::string_view model_name) {
  const ModelConfig& c = model.config();
  const std::string name(model_name);
  if (plan.ctx > c.max_position_embeddings)
    return OutOfRangeError("ctx " + std::to_string(plan.ctx) +
                           " exceeds the maximum context of " + name +
                           " (max_position_embeddings = " +
                           std::to_string(c.max_position_embeddings) + ")");
  if (static_cast<int64_t>(ids.size()) != plan.num_tokens)
    return InvalidArgumentError(
        "the plan covers " + std::to_string(plan.num_tokens) +
        " tokens but the input has " + std::to_string(ids.size()));
  for (size_t t = 0; t < ids.size(); ++t)
    if (ids[t] < 0 || ids[t] >= c.vocab_size)
      return OutOfRangeError("token id " + std::to_string(ids[t]) +
                             " at position " + std::to_string(t) +
                             " is outside the vocabulary of " + name + " [0, " +
                             std::to_string(c.vocab_size) + ")");
  if (plan.window_bos >= c.vocab_size)
    return OutOfRangeError("BOS id " + std::to_string(plan.window_bos) +
                           " is outside the vocabulary of " + name);
  return Status();
}

Status CheckWindowInterventions(const EvalOptions& options,
                                const WindowPlan& plan) {
  if (options.interventions == nullptr) return Status();
  return CheckInterventionsApply(*options.interventions,
                                 static_cast<int64_t>(plan.windows.size()),
                                 "windows", /*generates=*/false);
}

void WindowEdits(const EvalOptions& options, size_t wi, int64_t length,
                 std::vector<SequenceEdit>* edits) {
  edits->clear();
  if (options.interventions != nullptr)
    AddSequenceEdits(*options.interventions, static_cast<int64_t>(wi), 0,
                     length, edits);
}

StatusOr<PerplexityResult> EvaluatePerplexity(const Model& model,
                                              std::span<const int32_t> ids,
                                              const WindowPlan& plan,
                                              const EvalOptions& options) {
  RETURN_IF_ERROR(CheckPlanFitsModel(model, ids, plan, model.dir()));
  RETURN_IF_ERROR(CheckWindowInterventions(options, plan));
  HookSet hooks;
  hooks.Add({HookSite::kFinalNorm, -1});
  ExecutorOptions eo;
  eo.max_tokens = plan.max_window_tokens;
  eo.max_seq_len = plan.max_window_tokens;
  eo.logits_chunk_rows = options.logits_chunk_rows;
  eo.hf_bf16_activations = options.hf_bf16_activations;
  eo.segments = options.segments;
  ASSIGN_OR_RETURN(auto executor, Executor::Create(model, hooks, eo));
  // The head runs where the final norm is computed.
  const Executor::Device& last = executor->device(executor->num_devices() - 1);
  std::unique_ptr<Backend> head_backend;
  if (!last.host_memory) {
    ASSIGN_OR_RETURN(head_backend, last.backend->NewInstance());
  }
  ASSIGN_OR_RETURN(
      auto head,
      LogitsHead::Create(model, options.logits_chunk_rows, head_backend.get(),
                         head_backend ? last.weights : nullptr));

  PerplexityResult r;
  r.protocol = plan.protocol;
  r.ctx = plan.ctx;
  r.stride = plan.stride;
  // Everything the loop touches is allocated here.
  std::vector<int32_t> window_ids(plan.max_window_tokens);
  std::vector<double> lse(options.logits_chunk_rows);
  std::vector<SequenceEdit> edits;
  if (options.interventions != nullptr)
    edits.reserve(options.interventions->size());
  r.window_nll_sum.assign(plan.windows.size(), 0.0);
  if (options.keep_token_logprobs) {
    r.token_position.resize(plan.tokens_scored);
    r.token_logprob.resize(plan.tokens_scored);
  }
  r.executor_bytes = executor->arena_bytes();
  r.eval_bytes =
      head->bytes() + static_cast<int64_t>(window_ids.size() * sizeof(int32_t) +
                                           lse.size() * sizeof(double));

  ScoringSink sink(head.get(), lse.data(), last.backend);
  const auto start = std::chrono::steady_clock::now();
  int64_t scored = 0;
  for (size_t wi = 0; wi < plan.windows.size(); ++wi) {
    if (options.cancelled && options.cancelled())
      return CancelledError("interrupted");
    const Window& w = plan.windows[wi];
    std::span<const int32_t> wids = WindowIds(plan, w, ids, window_ids);
    const int64_t seq_start[2] = {0, w.length()};
    Batch batch{wids, std::span<const int64_t>(seq_start, 2)};
    float* out =
        options.keep_token_logprobs ? r.token_logprob.data() + scored : nullptr;
    sink.SetWindow(wids, w.score_begin - w.begin - 1, w.score_end - w.begin - 1,
                   out);
    WindowEdits(options, wi, w.length(), &edits);
    const Status st = executor->Forward(batch, &sink, nullptr, edits);
    if (!st.ok())
      return Status(st.code(),
                    "window " + std::to_string(wi) + ": " + st.message());
    if (options.keep_token_logprobs)
      for (int64_t t = w.score_begin; t < w.score_end; ++t)
        r.token_position[scored + t - w.score_begin] = t;
    r.window_nll_sum[wi] = sink.nll();
    r.nll_sum += sink.nll();
    scored += w.scored();
    if (options.progress)
      options.progress(static_cast<int64_t>(wi) + 1,
                       static_cast<int64_t>(plan.windows.size()));
  }
  LOOM_CHECK(scored == plan.tokens_scored);
  r.windows = static_cast<int64_t>(plan.windows.size());
  r.tokens_scored = scored;
  r.tokens_evaluated = plan.tokens_evaluated;
  r.nll_mean = r.nll_sum / static_cast<double>(scored);
  r.perplexity = std::exp(r.nll_mean);
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  r.tokens_per_second =
      r.seconds > 0 ? static_cast<double>(r.tokens_evaluated) / r.seconds : 0;
  return r;
}

nlohmann::json PerplexityJson(const std::string& model_name, DType precision,
                              bool bos, int64_t tokens,
                              const PerplexityResult& r,
                              const std::vector<Intervention>& interventions) {
  nlohmann::json j{{"model", model_name},
                   {"precision", std::string(DTypeName(precision))},
                   {"protocol", std::string(ProtocolName(r.protocol))},
                   {"ctx", r.ctx},
                   {"stride", r.stride},
                   {"bos", bos},
                   {"tokens", tokens},
                   {"windows", r.windows},
                   {"tokens_scored", r.tokens_scored},
                   {"tokens_evaluated", r.tokens_evaluated},
                   {"nll_sum", r.nll_sum},
                   {"nll_mean", r.nll_mean},
                   {"perplexity", r.perplexity},
                   {"seconds", r.seconds},
                   {"tokens_per_second", r.tokens_per_second}};
  if (!interventions.empty())
    j["interventions"] = InterventionsJson(interventions);
  return j;
}

}  // namespace loom::eval
