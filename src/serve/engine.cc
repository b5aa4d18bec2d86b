#include "src/serve/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <span>

#include "src/base/check.h"
#include "src/base/float16.h"
#include "src/model/layer_config.h"
#include "src/runtime/executor.h"

namespace loom::serve {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Bytes of a request's intervention vectors (counted in its capture need).
int64_t InterventionBytes(const GenRequest& r) {
  int64_t n = 0;
  for (const Intervention& iv : r.interventions)
    n += static_cast<int64_t>(iv.vector.size());
  return n * static_cast<int64_t>(sizeof(float));
}

// U+FFFD, what Decode gives for an incomplete UTF-8 sequence at the end.
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

}  // namespace

StatusOr<GenResult> Ticket::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
  if (!status_.ok()) return status_;
  return std::move(result_);
}

struct Engine::Pending {
  std::shared_ptr<Ticket> ticket;
  GenRequest request;
  int64_t capture_need = 0;
  int64_t pages_need = 0;  // KV pages (a paged cache)
  Clock::time_point submitted;
};

struct Engine::Seq {
  std::unique_ptr<Pending> p;
  int64_t slot = 0;
  int64_t fed = 0;         // positions in the KV cache
  int64_t prompt_fed = 0;  // prompt tokens fed
  int32_t next = -1;       // the token to feed when decoding
  std::mt19937_64 rng;
  GenResult result;
  int64_t capacity_rows = 0;  // rows each capture buffer holds
  // Attention (request.attention_layers): each block's query hook and the
  // query row of the last position fed, [q_width] (sized at admission).
  std::vector<HookPoint> attn_hooks;
  std::vector<std::vector<float>> attn_q;
  size_t emitted = 0;  // bytes of text passed to on_token
  Clock::time_point admitted;
  // This step's share of the forward.
  int64_t step_pos0 = 0, step_len = 0;
  bool decoding() const {
    return prompt_fed == static_cast<int64_t>(p->request.prompt.size());
  }
};

// Copies the rows each sequence of the step asked for into its capture
// buffers, straight from the forward's buffers.
class Engine::CaptureSink : public HookSink {
 public:
  // `devices`: the backends of the placement, whose Copy reads a device
  // view's rows (not owned).
  explicit CaptureSink(std::vector<Backend*> devices)
      : devices_(std::move(devices)) {}
  void Begin(const std::vector<Seq*>* seqs) { seqs_ = seqs; }
  Status OnActivation(const HookPoint& hook, const Batch& batch, int64_t,
                      int64_t row_begin, const ActivationView& view) override {
    if (seqs_ == nullptr) return Status();
    bool wanted = false;
    for (const Seq* s : *seqs_) {
      for (const HookPoint& h : s->p->request.hooks) wanted |= h == hook;
      for (const HookPoint& h : s->attn_hooks) wanted |= h == hook;
    }
    if (!wanted) return Status();
    if (view.dtype != DType::kF32)
      return UnimplementedError("serve: captures in " +
                                std::string(DTypeName(view.dtype)));
    Backend* copier = nullptr;
    if (!view.host_f32())
      for (Backend* b : devices_)
        if (b->device() == view.device) copier = b;
    if (!view.host_f32() && copier == nullptr)
      return InternalError("serve: a capture on a device no segment runs on");
    // One row of `n` floats from the forward's buffer (host or device).
    auto copy = [&](float* dst, const float* src, int64_t n) -> Status {
      if (copier == nullptr) {
        std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
        return Status();
      }
      return copier->Copy(dst, DeviceRef{}, src, view.device,
                          n * int64_t{sizeof(float)});
    };
    const float* data = static_cast<const float*>(view.data);  // [rows, ld]
    const int64_t row_end = row_begin + view.rows;
    for (size_t i = 0; i < seqs_->size(); ++i) {
      Seq& s = *(*seqs_)[i];
      const int64_t b = batch.seq_start[i], e = batch.seq_start[i + 1];
      // The attention query row: the last row of this step (the last one
      // fed when the sequence finishes).
      for (size_t a = 0; a < s.attn_hooks.size(); ++a) {
        if (!(s.attn_hooks[a] == hook) || e - 1 < row_begin || e - 1 >= row_end)
          continue;
        RETURN_IF_ERROR(copy(s.attn_q[a].data(),
                             data + (e - 1 - row_begin) * view.ld,
                             static_cast<int64_t>(s.attn_q[a].size())));
      }
      const std::vector<HookPoint>& hooks = s.p->request.hooks;
      const auto it = std::find(hooks.begin(), hooks.end(), hook);
      if (it == hooks.end()) continue;
      const size_t h = static_cast<size_t>(it - hooks.begin());
      const int64_t width = s.result.widths[h];
      float* dst = s.result.captures[h].data();  // [capacity_rows, width]
      const bool all = s.p->request.rows == CaptureRows::kAll;
      for (int64_t r = std::max(b, row_begin); r < std::min(e, row_end); ++r) {
        if (!all && r != e - 1) continue;
        const int64_t row = all ? s.step_pos0 + (r - b) : 0;
        if (row >= s.capacity_rows) continue;  // never: sized at admission
        RETURN_IF_ERROR(
            copy(dst + row * width, data + (r - row_begin) * view.ld, width));
      }
    }
    return Status();
  }

