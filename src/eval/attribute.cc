#include "src/eval/attribute.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "src/eval/extract.h"
#include "src/eval/patch.h"

namespace loom::eval {
namespace {

// Dense [T, width] copies of the grid hooks' activations.
class GridSink : public HookSink {
 public:
  Status OnActivation(const HookPoint& hook, const Batch& /*batch*/,
                      int64_t /*seq*/, int64_t row_begin,
                      const ActivationView& view) override {
    std::vector<float>& v = rows[hook];
    v.resize(static_cast<size_t>((row_begin + view.rows) * view.cols));
    const float* d = view.f32();
    for (int64_t r = 0; r < view.rows; ++r)
      std::copy(d + r * view.ld, d + r * view.ld + view.cols,
                v.begin() + (row_begin + r) * view.cols);
    return Status();
  }
  std::map<HookPoint, std::vector<float>> rows;
};

class GradSink : public GradientSink {
 public:
  Status OnGradient(const HookPoint& hook, const float* rows, int64_t tokens,
                    int64_t width) override {
    grads[hook].assign(rows, rows + tokens * width);
    return Status();
  }
  std::map<HookPoint, std::vector<float>> grads;
};

// The grid's hooks as the forward meets them: the embeddings, the blocks
// layer by layer, then the final norm (HookSet sorts model-level hooks
// first).
std::vector<HookPoint> ExecutionOrder(const HookSet& set, int64_t layers) {
  std::vector<HookPoint> v = set.hooks();
  auto key = [layers](const HookPoint& h) {
    const bool after =
        h.site == HookSite::kFinalNorm || h.site == HookSite::kLogits;
    return std::pair<int64_t, int>(after ? layers : h.layer,
                                   static_cast<int>(h.site));
  };
  std::stable_sort(
      v.begin(), v.end(),
      [&](const HookPoint& a, const HookPoint& b) { return key(a) < key(b); });
  return v;
}

Status CheckInputs(std::span<const int32_t> clean,
                   std::span<const int32_t> corrupted,
                   const AttributeOptions& o) {
  if (clean.empty() || clean.size() != corrupted.size())
    return InvalidArgumentError(
        "the clean prompt has " + std::to_string(clean.size()) +
        " tokens and the corrupted one " + std::to_string(corrupted.size()) +
        "; attribution needs two non-empty prompts of one length");
  if (o.check_top > 0 && o.metric != GradMetricKind::kLogitDiff)
    return InvalidArgumentError(
        "--check-top runs loom patch, whose metric is logit-diff");
  if (o.check_top < 0)
    return InvalidArgumentError("--check-top must be >= 0, not " +
                                std::to_string(o.check_top));
  return Status();
}

// The true patch of the check_top largest |atp| cells among the hooks loom
// patch can patch (IsInterventionSite), through RunPatch on the grid of
// their hooks and positions.
Status CheckTopCells(const Model& model, std::span<const int32_t> clean,
                     std::span<const int32_t> corrupted,
                     const AttributeOptions& o,
                     const std::vector<HookPoint>& grid, AttributeResult* r) {
  struct Cell {
    size_t h, p;
    double atp;
  };
  std::vector<Cell> cells;
  for (size_t h = 0; h < r->hooks.size(); ++h) {
    if (!IsInterventionSite(grid[h].site)) continue;  // loom patch cannot
    for (size_t p = 0; p < r->positions.size(); ++p)
      cells.push_back({h, p, r->atp[h][p]});
  }
  std::stable_sort(cells.begin(), cells.end(),
                   [](const Cell& a, const Cell& b) {
                     return std::fabs(a.atp) > std::fabs(b.atp);
                   });
  cells.resize(std::min(cells.size(), static_cast<size_t>(o.check_top)));
  if (cells.empty()) return Status();
  PatchOptions po;
  po.hooks.clear();
  po.positions.kind = InterventionPositions::Kind::kList;
  for (const Cell& c : cells) {
    if (std::find(po.hooks.begin(), po.hooks.end(), r->hooks[c.h]) ==
        po.hooks.end())
      po.hooks.push_back(r->hooks[c.h]);
    const int64_t pos = r->positions[c.p];
    if (std::find(po.positions.list.begin(), po.positions.list.end(), pos) ==
        po.positions.list.end())
      po.positions.list.push_back(pos);
  }
  std::sort(po.positions.list.begin(), po.positions.list.end());
  po.answer = r->answer;
  po.wrong = r->wrong;
  ASSIGN_OR_RETURN(PatchResult pr, RunPatch(model, clean, corrupted, po));
  const size_t P = pr.positions.size();
  for (const Cell& c : cells) {
    const size_t row = static_cast<size_t>(
        std::find(pr.hooks.begin(), pr.hooks.end(), r->hooks[c.h]) -
        pr.hooks.begin());
    const size_t col = static_cast<size_t>(
        std::find(pr.positions.begin(), pr.positions.end(), r->positions[c.p]) -
        pr.positions.begin());
    r->checks.push_back(
        {r->hooks[c.h], r->positions[c.p], c.atp,
         pr.logit_diff[row * P + col] - pr.corrupted_logit_diff});
  }
  return Status();
}

// Columns per group of an AtP sum at `h`: a head's (per_head at
// attn.hook_z) or 0 (the whole width).
int64_t HeadDim(const HookPoint& h, const AttributeOptions& o,
                const ModelConfig& c) {
  return o.per_head && h.site == HookSite::kZ ? c.head_dim : 0;
}

// Adds sum over the width of (a - b)[t, :] . g[t, :] at each position to
// row [P] (in double from the f32 values; `magnitude`: its absolute value),
// and with hd > 0 the per-head sums to per_head [P][heads] likewise.
void AddAtp(const std::vector<float>& a, const std::vector<float>& b,
            const std::vector<float>& g, int64_t T, int64_t hd,
            const std::vector<int64_t>& positions, bool magnitude,
            std::vector<double>* row,
            std::vector<std::vector<double>>* per_head) {
  const int64_t W = static_cast<int64_t>(g.size()) / T;
  const int64_t groups = hd > 0 ? W / hd : 1, width = hd > 0 ? hd : W;
  row->resize(positions.size(), 0.0);
  if (hd > 0)
    per_head->resize(positions.size(),
                     std::vector<double>(static_cast<size_t>(groups), 0.0));
  for (size_t p = 0; p < positions.size(); ++p) {
    double sum = 0;
    for (int64_t k = 0; k < groups; ++k) {
      double part = 0;
      for (int64_t w = k * width; w < (k + 1) * width; ++w) {
        const size_t i = static_cast<size_t>(positions[p] * W + w);
        part += (static_cast<double>(a[i]) - b[i]) * g[i];
      }
      sum += part;
      if (hd > 0)
        (*per_head)[p][static_cast<size_t>(k)] +=
            magnitude ? std::fabs(part) : part;
    }
    (*row)[p] += magnitude ? std::fabs(sum) : sum;
  }
}

// AtP*'s GradDrop: one backward of the corrupted prompt per layer with that
// layer's branches dropped, |AtP| of each summed, over L - 1.
Status GradDrop(Backward& bw, const ModelConfig& c,
                std::span<const int32_t> corrupted, const GradMetric& m,
                const std::vector<HookPoint>& order, const GridSink& clean,
                const GridSink& corr, const AttributeOptions& o,
                AttributeResult* r) {
  const int64_t T = static_cast<int64_t>(corrupted.size());
  const int64_t L = c.num_layers;
  r->atp_star.assign(order.size(), {});
  r->atp_star_head.assign(order.size(), {});
  for (int64_t l = 0; l < L; ++l) {
    GradSink g;
    ASSIGN_OR_RETURN(const double value,
                     bw.Run(corrupted, m, &g, nullptr, /*drop_layer=*/l));
    (void)value;  // the forward's, unchanged by the drop
    for (size_t i = 0; i < order.size(); ++i)
      AddAtp(clean.rows.at(order[i]), corr.rows.at(order[i]),
             g.grads.at(order[i]), T, HeadDim(order[i], o, c), r->positions,
             true, &r->atp_star[i], &r->atp_star_head[i]);
  }
  const double scale = L > 1 ? 1.0 / static_cast<double>(L - 1) : 1.0;
  for (size_t i = 0; i < order.size(); ++i) {
    for (double& v : r->atp_star[i]) v *= scale;
    for (auto& heads : r->atp_star_head[i])
      for (double& v : heads) v *= scale;
  }
  return Status();
}

}  // namespace

StatusOr<AttributeMethod> ParseAttributeMethod(std::string_view text,
                                               std::string_view flag) {
  if (text == "atp") return AttributeMethod::kAtp;
  if (text == "atp-star") return AttributeMethod::kAtpStar;
  if (text == "ig") return AttributeMethod::kIg;
  return InvalidArgumentError(std::string(flag) + ": '" + std::string(text) +
                              "' is not a method (atp, atp-star, ig)");
}

StatusOr<AttributeResult> RunAttribute(const Model& model,
                                       std::span<const int32_t> clean,
                                       std::span<const int32_t> corrupted,
                                       const AttributeOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(CheckInputs(clean, corrupted, o));
  const ModelConfig& c = model.config();
  const int64_t T = static_cast<int64_t>(clean.size()), V = c.vocab_size;
  ASSIGN_OR_RETURN(const HookSet grid,
                   ResolveExtractHooks(o.hooks, o.layers, c));
  if (grid.empty()) return InvalidArgumentError("hooks: no hook to attribute");
  AttributeResult r;
  StatusOr<std::vector<int64_t>> positions = ResolvePositions(o.positions, T);
  if (!positions.ok()) return positions.status().WithContext("positions");
  r.positions = *std::move(positions);
  BackwardOptions bo;
  bo.max_tokens = T;
  bo.freeze_attn_pattern = o.freeze_attn_pattern;
  bo.freeze_norm_scale = o.freeze_norm_scale;
  bo.grad_hooks = grid;
  bo.act_hooks = grid;
  ASSIGN_OR_RETURN(std::unique_ptr<Backward> bw, Backward::Create(model, bo));
  const bool logprob = o.metric == GradMetricKind::kLogProb;
  GridSink clean_acts;
  ASSIGN_OR_RETURN(Backward::Evaluation ce,
                   bw->Evaluate(clean, logprob, &clean_acts));
  GradMetric m;
  m.kind = o.metric;
  if (!logprob) {
    for (const int64_t t : {o.answer, o.wrong})
      if (t >= V)
        return InvalidArgumentError(
            "--answer/--wrong: token " + std::to_string(t) +
            " is outside the vocabulary of " + std::to_string(V));
    m.answer = o.answer >= 0 ? static_cast<int32_t>(o.answer)
                             : ArgmaxLogit(ce.last_logits.data(), V, -1);
    // B: given, or the corrupted argmax (runner-up when it is the answer),
    // resolved by the corrupted run itself.
    m.wrong = static_cast<int32_t>(std::max<int64_t>(o.wrong, 0));
    m.wrong_from_argmax = o.wrong < 0;
  } else {
    r.metric_clean = ce.logprob;
  }
  GridSink corrupted_acts;
  GradSink grads;
  ASSIGN_OR_RETURN(r.metric_corrupted,
                   bw->Run(corrupted, m, &grads, &corrupted_acts));
  m = bw->resolved_metric();
  if (!logprob) {
    r.metric_clean =
        static_cast<double>(ce.last_logits[m.answer]) - ce.last_logits[m.wrong];
    r.corrupted_logits_last.assign(bw->last_logits().begin(),
                                   bw->last_logits().end());
  }
  r.clean_logits_last = std::move(ce.last_logits);
  r.answer = m.answer;
  r.wrong = m.wrong;
  const std::vector<HookPoint> order = ExecutionOrder(grid, c.num_layers);
  for (const HookPoint& h : order) {
    r.hooks.push_back(HookName(h));
    r.atp.emplace_back();
    r.atp_head.emplace_back();
    AddAtp(clean_acts.rows.at(h), corrupted_acts.rows.at(h), grads.grads.at(h),
           T, HeadDim(h, o, c), r.positions, false, &r.atp.back(),
           &r.atp_head.back());
  }
  if (o.grad_drop)
    RETURN_IF_ERROR(GradDrop(*bw, c, corrupted, m, order, clean_acts,
                             corrupted_acts, o, &r));
  if (o.check_top > 0)
    RETURN_IF_ERROR(CheckTopCells(model, clean, corrupted, o, order, &r));
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  return r;
}

IgOptions IgOptionsOf(const AttributeOptions& o, int64_t steps,
                      int64_t baseline_token) {
  IgOptions ig;
  ig.metric = o.metric;
  ig.answer = o.answer;
  ig.wrong = o.wrong;
  ig.steps = steps;
  ig.baseline_token = baseline_token;
  ig.freeze_attn_pattern = o.freeze_attn_pattern;
  ig.freeze_norm_scale = o.freeze_norm_scale;
  return ig;
}

StatusOr<IgAttribution> RunIntegratedGradients(const Model& model,
                                               std::span<const int32_t> ids,
                                               const IgOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (ids.empty()) return InvalidArgumentError("ig: an empty prompt");
  const int64_t V = model.config().vocab_size;
  for (const int64_t t : {o.answer, o.wrong, o.baseline_token})
    if (t >= V)
      return InvalidArgumentError(
          "--answer/--wrong/--baseline-token: token " + std::to_string(t) +
          " is outside the vocabulary of " + std::to_string(V));
  BackwardOptions bo;
  bo.max_tokens = static_cast<int64_t>(ids.size());
  bo.freeze_attn_pattern = o.freeze_attn_pattern;
  bo.freeze_norm_scale = o.freeze_norm_scale;
  ASSIGN_OR_RETURN(std::unique_ptr<Backward> bw, Backward::Create(model, bo));
  GradMetric m;
  m.kind = o.metric;
  IgAttribution r;
  if (o.metric == GradMetricKind::kLogitDiff) {
    ASSIGN_OR_RETURN(Backward::Evaluation e, bw->Evaluate(ids, false, nullptr));
    m.answer = o.answer >= 0 ? static_cast<int32_t>(o.answer)
                             : ArgmaxLogit(e.last_logits.data(), V, -1);
    m.wrong = o.wrong >= 0 ? static_cast<int32_t>(o.wrong)
                           : ArgmaxLogit(e.last_logits.data(), V, m.answer);
  }
  ASSIGN_OR_RETURN(
      Backward::IgResult ig,
      bw->IntegratedGradients(ids, m, o.steps,
                              static_cast<int32_t>(o.baseline_token)));
  r.per_token = std::move(ig.per_token);
  r.answer = m.answer;
  r.wrong = m.wrong;
  r.metric_input = ig.metric_input;
  r.metric_baseline = ig.metric_baseline;
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  return r;
}

nlohmann::json IgJson(const IgAttribution& r, const IgOptions& o) {
  const bool logprob = o.metric == GradMetricKind::kLogProb;
  nlohmann::json j;
  j["method"] = "ig";
  j["steps"] = o.steps;
  j["baseline_token"] = o.baseline_token;
  j["metric"] = logprob ? "logprob" : "logit-diff";
  if (!logprob) j["answer_token_ids"] = {r.answer, r.wrong};
  std::vector<int64_t> positions(r.per_token.size());
  for (size_t i = 0; i < positions.size(); ++i)
    positions[i] = static_cast<int64_t>(i);
  j["positions"] = positions;
  j["ig"] = r.per_token;
  j["metric_input"] = r.metric_input;
  j["metric_baseline"] = r.metric_baseline;
  double sum = 0;
  for (double v : r.per_token) sum += v;
  j["completeness_error"] = sum - (r.metric_input - r.metric_baseline);
  j["seconds"] = r.seconds;
  return j;
}

StatusOr<JobSpec> AttributeJob(const ModelConfig& c, int64_t tokens,
                               const AttributeOptions& o) {
  if (tokens < 1) return InvalidArgumentError("attribute: an empty prompt");
  ASSIGN_OR_RETURN(HookSet hooks, ResolveExtractHooks(o.hooks, o.layers, c));
  JobSpec job;
  job.tapped_hooks = BackwardTappedHooks(c, hooks);
  job.batch_tokens = tokens;
  job.context = tokens;
  job.seqs_per_batch = 1;
  job.hooks = hooks;
  job.selector = Selector::kAll;
  // The grid hooks' rows are held three times: the clean and corrupted
  // activations and the gradients.
  job.capture_buffers = 3;
  job.logits = true;
  job.logits_chunk_rows = std::min<int64_t>(256, tokens);
  job.backward_bytes = PlannedBackwardBytes(c, tokens, job.logits_chunk_rows);
  return job;
}

nlohmann::json AttributionJson(const AttributeResult& r,
                               const AttributeOptions& o) {
  const bool logprob = o.metric == GradMetricKind::kLogProb;
  nlohmann::json j;
  j["hooks"] = r.hooks;
  j["positions"] = r.positions;
  j["metric"] = logprob ? "logprob" : "logit-diff";
  if (!logprob) j["answer_token_ids"] = {r.answer, r.wrong};
  j["method"] = o.grad_drop ? "atp-star" : "atp";
  nlohmann::json freeze = nlohmann::json::array();
  if (o.freeze_attn_pattern) freeze.push_back("attn_pattern");
  if (o.freeze_norm_scale) freeze.push_back("norm_scale");
  j["freeze"] = freeze;
  j["metric_clean"] = r.metric_clean;
  j["metric_corrupted"] = r.metric_corrupted;
  j["atp"] = r.atp;
  // [hook][position][head], parallel to hooks ([] for rows without heads).
  if (o.per_head) j["atp_head"] = r.atp_head;
  if (o.grad_drop) {
    j["atp_star"] = r.atp_star;
    if (o.per_head) j["atp_star_head"] = r.atp_star_head;
  }
  nlohmann::json checks = nlohmann::json::array();
  for (const AttributeCheck& c : r.checks)
    checks.push_back({{"hook", c.hook},
                      {"position", c.position},
                      {"atp", c.atp},
                      {"true_patch", c.true_patch},
                      {"error", c.atp - c.true_patch}});
  j["checks"] = checks;
  j["seconds"] = r.seconds;
  return j;
}

}  // namespace loom::eval
