#include "src/eval/extract_run.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <span>

#include "src/base/read_file.h"
#include "src/base/units.h"
#include "src/eval/extract_batches.h"

namespace loom {

namespace {

// The short-input rule over the rows `next` gives (false at the end; an
// error keeps the default).
int64_t ShortBatchTokens(const ExtractOptions& o, const ExtractSettings& s,
                         const std::function<StatusOr<bool>(InputRow*)>& next,
                         const tok::Tokenizer* tokenizer,
                         const std::string& tokenizer_error) {
  const RowPreparer preparer =
      MakeRowPreparer(o, s, s.config, tokenizer, tokenizer_error);
  int64_t total = 0;
  InputRow row;
  while (true) {
    StatusOr<bool> more = next(&row);
    if (!more.ok()) return s.batch_tokens;
    if (!*more) break;
    const PreparedRow prepared = preparer.Prepare(std::move(row));
    // A bad row keeps the default: its message names the default budget.
    if (!prepared.ok()) return s.batch_tokens;
    total += prepared.size();
    row = InputRow();
  }
  if (total == 0) return s.batch_tokens;
  return std::min(s.batch_tokens, AlignUp(total, 64));
}

bool UsesShortInputRule(const ExtractOptions& o, const ExtractSettings& s) {
  return o.batch_tokens == 0 && !s.streaming();
}

}  // namespace

int64_t ShortInputBatchTokens(const ExtractOptions& o, const ExtractSettings& s,
                              const tok::Tokenizer* tokenizer,
                              const std::string& tokenizer_error) {
  if (!UsesShortInputRule(o, s)) return s.batch_tokens;
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(o.input_path, ec);
  if (ec || bytes > kShortInputBytes) return s.batch_tokens;
  StatusOr<std::unique_ptr<InputReader>> reader =
      InputReader::Open(o.input_path, 0, 0);
  if (!reader.ok()) return s.batch_tokens;
  return ShortBatchTokens(
      o, s,
      [&](InputRow* row) {
        return (*reader)->Next(row, o.replace_invalid_utf8);
      },
      tokenizer, tokenizer_error);
}

Status CheckExtractInterventions(const ExtractOptions& o,
                                 const std::vector<Intervention>& list) {
  int64_t rows = std::numeric_limits<int64_t>::max();
  const bool lists_rows =
      std::any_of(list.begin(), list.end(),
                  [](const Intervention& iv) { return !iv.rows.empty(); });
  if (lists_rows) {
    StatusOr<std::unique_ptr<InputReader>> reader =
        InputReader::Open(o.input_path, 0, 0);
    if (!reader.ok()) return Status();
    StatusOr<int64_t> n = (*reader)->Skip(std::numeric_limits<int64_t>::max());
    if (!n.ok()) return Status();
    rows = *n;
  }
  return CheckInterventionsApply(list, rows, "input rows",
                                 /*generates=*/false);
}

int64_t ShortRowsBatchTokens(const ExtractOptions& o, const ExtractSettings& s,
                             std::span<const InputRow> rows,
                             const tok::Tokenizer* tokenizer,
                             const std::string& tokenizer_error) {
  if (!UsesShortInputRule(o, s)) return s.batch_tokens;
  int64_t bytes = 0;
  for (const InputRow& r : rows)
    bytes += static_cast<int64_t>(r.text.size() + 4 * r.tokens.size());
  if (bytes > kShortInputBytes) return s.batch_tokens;
  size_t i = 0;
  return ShortBatchTokens(
      o, s,
      [&](InputRow* row) -> StatusOr<bool> {
        if (i == rows.size()) return false;
        *row = rows[i++];
        return true;
      },
      tokenizer, tokenizer_error);
}

int64_t RecordedBatchTokens(const std::string& out_dir) {
  StatusOr<std::string> text = ReadFileToString(out_dir + "/manifest.json");
  if (!text.ok()) return 0;
  const nlohmann::json m = nlohmann::json::parse(*text, nullptr, false);
  if (!m.is_object() || !m.contains("settings")) return 0;
  const nlohmann::json& st = m["settings"];
  if (!st.is_object() || !st.contains("batch_tokens") ||
      !st["batch_tokens"].is_number_integer())
    return 0;
  return st["batch_tokens"].get<int64_t>();
}

RowPreparer MakeRowPreparer(const ExtractOptions& o, const ExtractSettings& s,
                            const ModelConfig& c,
                            const tok::Tokenizer* tokenizer,
                            const std::string& tokenizer_error) {
  return RowPreparer({.template_text = o.template_text,
                      .add_bos = o.add_bos,
                      .replace_invalid_utf8 = o.replace_invalid_utf8,
                      .batch_tokens = s.batch_tokens,
                      .max_row_tokens = s.max_row_tokens,
                      .max_positions = s.max_positions,
                      .vocab_size = c.vocab_size,
                      .config_bos_id = c.bos_token_id,
                      .interventions = &s.interventions},
                     tokenizer, tokenizer_error, &s.selectors);
}

RowPreparer MakeRowPreparer(const ExtractOptions& o, const ExtractSettings& s,
                            const Session& session) {
  return MakeRowPreparer(o, s, session.config(), session.tokenizer(),
                         session.tokenizer_error());
}

Status CheckStreamingBackends(const std::vector<ExecutorSegment>& segments) {
  for (const ExecutorSegment& seg : segments) {
    if (seg.backend->Costs().kv_attention_workspace == nullptr)
      return UnimplementedError(
          "--streaming-chunk-size: backend '" +
          std::string(seg.backend->name()) +
          "' has no attention over a KV cache yet (run the job on the CPU: "
          "--device cpu)");
  }
  return Status();
}

// The KV cache that streamed rows are prefilled through (one slot of
// --max-row-tokens positions, the layers the executor runs), and the
// per-chunk metadata; all sized once for the job.
struct WindowRunner::Streamer {
  int64_t chunk = 0;  // --streaming-chunk-size
  std::unique_ptr<KvCache> cache;
  std::vector<int64_t> starts = std::vector<int64_t>(2, 0);  // [2]
  std::vector<int64_t> slots = std::vector<int64_t>(1, 0);   // [1]: window slot
  int64_t kv_slot = 0;  // the cache's one slot
  int64_t pos0 = 0;
};

// --grad-of: the backward's gradient at each HOOK.grad, captured into that
// derived output's arrays for the row in progress.
class WindowRunner::GradCapture : public GradientSink {
 public:
  GradCapture(const ExtractSettings& s, OutputSet* outputs)
      : s_(s), outputs_(outputs) {}
  void SetRow(std::span<const int32_t> ids) {
    ids_ = ids;
    starts_[1] = static_cast<int64_t>(ids.size());
  }
  Status OnGradient(const HookPoint& hook, const float* rows, int64_t tokens,
                    int64_t width) override {
    for (size_t i = 0; i < s_.derived.size(); ++i) {
      const DerivedHook& d = s_.derived[i];
      if (!d.gradient() || !(d.source == hook)) continue;
      outputs_->Capture(hook, Batch{ids_, starts_},
                        ActivationRows{.data = rows,
                                       .row_begin = 0,
                                       .rows = tokens,
                                       .cols = width,
                                       .ld = width},
                        static_cast<int>(i));
    }
    return Status();
  }

