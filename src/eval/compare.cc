#include "src/eval/compare.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "src/base/check.h"
#include "src/base/read_file.h"
#include "src/eval/logits_head.h"
#include "src/io/npy.h"
#include "src/runtime/executor.h"
#include "src/tokenizer/tokenizer.h"

namespace loom::eval {
namespace {

struct DriftSums {
  double diff2 = 0, ref2 = 0, cand2 = 0, dot = 0;
};

// The backends whose memory an executor's views may be in (its segments not
// on the host).
std::vector<Backend*> DeviceBackends(const Executor& ex) {
  std::vector<Backend*> out;
  for (int i = 0; i < ex.num_devices(); ++i)
    if (!ex.device(i).host_memory) out.push_back(ex.device(i).backend);
  return out;
}

// A dense [rows, cols] f32 view as host f32: the view itself when it is in
// host memory, else copied into `staging` (rows * cols floats) through the
// backend of its device.
StatusOr<const float*> HostRows(const ActivationView& view,
                                const std::vector<Backend*>& devices,
                                float* staging) {
  if (view.device.kind == DeviceKind::kCpu) return view.f32();
  for (Backend* b : devices)
    if (b->device() == view.device) {
      RETURN_IF_ERROR(b->Copy(staging, DeviceRef{}, view.data, view.device,
                              view.rows * view.cols * int64_t{sizeof(float)}));
      return staging;
    }
  return InternalError("compare: a view of a device no executor segment has");
}

// B (reference): keeps the final-norm rows and, with drift, every layer's
// residual stream of the window.
class ReferenceSink : public HookSink {
 public:
  ReferenceSink(float* hidden, float* layers, int64_t layer_stride,
                std::vector<Backend*> devices = {})
      : hidden_(hidden),
        layers_(layers),
        layer_stride_(layer_stride),
        devices_(std::move(devices)) {}
  Status OnActivation(const HookPoint& hook, const Batch&, int64_t,
                      int64_t row_begin, const ActivationView& view) override {
    const int64_t rows = view.rows, cols = view.cols;
    LOOM_CHECK(row_begin == 0 && view.ld == cols);
    float* dst = nullptr;
    if (hook.site == HookSite::kFinalNorm) {
      dst = hidden_;
    } else if (hook.site == HookSite::kResidPost && layers_ != nullptr) {
      dst = layers_ + hook.layer * layer_stride_;
    }
    if (dst == nullptr) return Status();
    ASSIGN_OR_RETURN(const float* data, HostRows(view, devices_, dst));
    if (data != dst) std::memcpy(dst, data, sizeof(float) * rows * cols);
    return Status();
  }