 private:
  const std::vector<Seq*>* seqs_ = nullptr;
  std::vector<Backend*> devices_;
};

Engine::Engine(const std::string& id, const std::string& dir,
               const EngineOptions& options)
    : id_(id), dir_(dir), options_(options) {
  options_.admit = nullptr;  // asked once, by Create (it may hold the caller's
                             // locals)
}

Engine::~Engine() { Shutdown(true); }

namespace {

// The query rows of a block (return_attention reads them; the KV cache holds
// the keys): after RoPE where the layer rotates.
HookPoint QueryHookOf(const ModelConfig& c, int64_t layer) {
  const LayerConfig lc = MakeLayerConfig(c, layer);
  return {lc.rope_half > 0 ? HookSite::kRotQ : HookSite::kQ, layer};
}

// The generator of an engine: its slots and chunks, every capturable hook
// and the query rows of every block, and the paged KV cache.
StatusOr<eval::Generator::Options> GeneratorOptions(
    const ModelConfig& c, const HookSet& capturable,
    const EngineOptions& options) {
  eval::Generator::Options go;
  go.slots = options.slots;
  go.context = options.context;
  go.prefill_chunk = options.prefill_chunk;
  go.batch_tokens = options.batch_tokens > 0
                        ? options.batch_tokens
                        : options.prefill_chunk + options.slots;
  for (const HookPoint& h : capturable.hooks())
    if (h.site != HookSite::kFinalNorm) go.capture_hooks.Add(h);
  for (int64_t l = 0; l < c.num_layers; ++l)
    go.capture_hooks.Add(QueryHookOf(c, l));
  ASSIGN_OR_RETURN(go, eval::Generator::Resolve(c, go));
  if (options.page_size > 0) {  // the resolved context's positions per slot
    const int64_t tokens =
        options.kv_tokens > 0 ? options.kv_tokens : options.slots * go.context;
    go.paging = {options.page_size,
                 (tokens + options.page_size - 1) / options.page_size};
  }
  return go;
}

// Every blocks.K.hook_resid_pre, the final norm and the options' extra
// hooks (InvalidArgument naming the setting for a hook that cannot be
// captured while generating).
StatusOr<HookSet> CapturableHooks(const ModelConfig& c,
                                  const EngineOptions& options) {
  HookSet set;
  for (int64_t l = 0; l < c.num_layers; ++l) set.Add({HookSite::kResidPre, l});
  set.Add({HookSite::kFinalNorm, -1});
  for (const std::string& name : options.optional_hooks) {
    StatusOr<std::vector<HookPoint>> hooks = ParseModelHookPattern(name, c);
    if (!hooks.ok()) continue;  // not a hook of this model
    for (const HookPoint& h : *hooks)
      if (CheckHookExists(h, c).ok() && IsFloatRowSite(h.site) &&
          h.site != HookSite::kLogits)
        set.Add(h);
  }
  if (options.extra_hooks.empty()) return set;
  StatusOr<HookSet> extra = ResolveHooks(options.extra_hooks, {}, c);
  if (!extra.ok())
    return extra.status().WithContext(options.extra_hooks_setting);
  for (const HookPoint& h : extra->hooks()) {
    if (!IsFloatRowSite(h.site))
      return InvalidArgumentError(
          options.extra_hooks_setting + ": " + HookName(h) +
          " cannot be captured while generating (attention patterns and "
          "expert ids are not rows of floats per token)");
    if (h.site == HookSite::kLogits)
      return InvalidArgumentError(
          options.extra_hooks_setting +
          ": logits cannot be captured while generating (one row per "
          "token of vocab_size floats); use the generated text");
    set.Add(h);
  }
  return set;
}

Status CheckEngineOptions(const EngineOptions& options) {
  if (options.slots <= 0 || options.prefill_chunk <= 0 ||
      options.capture_bytes <= 0 || options.max_queue < 0)
    return InvalidArgumentError(
        "serve: slots (" + std::to_string(options.slots) +
        "), streaming_chunk_size (" + std::to_string(options.prefill_chunk) +
        ") and capture_bytes (" + std::to_string(options.capture_bytes) +
        ") must be > 0, max_queue (" + std::to_string(options.max_queue) +
        ") >= 0");
  if (options.kv_tokens < 0 || options.page_size < 0 ||
      (options.kv_tokens > 0 && options.page_size == 0))
    return InvalidArgumentError(
        "kv_tokens (" + std::to_string(options.kv_tokens) +
        ") must be >= 0 and page_size (" + std::to_string(options.page_size) +
        ") >= 0, and > 0 when kv_tokens is given");
  return Status();
}

SessionParams SessionParamsOf(const std::string& dir,
                              const EngineOptions& options) {
  SessionParams sp;
  sp.command = options.command;
  sp.model_dir = dir;
  sp.precision = options.precision;
  sp.plan = options.plan;
  sp.threads = options.threads;
  // A checkpoint without a tokenizer is served for token-id prompts; a
  // text prompt to it is the request's error.
  sp.tokenizer = TokenizerUse::kOptional;
  sp.interventions = options.interventions;
  sp.compute_backend_for_tests = options.compute_backend_for_tests;
  return sp;
}

}  // namespace

