#include "src/eval/patch.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "src/eval/extract.h"
#include "src/eval/logits_head.h"

namespace loom::eval {
namespace {

// The final norm's row of each sequence's last token -> last_hidden [S, H];
// with `clean` set, every grid hook's rows of the one sequence -> (*clean)[h]
// [T, width(h)] (host memory: patching runs on the CPU backend).
class PatchSink : public HookSink {
 public:
  PatchSink(const std::vector<HookPoint>& grid, int64_t hidden,
            float* last_hidden)
      : grid_(grid), hidden_(hidden), last_hidden_(last_hidden) {}
  void set_clean(std::vector<std::vector<float>>* clean) { clean_ = clean; }

  Status OnActivation(const HookPoint& hook, const Batch& batch, int64_t,
                      int64_t, const ActivationView& view) override {
    const float* data = static_cast<const float*>(view.data);
    if (hook.site == HookSite::kFinalNorm) {
      for (int64_t s = 0; s < batch.num_seqs(); ++s)
        std::memcpy(last_hidden_ + s * hidden_,
                    data + (batch.seq_start[s + 1] - 1) * view.ld,
                    static_cast<size_t>(hidden_) * sizeof(float));
      return Status();
    }
    if (clean_ == nullptr) return Status();
    const auto it = std::find(grid_.begin(), grid_.end(), hook);
    if (it == grid_.end()) return Status();
    std::vector<float>& out =
        (*clean_)[static_cast<size_t>(it - grid_.begin())];
    out.resize(static_cast<size_t>(view.rows * view.cols));
    for (int64_t r = 0; r < view.rows; ++r)
      std::memcpy(out.data() + r * view.cols, data + r * view.ld,
                  static_cast<size_t>(view.cols) * sizeof(float));
    return Status();
  }

