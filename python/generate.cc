#include "python/generate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <utility>

#include "src/eval/job_plan.h"
#include "src/runtime/executor.h"

namespace loom::python {
namespace {

// Copies every position of the one sequence fed to its row of each capture
// buffer (row = the position in the sequence), straight from the forward's
// buffers.
class CaptureSink : public HookSink {
 public:
  CaptureSink(const std::vector<HookPoint>& hooks,
              const std::vector<int64_t>& widths,
              std::vector<std::vector<float>>* captures, int64_t capacity)
      : hooks_(hooks),
        widths_(widths),
        captures_(*captures),
        capacity_(capacity) {}

  void set_pos0(int64_t pos0) { pos0_ = pos0; }

  Status OnActivation(const HookPoint& hook, const Batch& batch, int64_t,
                      int64_t row_begin, const ActivationView& view) override {
    const auto it = std::find(hooks_.begin(), hooks_.end(), hook);
    if (it == hooks_.end()) return Status();
    if (!view.host_f32())
      return UnimplementedError("generate: captures outside host memory");
    const size_t h = static_cast<size_t>(it - hooks_.begin());
    const int64_t width = widths_[h];
    float* dst = captures_[h].data();  // [capacity, width]
    const float* data = view.f32();    // [view.rows, ld]
    const int64_t b = batch.seq_start[0], e = batch.seq_start[1];
    const int64_t row_end = row_begin + view.rows;
    for (int64_t r = std::max(b, row_begin); r < std::min(e, row_end); ++r) {
      const int64_t row = pos0_ + (r - b);
      if (row >= capacity_) continue;  // never: sized for every position fed
      std::memcpy(dst + row * width, data + (r - row_begin) * view.ld,
                  static_cast<size_t>(width) * sizeof(float));
    }
    return Status();
  }

 private:
  const std::vector<HookPoint>& hooks_;
  const std::vector<int64_t>& widths_;
  std::vector<std::vector<float>>& captures_;
  const int64_t capacity_;
  int64_t pos0_ = 0;
};

// The request's checks that need no forward; the width of each hook.
StatusOr<std::vector<int64_t>> CheckRequest(const ModelConfig& c,
                                            const tok::Tokenizer* tokenizer,
                                            const GenerateRequest& r) {
  RETURN_IF_ERROR(eval::ValidateSampling(r.sampling));
  if (r.max_new_tokens < 0)
    return InvalidArgumentError("max_tokens must be >= 0, got " +
                                std::to_string(r.max_new_tokens));
  if (r.prefill_chunk < 1)
    return InvalidArgumentError("prefill_chunk must be >= 1, got " +
                                std::to_string(r.prefill_chunk));
  if (!r.stop_strings.empty() && tokenizer == nullptr)
    return InvalidArgumentError("stop strings need a tokenizer");
  const int64_t V = c.vocab_size;
  const int64_t n = static_cast<int64_t>(r.prompt.size());
  if (n == 0) return InvalidArgumentError("the prompt has no tokens");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] < 0 || r.prompt[i] >= V)
      return InvalidArgumentError(
          "token " + std::to_string(i) + " of the prompt is " +
          std::to_string(r.prompt[i]) + ", outside the vocabulary [0, " +
          std::to_string(V) + ")");
  if (r.interventions != nullptr) {
    RETURN_IF_ERROR(CheckInterventionsApply(*r.interventions, 1, "prompts",
                                            /*generates=*/true));
    const std::string misfit = CheckInterventionsFit(*r.interventions, 0, n);
    if (!misfit.empty())
      return InvalidArgumentError("interventions: " + misfit + " (the prompt)");
  }
  std::vector<int64_t> widths;
  for (const HookPoint& h : r.hooks) {
    if (!IsFloatRowSite(h.site) || h.site == HookSite::kLogits)
      return InvalidArgumentError(
          "hooks: " + HookName(h) +
          " cannot be captured while generating (attention patterns, expert "
          "ids and logits are not rows of floats per token; use extract)");
    ASSIGN_OR_RETURN(int64_t w, HookWidth(h, c));
    widths.push_back(w);
  }
  return widths;
}

// The rows each selector keeps of each hook's `captures` [rows, width].
Status SelectCaptures(const GenerateRequest& r,
                      const std::vector<int64_t>& widths,
                      const std::vector<std::vector<float>>& captures,
                      GenerateResult* out) {
  for (size_t h = 0; h < r.hooks.size(); ++h) {
    for (const RowSelector& s : r.selectors) {
      SelectedRows sel;
      sel.hook = r.hooks[h];
      sel.selector = s;
      sel.cols = widths[h];
      ASSIGN_OR_RETURN(sel.data,
                       SelectRows(s, captures[h].data(), out->activation_rows,
                                  widths[h], &sel.rows));
      out->activations.push_back(std::move(sel));
    }
  }
  return Status();
}

}  // namespace

eval::Generator::Options GeneratorOptionsOf(
    const ModelConfig& c, const GenerateRequest& r,
    const std::vector<ExecutorSegment>& segments) {
  eval::Generator::Options go;
  go.slots = 1;
  go.context = r.context;
  go.prefill_chunk = r.prefill_chunk;
  go.segments = segments;
  if (!r.hooks.empty()) {
    // As the engine behind `loom generate --hooks` sizes its generator.
    go.batch_tokens = r.prefill_chunk + 1;
    for (const HookPoint& h : r.hooks)
      if (h.site != HookSite::kFinalNorm) go.capture_hooks.Add(h);
    const int64_t context =
        r.context > 0 ? r.context : DefaultContext(c, kGenerationContext);
    go.paging = {eval::kKvPageSize,
                 (context + eval::kKvPageSize - 1) / eval::kKvPageSize};
  }
  return go;
}

