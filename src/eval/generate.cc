#include "src/eval/generate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <variant>

#include "src/backend/registry.h"
#include "src/eval/job_plan.h"
#include "src/eval/params.h"
#include "src/model/config_reader.h"
#include "src/tokenizer/tokenizer.h"

namespace loom::eval {
namespace {

std::string Num(double x) {
  char b[32];
  std::snprintf(b, sizeof(b), "%g", x);
  return b;
}

}  // namespace

Status ValidateSampling(const SamplingOptions& o) {
  // The ranges of the generation parameters' table (src/eval/params.h),
  // which every front end reads too.
  SamplingOptions copy = o;
  int64_t max_tokens = 0;
  std::vector<std::string> stop;
  for (const ParamField& f : GenerationParams(&max_tokens, &copy, &stop)) {
    double v = 0;
    if (auto* x = std::get_if<float*>(&f.target)) {
      v = **x;
    } else if (auto* i = std::get_if<int64_t*>(&f.target);
               i != nullptr && *i != &max_tokens) {
      v = static_cast<double>(**i);
    } else {
      continue;  // seed: any value; max_tokens and stop: the request's
    }
    if (!InParamRange(f, v))
      return InvalidArgumentError(std::string(f.spec->name) + ": expected " +
                                  ParamRangeText(f) + ", got " + Num(v));
  }
  return Status();
}

int32_t SelectToken(const float* logits, int64_t vocab,
                    const SamplingOptions& o, std::mt19937_64& rng,
                    SamplingScratch& scratch) {
  if (o.temperature == 0.0f) return static_cast<int32_t>(ArgMax(logits, vocab));
  const float kNegInf = -std::numeric_limits<float>::infinity();
  float* x = scratch.values.data();  // [V]
  for (int64_t i = 0; i < vocab; ++i) x[i] = logits[i] / o.temperature;
  int32_t* order = scratch.order.data();  // [V]
  for (int64_t i = 0; i < vocab; ++i) order[i] = static_cast<int32_t>(i);
  if (o.top_k > 0 && o.top_k < vocab) {
    // The k-th largest value; everything strictly below it is removed.
    std::nth_element(order, order + o.top_k - 1, order + vocab,
                     [x](int32_t a, int32_t b) { return x[a] > x[b]; });
    const float kth = x[order[o.top_k - 1]];
    for (int64_t i = 0; i < vocab; ++i)
      if (x[i] < kth) x[i] = kNegInf;
  }
  double* p = scratch.probs.data();  // [V]
  auto softmax = [&]() {
    float mx = kNegInf;
    for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, x[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i) {
      p[i] = x[i] == kNegInf ? 0.0 : std::exp(double{x[i]} - mx);
      sum += p[i];
    }
    for (int64_t i = 0; i < vocab; ++i) p[i] /= sum;
  };
  softmax();
  if (o.top_p < 1.0f) {
    // Ascending probability, ties: higher id first (lower ids are dropped
    // last).
    for (int64_t i = 0; i < vocab; ++i) order[i] = static_cast<int32_t>(i);
    std::sort(order, order + vocab, [p](int32_t a, int32_t b) {
      return p[a] != p[b] ? p[a] < p[b] : a > b;
    });
    double cum = 0.0;
    for (int64_t r = 0; r + 1 < vocab; ++r) {  // the most probable stays
      cum += p[order[r]];
      if (cum > 1.0 - static_cast<double>(o.top_p)) break;
      x[order[r]] = kNegInf;
    }
    softmax();
  }
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
  double cum = 0.0;
  int32_t last = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    if (p[i] == 0.0) continue;
    last = static_cast<int32_t>(i);
    cum += p[i];
    if (cum > u) return last;
  }
  return last;  // round-off: u above the summed mass
}

StatusOr<std::vector<int32_t>> LoadStopIds(const Model& model) {
  std::vector<int32_t> ids;
  auto add = [&ids](int64_t id) {
    if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end())
      ids.push_back(static_cast<int32_t>(id));
  };
  add(model.config().eos_token_id);
  const std::string path =
      (std::filesystem::path(model.dir()) / "generation_config.json").string();
  // Optional: absent, the config's eos; any other error (a directory, not
  // JSON) is reported as for config.json.
  StatusOr<ConfigReader> config = ConfigReader::FromFile(path);
  if (config.status().code() == StatusCode::kNotFound) return ids;
  if (!config.ok()) return config.status();
  const nlohmann::json& j = config->json();
  if (j.contains("eos_token_id")) {
    const nlohmann::json& e = j["eos_token_id"];
    if (e.is_number_integer()) {
      add(e.get<int64_t>());
    } else if (e.is_array()) {
      for (const nlohmann::json& x : e)
        if (x.is_number_integer()) add(x.get<int64_t>());
    }
  }
  return ids;
}

