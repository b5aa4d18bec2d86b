#include "src/eval/lens_job.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "src/eval/lens.h"

namespace loom::eval {
namespace {

// Feeds each delivered residual hook through the lens into its grid row
// (with `kept`: and keeps its rows there, [hooks, tokens, cols]).
class LensSink : public HookSink {
 public:
  LensSink(Lens* lens, LensGrid* grid, std::vector<float>* kept)
      : lens_(lens), grid_(grid), kept_(kept) {}
  Status OnActivation(const HookPoint& hook, const Batch& batch, int64_t seq,
                      int64_t row_begin, const ActivationView& view) override {
    size_t h = 0;
    while (h < grid_->hooks.size() && !(grid_->hooks[h] == hook)) ++h;
    if (h == grid_->hooks.size()) return Status();
    if (!view.host_f32())
      return UnimplementedError(
          "loom lens: " + HookName(hook) +
          " is computed off the host, and the lens runs its head on the "
          "host; place the layers on the CPU");
    if (view.ld != view.cols || row_begin != 0 ||
        view.rows != batch.num_tokens())
      return InternalError("lens: " + HookName(hook) + " delivered in pieces");
    const int64_t T = grid_->tokens, k = grid_->topk;
    LensOutputs out;
    out.topk = k;
    out.topk_ids = grid_->topk_ids.data() + h * T * k;
    out.topk_logits = grid_->topk_logits.data() + h * T * k;
    if (kept_ != nullptr) {
      const size_t n = static_cast<size_t>(view.rows * view.cols);
      std::copy(view.f32(), view.f32() + n, kept_->begin() + h * n);
    }
    const auto start = std::chrono::steady_clock::now();
    const Status s = lens_->Run(hook, view.f32(), view.rows, out);
    grid_->lens_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    return s;
  }