 private:
  const ExtractSettings& s_;
  OutputSet* outputs_;
  std::span<const int32_t> ids_;
  int64_t starts_[2] = {0, 0};
};

WindowRunner::~WindowRunner() = default;

namespace {

// Whether an SAE, a lens or a dashboard is computed from delivered hooks.
bool NeedsDerivedRunner(const ExtractSettings& s) {
  return s.analyses.dashboard > 0 ||
         std::any_of(s.derived.begin(), s.derived.end(),
                     [](const DerivedHook& d) { return !d.gradient(); });
}

}  // namespace

StatusOr<std::unique_ptr<WindowRunner>> WindowRunner::CreateBackward(
    const ExtractSettings& s, const Model& model,
    std::unique_ptr<WindowRunner> r, OutputSet* outputs) {
  BackwardOptions bo;
  bo.max_tokens = s.batch_tokens;
  bo.act_hooks = s.delivered;
  for (const DerivedHook& d : s.derived)
    if (d.gradient()) bo.grad_hooks.Add(d.source);
  ASSIGN_OR_RETURN(r->backward_, Backward::Create(model, bo));
  r->metric_ = *s.grad_of;
  r->grads_ = std::make_unique<GradCapture>(s, outputs);
  r->sink_ = std::make_unique<ExtractSink>(outputs, s.batch_tokens);
  if (NeedsDerivedRunner(s)) {
    ASSIGN_OR_RETURN(r->derived_, DerivedRunner::Create(model, s));
    r->sink_->SetDerived(r->derived_.get());
  }
  return r;
}

StatusOr<std::unique_ptr<WindowRunner>> WindowRunner::Create(
    const ExtractSettings& s, bool hf_bf16_activations, const Model& model,
    const std::vector<ExecutorSegment>& segments, OutputSet* outputs) {
  std::unique_ptr<WindowRunner> r(new WindowRunner());
  r->batch_tokens_ = s.batch_tokens;
  r->outputs_ = outputs;
  r->interventions_ = &s.interventions;
  if (s.grad_of) return CreateBackward(s, model, std::move(r), outputs);
  ASSIGN_OR_RETURN(
      r->ex_, Executor::Create(
                  model, s.delivered,
                  {.max_tokens = s.batch_tokens,
                   .max_seq_len = std::min(s.batch_tokens, s.max_positions),
                   .logits_chunk_rows = 256,
                   .hf_bf16_activations = hf_bf16_activations,
                   .segments = segments}));
  // Selection on the device for segments not on the host; the sink's
  // staging is sized here, once for the job.
  r->sink_ = std::make_unique<ExtractSink>(outputs, s.batch_tokens);
  if (NeedsDerivedRunner(s)) {
    ASSIGN_OR_RETURN(r->derived_, DerivedRunner::Create(model, s));
    r->sink_->SetDerived(r->derived_.get());
  }
  std::vector<Backend*> device_backends;
  for (int i = 0; i < r->ex_->num_devices(); ++i)
    if (!r->ex_->device(i).host_memory)
      device_backends.push_back(r->ex_->device(i).backend);
  RETURN_IF_ERROR(r->sink_->EnableDevices(device_backends));
  if (!s.streaming()) return r;
  // --streaming-chunk-size: each layer's cache on the device that computes
  // it (the planned `kv` term: KvLayerBytes per layer run).
  StatusOr<std::unique_ptr<KvCache>> cache = KvCache::Create(
      model.config(), /*slots=*/1, s.max_row_tokens, r->ex_->LayerBackends());
  if (!cache.ok()) return cache.status().WithContext("--streaming-chunk-size");
  r->streamer_ = std::make_unique<Streamer>();
  r->streamer_->chunk = s.streaming_chunk_size;
  r->streamer_->cache = std::move(cache).value();
  return r;
}

namespace {
Status CheckCancelled(const std::function<bool()>& cancelled) {
  if (cancelled && cancelled()) return CancelledError("interrupted");
  return Status();
}
}  // namespace

// Runs one streamed row (window slot `slot`) alone, chunk by chunk, through
// the cache: each chunk's tokens take their positions in the row and attend
// to every earlier position, so every hook's rows are a full pass's.
Status WindowRunner::StreamRow(const std::vector<PreparedRow>& window,
                               int64_t slot, int64_t* tokens,
                               const std::function<bool()>& cancelled) {
  Streamer& st = *streamer_;
  const PreparedRow& row = window[static_cast<size_t>(slot)];
  const int64_t n = row.size();
  st.cache->Reset(st.kv_slot);
  st.slots[0] = slot;
  outputs_->SetBatchSlots(&st.slots);
  CollectEdits(window, st.slots);
  for (int64_t p0 = 0; p0 < n; p0 += st.chunk) {
    RETURN_IF_ERROR(CheckCancelled(cancelled));
    const int64_t len = std::min(st.chunk, n - p0);
    st.starts[1] = len;
    st.pos0 = p0;
    outputs_->SetChunk(p0, n);
    const Batch b{std::span<const int32_t>(row.ids).subspan(
                      static_cast<size_t>(p0), static_cast<size_t>(len)),
                  std::span<const int64_t>(st.starts)};
    const KvBatch kv{st.cache.get(), {&st.kv_slot, 1}, {&st.pos0, 1}};
    const Status status = ex_->Forward(b, sink_.get(), &kv, edits_);
    outputs_->ClearChunk();
    RETURN_IF_ERROR(status);
    sink_->Flush();  // Forward has synchronised every device
    *tokens += len;
  }
  return Status();
}

void WindowRunner::CollectEdits(const std::vector<PreparedRow>& window,
                                const std::vector<int64_t>& slots) {
  edits_.clear();
  for (size_t s = 0; s < slots.size(); ++s) {
    const PreparedRow& row = window[static_cast<size_t>(slots[s])];
    AddSequenceEdits(*interventions_, row.index, static_cast<int64_t>(s),
                     row.size(), &edits_);
  }
}

Status WindowRunner::RunBackward(const std::vector<PreparedRow>& window,
                                 int64_t* tokens,
                                 const std::function<bool()>& cancelled) {
  std::vector<int64_t> slots(1, 0);  // [1]: the row's window slot
  for (size_t slot = 0; slot < window.size(); ++slot) {
    const PreparedRow& row = window[slot];
    if (!row.ok()) continue;
    RETURN_IF_ERROR(CheckCancelled(cancelled));
    slots[0] = static_cast<int64_t>(slot);
    outputs_->SetBatchSlots(&slots);
    grads_->SetRow(row.ids);
    StatusOr<double> m =
        backward_->Run(row.ids, metric_, grads_.get(), sink_.get());
    if (!m.ok())
      return m.status().WithContext("--grad-of: row " +
                                    std::to_string(row.index));
    sink_->Flush();
    *tokens += row.size();
  }
  outputs_->SetBatchSlots(nullptr);
  outputs_->FinishWindow(window);
  return Status();
}

Status WindowRunner::Run(const std::vector<PreparedRow>& window,
                         int64_t* tokens,
                         const std::function<bool()>& cancelled) {
  outputs_->StageWindow(window);
  if (backward_ != nullptr) return RunBackward(window, tokens, cancelled);
  BatchPacker packer(window, batch_tokens_);
  PackedBatch b;
  b.ids.reserve(static_cast<size_t>(batch_tokens_));
  while (packer.Next(&b)) {
    RETURN_IF_ERROR(CheckCancelled(cancelled));
    outputs_->SetBatchSlots(&b.slots);
    CollectEdits(window, b.slots);
    RETURN_IF_ERROR(
        ex_->Forward(Batch{b.ids, b.starts}, sink_.get(), nullptr, edits_));
    sink_->Flush();  // Forward has synchronised every device
    *tokens += static_cast<int64_t>(b.ids.size());
  }
  // Rows longer than a batch: validated only when streaming is on.
  for (int64_t slot : StreamedRows(window, batch_tokens_)) {
    LOOM_CHECK(streamer_ != nullptr) << "a row exceeds --batch-tokens";
    RETURN_IF_ERROR(StreamRow(window, slot, tokens, cancelled));
  }
  outputs_->FinishWindow(window);
  return Status();
}

}  // namespace loom
