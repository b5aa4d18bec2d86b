#include "src/eval/compare.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "src/base/check.h"
#include "src/eval/logits_head.h"
#include "src/runtime/executor.h"

namespace loom::eval {
namespace {

struct DriftSums {
  double diff2 = 0, ref2 = 0, cand2 = 0, dot = 0;
};

// B (reference): keeps the final-norm rows and, with drift, every layer's
// residual stream of the window.
class ReferenceSink : public HookSink {
 public:
  ReferenceSink(float* hidden, float* layers, int64_t layer_stride)
      : hidden_(hidden), layers_(layers), layer_stride_(layer_stride) {}
  Status OnActivation(const HookPoint& hook, const Batch&, int64_t,
                      int64_t row_begin, int64_t rows, int64_t cols, int64_t ld,
                      const float* data) override {
    LOOM_CHECK(row_begin == 0 && ld == cols);
    if (hook.site == HookSite::kFinalNorm) {
      std::memcpy(hidden_, data, sizeof(float) * rows * cols);
    } else if (hook.site == HookSite::kResidPost && layers_ != nullptr) {
      std::memcpy(layers_ + hook.layer * layer_stride_, data,
                  sizeof(float) * rows * cols);
    }
    return Status();
  }

 private:
  float* hidden_;
  float* layers_;
  int64_t layer_stride_;
};

// A (candidate): keeps the final-norm rows; reduces every layer's residual
// stream against B's as it arrives.
class CandidateSink : public HookSink {
 public:
  CandidateSink(float* hidden, const float* ref_layers, int64_t layer_stride,
                DriftSums* sums)
      : hidden_(hidden),
        ref_layers_(ref_layers),
        layer_stride_(layer_stride),
        sums_(sums) {}
  Status OnActivation(const HookPoint& hook, const Batch&, int64_t,
                      int64_t row_begin, int64_t rows, int64_t cols, int64_t ld,
                      const float* data) override {
    LOOM_CHECK(row_begin == 0 && ld == cols);
    if (hook.site == HookSite::kFinalNorm) {
      std::memcpy(hidden_, data, sizeof(float) * rows * cols);
    } else if (hook.site == HookSite::kResidPost && ref_layers_ != nullptr) {
      const float* ref = ref_layers_ + hook.layer * layer_stride_;
      const int64_t n = rows * cols;
      double diff2 = 0, ref2 = 0, cand2 = 0, dot = 0;
#pragma omp parallel for schedule(static) reduction(+ : diff2, ref2, cand2, dot)
      for (int64_t i = 0; i < n; ++i) {
        const double a = data[i], b = ref[i];
        diff2 += (a - b) * (a - b);
        ref2 += b * b;
        cand2 += a * a;
        dot += a * b;
      }
      DriftSums& s = sums_[hook.layer];
      s.diff2 += diff2;
      s.ref2 += ref2;
      s.cand2 += cand2;
      s.dot += dot;
    }
    return Status();
  }