StatusOr<std::unique_ptr<Engine>> Engine::Create(const std::string& id,
                                                 const std::string& dir,
                                                 const EngineOptions& options) {
  const Clock::time_point t0 = Clock::now();
  auto e = std::unique_ptr<Engine>(new Engine(id, dir, options));
  RETURN_IF_ERROR(CheckEngineOptions(options));
  SessionParams sp = SessionParamsOf(dir, options);
  if (options.admit)
    sp.admit = [admit = options.admit](const Session& s) {
      return admit(s.plan());
    };
  eval::Generator::Options go;
  // The capturable hooks and the generator's options follow from
  // config.json alone: a bad hook is refused before anything is planned.
  ASSIGN_OR_RETURN(
      e->session_,
      Session::Open(sp, [&](const Session& s) -> StatusOr<JobSpec> {
        ASSIGN_OR_RETURN(e->capturable_, CapturableHooks(s.config(), options));
        ASSIGN_OR_RETURN(go,
                         GeneratorOptions(s.config(), e->capturable_, options));
        return eval::Generator::Job(s.config(), go);
      }));
  go.segments = e->session_->segments();
  StatusOr<tok::ChatTemplate> tpl = tok::LoadChatTemplate(dir);
  if (tpl.ok()) {
    e->chat_template_ = std::move(tpl).value();
  } else if (tpl.status().code() != StatusCode::kNotFound) {
    return tpl.status().WithContext("chat template of " + dir);
  }
  ASSIGN_OR_RETURN(e->stop_ids_, eval::LoadStopIds(e->model()));
  ASSIGN_OR_RETURN(e->gen_, eval::Generator::Create(e->model(), go));
  e->context_ = e->gen_->context();
  std::vector<Backend*> devices;
  for (const ExecutorSegment& seg : e->session_->segments())
    devices.push_back(seg.backend);
  e->sink_ = std::make_unique<CaptureSink>(std::move(devices));
  const BoundWeights& w = e->model().weights();
  e->memory_.weights = w.converted_bytes() + w.in_place_bytes();
  e->memory_.arenas = e->gen_->executor().arena_bytes();
  e->memory_.kv =
      e->gen_->cache().storage_bytes() + e->gen_->cache().workspace_bytes();
  e->memory_.head = e->gen_->head().bytes();
  e->memory_.capture = options.capture_bytes;
  const int64_t slots = e->gen_->slots();
  for (int64_t s = slots - 1; s >= 0; --s) e->free_slots_.push_back(s);
  const int64_t batch_tokens = e->gen_->batch_tokens();
  e->ids_.resize(static_cast<size_t>(batch_tokens));
  e->seq_start_.resize(static_cast<size_t>(slots) + 1);
  e->slot_.resize(static_cast<size_t>(slots));
  e->pos0_.resize(static_cast<size_t>(slots));
  e->active_.reserve(static_cast<size_t>(slots));
  e->step_seqs_.reserve(static_cast<size_t>(slots));
  e->done_seqs_.reserve(static_cast<size_t>(slots));
  e->scratch_ =
      std::make_unique<eval::SamplingScratch>(e->session_->config().vocab_size);
  e->load_seconds_ = std::chrono::duration<double>(Clock::now() - t0).count();
  Engine* self = e.get();
  e->thread_ = std::thread([self] { self->Loop(); });
  return e;
}

StatusOr<HookPoint> Engine::LayerHook(int64_t index) const {
  const int64_t n = session_->model().config().num_layers;
  const int64_t i = index < 0 ? index + n + 1 : index;
  if (i < 0 || i > n)
    return OutOfRangeError("hidden state layer " + std::to_string(index) +
                           " is outside [" + std::to_string(-(n + 1)) + ", " +
                           std::to_string(n) + "] for a model of " +
                           std::to_string(n) + " layers");
  if (i == n) return HookPoint{HookSite::kFinalNorm, -1};
  return HookPoint{HookSite::kResidPre, i};
}

bool Engine::Capturable(const HookPoint& hook) const {
  return capturable_.Contains(hook);
}