 private:
  float* hidden_;
  float* layers_;
  int64_t layer_stride_;
  std::vector<Backend*> devices_;
};

// A (candidate): keeps the final-norm rows; reduces every layer's residual
// stream against B's as it arrives.
class CandidateSink : public HookSink {
 public:
  // `staging` [layer_stride] floats: a device layer's rows on the host
  // (unused when every view is in host memory).
  CandidateSink(float* hidden, const float* ref_layers, int64_t layer_stride,
                DriftSums* sums, std::vector<Backend*> devices = {},
                float* staging = nullptr)
      : hidden_(hidden),
        ref_layers_(ref_layers),
        layer_stride_(layer_stride),
        sums_(sums),
        devices_(std::move(devices)),
        staging_(staging) {}
  Status OnActivation(const HookPoint& hook, const Batch&, int64_t,
                      int64_t row_begin, const ActivationView& view) override {
    const int64_t rows = view.rows, cols = view.cols;
    LOOM_CHECK(row_begin == 0 && view.ld == cols);
    if (hook.site == HookSite::kFinalNorm) {
      ASSIGN_OR_RETURN(const float* data, HostRows(view, devices_, hidden_));
      if (data != hidden_)
        std::memcpy(hidden_, data, sizeof(float) * rows * cols);
    } else if (hook.site == HookSite::kResidPost && ref_layers_ != nullptr) {
      ASSIGN_OR_RETURN(const float* data, HostRows(view, devices_, staging_));
      const float* ref = ref_layers_ + hook.layer * layer_stride_;
      const int64_t n = rows * cols;
      // Fixed chunks (a function of n only), each summed by one thread, then
      // added in chunk order: the sums do not depend on the thread count.
      constexpr int64_t kMaxChunks = 64;
      const int64_t chunk =
          std::max<int64_t>(1 << 16, (n + kMaxChunks - 1) / kMaxChunks);
      const int64_t chunks = (n + chunk - 1) / chunk;
      double part[kMaxChunks][4] = {};
#pragma omp parallel for schedule(static) if (chunks > 1)
      for (int64_t c = 0; c < chunks; ++c) {
        double diff2 = 0, ref2 = 0, cand2 = 0, dot = 0;
        for (int64_t i = c * chunk, e = std::min(n, i + chunk); i < e; ++i) {
          const double a = data[i], b = ref[i];
          diff2 += (a - b) * (a - b);
          ref2 += b * b;
          cand2 += a * a;
          dot += a * b;
        }
        part[c][0] = diff2, part[c][1] = ref2, part[c][2] = cand2;
        part[c][3] = dot;
      }
      DriftSums& s = sums_[hook.layer];
      for (int64_t c = 0; c < chunks; ++c) {
        s.diff2 += part[c][0];
        s.ref2 += part[c][1];
        s.cand2 += part[c][2];
        s.dot += part[c][3];
      }
    }
    return Status();
  }

 private:
  float* hidden_;
  const float* ref_layers_;
  int64_t layer_stride_;
  DriftSums* sums_;
  std::vector<Backend*> devices_;
  float* staging_;
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

void AddToken(Sums& s, double lpa, double lpb, double kl, bool same) {
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
  s.kl += kl;
  s.kl2 += kl * kl;
  s.same += same;
}

void Finish(const Sums& s, bool keep_token_kl, std::vector<double>& token_kl,
            CompareResult& r);

// The reference's saved rows: [tokens, k] ids and log-probs, [tokens] target
// log-probs, read chunk by chunk.
struct SavedReference {
  std::unique_ptr<NpyWriter> ids, logprobs, target;  // when saving
  int64_t k = 0;
};

// Top k of `row` [V] by value, as (ids, values) in descending order; `heap`
// holds k (value, id) pairs of scratch.
void TopK(const float* row, int64_t V, int64_t k,
          std::pair<float, int32_t>* heap, int32_t* ids, float* values) {
  auto greater = [](const std::pair<float, int32_t>& x,
                    const std::pair<float, int32_t>& y) { return x > y; };
  int64_t n = 0;
  for (int64_t v = 0; v < V; ++v) {
    if (n < k) {
      heap[n++] = {row[v], static_cast<int32_t>(v)};
      std::push_heap(heap, heap + n, greater);
    } else if (row[v] > heap[0].first) {
      std::pop_heap(heap, heap + n, greater);
      heap[n - 1] = {row[v], static_cast<int32_t>(v)};
      std::push_heap(heap, heap + n, greater);
    }
  }
  std::sort_heap(heap, heap + n, greater);  // descending
  for (int64_t i = 0; i < n; ++i) {
    ids[i] = heap[i].second;
    values[i] = heap[i].first;
  }
}

uint64_t HashIds(std::span<const int32_t> ids) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t id : ids) h = (h ^ static_cast<uint32_t>(id)) * 1099511628211ull;
  return h;
}

nlohmann::json ReferenceHeader(const std::string& model_dir, int64_t vocab,
                               std::span<const int32_t> ids,
                               const WindowPlan& plan, int64_t k) {
  return nlohmann::json{{"format", "loom-reference-logprobs"},
                        {"version", 1},
                        {"reference_model", model_dir},
                        {"vocab_size", vocab},
                        {"protocol", std::string(ProtocolName(plan.protocol))},
                        {"ctx", plan.ctx},
                        {"stride", plan.stride},
                        {"windows", static_cast<int64_t>(plan.windows.size())},
                        {"tokens_scored", plan.tokens_scored},
                        {"ids_fnv1a64", std::to_string(HashIds(ids))},
                        {"top_k", k}};
}

Status CreateReferenceDir(const std::string& dir, const Model& b,
                          std::span<const int32_t> ids, const WindowPlan& plan,
                          int64_t top_k, SavedReference* save) {
  const int64_t V = b.config().vocab_size;
  if (top_k <= 0 || top_k > V)
    return InvalidArgumentError("--top-k " + std::to_string(top_k) +
                                ": expected 1.." + std::to_string(V));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("--save-reference " + dir + ": " + ec.message());
  if (std::filesystem::exists(dir + "/reference.json"))
    return FailedPreconditionError(
        "--save-reference " + dir +
        " already holds a reference (nothing overwritten)");
  save->k = top_k;
  ASSIGN_OR_RETURN(save->ids, NpyWriter::Create(dir + "/topk_ids.npy",
                                                DType::kI32, {top_k}));
  ASSIGN_OR_RETURN(save->logprobs, NpyWriter::Create(dir + "/topk_logprobs.npy",
                                                     DType::kF32, {top_k}));
  ASSIGN_OR_RETURN(save->target, NpyWriter::Create(dir + "/target_logprob.npy",
                                                   DType::kF32, {}));
  std::ofstream out(dir + "/reference.json");
  out << ReferenceHeader(b.dir(), V, ids, plan, top_k).dump(2) << "\n";
  if (!out) return IoError(dir + "/reference.json: write failed");
  return Status();
}

}  // namespace