StatusOr<GenerateResult> GenerateOne(
    const Model& model, const tok::Tokenizer* tokenizer,
    const std::vector<ExecutorSegment>& segments, const GenerateRequest& r) {
  const ModelConfig& c = model.config();
  ASSIGN_OR_RETURN(const std::vector<int64_t> widths,
                   CheckRequest(c, tokenizer, r));
  const int64_t V = c.vocab_size;
  const int64_t n = static_cast<int64_t>(r.prompt.size());
  const bool capture = !r.hooks.empty();

  const eval::Generator::Options go = GeneratorOptionsOf(c, r, segments);
  ASSIGN_OR_RETURN(std::unique_ptr<eval::Generator> gen,
                   eval::Generator::Create(model, go));
  const int64_t context = gen->context();
  if (n > context)
    return OutOfRangeError("the prompt has " + std::to_string(n) +
                           " tokens, more than the context (ctx) of " +
                           std::to_string(context) + " positions");

  GenerateResult out;
  out.prompt_ids = r.prompt;
  if (r.max_new_tokens == 0 && !capture) {
    out.stop_reason = "prompt";  // as Generator::Generate: no forward
    return out;
  }
  // Every position that can be fed: the prompt, then each generated token
  // but the last.
  const int64_t capacity =
      std::min(n + std::max<int64_t>(r.max_new_tokens - 1, 0), context);
  std::vector<std::vector<float>> captures;
  for (const int64_t w : widths)
    captures.emplace_back(static_cast<size_t>(capacity * w), 0.0f);
  CaptureSink sink(r.hooks, widths, &captures, capacity);

  KvCache& cache = gen->cache();
  cache.Reset(0);
  RETURN_IF_ERROR(cache.Reserve(0, std::min(n + r.max_new_tokens, context)));
  int64_t seq_start[2] = {0, 0};
  int64_t slot[1] = {0};
  int64_t pos0[1] = {0};
  int64_t fed = 0;
  // The interventions of one forward, as eval::Generator::Generate gives
  // them: the prompt's (its positions of the whole prompt) in each prefill
  // chunk, the generated tokens' (every_position) in each decode step.
  std::vector<SequenceEdit> edits;
  auto forward = [&](const int32_t* ids,
                     int64_t len) -> StatusOr<const float*> {
    if (r.cancelled && r.cancelled()) return CancelledError("interrupted");
    seq_start[1] = len;
    pos0[0] = fed;
    sink.set_pos0(fed);
    edits.clear();
    if (r.interventions != nullptr) {
      if (fed < n)
        AddSequenceEdits(*r.interventions, 0, 0, n, &edits);
      else
        AddGeneratedEdits(*r.interventions, 0, 0, fed + 1, &edits);
    }
    const Batch b{std::span<const int32_t>(ids, static_cast<size_t>(len)),
                  std::span<const int64_t>(seq_start, 2)};
    ASSIGN_OR_RETURN(const float* logits,
                     gen->StepLogits(b, {&cache, {slot, 1}, {pos0, 1}},
                                     capture ? &sink : nullptr, edits));
    fed += len;
    return logits;
  };

  const float* logits = nullptr;
  while (fed < n) {
    const int64_t len = std::min(gen->prefill_chunk(), n - fed);
    ASSIGN_OR_RETURN(logits, forward(r.prompt.data() + fed, len));
  }
  if (r.max_new_tokens == 0) out.stop_reason = "prompt";  // nothing asked
  std::mt19937_64 rng(r.sampling.seed);
  eval::SamplingScratch scratch(V);
  while (out.stop_reason.empty()) {
    const int32_t tok = eval::SelectToken(logits, V, r.sampling, rng, scratch);
    out.token_ids.push_back(tok);
    if (std::find(r.stop_ids.begin(), r.stop_ids.end(), tok) !=
        r.stop_ids.end()) {
      out.stop_reason = "stop_id";
      break;
    }
    if (!r.stop_strings.empty()) {
      ASSIGN_OR_RETURN(std::string text,
                       tokenizer->Decode(out.token_ids, true));
      for (const std::string& s : r.stop_strings)
        if (!s.empty() && text.find(s) != std::string::npos)
          out.stop_reason = "stop_string";
      if (!out.stop_reason.empty()) break;
    }
    if (static_cast<int64_t>(out.token_ids.size()) >= r.max_new_tokens) {
      out.stop_reason = "max_tokens";
      break;
    }
    if (fed >= context) {  // no room to feed `tok`
      out.stop_reason = "context";
      break;
    }
    ASSIGN_OR_RETURN(logits, forward(&out.token_ids.back(), 1));
  }
  cache.Reset(0);

  if (tokenizer != nullptr && !out.token_ids.empty()) {
    // Ids past the tokenizer's vocabulary (padding rows of a larger
    // embedding) have no text.
    std::vector<int32_t> known;
    for (const int32_t id : out.token_ids)
      if (id < tokenizer->vocab_size()) known.push_back(id);
    ASSIGN_OR_RETURN(out.text, tokenizer->Decode(known, true));
  }
  if (capture) {
    out.activation_rows = std::min(fed, capacity);
    RETURN_IF_ERROR(SelectCaptures(r, widths, captures, &out));
  }
  return out;
}

}  // namespace loom::python