 private:
  const std::vector<HookPoint>& grid_;
  int64_t hidden_;
  float* last_hidden_;
  std::vector<std::vector<float>>* clean_ = nullptr;
};


// The grid's hooks (every one an intervention site) and positions.
Status ResolveGrid(const ModelConfig& c, int64_t T, const PatchOptions& o,
                   std::vector<HookPoint>* hooks,
                   std::vector<int64_t>* positions) {
  ASSIGN_OR_RETURN(const HookSet set,
                   ResolveExtractHooks(o.hooks, o.layers, c));
  for (const HookPoint& h : set.hooks()) {
    if (!IsInterventionSite(h.site))
      return InvalidArgumentError(
          "hooks: '" + HookName(h) +
          "' cannot be patched (the residual stream, hook_attn_out, "
          "hook_mlp_out, attn.hook_z and mlp.hook_post can)");
    hooks->push_back(h);
  }
  if (hooks->empty()) return InvalidArgumentError("hooks: no hook to patch");
  StatusOr<std::vector<int64_t>> p = ResolvePositions(o.positions, T);
  if (!p.ok()) return p.status().WithContext("positions");
  *positions = *std::move(p);
  return Status();
}

Status CheckPromptLengths(int64_t clean, int64_t corrupted) {
  if (clean == 0 || corrupted != clean)
    return InvalidArgumentError(
        "the clean prompt has " + std::to_string(clean) +
        " tokens and the corrupted one " + std::to_string(corrupted) +
        "; patching needs two non-empty prompts of one length");
  return Status();
}

// The grid and the executor's shape, for both the plan (PatchJob) and the
// run (RunPatch).
struct PatchShape {
  std::vector<HookPoint> grid;
  std::vector<int64_t> positions;  // [P]
  // The grid's rows: (index into `grid`, head or -1).
  std::vector<std::pair<size_t, int64_t>> rows;
  int64_t per_forward = 0;  // sequences of T tokens per forward
  HookSet hooks;            // the grid's and the final norm
};

StatusOr<PatchShape> ShapeOf(const ModelConfig& c, int64_t T,
                             const PatchOptions& o) {
  PatchShape sh;
  RETURN_IF_ERROR(ResolveGrid(c, T, o, &sh.grid, &sh.positions));
  for (size_t g = 0; g < sh.grid.size(); ++g) {
    const bool heads = o.per_head && sh.grid[g].site == HookSite::kZ;
    for (int64_t h = heads ? 0 : -1; h < (heads ? c.num_heads : 0); ++h)
      sh.rows.emplace_back(g, h);
  }
  const int64_t cells = static_cast<int64_t>(sh.rows.size()) *
                        static_cast<int64_t>(sh.positions.size());
  // One executor for the three kinds of forwards: the grid hooks (captured
  // by the clean run) and the final norm (every run's last rows).
  const int64_t budget = std::max(
      T, o.batch_tokens > 0 ? o.batch_tokens : DefaultContext(c, 4096));
  sh.per_forward = std::min(budget / T, std::max<int64_t>(cells, 2));
  for (const HookPoint& h : sh.grid) sh.hooks.Add(h);
  sh.hooks.Add({HookSite::kFinalNorm, -1});
  return sh;
}

double LogitDiff(const float* logits, int32_t a, int32_t b) {
  return double{logits[a]} - double{logits[b]};
}

// Whether `b` holds both un-patched runs of this job.
bool Reusable(const PatchBaselines* b, std::span<const int32_t> clean,
              std::span<const int32_t> corrupted,
              const std::vector<std::string>& hooks, bool hf_bf16) {
  return b != nullptr && b->has_clean() && b->has_corrupted() &&
         b->hf_bf16_activations == hf_bf16 && b->hooks == hooks &&
         b->clean_rows.size() == hooks.size() &&
         std::equal(clean.begin(), clean.end(), b->clean_ids.begin(),
                    b->clean_ids.end()) &&
         std::equal(corrupted.begin(), corrupted.end(),
                    b->corrupted_ids.begin(), b->corrupted_ids.end());
}

}  // namespace

int64_t PatchBaselines::clean_bytes() const {
  int64_t n = static_cast<int64_t>(clean_logits_last.size());
  for (const std::vector<float>& rows : clean_rows)
    n += static_cast<int64_t>(rows.size());
  return n * static_cast<int64_t>(sizeof(float));
}

int64_t PatchBaselines::corrupted_bytes() const {
  return static_cast<int64_t>(corrupted_logits_last.size() * sizeof(float));
}

Status CheckPatchInputs(std::span<const int32_t> clean,
                        std::span<const int32_t> corrupted,
                        const PatchOptions& o) {
  RETURN_IF_ERROR(CheckPromptLengths(static_cast<int64_t>(clean.size()),
                                     static_cast<int64_t>(corrupted.size())));
  if (std::equal(clean.begin(), clean.end(), corrupted.begin()))
    return InvalidArgumentError(
        "the clean and corrupted prompts are the same " +
        std::to_string(clean.size()) +
        " tokens: the corrupted run is the clean one, so every recovery "
        "(patched - corrupted) / (clean - corrupted) would be 0/0; give "
        "prompts that differ");
  if (o.answer >= 0 && o.answer == o.wrong)
    return InvalidArgumentError(
        "answer and wrong are the same token " + std::to_string(o.answer) +
        ": every logit difference would be 0 and every recovery undefined; "
        "give two different tokens");
  return Status();
}

StatusOr<PatchResult> RunPatch(const Model& model,
                               std::span<const int32_t> clean,
                               std::span<const int32_t> corrupted,
                               const PatchOptions& o) {
  const ModelConfig& c = model.config();
  const int64_t T = static_cast<int64_t>(clean.size()), H = c.hidden_size,
                V = c.vocab_size;
  RETURN_IF_ERROR(
      CheckPromptLengths(T, static_cast<int64_t>(corrupted.size())));
  for (const int64_t id : {o.answer, o.wrong})
    if (id >= V)
      return InvalidArgumentError("token " + std::to_string(id) +
                                  " is outside the vocabulary [0, " +
                                  std::to_string(V) + ")");
  PatchResult r;
  ASSIGN_OR_RETURN(const PatchShape sh, ShapeOf(c, T, o));
  const std::vector<HookPoint>& grid = sh.grid;
  const std::vector<std::pair<size_t, int64_t>>& rows = sh.rows;
  r.positions = sh.positions;
  for (const auto& [g, h] : rows) {
    r.hooks.push_back(HookName(grid[g]));
    r.heads.push_back(h);
  }
  const int64_t P = static_cast<int64_t>(r.positions.size());
  const int64_t cells = static_cast<int64_t>(rows.size()) * P;
  const int64_t per_forward = sh.per_forward;
  const HookSet& hooks = sh.hooks;
  ExecutorOptions eo;
  eo.max_tokens = per_forward * T;
  eo.max_seq_len = T;
  eo.hf_bf16_activations = o.hf_bf16_activations;
  eo.segments = o.segments;
  ASSIGN_OR_RETURN(auto ex, Executor::Create(model, hooks, eo));
  ASSIGN_OR_RETURN(auto head, LogitsHead::Create(model, per_forward));

  // Everything the forwards touch, sized here.
  std::vector<int32_t> ids(static_cast<size_t>(per_forward * T));
  std::vector<int64_t> starts(static_cast<size_t>(per_forward) + 1);
  std::vector<float> last_hidden(static_cast<size_t>(per_forward * H));
  std::vector<std::vector<float>> clean_rows(grid.size());
  std::vector<Intervention> cell_edit(static_cast<size_t>(cells));
  std::vector<SequenceEdit> edits;
  edits.reserve(static_cast<size_t>(per_forward));
  r.patched_logits_last.resize(static_cast<size_t>(cells * V));
  PatchSink sink(grid, H, last_hidden.data());
  const auto start = std::chrono::steady_clock::now();

  auto check_cancelled = [&]() -> Status {
    if (o.cancelled && o.cancelled()) return CancelledError("interrupted");
    return Status();
  };
  // The two un-patched runs (or the reused ones).
  std::vector<std::string> grid_names;
  for (const HookPoint& h : grid) grid_names.push_back(HookName(h));
  r.reused =
      Reusable(o.reuse, clean, corrupted, grid_names, o.hf_bf16_activations);
  // The clean captures the cells read: this job's, or the reused ones.
  const std::vector<std::vector<float>>& clean_source =
      r.reused ? o.reuse->clean_rows : clean_rows;
  if (r.reused) {
    r.clean_logits_last = o.reuse->clean_logits_last;
    r.corrupted_logits_last = o.reuse->corrupted_logits_last;
  }
  for (const bool is_clean : {true, false}) {
    if (r.reused) break;
    RETURN_IF_ERROR(check_cancelled());
    const std::span<const int32_t> prompt = is_clean ? clean : corrupted;
    starts[0] = 0;
    starts[1] = T;
    sink.set_clean(is_clean ? &clean_rows : nullptr);
    RETURN_IF_ERROR(ex->Forward(Batch{prompt, {starts.data(), 2}}, &sink));
    const float* logits = head->Compute(last_hidden.data(), 1);
    (is_clean ? r.clean_logits_last : r.corrupted_logits_last)
        .assign(logits, logits + V);
    ++r.forwards;
  }
  sink.set_clean(nullptr);
  r.answer = o.answer >= 0 ? static_cast<int32_t>(o.answer)
                           : ArgmaxLogit(r.clean_logits_last.data(), V, -1);
  r.wrong = o.wrong >= 0 ? static_cast<int32_t>(o.wrong)
                         : ArgmaxLogit(r.corrupted_logits_last.data(), V, -1);
  if (o.wrong < 0 && r.wrong == r.answer)
    r.wrong = ArgmaxLogit(r.corrupted_logits_last.data(), V, r.answer);
  r.clean_logit_diff = LogitDiff(r.clean_logits_last.data(), r.answer, r.wrong);
  r.corrupted_logit_diff =
      LogitDiff(r.corrupted_logits_last.data(), r.answer, r.wrong);

  // The cells, per_forward at a time: cell k = (row k / P, position k % P).
  for (int64_t k = 0; k < cells; ++k) {
    Intervention& iv = cell_edit[static_cast<size_t>(k)];
    const auto [g, head] = rows[static_cast<size_t>(k / P)];
    iv.hook = grid[g];
    iv.mode =
        head < 0 ? InterventionMode::kPatch : InterventionMode::kPatchHead;
    iv.head = head;
    iv.positions.kind = InterventionPositions::Kind::kList;
    iv.positions.list = {r.positions[static_cast<size_t>(k % P)]};
  }
  for (int64_t k0 = 0; k0 < cells; k0 += per_forward) {
    RETURN_IF_ERROR(check_cancelled());
    const int64_t S = std::min(per_forward, cells - k0);
    edits.clear();
    for (int64_t s = 0; s < S; ++s) {
      std::copy(corrupted.begin(), corrupted.end(), ids.begin() + s * T);
      starts[static_cast<size_t>(s) + 1] = (s + 1) * T;
      const int64_t k = k0 + s;
      const std::vector<float>& src =
          clean_source[rows[static_cast<size_t>(k / P)].first];
      const int64_t width = static_cast<int64_t>(src.size()) / T;
      edits.push_back({s, T, &cell_edit[static_cast<size_t>(k)], false,
                       src.data() + r.positions[k % P] * width});
    }
    RETURN_IF_ERROR(
        ex->Forward(Batch{{ids.data(), static_cast<size_t>(S * T)},
                          {starts.data(), static_cast<size_t>(S) + 1}},
                    &sink, nullptr, edits));
    const float* logits = head->Compute(last_hidden.data(), S);
    std::copy(logits, logits + S * V, r.patched_logits_last.begin() + k0 * V);
    ++r.forwards;
    if (o.progress) o.progress(k0 + S, cells);
  }
  const double denom = r.clean_logit_diff - r.corrupted_logit_diff;
  for (int64_t k = 0; k < cells; ++k) {
    const double ld =
        LogitDiff(r.patched_logits_last.data() + k * V, r.answer, r.wrong);
    r.logit_diff.push_back(ld);
    r.recovery.push_back((ld - r.corrupted_logit_diff) / denom);
  }
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (r.reused) return r;  // the caller holds them already
  PatchBaselines& b = r.baselines;
  b.clean_ids.assign(clean.begin(), clean.end());
  b.corrupted_ids.assign(corrupted.begin(), corrupted.end());
  b.hooks = std::move(grid_names);
  b.hf_bf16_activations = o.hf_bf16_activations;
  b.clean_rows = std::move(clean_rows);
  b.clean_logits_last = r.clean_logits_last;
  b.corrupted_logits_last = r.corrupted_logits_last;
  return r;
}

StatusOr<JobSpec> PatchJob(const ModelConfig& c, int64_t prompt_tokens,
                           int64_t corrupted_tokens, const PatchOptions& o) {
  RETURN_IF_ERROR(CheckPromptLengths(prompt_tokens, corrupted_tokens));
  ASSIGN_OR_RETURN(const PatchShape sh, ShapeOf(c, prompt_tokens, o));
  JobSpec job;
  job.batch_tokens = sh.per_forward * prompt_tokens;
  job.context = prompt_tokens;
  job.seqs_per_batch = sh.per_forward;
  job.hooks = sh.hooks;
  job.selector = Selector::kAll;
  // LogitsHead: the last row of every sequence of a forward.
  job.logits = true;
  job.logits_chunk_rows = sh.per_forward;
  return job;
}

nlohmann::json PatchJson(const PatchResult& r) {
  const size_t P = r.positions.size();
  nlohmann::json ld = nlohmann::json::array(), rec = nlohmann::json::array();
  for (size_t h = 0; h < r.hooks.size(); ++h) {
    ld.push_back(std::vector<double>(r.logit_diff.begin() + h * P,
                                     r.logit_diff.begin() + (h + 1) * P));
    rec.push_back(std::vector<double>(r.recovery.begin() + h * P,
                                      r.recovery.begin() + (h + 1) * P));
  }
  nlohmann::json out = {{"hooks", r.hooks}};
  if (std::any_of(r.heads.begin(), r.heads.end(),
                  [](int64_t h) { return h >= 0; }))
    out["heads"] = r.heads;
  out.update(
      nlohmann::json{{"positions", r.positions},
                     {"answer_token_ids", {{"A", r.answer}, {"B", r.wrong}}},
                     {"metric", "logit_diff"},
                     {"clean_logit_diff", r.clean_logit_diff},
                     {"corrupted_logit_diff", r.corrupted_logit_diff},
                     {"logit_diff", ld},
                     {"recovery", rec},
                     {"forwards", r.forwards},
                     {"seconds", r.seconds}});
  return out;
}

int32_t ArgmaxLogit(const float* logits, int64_t V, int64_t skip) {
  int32_t best = -1;
  for (int64_t v = 0; v < V; ++v)
    if (v != skip && (best < 0 || logits[v] > logits[best]))
      best = static_cast<int32_t>(v);
  return best;
}

}  // namespace loom::eval