namespace {

void Finish(const Sums& s, bool keep_token_kl, std::vector<double>& token_kl,
            CompareResult& r) {
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

  if (keep_token_kl) r.token_kl = token_kl;
  std::sort(token_kl.begin(), token_kl.end());
  r.kl_median = Percentile(token_kl, 0.5);
  r.kl_p90 = Percentile(token_kl, 0.90);
  r.kl_p95 = Percentile(token_kl, 0.95);
  r.kl_p99 = Percentile(token_kl, 0.99);
  r.kl_max = token_kl.back();
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
  RETURN_IF_ERROR(CheckWindowInterventions(options, plan));

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
  eo.hf_bf16_activations = options.hf_bf16_activations;
  ExecutorOptions eo_b = eo;
  eo.segments = options.segments;
  eo_b.segments = options.reference_segments;
  ASSIGN_OR_RETURN(auto exec_a, Executor::Create(a, hooks, eo));
  ASSIGN_OR_RETURN(auto exec_b, Executor::Create(b, hooks, eo_b));
  ASSIGN_OR_RETURN(auto head_a, LogitsHead::Create(a, C));
  ASSIGN_OR_RETURN(auto head_b, LogitsHead::Create(b, C));

  // Everything the loop touches is allocated here.
  std::vector<int32_t> window_ids(T);
  std::vector<float> hidden_a(T * Ha), hidden_b(T * Hb);
  std::vector<float> ref_layers(options.drift ? L * T * Hb : 0);
  const std::vector<Backend*> devices_a = DeviceBackends(*exec_a);
  std::vector<float> drift_staging(options.drift && !devices_a.empty() ? T * Ha
                                                                       : 0);
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
      static_cast<int64_t>(
          sizeof(float) * (hidden_a.size() + hidden_b.size() +
                           ref_layers.size() + drift_staging.size()) +
          sizeof(double) * (4 * C + token_kl.size()) + sizeof(int32_t) * T);

  ReferenceSink sink_b(hidden_b.data(),
                       options.drift ? ref_layers.data() : nullptr, T * Hb,
                       DeviceBackends(*exec_b));
  CandidateSink sink_a(hidden_a.data(),
                       options.drift ? ref_layers.data() : nullptr, T * Hb,
                       drift_sums.data(), devices_a, drift_staging.data());
  SavedReference save;
  std::vector<int32_t> save_ids;
  std::vector<float> save_lp, save_target;
  std::vector<std::pair<float, int32_t>> save_heap;
  if (!options.save_reference_dir.empty()) {
    RETURN_IF_ERROR(CreateReferenceDir(options.save_reference_dir, b, ids, plan,
                                       options.top_k, &save));
    save_ids.resize(C * save.k);
    save_lp.resize(C * save.k);
    save_target.resize(C);
    save_heap.resize(C * save.k);
  }
  Sums s;
  int64_t scored = 0;
  std::vector<SequenceEdit> edits;  // the candidate's (options.interventions)
  if (options.interventions != nullptr)
    edits.reserve(options.interventions->size());
  const auto start = std::chrono::steady_clock::now();
  for (size_t wi = 0; wi < plan.windows.size(); ++wi) {
    const Window& w = plan.windows[wi];
    std::span<const int32_t> wids = WindowIds(plan, w, ids, window_ids);
    const int64_t seq_start[2] = {0, w.length()};
    Batch batch{wids, std::span<const int64_t>(seq_start, 2)};
    RETURN_IF_ERROR(exec_b->Forward(batch, &sink_b));
    WindowEdits(options, wi, w.length(), &edits);
    RETURN_IF_ERROR(exec_a->Forward(batch, &sink_a, nullptr, edits));
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
        if (save.k > 0) {
          const int64_t k = save.k;
          TopK(rb, V, k, &save_heap[i * k], &save_ids[i * k], &save_lp[i * k]);
          for (int64_t j = 0; j < k; ++j)
            save_lp[i * k + j] -= static_cast<float>(zb);
          save_target[i] = static_cast<float>(
              static_cast<double>(rb[wids[r0 + i + 1]]) - zb);
        }
      }
      if (save.k > 0) {
        RETURN_IF_ERROR(save.ids->AppendRows(save_ids.data(), n));
        RETURN_IF_ERROR(save.logprobs->AppendRows(save_lp.data(), n));
        RETURN_IF_ERROR(save.target->AppendRows(save_target.data(), n));
      }
      for (int64_t i = 0; i < n; ++i) {
        const int32_t target = wids[r0 + i + 1];
        const double lpa = static_cast<double>(la[i * V + target]) - lse_a[i];
        const double lpb = static_cast<double>(lb[i * V + target]) - lse_b[i];
        AddToken(s, lpa, lpb, row_kl[i], row_same[i]);
        token_kl[scored++] = row_kl[i];
      }
    }
    if (options.progress)
      options.progress(static_cast<int64_t>(wi) + 1,
                       static_cast<int64_t>(plan.windows.size()));
  }
  LOOM_CHECK(scored == plan.tokens_scored);
  if (save.k > 0) {
    RETURN_IF_ERROR(save.ids->Commit());
    RETURN_IF_ERROR(save.logprobs->Commit());
    RETURN_IF_ERROR(save.target->Commit());
  }
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  r.windows = static_cast<int64_t>(plan.windows.size());
  r.tokens_scored = scored;
  r.tokens_evaluated = plan.tokens_evaluated;

  Finish(s, options.keep_token_logprobs, token_kl, r);

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