StatusOr<int64_t> Engine::HookWidthOf(const HookPoint& hook) const {
  return HookWidth(hook, session_->model().config());
}

int64_t Engine::WidthOf(const HookPoint& hook) const {
  StatusOr<int64_t> w = HookWidth(hook, session_->model().config());
  return w.ok() ? *w : 0;  // capturable hooks exist: never 0
}

int64_t Engine::CaptureNeed(const GenRequest& r) const {
  int64_t width = 0;
  for (const HookPoint& h : r.hooks) width += WidthOf(h);
  const int64_t n = static_cast<int64_t>(r.prompt.size());
  const int64_t fed =
      std::min(n + std::max<int64_t>(r.max_new_tokens - 1, 0), context_);
  const int64_t rows = r.rows == CaptureRows::kLast ? 1 : fed;
  // Attention: one query row and heads x positions fed probabilities.
  int64_t attention = 0;
  for (int64_t l : r.attention_layers) {
    const LayerConfig lc = MakeLayerConfig(session_->model().config(), l);
    attention += lc.q_width() + lc.q_heads * fed;
  }
  return (rows * width + attention) * static_cast<int64_t>(sizeof(float));
}

HookPoint Engine::AttentionQueryHook(int64_t layer) const {
  return QueryHookOf(session_->config(), layer);
}

void Engine::AttentionRows(Seq& s) {
  const GenRequest& r = s.p->request;
  GenResult& res = s.result;
  const KvCache& kv = gen_->cache();
  const int64_t keys = s.fed, p = s.fed - 1;  // the last position fed
  res.attention_keys = keys;
  std::vector<double> e(static_cast<size_t>(keys));
  for (size_t a = 0; a < r.attention_layers.size(); ++a) {
    const int64_t l = r.attention_layers[a];
    const LayerConfig lc = MakeLayerConfig(session_->model().config(), l);
    const int64_t heads = lc.q_heads, group = lc.q_heads / lc.kv_heads,
                  d = lc.head_dim, kvd = lc.k_width();
    // The cache row of position j: its page's row, or the slot's row
    // (a ring for a sliding-window layer).
    const int64_t cap = kv.positions(l), page = kv.page_size();
    const int32_t* table = kv.layer_paged(l) ? kv.page_table(s.slot) : nullptr;
    auto key = [&](int64_t j) {
      const int64_t row = table != nullptr
                              ? int64_t{table[j / page]} * page + j % page
                              : s.slot * cap + j % cap;
      return kv.k(l) + row * kvd;
    };
    const int64_t lo =
        lc.window > 0 ? std::max<int64_t>(0, p - lc.window + 1) : 0;
    const TensorView* sinks =
        lc.attn_sinks
            ? &session_->model().weights().Require(WeightRole::kAttnSinks, l)
            : nullptr;
    std::vector<float>& out = res.attention[a];  // sized at admission
    out.assign(static_cast<size_t>(heads * keys), 0.0f);
    for (int64_t h = 0; h < heads; ++h) {
      const float* q = s.attn_q[a].data() + h * d;
      const int64_t kvh = h / group;
      // As the attention kernels (src/backend/cpu/kernels.h): scores in
      // double, softcap, the sink logit joining the max and the sum.
      double sink = 0.0;
      if (sinks != nullptr) {
        const void* v = sinks->data;
        sink = sinks->dtype == DType::kBF16
                   ? Bf16ToF32(static_cast<const uint16_t*>(v)[h])
               : sinks->dtype == DType::kF16
                   ? F16ToF32(static_cast<const uint16_t*>(v)[h])
                   : static_cast<const float*>(v)[h];
      }
      double mx =
          sinks != nullptr ? sink : -std::numeric_limits<double>::infinity();
      for (int64_t j = lo; j <= p; ++j) {
        const float* k = key(j) + kvh * d;
        double dot = 0.0;
        for (int64_t c = 0; c < d; ++c) dot += static_cast<double>(q[c]) * k[c];
        dot *= lc.attn_scale;
        if (lc.attn_softcap > 0.0f)
          dot = lc.attn_softcap * std::tanh(dot / lc.attn_softcap);
        e[static_cast<size_t>(j)] = dot;
        mx = std::max(mx, dot);
      }
      double sum = sinks != nullptr ? std::exp(sink - mx) : 0.0;
      for (int64_t j = lo; j <= p; ++j)
        sum += e[static_cast<size_t>(j)] =
            std::exp(e[static_cast<size_t>(j)] - mx);
      for (int64_t j = lo; j <= p; ++j)
        out[static_cast<size_t>(h * keys + j)] =
            static_cast<float>(e[static_cast<size_t>(j)] / sum);
    }
    res.attention_heads.push_back(heads);
  }
}