// Copies the final-norm row of each sequence's last token to last_hidden_
// (from a device's memory with its backend's Copy), and passes every hook on
// to the step's capture sink, if any.
class Generator::LastRowSink : public HookSink {
 public:
  LastRowSink(std::vector<float>& out, Backend* backend)
      : out_(out), backend_(backend) {}
  void set_capture(HookSink* capture) { capture_ = capture; }
  Status OnActivation(const HookPoint& hook, const Batch& batch, int64_t seq,
                      int64_t row_begin, const ActivationView& view) override {
    if (capture_ != nullptr)
      RETURN_IF_ERROR(
          capture_->OnActivation(hook, batch, seq, row_begin, view));
    if (hook.site != HookSite::kFinalNorm) return Status();
    if (view.dtype != DType::kF32)
      return UnimplementedError("generate: final-norm rows in " +
                                std::string(DTypeName(view.dtype)) +
                                " (f32 expected)");
    const float* rows = static_cast<const float*>(view.data);
    for (int64_t s = 0; s < batch.num_seqs(); ++s) {
      const float* row = rows + (batch.seq_start[s + 1] - 1) * view.ld;
      float* dst = out_.data() + s * view.cols;
      if (view.host_f32()) {
        std::copy(row, row + view.cols, dst);
        continue;
      }
      RETURN_IF_ERROR(backend_->Copy(dst, DeviceRef{}, row, view.device,
                                     view.cols * int64_t{sizeof(float)}));
    }
    return Status();
  }

 private:
  std::vector<float>& out_;
  Backend* backend_;  // the executor's: copies device rows to the host
  HookSink* capture_ = nullptr;
};

Generator::Generator(const Model& model, const Options& options)
    : model_(model), options_(options) {}

Generator::~Generator() = default;

StatusOr<Generator::Options> Generator::Resolve(const ModelConfig& c,
                                                const Options& options) {
  Options o = options;
  if (o.context <= 0) o.context = DefaultContext(c, kGenerationContext);
  if (o.slots <= 0 || o.prefill_chunk <= 0)
    return InvalidArgumentError("generate: slots (" + std::to_string(o.slots) +
                                ") and prefill_chunk (" +
                                std::to_string(o.prefill_chunk) +
                                ") must be > 0");
  if (o.context > c.max_position_embeddings)
    return OutOfRangeError("generate: context of " + std::to_string(o.context) +
                           " positions exceeds max_position_embeddings = " +
                           std::to_string(c.max_position_embeddings));
  o.prefill_chunk = std::min(o.prefill_chunk, o.context);
  if (o.batch_tokens <= 0) o.batch_tokens = std::max(o.prefill_chunk, o.slots);
  if (o.batch_tokens < std::max(o.prefill_chunk, o.slots))
    return InvalidArgumentError(
        "generate: batch_tokens (" + std::to_string(o.batch_tokens) +
        ") must hold a prefill chunk (" + std::to_string(o.prefill_chunk) +
        ") and one token per slot (" + std::to_string(o.slots) + ")");
  return o;
}

JobSpec Generator::Job(const ModelConfig& c, const Options& o) {
  JobSpec job;
  job.mode = JobMode::kGeneration;
  job.batch_tokens = o.batch_tokens;
  job.context = std::min(o.context, c.max_position_embeddings);
  job.seqs_per_batch = o.slots;
  job.kv_seqs = o.slots;
  job.kv_page_size = o.paging.page_size;
  job.kv_pages = o.paging.num_pages;
  job.hooks = o.capture_hooks;
  job.hooks.Add({HookSite::kFinalNorm, -1});
  job.selector = Selector::kAll;
  // LogitsHead: one row of logits per slot.
  job.logits = true;
  job.logits_chunk_rows = o.slots;
  return job;
}

StatusOr<std::unique_ptr<Generator>> Generator::Create(const Model& model,
                                                       const Options& options) {
  const ModelConfig& c = model.config();
  ASSIGN_OR_RETURN(const Options o, Resolve(c, options));
  auto g = std::unique_ptr<Generator>(new Generator(model, o));
  Backend* backend = o.backend;
  if (backend == nullptr && o.segments.empty()) {
    ASSIGN_OR_RETURN(g->owned_backend_, CreateBackend("cpu"));
    backend = g->owned_backend_.get();
  }
  HookSet hooks = o.capture_hooks;
  hooks.Add({HookSite::kFinalNorm, -1});
  ExecutorOptions eo;
  eo.max_tokens = o.batch_tokens;
  eo.max_seq_len = o.prefill_chunk;
  eo.backend = backend;
  eo.segments = o.segments;
  ASSIGN_OR_RETURN(g->executor_, Executor::Create(model, hooks, eo));
  // Each layer's cache where the executor computes it.
  ASSIGN_OR_RETURN(g->cache_,
                   KvCache::Create(c, o.slots, o.context,
                                   g->executor_->LayerBackends(), o.paging));
  ASSIGN_OR_RETURN(g->head_, LogitsHead::Create(model, o.slots));
  g->ids_.resize(static_cast<size_t>(eo.max_tokens));
  g->seq_start_.resize(static_cast<size_t>(o.slots) + 1);
  g->slot_.resize(static_cast<size_t>(o.slots));
  g->pos0_.resize(static_cast<size_t>(o.slots));
  g->last_hidden_.resize(static_cast<size_t>(o.slots * c.hidden_size));
  // The final norm runs on the last device: its rows reach the host through
  // that backend.
  const Executor& ex = *g->executor_;
  g->sink_ = std::make_unique<LastRowSink>(
      g->last_hidden_, ex.device(ex.num_devices() - 1).backend);
  return g;
}