namespace loom::eval {

StatusOr<CompareResult> CompareWithSavedReference(
    const Model& a, std::span<const int32_t> ids, const WindowPlan& plan,
    const std::string& dir, const CompareOptions& options) {
  if (options.drift)
    return InvalidArgumentError(
        "--drift needs the reference model itself, not saved log-probs");
  StatusOr<std::string> text = ReadFileToString(dir + "/reference.json");
  if (!text.ok()) return text.status().WithContext("--reference-logprobs");
  const nlohmann::json saved = nlohmann::json::parse(*text, nullptr, false);
  if (saved.is_discarded() || !saved.is_object() ||
      saved.value("format", "") != "loom-reference-logprobs")
    return DataLossError(dir + "/reference.json: not a saved reference");
  const int64_t V = a.config().vocab_size;
  const int64_t k = saved.value("top_k", int64_t{0});
  const nlohmann::json now =
      ReferenceHeader(saved.value("reference_model", ""), V, ids, plan, k);
  for (const char* key : {"vocab_size", "protocol", "ctx", "stride", "windows",
                          "tokens_scored", "ids_fnv1a64"})
    if (saved.value(key, nlohmann::json()) != now[key])
      return FailedPreconditionError(
          "--reference-logprobs " + dir + ": " + key + " is " +
          saved.value(key, nlohmann::json()).dump() + " there but " +
          now[key].dump() +
          " for this run; use the same text, tokenizer and window options");
  ASSIGN_OR_RETURN(NpyHeader ids_h, ReadNpyHeader(dir + "/topk_ids.npy"));
  ASSIGN_OR_RETURN(NpyHeader lp_h, ReadNpyHeader(dir + "/topk_logprobs.npy"));
  ASSIGN_OR_RETURN(NpyHeader tg_h, ReadNpyHeader(dir + "/target_logprob.npy"));
  const std::vector<int64_t> want_k = {plan.tokens_scored, k};
  if (ids_h.shape != want_k || lp_h.shape != want_k ||
      tg_h.shape != std::vector<int64_t>{plan.tokens_scored} ||
      ids_h.dtype != DType::kI32 || lp_h.dtype != DType::kF32 ||
      tg_h.dtype != DType::kF32)
    return DataLossError(dir + ": arrays do not hold " +
                         std::to_string(plan.tokens_scored) + " rows of top-" +
                         std::to_string(k) +
                         " (int32 ids, float32 log-probs) and float32 targets");
  RETURN_IF_ERROR(CheckPlanFitsModel(a, ids, plan, a.dir()));
  RETURN_IF_ERROR(CheckWindowInterventions(options, plan));

  const int64_t T = plan.max_window_tokens, C = options.logits_chunk_rows,
                H = a.config().hidden_size;
  HookSet hooks;
  hooks.Add({HookSite::kFinalNorm, -1});
  ExecutorOptions eo;
  eo.max_tokens = T;
  eo.max_seq_len = T;
  eo.logits_chunk_rows = C;
  eo.hf_bf16_activations = options.hf_bf16_activations;
  eo.segments = options.segments;
  ASSIGN_OR_RETURN(auto exec, Executor::Create(a, hooks, eo));
  ASSIGN_OR_RETURN(auto head, LogitsHead::Create(a, C));
  std::vector<int32_t> window_ids(T), ref_ids(C * k);
  std::vector<float> hidden(T * H), ref_lp(C * k), ref_target(C);
  std::vector<double> lse(C), row_kl(C);
  std::vector<uint8_t> row_same(C);
  std::vector<double> token_kl(plan.tokens_scored);
  std::vector<SequenceEdit> edits;  // the candidate's (options.interventions)
  if (options.interventions != nullptr)
    edits.reserve(options.interventions->size());
  std::ifstream f_ids(dir + "/topk_ids.npy", std::ios::binary),
      f_lp(dir + "/topk_logprobs.npy", std::ios::binary),
      f_tg(dir + "/target_logprob.npy", std::ios::binary);
  auto read_rows = [&](std::ifstream& f, const NpyHeader& h, int64_t row,
                       int64_t n, int64_t row_bytes, void* dst) {
    f.seekg(h.data_offset + row * row_bytes);
    f.read(static_cast<char*>(dst), n * row_bytes);
    return f.good() ? Status()
                    : DataLossError(dir + ": short read at row " +
                                    std::to_string(row));
  };
  CandidateSink sink(hidden.data(), nullptr, T * H, nullptr,
                     DeviceBackends(*exec));
  CompareResult r;
  r.protocol = plan.protocol;
  r.ctx = plan.ctx;
  r.stride = plan.stride;
  Sums s;
  int64_t scored = 0;
  const auto start = std::chrono::steady_clock::now();
  for (size_t wi = 0; wi < plan.windows.size(); ++wi) {
    const Window& w = plan.windows[wi];
    std::span<const int32_t> wids = WindowIds(plan, w, ids, window_ids);
    const int64_t seq_start[2] = {0, w.length()};
    WindowEdits(options, wi, w.length(), &edits);
    RETURN_IF_ERROR(
        exec->Forward(Batch{wids, std::span<const int64_t>(seq_start, 2)},
                      &sink, nullptr, edits));
    const int64_t row_end = w.score_end - w.begin - 1;
    for (int64_t r0 = w.score_begin - w.begin - 1; r0 < row_end; r0 += C) {
      const int64_t n = std::min(C, row_end - r0);
      RETURN_IF_ERROR(
          read_rows(f_ids, ids_h, scored, n, 4 * k, ref_ids.data()));
      RETURN_IF_ERROR(read_rows(f_lp, lp_h, scored, n, 4 * k, ref_lp.data()));
      RETURN_IF_ERROR(read_rows(f_tg, tg_h, scored, n, 4, ref_target.data()));
      const float* la = head->Compute(hidden.data() + r0 * H, n);
      head->LogSumExp(n, lse.data());
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        // KL over the saved top-k plus one bucket for the rest.
        double kl = 0, mass_b = 0, mass_a = 0;
        for (int64_t j = 0; j < k; ++j) {
          const double lpb = ref_lp[i * k + j];
          const double lpa =
              static_cast<double>(la[i * V + ref_ids[i * k + j]]) - lse[i];
          const double pb = std::exp(lpb);
          kl += pb * (lpb - lpa);
          mass_b += pb;
          mass_a += std::exp(lpa);
        }
        const double rest_b = 1.0 - mass_b,
                     rest_a = std::max(1.0 - mass_a, 1e-300);
        if (rest_b > 1e-12)
          kl += rest_b * (std::log(rest_b) - std::log(rest_a));
        row_kl[i] = std::max(kl, 0.0);
        row_same[i] = ArgMax(la + i * V, V) == ref_ids[i * k];
      }
      for (int64_t i = 0; i < n; ++i) {
        const int32_t target = wids[r0 + i + 1];
        const double lpa = static_cast<double>(la[i * V + target]) - lse[i];
        AddToken(s, lpa, ref_target[i], row_kl[i], row_same[i]);
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
  Finish(s, options.keep_token_logprobs, token_kl, r);
  r.eval_bytes = exec->arena_bytes() + head->bytes();
  return r;
}

Status CheckSameTokenizer(const std::string& model_dir,
                          const std::string& reference_dir) {
  const std::string way_out =
      " (--same-tokens with --tokens ids compares them anyway, when you know "
      "the two models read ids alike)";
  StatusOr<std::unique_ptr<tok::Tokenizer>> a = tok::Tokenizer::Load(model_dir);
  StatusOr<std::unique_ptr<tok::Tokenizer>> b =
      tok::Tokenizer::Load(reference_dir);
  for (const auto* t : {&a, &b})
    if (!t->ok())
      return FailedPreconditionError(
          "cannot check that --model and --reference share a tokenizer: " +
          (t == &a ? model_dir : reference_dir) + " has none that loads (" +
          std::string(t->status().message()) + ")" + way_out);
  const int64_t va = (*a)->vocab_size(), vb = (*b)->vocab_size();
  if (va != vb)
    return FailedPreconditionError(
        "--model " + model_dir + " and --reference " + reference_dir +
        " have different tokenizers: " + std::to_string(va) + " and " +
        std::to_string(vb) + " tokens; KL would compare unrelated tokens" +
        way_out);
  for (int32_t id = 0; id < va; ++id) {
    const std::string ta = (*a)->IdToToken(id), tb = (*b)->IdToToken(id);
    if (ta != tb)
      return FailedPreconditionError(
          "--model " + model_dir + " and --reference " + reference_dir +
          " have different tokenizers: id " + std::to_string(id) + " is '" +
          ta + "' in the model and '" + tb +
          "' in the reference; KL would compare unrelated tokens" + way_out);
  }
  return Status();
}

}  // namespace loom::eval