Status Engine::CheckInterventions(const GenRequest& r) const {
  const ModelConfig& c = session_->model().config();
  const int64_t n = static_cast<int64_t>(r.prompt.size());
  for (size_t i = 0; i < r.interventions.size(); ++i) {
    const Intervention& iv = r.interventions[i];
    const std::string name =
        "intervention " + std::to_string(i) + " (" + HookName(iv.hook) + ")";
    if (iv.mode == InterventionMode::kPatch ||
        iv.mode == InterventionMode::kPatchHead)
      return UnimplementedError(name + ": mode " +
                                std::string(InterventionModeName(iv.mode)) +
                                " is not served on the generation routes (use "
                                "/api/patching/run)");
    RETURN_IF_ERROR(CheckIntervention(iv, c, name));
    if (!AppliesToRow(iv, 0) || !iv.edits_prompt()) continue;
    // A position outside the prompt would fail the shared forward, and every
    // request in it: refused here.
    StatusOr<std::vector<int64_t>> fit = ResolvePositions(iv.positions, n);
    if (!fit.ok())
      return InvalidArgumentError(name + ": " + fit.status().message());
  }
  return Status();
}

int64_t Engine::PagesNeed(const GenRequest& r) const {
  const int64_t n = static_cast<int64_t>(r.prompt.size());
  return gen_->cache().PagesFor(std::min(n + r.max_new_tokens, context_));
}

StatusOr<std::shared_ptr<Ticket>> Engine::Submit(GenRequest r) {
  const ModelConfig& c = session_->model().config();
  const int64_t n = static_cast<int64_t>(r.prompt.size());
  if (n == 0) return InvalidArgumentError("the prompt has no tokens");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] < 0 || r.prompt[i] >= c.vocab_size)
      return InvalidArgumentError(
          "token " + std::to_string(i) + " of the prompt is " +
          std::to_string(r.prompt[i]) + ", outside the vocabulary [0, " +
          std::to_string(c.vocab_size) + ")");
  if (n > context_)
    return OutOfRangeError("the prompt has " + std::to_string(n) +
                           " tokens, more than the context of " +
                           std::to_string(context_) + " positions");
  if (r.max_new_tokens < 0)
    return InvalidArgumentError("max_tokens must be >= 0, got " +
                                std::to_string(r.max_new_tokens));
  RETURN_IF_ERROR(eval::ValidateSampling(r.sampling));
  if (!r.stop_strings.empty() && tokenizer() == nullptr)
    return InvalidArgumentError("stop strings need a tokenizer, and model " +
                                id_ + " has none (" + tokenizer_error() +
                                "); leave `stop` out");
  for (const HookPoint& h : r.hooks)
    if (!Capturable(h))
      return InvalidArgumentError(
          "hook " + HookName(h) +
          " is not captured by this server (hidden-state layers and " +
          options_.extra_hooks_setting + ")");
  RETURN_IF_ERROR(CheckInterventions(r));
  for (int64_t l : r.attention_layers)
    if (l < 0 || l >= c.num_layers)
      return OutOfRangeError("attention of block " + std::to_string(l) +
                             ": the model has blocks 0.." +
                             std::to_string(c.num_layers - 1));
  // AttentionRows reads the cached keys as f32 (the CPU backend's cache).
  if (!r.attention_layers.empty() && gen_->cache().dtype() != DType::kF32)
    return UnimplementedError(
        "return_attention needs an f32 KV cache; this engine's holds " +
        std::string(DTypeName(gen_->cache().dtype())));
  auto p = std::make_unique<Pending>();
  p->pages_need = PagesNeed(r);
  if (p->pages_need > gen_->cache().num_pages())
    return OutOfRangeError(
        "the request needs " + std::to_string(p->pages_need) + " KV pages of " +
        std::to_string(gen_->cache().page_size()) +
        " positions (prompt + max_tokens), more than the server's " +
        std::to_string(gen_->cache().num_pages()) +
        " (its whole KV pool); ask for fewer tokens");
  p->capture_need = CaptureNeed(r);
  if (p->capture_need > options_.capture_bytes)
    return OutOfRangeError(
        "the hidden states asked for need " + std::to_string(p->capture_need) +
        " bytes, more than the server's "
        "capture budget of " +
        std::to_string(options_.capture_bytes) +
        " bytes (batching.capture_bytes); ask for fewer layers or rows");
  const int64_t edit_bytes = InterventionBytes(r);
  if (edit_bytes > 0 && p->capture_need + edit_bytes > options_.capture_bytes)
    return OutOfRangeError(
        "the hidden states asked for (" + std::to_string(p->capture_need) +
        " bytes) and the intervention vectors (" + std::to_string(edit_bytes) +
        " bytes) need more than the server's capture budget of " +
        std::to_string(options_.capture_bytes) +
        " bytes (batching.capture_bytes)");
  p->capture_need += edit_bytes;
  p->ticket = std::make_shared<Ticket>();
  p->request = std::move(r);
  p->submitted = Clock::now();
  std::shared_ptr<Ticket> ticket = p->ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting_)
      return FailedPreconditionError("model " + id_ + " is shutting down");
    const size_t bound =
        static_cast<size_t>(options_.max_queue) + free_slots_.size();
    if (queue_.size() >= bound) {
      ++stats_.requests_rejected;
      return ResourceExhaustedError(
          "model " + id_ + " is busy: every slot is taken and " +
          std::to_string(queue_.size()) +
          " requests are waiting (server.max_queue = " +
          std::to_string(options_.max_queue) + "); retry later");
    }
    queue_.push_back(std::move(p));
    stats_.queued = static_cast<int64_t>(queue_.size());
  }
  cv_.notify_all();
  return ticket;
}