 private:
  float* hidden_;
  const float* ref_layers_;
  int64_t layer_stride_;
  DriftSums* sums_;
};

// Running sums of the per-token statistics.
struct Sums {
  double n = 0;
  double nll_a = 0, nll_a2 = 0, nll_b = 0, nll_b2 = 0, nll_ab = 0;
  double p_a = 0, p_a2 = 0, p_b = 0, p_b2 = 0, p_ab = 0;
  double dp = 0, dp2 = 0, dp4 = 0;
  double kl = 0, kl2 = 0;
  double same = 0;
};

Estimate MeanAndUncertainty(double sum, double sum2, double n) {
  Estimate e;
  e.value = sum / n;
  const double var = sum2 / n - e.value * e.value;
  e.uncertainty = n > 1 ? std::sqrt(std::max(var, 0.0) / (n - 1)) : 0.0;
  return e;
}

}  // namespace

double Percentile(std::span<const double> sorted, double fraction) {
  LOOM_CHECK(!sorted.empty());
  if (fraction <= 0) return sorted.front();
  if (fraction >= 1) return sorted.back();
  double p = fraction * static_cast<double>(sorted.size() - 1);
  const size_t ip = static_cast<size_t>(p);
  p -= static_cast<double>(ip);
  return (1 - p) * sorted[ip] + p * sorted[std::min(ip + 1, sorted.size() - 1)];
}

StatusOr<CompareResult> CompareModels(const Model& a, const Model& b,
                                      std::span<const int32_t> ids,
                                      const WindowPlan& plan,
                                      const CompareOptions& options) {
  const ModelConfig& ca = a.config();
  const ModelConfig& cb = b.config();
  if (ca.vocab_size != cb.vocab_size)
    return InvalidArgumentError("model " + a.dir() + " has a vocabulary of " +
                                std::to_string(ca.vocab_size) +
                                " tokens but the reference " + b.dir() +
                                " has " + std::to_string(cb.vocab_size) +
                                "; KL needs the same vocabulary");
  if (options.drift &&
      (ca.num_layers != cb.num_layers || ca.hidden_size != cb.hidden_size))
    return InvalidArgumentError(
        "drift needs the same layers and hidden size: model " + a.dir() +
        " has " + std::to_string(ca.num_layers) + " x " +
        std::to_string(ca.hidden_size) + ", the reference " + b.dir() +
        " has " + std::to_string(cb.num_layers) + " x " +
        std::to_string(cb.hidden_size));
  RETURN_IF_ERROR(CheckPlanFitsModel(a, ids, plan, a.dir()));
  RETURN_IF_ERROR(CheckPlanFitsModel(b, ids, plan, b.dir()));

  const int64_t T = plan.max_window_tokens, C = options.logits_chunk_rows,
                V = ca.vocab_size;
  const int64_t Ha = ca.hidden_size, Hb = cb.hidden_size, L = ca.num_layers;
  HookSet hooks;
  hooks.Add({HookSite::kFinalNorm, -1});
  if (options.drift)
    for (int64_t l = 0; l < L; ++l) hooks.Add({HookSite::kResidPost, l});
  ExecutorOptions eo;
  eo.max_tokens = T;
  eo.max_seq_len = T;
  eo.logits_chunk_rows = C;
  ASSIGN_OR_RETURN(auto exec_a, Executor::Create(a, hooks, eo));
  ASSIGN_OR_RETURN(auto exec_b, Executor::Create(b, hooks, eo));
  ASSIGN_OR_RETURN(auto head_a, LogitsHead::Create(a, C));
  ASSIGN_OR_RETURN(auto head_b, LogitsHead::Create(b, C));

  // Everything the loop touches is allocated here.
  std::vector<int32_t> window_ids(T);
  std::vector<float> hidden_a(T * Ha), hidden_b(T * Hb);
  std::vector<float> ref_layers(options.drift ? L * T * Hb : 0);
  std::vector<DriftSums> drift_sums(options.drift ? L : 0);
  std::vector<double> lse_a(C), lse_b(C), row_kl(C);
  std::vector<uint8_t> row_same(C);
  std::vector<double> token_kl(plan.tokens_scored);

  CompareResult r;
  r.protocol = plan.protocol;
  r.ctx = plan.ctx;
  r.stride = plan.stride;
  r.eval_bytes =
      exec_a->arena_bytes() + exec_b->arena_bytes() + head_a->bytes() +
      head_b->bytes() +
      static_cast<int64_t>(sizeof(float) * (hidden_a.size() + hidden_b.size() +
                                            ref_layers.size()) +
                           sizeof(double) * (4 * C + token_kl.size()) +
                           sizeof(int32_t) * T);

  ReferenceSink sink_b(hidden_b.data(),
                       options.drift ? ref_layers.data() : nullptr, T * Hb);
  CandidateSink sink_a(hidden_a.data(),
                       options.drift ? ref_layers.data() : nullptr, T * Hb,
                       drift_sums.data());
  Sums s;
  int64_t scored = 0;
  const auto start = std::chrono::steady_clock::now();
  for (size_t wi = 0; wi < plan.windows.size(); ++wi) {
    const Window& w = plan.windows[wi];
    std::span<const int32_t> wids = WindowIds(plan, w, ids, window_ids);
    const int64_t seq_start[2] = {0, w.length()};
    Batch batch{wids, std::span<const int64_t>(seq_start, 2)};
    RETURN_IF_ERROR(exec_b->Forward(batch, &sink_b));
    RETURN_IF_ERROR(exec_a->Forward(batch, &sink_a));
    const int64_t row_end = w.score_end - w.begin - 1;
    for (int64_t r0 = w.score_begin - w.begin - 1; r0 < row_end; r0 += C) {
      const int64_t n = std::min(C, row_end - r0);
      const float* la = head_a->Compute(hidden_a.data() + r0 * Ha, n);
      head_a->LogSumExp(n, lse_a.data());
      const float* lb = head_b->Compute(hidden_b.data() + r0 * Hb, n);
      head_b->LogSumExp(n, lse_b.data());
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        const float* ra = la + i * V;
        const float* rb = lb + i * V;
        const double za = lse_a[i], zb = lse_b[i];
        double kl = 0;
        for (int64_t v = 0; v < V; ++v) {
          const double qb = static_cast<double>(rb[v]) - zb;
          kl += std::exp(qb) * (qb - (static_cast<double>(ra[v]) - za));
        }
        row_kl[i] = kl;
        row_same[i] = ArgMax(ra, V) == ArgMax(rb, V);
      }
      for (int64_t i = 0; i < n; ++i) {
        const int32_t target = wids[r0 + i + 1];
        const double lpa = static_cast<double>(la[i * V + target]) - lse_a[i];
        const double lpb = static_cast<double>(lb[i * V + target]) - lse_b[i];
        const double pa = std::exp(lpa), pb = std::exp(lpb), dp = pa - pb;
        s.n += 1;
        s.nll_a -= lpa;
        s.nll_a2 += lpa * lpa;
        s.nll_b -= lpb;
        s.nll_b2 += lpb * lpb;
        s.nll_ab += lpa * lpb;
        s.p_a += pa;
        s.p_a2 += pa * pa;
        s.p_b += pb;
        s.p_b2 += pb * pb;
        s.p_ab += pa * pb;
        s.dp += dp;
        s.dp2 += dp * dp;
        s.dp4 += dp * dp * dp * dp;
        s.kl += row_kl[i];
        s.kl2 += row_kl[i] * row_kl[i];
        s.same += row_same[i];
        token_kl[scored++] = row_kl[i];
      }
    }
    if (options.progress)
      options.progress(static_cast<int64_t>(wi) + 1,
                       static_cast<int64_t>(plan.windows.size()));
  }
  LOOM_CHECK(scored == plan.tokens_scored);
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  r.windows = static_cast<int64_t>(plan.windows.size());
  r.tokens_scored = scored;
  r.tokens_evaluated = plan.tokens_evaluated;

