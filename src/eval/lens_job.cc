#include "src/eval/lens_job.h"

#include <chrono>
#include <memory>

#include "src/eval/lens.h"

namespace loom::eval {
namespace {

// Feeds each delivered residual hook through the lens into its grid row.
class LensSink : public HookSink {
 public:
  LensSink(Lens* lens, LensGrid* grid) : lens_(lens), grid_(grid) {}
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
};

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
  LensSink sink(lens.get(), &g);
  const int64_t seq_start[2] = {0, T};
  const Batch batch{ids, std::span<const int64_t>(seq_start, 2)};
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(executor->Forward(batch, &sink));
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
  out["executor_bytes"] = g.executor_bytes;
  out["lens_bytes"] = g.lens_bytes;
  out["seconds"] = g.seconds;
  out["lens_seconds"] = g.lens_seconds;
  return out;
}

}  // namespace loom::eval