void Engine::Shutdown(bool drain) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = false;
    if (!stop_) drain_ = drain;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id())
    thread_.join();
}

EngineStats Engine::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

EngineMemory Engine::Memory() const {
  EngineMemory m = memory_;
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t slots = gen_->slots();
  const int64_t used = slots - static_cast<int64_t>(free_slots_.size());
  const KvCache& kv = gen_->cache();
  m.kv_used = kv.paged() ? pages_reserved_ * kv.page_bytes() +
                               used * kv.slot_ring_bytes()
                         : kv.storage_bytes() / slots * used;
  m.capture_used = stats_.capture_reserved;
  return m;
}

void Engine::Admit() {
  std::lock_guard<std::mutex> lock(mu_);
  while (!queue_.empty()) {
    if (queue_.front()->ticket->cancelled()) {
      std::unique_ptr<Pending> p = std::move(queue_.front());
      queue_.pop_front();
      ++stats_.requests_cancelled;
      {
        std::lock_guard<std::mutex> tl(p->ticket->mu_);
        p->ticket->status_ =
            FailedPreconditionError("request cancelled while queued");
        p->ticket->done_ = true;
      }
      p->ticket->cv_.notify_all();
      if (p->request.on_finish) p->request.on_finish();
      continue;
    }
    if (free_slots_.empty() ||
        stats_.capture_reserved + queue_.front()->capture_need >
            options_.capture_bytes ||
        queue_.front()->pages_need > gen_->cache().free_pages())
      break;
    auto s = std::make_unique<Seq>();
    s->p = std::move(queue_.front());
    queue_.pop_front();
    s->slot = free_slots_.back();
    free_slots_.pop_back();
    stats_.capture_reserved += s->p->capture_need;
    ++stats_.requests_admitted;
    stats_.prompt_tokens += static_cast<int64_t>(s->p->request.prompt.size());
    s->admitted = Clock::now();
    s->result.queue_ms = MsSince(s->p->submitted);
    const GenRequest& r = s->p->request;
    s->rng.seed(r.sampling.seed);
    s->result.prompt_ids = r.prompt;
    const int64_t n = static_cast<int64_t>(r.prompt.size());
    s->capacity_rows =
        r.rows == CaptureRows::kLast
            ? 1
            : std::min(n + std::max<int64_t>(r.max_new_tokens - 1, 0),
                       context_);
    for (const HookPoint& h : r.hooks) {
      const int64_t w = WidthOf(h);
      s->result.widths.push_back(w);
      s->result.captures.emplace_back(static_cast<size_t>(s->capacity_rows * w),
                                      0.0f);
    }
    for (int64_t l : r.attention_layers) {
      const LayerConfig lc = MakeLayerConfig(session_->model().config(), l);
      s->attn_hooks.push_back(AttentionQueryHook(l));
      s->attn_q.emplace_back(static_cast<size_t>(lc.q_width()), 0.0f);
      // Room for every position the request can feed: filled at Finish.
      s->result.attention.emplace_back();
      s->result.attention.back().reserve(static_cast<size_t>(
          lc.q_heads *
          std::min(n + std::max<int64_t>(r.max_new_tokens - 1, 0), context_)));
    }
    s->result.token_ids.reserve(
        static_cast<size_t>(std::min(r.max_new_tokens, context_)));
    gen_->cache().Reset(s->slot);
    // Cannot fail: the pages are free and fit the context.
    const Status reserved = gen_->cache().Reserve(
        s->slot, std::min(n + r.max_new_tokens, context_));
    LOOM_CHECK(reserved.ok()) << reserved.ToString();
    pages_reserved_ += gen_->cache().reserved_pages(s->slot);
    // Every intervention of every admitted request fits the edit list, so
    // a forward never grows it.
    active_interventions_ += static_cast<int64_t>(r.interventions.size());
    if (edits_.capacity() < static_cast<size_t>(active_interventions_))
      edits_.reserve(static_cast<size_t>(active_interventions_));
    active_.push_back(std::move(s));
  }
  stats_.queued = static_cast<int64_t>(queue_.size());
  stats_.active = static_cast<int64_t>(active_.size());
}