  const double n = s.n;
  r.nll_mean_a = s.nll_a / n;
  r.nll_mean_b = s.nll_b / n;
  r.ppl_a = std::exp(r.nll_mean_a);
  r.ppl_b = std::exp(r.nll_mean_b);
  r.kl = MeanAndUncertainty(s.kl, s.kl2, n);
  // ln(PPL_A / PPL_B): the mean of nll_A - nll_B (log-probs enter with sign
  // flipped).
  r.ln_ppl_ratio = MeanAndUncertainty(s.nll_a - s.nll_b,
                                      s.nll_a2 + s.nll_b2 - 2 * s.nll_ab, n);
  const Estimate nll_a = MeanAndUncertainty(s.nll_a, s.nll_a2, n);
  const Estimate nll_b = MeanAndUncertainty(s.nll_b, s.nll_b2, n);
  const double cov_ab =
      n > 1 ? (s.nll_ab / n - r.nll_mean_a * r.nll_mean_b) / (n - 1) : 0.0;
  r.ppl_diff.value = r.ppl_a - r.ppl_b;
  const double ua = r.ppl_a * nll_a.uncertainty,
               ub = r.ppl_b * nll_b.uncertainty;
  r.ppl_diff.uncertainty = std::sqrt(
      std::max(ua * ua + ub * ub - 2 * r.ppl_a * r.ppl_b * cov_ab, 0.0));
  r.same_top1.value = s.same / n;
  r.same_top1.uncertainty =
      n > 1 ? std::sqrt(
                  std::max(r.same_top1.value * (1 - r.same_top1.value), 0.0) /
                  (n - 1))
            : 0.0;
  r.delta_p = MeanAndUncertainty(s.dp, s.dp2, n);
  const Estimate dp2 = MeanAndUncertainty(s.dp2, s.dp4, n);
  r.rms_delta_p.value = std::sqrt(dp2.value);
  r.rms_delta_p.uncertainty = r.rms_delta_p.value > 0
                                  ? dp2.uncertainty / (2 * r.rms_delta_p.value)
                                  : 0.0;
  const double ma = s.p_a / n, mb = s.p_b / n;
  const double var_a = s.p_a2 / n - ma * ma, var_b = s.p_b2 / n - mb * mb;
  const double cov = s.p_ab / n - ma * mb;
  r.prob_pearson =
      var_a > 0 && var_b > 0 ? cov / std::sqrt(var_a * var_b) : 0.0;

  if (options.keep_token_logprobs) r.token_kl = token_kl;
  std::sort(token_kl.begin(), token_kl.end());
  r.kl_median = Percentile(token_kl, 0.5);
  r.kl_p90 = Percentile(token_kl, 0.90);
  r.kl_p95 = Percentile(token_kl, 0.95);
  r.kl_p99 = Percentile(token_kl, 0.99);
  r.kl_max = token_kl.back();

  for (int64_t l = 0; l < static_cast<int64_t>(drift_sums.size()); ++l) {
    const DriftSums& d = drift_sums[l];
    LayerDrift ld;
    ld.layer = l;
    ld.rel_frobenius = d.ref2 > 0 ? std::sqrt(d.diff2 / d.ref2) : 0.0;
    ld.cosine =
        d.ref2 > 0 && d.cand2 > 0 ? d.dot / std::sqrt(d.ref2 * d.cand2) : 0.0;
    ld.sqnr_db = d.diff2 > 0 ? 10 * std::log10(d.ref2 / d.diff2)
                             : std::numeric_limits<double>::infinity();
    r.drift.push_back(ld);
  }
  return r;
}

}  // namespace loom::eval