 private:
  Lens* lens_;
  LensGrid* grid_;
  std::vector<float>* kept_;
};

// Row r of logits [C, V] as log-probabilities (f32 values, f64 sum).
void LogSoftmax(const float* logits, int64_t V, float* out) {
  const float max = *std::max_element(logits, logits + V);
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(double{logits[v]} - max);
  const double log_z = max + std::log(sum);
  for (int64_t v = 0; v < V; ++v)
    out[v] = static_cast<float>(double{logits[v]} - log_z);
}

// g->kl from the kept rows [hooks, T, H]: chunk by chunk of positions, the
// final hook's log-probabilities, then each hook's against them.
Status KlToFinal(Lens& lens, const std::vector<float>& kept, int64_t H,
                 LensGrid* g) {
  const int64_t T = g->tokens, V = lens.vocab(), C = lens.chunk_rows();
  const size_t last = g->hooks.size() - 1;
  std::vector<float> final_lp(static_cast<size_t>(C * V)),
      logits(static_cast<size_t>(C * V)), lp(static_cast<size_t>(V));
  g->kl.assign(g->hooks.size() * static_cast<size_t>(T), 0.0f);
  for (int64_t r0 = 0; r0 < T; r0 += C) {
    const int64_t n = std::min(C, T - r0);
    auto rows = [&](size_t h) { return kept.data() + (h * T + r0) * H; };
    LensOutputs o;
    o.logits = logits.data();
    RETURN_IF_ERROR(lens.Run(g->hooks[last], rows(last), n, o));
    for (int64_t i = 0; i < n; ++i)
      LogSoftmax(logits.data() + i * V, V, final_lp.data() + i * V);
    for (size_t h = 0; h < last; ++h) {
      RETURN_IF_ERROR(lens.Run(g->hooks[h], rows(h), n, o));
      for (int64_t i = 0; i < n; ++i) {
        LogSoftmax(logits.data() + i * V, V, lp.data());
        const float* f = final_lp.data() + i * V;
        double kl = 0;
        for (int64_t v = 0; v < V; ++v)
          kl += std::exp(double{f[v]}) * (double{f[v]} - lp[v]);
        g->kl[h * T + r0 + i] = static_cast<float>(kl);
      }
    }
  }
  return Status();
}

}  // namespace

StatusOr<std::vector<HookPoint>> LensGridHooks(const ModelConfig& c,
                                               const LensGridOptions& o) {
  std::vector<std::string> hooks = o.hooks;
  if (hooks.empty())
    hooks = {"blocks.0.hook_resid_pre", "blocks.*.hook_resid_post"};
  ASSIGN_OR_RETURN(const HookSet set,
                   ResolveHooks(hooks, o.layers, c, !o.layers.empty()));
  if (set.empty()) return InvalidArgumentError("--hooks: no hook given");
  for (const HookPoint& h : set.hooks()) {
    RETURN_IF_ERROR(CheckLensHook(h, c, o.tuned).status());
  }
  return set.hooks();
}

StatusOr<JobSpec> LensGridJob(const ModelConfig& c, int64_t tokens,
                              const LensGridOptions& o) {
  if (tokens < 1) return InvalidArgumentError("the prompt has no tokens");
  if (o.chunk_rows < 1)
    return InvalidArgumentError(
        "--chunk-rows: " + std::to_string(o.chunk_rows) + " is < 1");
  RETURN_IF_ERROR(eval::CheckLensTopK(o.topk, c.vocab_size, 1, "--topk"));
  ASSIGN_OR_RETURN(const std::vector<HookPoint> hooks, LensGridHooks(c, o));
  JobSpec job;
  // KL to the final distribution: the last residual stream is a row.
  if (o.kl) job.hooks.Add({HookSite::kResidPost, c.num_layers - 1});
  job.batch_tokens = tokens;
  job.context = tokens;
  job.seqs_per_batch = 1;
  for (const HookPoint& h : hooks) job.hooks.Add(h);
  job.selector = Selector::kAll;
  return job;
}

StatusOr<LensGrid> RunLensGrid(const Model& model, std::span<const int32_t> ids,
                               const LensGridOptions& o) {
  const ModelConfig& c = model.config();
  const int64_t T = static_cast<int64_t>(ids.size());
  ASSIGN_OR_RETURN(const JobSpec job, LensGridJob(c, T, o));
  LensGrid g;
  g.hooks = job.hooks.hooks();
  g.tokens = T;
  g.topk = o.topk;
  const size_t cells = g.hooks.size() * static_cast<size_t>(T * o.topk);
  g.topk_ids.resize(cells);
  g.topk_logits.resize(cells);
  ExecutorOptions eo;
  eo.max_tokens = T;
  eo.max_seq_len = T;
  eo.hf_bf16_activations = o.hf_bf16_activations;
  eo.segments = o.segments;
  ASSIGN_OR_RETURN(auto executor, Executor::Create(model, job.hooks, eo));
  ASSIGN_OR_RETURN(auto lens,
                   Lens::Create(model, o.tuned, std::min(T, o.chunk_rows)));
  g.executor_bytes = executor->arena_bytes();
  g.lens_bytes = lens->bytes();
  std::vector<float> kept;
  if (o.kl) {
    kept.resize(g.hooks.size() * static_cast<size_t>(T * c.hidden_size));
    g.kl_bytes = static_cast<int64_t>(kept.size() * sizeof(float)) +
                 2 * lens->chunk_rows() * lens->vocab() *
                     static_cast<int64_t>(sizeof(float));
  }
  LensSink sink(lens.get(), &g, o.kl ? &kept : nullptr);
  const int64_t seq_start[2] = {0, T};
  const Batch batch{ids, std::span<const int64_t>(seq_start, 2)};
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(executor->Forward(batch, &sink));
  if (o.kl) {
    if (!(g.hooks.back() == HookPoint{HookSite::kResidPost, c.num_layers - 1}))
      return InternalError("lens: the final residual hook is not the last row");
    RETURN_IF_ERROR(KlToFinal(*lens, kept, c.hidden_size, &g));
  }
  g.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return g;
}

nlohmann::json LensGridJson(const LensGrid& g, std::span<const int32_t> ids,
                            const tok::Tokenizer* tokenizer) {
  using json = nlohmann::json;
  const int64_t T = g.tokens, k = g.topk;
  auto piece = [&](int32_t id) -> std::string {
    tok::DecodeOptions d;
    d.skip_special_tokens = false;
    d.clean_up_tokenization_spaces = false;
    StatusOr<std::string> s =
        tokenizer->Decode(std::span<const int32_t>(&id, 1), d);
    return s.ok() ? *s : "<" + std::to_string(id) + ">";
  };
  json hooks = json::array(), top_ids = json::array(),
       top_logits = json::array(), top_tokens = json::array();
  for (size_t h = 0; h < g.hooks.size(); ++h) {
    hooks.push_back(HookName(g.hooks[h]));
    json ri = json::array(), rl = json::array(), rt = json::array();
    for (int64_t t = 0; t < T; ++t) {
      const size_t at = (h * T + t) * k;
      ri.push_back(std::vector<int32_t>(g.topk_ids.begin() + at,
                                        g.topk_ids.begin() + at + k));
      rl.push_back(std::vector<float>(g.topk_logits.begin() + at,
                                      g.topk_logits.begin() + at + k));
      if (tokenizer != nullptr) {
        json words = json::array();
        for (int64_t r = 0; r < k; ++r)
          words.push_back(piece(g.topk_ids[at + r]));
        rt.push_back(std::move(words));
      }
    }
    top_ids.push_back(std::move(ri));
    top_logits.push_back(std::move(rl));
    if (tokenizer != nullptr) top_tokens.push_back(std::move(rt));
  }
  json out = {{"hooks", hooks},
              {"input_ids", std::vector<int32_t>(ids.begin(), ids.end())},
              {"topk", k},
              {"topk_ids", top_ids},
              {"topk_logits", top_logits}};
  if (tokenizer != nullptr) {
    json tokens = json::array();
    for (int32_t id : ids) tokens.push_back(piece(id));
    out["tokens"] = tokens;
    out["topk_tokens"] = top_tokens;
  }
  if (!g.kl.empty()) {
    json kl = json::array();
    for (size_t h = 0; h < g.hooks.size(); ++h)
      kl.push_back(std::vector<float>(g.kl.begin() + h * T,
                                      g.kl.begin() + (h + 1) * T));
    out["kl_to_final"] = kl;
    out["kl_bytes"] = g.kl_bytes;
  }
  out["executor_bytes"] = g.executor_bytes;
  out["lens_bytes"] = g.lens_bytes;
  out["seconds"] = g.seconds;
  out["lens_seconds"] = g.lens_seconds;
  return out;
}

}  // namespace loom::eval