StatusOr<std::string> Engine::DecodeText(const std::vector<int32_t>& ids) {
  // Ids past the tokenizer's vocabulary (padding rows of a larger embedding)
  // decode to nothing, as they have no text.
  if (session_->tokenizer() == nullptr) return std::string();  // ids only
  const int64_t known = session_->tokenizer()->vocab_size();
  decode_ids_.clear();
  for (int32_t id : ids)
    if (id < known) decode_ids_.push_back(id);
  return session_->tokenizer()->Decode(decode_ids_, true);
}

void Engine::Finish(Seq& s, Status status) {
  GenResult& res = s.result;
  if (status.ok() && !res.token_ids.empty()) {
    StatusOr<std::string> text = DecodeText(res.token_ids);
    if (text.ok()) {
      res.text = std::move(text).value();
    } else {
      status = text.status();
    }
  }
  if (status.ok() && s.fed > 0 && !s.p->request.attention_layers.empty())
    AttentionRows(s);
  // Rows captured: 1, or every position fed.
  res.rows = s.p->request.rows == CaptureRows::kLast
                 ? 1
                 : std::min(s.fed, s.capacity_rows);
  for (size_t h = 0; h < res.captures.size(); ++h)
    res.captures[h].resize(static_cast<size_t>(res.rows * res.widths[h]));
  res.run_ms = MsSince(s.admitted);
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_slots_.push_back(s.slot);
    pages_reserved_ -= gen_->cache().reserved_pages(s.slot);
    gen_->cache().Reset(s.slot);  // its pages go back to the pool
    --stats_.active;
    stats_.capture_reserved -= s.p->capture_need;
    active_interventions_ -=
        static_cast<int64_t>(s.p->request.interventions.size());
    stats_.generated_tokens += static_cast<int64_t>(res.token_ids.size());
    if (!status.ok()) {
      ++stats_.requests_failed;
    } else if (res.stop_reason == "cancelled") {
      ++stats_.requests_cancelled;
    } else {
      ++stats_.requests_completed;
    }
  }
  Ticket& t = *s.p->ticket;
  {
    std::lock_guard<std::mutex> lock(t.mu_);
    t.status_ = std::move(status);
    t.result_ = std::move(res);
    t.done_ = true;
  }
  t.cv_.notify_all();
  if (s.p->request.on_finish) s.p->request.on_finish();
}