StatusOr<const float*> Generator::StepLogits(const Batch& batch,
                                             const KvBatch& kv) {
  return StepLogits(batch, kv, nullptr);
}

StatusOr<const float*> Generator::StepLogits(const Batch& batch,
                                             const KvBatch& kv,
                                             HookSink* capture) {
  return StepLogits(batch, kv, capture, {});
}

StatusOr<const float*> Generator::StepLogits(
    const Batch& batch, const KvBatch& kv, HookSink* capture,
    std::span<const SequenceEdit> edits) {
  if (batch.num_seqs() > options_.slots)
    return OutOfRangeError("generate: " + std::to_string(batch.num_seqs()) +
                           " sequences in one step, more than the " +
                           std::to_string(options_.slots) + " slots");
  sink_->set_capture(capture);
  const Status st = executor_->Forward(batch, sink_.get(), &kv, edits);
  sink_->set_capture(nullptr);
  RETURN_IF_ERROR(st);
  return head_->Compute(last_hidden_.data(), batch.num_seqs());
}

StatusOr<std::vector<Generation>> Generator::Generate(
    const std::vector<std::vector<int32_t>>& prompts,
    const GenerateOptions& options, const tok::Tokenizer* tokenizer) {
  RETURN_IF_ERROR(ValidateSampling(options.sampling));
  if (options.max_new_tokens < 0)
    return InvalidArgumentError("generate: max_new_tokens must be >= 0");
  if (!options.stop_strings.empty() && tokenizer == nullptr)
    return InvalidArgumentError("generate: stop strings need a tokenizer");
  if (options.interventions != nullptr)
    RETURN_IF_ERROR(CheckInterventionsApply(
        *options.interventions, static_cast<int64_t>(prompts.size()), "prompts",
        /*generates=*/true));
  const int64_t V = model_.config().vocab_size;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t n = static_cast<int64_t>(prompts[i].size());
    if (n == 0)
      return InvalidArgumentError("generate: prompt " + std::to_string(i) +
                                  " is empty");
    if (n > options_.context)
      return OutOfRangeError("generate: prompt " + std::to_string(i) + " has " +
                             std::to_string(n) +
                             " tokens, more than the context of " +
                             std::to_string(options_.context) + " positions");
  }
  std::vector<Generation> results(prompts.size());
  struct Active {
    size_t prompt = 0;
    int64_t slot = 0;
    int64_t pos = 0;   // positions in the cache
    int32_t next = 0;  // the token to feed
    std::mt19937_64 rng;
  };
  std::vector<Active> active;
  active.reserve(static_cast<size_t>(options_.slots));
  std::vector<int64_t> free_slots;
  for (int64_t s = options_.slots - 1; s >= 0; --s) free_slots.push_back(s);
  SamplingScratch scratch(V);
  if (options.interventions != nullptr)
    edits_.reserve(options.interventions->size() *
                   static_cast<size_t>(options_.slots));

  // Records token `tok` of `a`; true when its sequence is finished.
  auto take = [&](Active& a, int32_t tok) -> StatusOr<bool> {
    Generation& g = results[a.prompt];
    g.token_ids.push_back(tok);
    a.next = tok;
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), tok) !=
        options.stop_ids.end()) {
      g.stop_reason = "stop_id";
      return true;
    }
    if (!options.stop_strings.empty()) {
      ASSIGN_OR_RETURN(std::string text, tokenizer->Decode(g.token_ids, true));
      for (const std::string& s : options.stop_strings)
        if (!s.empty() && text.find(s) != std::string::npos) {
          g.stop_reason = "stop_string";
          return true;
        }
    }
    if (static_cast<int64_t>(g.token_ids.size()) >= options.max_new_tokens) {
      g.stop_reason = "max_tokens";
      return true;
    }
    if (a.pos >= options_.context) {  // no room to feed `tok`
      g.stop_reason = "context";
      return true;
    }
    return false;
  };

  size_t next_prompt = 0;
  while (next_prompt < prompts.size() || !active.empty()) {
    // Joining: prefill new prompts into free slots, chunk by chunk.
    while (!free_slots.empty() && next_prompt < prompts.size()) {
      const size_t i = next_prompt++;
      const std::vector<int32_t>& prompt = prompts[i];
      results[i].prompt_ids = prompt;
      results[i].token_ids.reserve(static_cast<size_t>(
          std::min(options.max_new_tokens, options_.context)));
      if (options.max_new_tokens == 0) {
        results[i].stop_reason = "prompt";  // as loom serve's engine
        continue;
      }
      const int64_t n = static_cast<int64_t>(prompt.size());
      // Pages for every position the sequence can feed (a paged cache).
      const int64_t need =
          std::min(n + options.max_new_tokens, options_.context);
      cache_->Reset(free_slots.back());
      if (cache_->PagesFor(need) > cache_->free_pages()) {
        if (active.empty())
          return ResourceExhaustedError(
              "generate: prompt " + std::to_string(i) + " needs " +
              std::to_string(cache_->PagesFor(need)) +
              " KV pages, the pool has " +
              std::to_string(cache_->free_pages()) + " free of " +
              std::to_string(cache_->num_pages()));
        --next_prompt;  // wait for running sequences to free pages
        break;
      }
      RETURN_IF_ERROR(cache_->Reserve(free_slots.back(), need));
      Active a;
      a.prompt = i;
      a.slot = free_slots.back();
      a.rng.seed(options.sampling.seed + i);
      const float* logits = nullptr;
      edits_.clear();
      if (options.interventions != nullptr)
        AddSequenceEdits(*options.interventions, static_cast<int64_t>(i), 0, n,
                         &edits_);
      for (int64_t p0 = 0; p0 < n; p0 += options_.prefill_chunk) {
        const int64_t len = std::min(options_.prefill_chunk, n - p0);
        seq_start_[0] = 0;
        seq_start_[1] = len;
        slot_[0] = a.slot;
        pos0_[0] = p0;
        const Batch b{std::span<const int32_t>(prompt).subspan(p0, len),
                      std::span<const int64_t>(seq_start_.data(), 2)};
        ASSIGN_OR_RETURN(
            logits,
            StepLogits(b, {cache_.get(), {slot_.data(), 1}, {pos0_.data(), 1}},
                       nullptr, edits_));
      }
      a.pos = n;
      ASSIGN_OR_RETURN(
          bool done,
          take(a, SelectToken(logits, V, options.sampling, a.rng, scratch)));
      if (done) {  // the slot stays free
        cache_->Reset(a.slot);
        continue;
      }
      free_slots.pop_back();
      active.push_back(std::move(a));
    }
    if (active.empty()) continue;
    // One decode step: one token per active sequence.
    const int64_t S = static_cast<int64_t>(active.size());
    seq_start_[0] = 0;
    edits_.clear();
    for (int64_t s = 0; s < S; ++s) {
      const Active& a = active[static_cast<size_t>(s)];
      if (options.interventions != nullptr)
        AddGeneratedEdits(*options.interventions,
                          static_cast<int64_t>(a.prompt), s, a.pos + 1,
                          &edits_);
      ids_[static_cast<size_t>(s)] = a.next;
      seq_start_[static_cast<size_t>(s) + 1] = s + 1;
      slot_[static_cast<size_t>(s)] = a.slot;
      pos0_[static_cast<size_t>(s)] = a.pos;
    }
    const Batch b{std::span<const int32_t>(ids_.data(), static_cast<size_t>(S)),
                  std::span<const int64_t>(seq_start_.data(),
                                           static_cast<size_t>(S) + 1)};
    ASSIGN_OR_RETURN(const float* logits,
                     StepLogits(b,
                                {cache_.get(),
                                 {slot_.data(), static_cast<size_t>(S)},
                                 {pos0_.data(), static_cast<size_t>(S)}},
                                nullptr, edits_));
    // Leaving: finished sequences free their slots (order kept).
    size_t kept = 0;
    for (int64_t s = 0; s < S; ++s) {
      Active& a = active[static_cast<size_t>(s)];
      a.pos += 1;
      ASSIGN_OR_RETURN(bool done,
                       take(a, SelectToken(logits + s * V, V, options.sampling,
                                           a.rng, scratch)));
      if (done) {
        cache_->Reset(a.slot);  // its pages go back to the pool
        free_slots.push_back(a.slot);
      } else {
        if (kept != static_cast<size_t>(s)) active[kept] = std::move(a);
        ++kept;
      }
    }
    active.resize(kept);
  }
  if (tokenizer != nullptr) {
    for (Generation& g : results) {
      ASSIGN_OR_RETURN(g.text, tokenizer->Decode(g.token_ids, true));
    }
  }
  return results;
}

}  // namespace loom::eval