Status Engine::Step() {
  Admit();
  // Cancelled sequences leave before the forward.
  for (size_t i = 0; i < active_.size();) {
    if (active_[i]->p->ticket->cancelled()) {
      active_[i]->result.stop_reason = "cancelled";
      Finish(*active_[i], Status());
      active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  if (active_.empty()) return Status();
  // Compose the forward: decode tokens first, then prefill chunks.
  std::vector<Seq*>& step = step_seqs_;  // at most `slots` (reserved)
  step.clear();
  const int64_t budget = gen_->batch_tokens();
  int64_t tokens = 0;
  seq_start_[0] = 0;
  auto add = [&](Seq& s, const int32_t* ids, int64_t len) {
    std::copy(ids, ids + len, ids_.begin() + tokens);
    s.step_pos0 = s.fed;
    s.step_len = len;
    slot_[step.size()] = s.slot;
    pos0_[step.size()] = s.fed;
    tokens += len;
    seq_start_[step.size() + 1] = tokens;
    step.push_back(&s);
  };
  for (const auto& s : active_)
    if (s->decoding()) add(*s, &s->next, 1);
  for (const auto& s : active_) {
    if (s->decoding() || tokens >= budget) continue;
    const std::vector<int32_t>& prompt = s->p->request.prompt;
    const int64_t len = std::min(
        {gen_->prefill_chunk(),
         static_cast<int64_t>(prompt.size()) - s->prompt_fed, budget - tokens});
    add(*s, prompt.data() + s->prompt_fed, len);
  }
  const size_t S = step.size();
  const Batch batch{
      std::span<const int32_t>(ids_.data(), static_cast<size_t>(tokens)),
      std::span<const int64_t>(seq_start_.data(), S + 1)};
  const KvBatch kv{&gen_->cache(), {slot_.data(), S}, {pos0_.data(), S}};
  BuildEdits(step);
  const bool edited = !edits_.empty();
  sink_->Begin(&step);
  const Clock::time_point t0 = Clock::now();
  StatusOr<const float*> logits =
      gen_->StepLogits(batch, kv, sink_.get(), edits_);
  sink_->Begin(nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.forwards;
    stats_.edits_applied += static_cast<int64_t>(edits_.size());
    if (edited && S > 1) ++stats_.mixed_edit_forwards;
    stats_.forward_tokens += tokens;
    stats_.forward_seqs += static_cast<int64_t>(S);
    stats_.max_forward_seqs =
        std::max(stats_.max_forward_seqs, static_cast<int64_t>(S));
    stats_.forward_seconds +=
        std::chrono::duration<double>(Clock::now() - t0).count();
  }
  if (!logits.ok()) {
    // The forward failed: every sequence in it ends with the error; the
    // engine goes on serving the others.
    for (Seq* s : step) Finish(*s, logits.status());
    std::erase_if(active_, [&](const std::unique_ptr<Seq>& s) {
      return std::find(step.begin(), step.end(), s.get()) != step.end();
    });
    return Status();
  }
  const int64_t V = session_->model().config().vocab_size;
  std::vector<Seq*>& done = done_seqs_;  // at most `slots` (reserved)
  done.clear();
  for (size_t i = 0; i < S; ++i) {
    Seq& s = *step[i];
    const bool was_prefill = !s.decoding();
    s.fed += s.step_len;
    if (was_prefill) {
      s.prompt_fed += s.step_len;
      if (!s.decoding()) continue;  // more of the prompt to read
    }
    const GenRequest& r = s.p->request;
    if (r.max_new_tokens == 0) {
      s.result.stop_reason = "prompt";
      done.push_back(&s);
      continue;
    }
    const int32_t tok = eval::SelectToken(*logits + static_cast<int64_t>(i) * V,
                                          V, r.sampling, s.rng, *scratch_);
    s.result.token_ids.push_back(tok);
    s.next = tok;
    bool stop = false;
    if (std::find(r.stop_ids.begin(), r.stop_ids.end(), tok) !=
        r.stop_ids.end()) {
      s.result.stop_reason = "stop_id";
      stop = true;
    }
    if ((r.on_token || !r.stop_strings.empty()) &&
        session_->tokenizer() != nullptr) {
      StatusOr<std::string> text =
          session_->tokenizer()->Decode(s.result.token_ids, true);
      if (!text.ok()) {
        Finish(s, text.status());
        s.p = nullptr;
        continue;
      }
      if (!stop)
        for (const std::string& str : r.stop_strings)
          if (!str.empty() && text->find(str) != std::string::npos) {
            s.result.stop_reason = "stop_string";
            stop = true;
          }
      if (r.on_token) {
        std::string piece;
        const bool partial = text->size() >= kReplacement.size() &&
                             text->ends_with(kReplacement) && !stop;
        if (!partial && text->size() > s.emitted) {
          piece = text->substr(s.emitted);
          s.emitted = text->size();
        }
        r.on_token(tok, piece);
      }
    }
    if (!stop &&
        static_cast<int64_t>(s.result.token_ids.size()) >= r.max_new_tokens) {
      s.result.stop_reason = "max_tokens";
      stop = true;
    }
    if (!stop && s.fed >= context_) {
      s.result.stop_reason = "context";
      stop = true;
    }
    if (stop) done.push_back(&s);
  }
  for (Seq* s : done) Finish(*s, Status());
  std::erase_if(active_, [&](const std::unique_ptr<Seq>& s) {
    return s->p == nullptr ||
           std::find(done.begin(), done.end(), s.get()) != done.end();
  });
  return Status();
}

void Engine::BuildEdits(const std::vector<Seq*>& step) {
  edits_.clear();  // capacity reserved at admission: no allocation
  for (size_t i = 0; i < step.size(); ++i) {
    const Seq& s = *step[i];
    const std::vector<Intervention>& list = s.p->request.interventions;
    if (list.empty()) continue;
    const int64_t seq = static_cast<int64_t>(i);
    if (s.decoding()) {
      // The token fed back at position s.fed.
      AddGeneratedEdits(list, 0, seq, s.fed + 1, &edits_);
    } else {
      // A chunk of the prompt: positions count in the whole prompt.
      AddSequenceEdits(list, 0, seq,
                       static_cast<int64_t>(s.p->request.prompt.size()),
                       &edits_);
    }
  }
}

void Engine::Loop() {
  // OpenMP's thread count is per calling thread: set it on this one, which
  // runs every forward.
  session_->host()->SetNumThreads(options_.threads);
  for (const ExecutorSegment& seg : session_->segments())
    seg.backend->SetNumThreads(options_.threads);
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock,
               [this] { return stop_ || !queue_.empty() || !active_.empty(); });
      if (stop_ && (!drain_ || (queue_.empty() && active_.empty()))) break;
    }
    Step().IgnoreError();
  }
  // Not drained: what is left ends with an error.
  const Status gone = FailedPreconditionError("model " + id_ + " was unloaded");
  for (auto& s : active_) Finish(*s, gone);
  active_.clear();
  std::deque<std::unique_ptr<Pending>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(queue_);
  }
  for (auto& p : left) {
    {
      std::lock_guard<std::mutex> lock(p->ticket->mu_);
      p->ticket->status_ = gone;
      p->ticket->done_ = true;
    }
    p->ticket->cv_.notify_all();
    if (p->request.on_finish) p->request.on_finish();
  }
}

}  // namespace loom::serve
