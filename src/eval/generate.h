// Text generation with a KV cache: prompt prefill in chunks, then one token
// per step for every active sequence, batched (docs/design/generation.md).
//
// A Generator owns an Executor (hooks: the final norm only), a KvCache of
// `slots` sequences of up to `context` positions, and a LogitsHead for one
// row per slot. Generate() runs a list of prompts: each takes a free slot,
// is prefilled chunk by chunk (the last chunk's last row gives the first
// token's logits), then joins the decode batch (one new token per active
// sequence per forward); a finished sequence frees its slot for the next
// prompt between steps. Everything a step touches is sized at Create; the
// forwards and the token selection allocate nothing (detokenizing for stop
// strings does, outside the forward).
//
// Token selection (SelectToken), per sequence with its own RNG:
//   temperature == 0: greedy, the first maximum of the logits (as HF's
//     argmax);
//   else, in Hugging Face's order: logits / temperature; top-k (k > 0):
//     logits below the k-th largest become -inf (ties with it are kept);
//     top-p (< 1): sorted by ascending probability (ties: higher id first),
//     the prefix whose cumulative probability is <= 1 - top_p is dropped,
//     never the most probable token; then softmax (double) over what is
//     left and one draw u = (rng() >> 11) * 2^-53 from std::mt19937_64
//     seeded with seed + the prompt's index: the first token, in id order,
//     at which the cumulative probability exceeds u.
#ifndef LOOM_EVAL_GENERATE_H_
#define LOOM_EVAL_GENERATE_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/eval/logits_head.h"
#include "src/runtime/executor.h"
#include "src/runtime/kv_cache.h"
#include "src/runtime/model.h"

namespace loom::tok {
class Tokenizer;
}

namespace loom::eval {

// The temperatures every front end accepts (`loom generate --temperature`,
// serve's `temperature` field, ValidateSampling): [0, kMaxTemperature], as
// OpenAI's and TheLoom's APIs.
inline constexpr float kMaxTemperature = 2.0f;

// Positions per KV-cache page of the serving engine (serve, `loom generate
// --hooks`, the Python module's generate): one value, so their forwards
// and outputs are the same.
inline constexpr int64_t kKvPageSize = 16;

struct SamplingOptions {
  float temperature = 0.0f;  // 0 = greedy; at most kMaxTemperature
  int64_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
};

// Scratch of SelectToken for a vocabulary of `vocab` tokens (sized once).
struct SamplingScratch {
  explicit SamplingScratch(int64_t vocab)
      : values(static_cast<size_t>(vocab)),
        order(static_cast<size_t>(vocab)),
        probs(static_cast<size_t>(vocab)) {}
  std::vector<float> values;   // [V] scaled and filtered logits
  std::vector<int32_t> order;  // [V] token ids, sorted for top-k / top-p
  std::vector<double> probs;   // [V]
};

// The next token from logits [vocab] (see the header comment).
int32_t SelectToken(const float* logits, int64_t vocab,
                    const SamplingOptions& options, std::mt19937_64& rng,
                    SamplingScratch& scratch);

// Checks the options against the generation parameters' ranges
// (GenerationParams, src/eval/params.h): temperature in [0,
// kMaxTemperature], top_k in [0, 2^30], top_p in (0, 1].
Status ValidateSampling(const SamplingOptions& options);

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  SamplingOptions sampling;
  // Generation of a sequence stops after it emits one of these (kept in
  // token_ids, as HF does), or once its detokenized text contains one of
  // the stop strings (needs a tokenizer; the text is kept whole).
  std::vector<int32_t> stop_ids;
  std::vector<std::string> stop_strings;
  // Interventions (borrowed, may be null): those whose `rows` include a
  // prompt's index (or every prompt) edit its prefill at their positions
  // (edits_prompt) and every generated token fed back (edits_generated).
  const std::vector<Intervention>* interventions = nullptr;
};

struct Generation {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> token_ids;  // generated ids only
  std::string text;                // decoded token_ids ("" without tokenizer)
  // "stop_id", "stop_string", "max_tokens", "context" (the cache is full)
  // or "prompt" (max_new_tokens 0: nothing was asked for; as loom serve).
  std::string stop_reason;
};

// The stop ids of a model directory: config.json's eos_token_id and
// generation_config.json's eos_token_id (an id or a list), deduplicated.
StatusOr<std::vector<int32_t>> LoadStopIds(const Model& model);

class Generator {
 public:
  struct Options {
    int64_t slots = 1;    // sequences decoded together
    int64_t context = 0;  // positions per sequence; 0 = min(2048, max pos)
    int64_t prefill_chunk = 256;  // prompt tokens per forward
    // Tokens per forward (a batch may mix prefill chunks and decode tokens);
    // 0 = max(prefill_chunk, slots).
    int64_t batch_tokens = 0;
    // Hooks besides the final norm that StepLogits may deliver to a capture
    // sink (e.g. the server's hidden-state layers).
    HookSet capture_hooks;
    // The executor's backend (not owned); null = a CPU backend it owns.
    Backend* backend = nullptr;
    // A placement (a Session's segments(): layers split across devices,
    // offloaded or streamed from disk); when given, `backend` is ignored and
    // the KV cache holds each layer on the device that computes it.
    std::vector<ExecutorSegment> segments;
    // Paged KV (KvCache, src/plan/kv_layout.h); page_size 0 = contiguous.
    // Generate reserves min(prompt + max_new_tokens, context) positions when
    // a prompt takes a slot (waiting for pages as for slots) and frees them
    // when its sequence ends.
    KvPaging paging;
  };
  static StatusOr<std::unique_ptr<Generator>> Create(const Model& model,
                                                     const Options& options);
  ~Generator();

  // `options` with the defaults filled in for `config` (context,
  // batch_tokens, the prefill chunk capped at the context), as Create runs
  // them; InvalidArgument / OutOfRange as Create.
  static StatusOr<Options> Resolve(const ModelConfig& config,
                                   const Options& options);
  // The job the planner sizes for a generator of `resolved` options: its
  // KV cache, its forwards' activations and the logits of every slot.
  static JobSpec Job(const ModelConfig& config, const Options& resolved);

  // Generates a continuation of every prompt. `tokenizer` (may be null)
  // decodes the text and enables stop strings. A prompt longer than the
  // context is an OutOfRange error naming both numbers.
  StatusOr<std::vector<Generation>> Generate(
      const std::vector<std::vector<int32_t>>& prompts,
      const GenerateOptions& options,
      const tok::Tokenizer* tokenizer = nullptr);

  // Forward of `batch` with the cache (see KvBatch) and logits of the last
  // token of each sequence: [num_seqs, vocab], valid until the next call.
  StatusOr<const float*> StepLogits(const Batch& batch, const KvBatch& kv);
  // The same, delivering every hook of Options::capture_hooks (and the final
  // norm) to `capture` (may be null) as the forward produces it.
  StatusOr<const float*> StepLogits(const Batch& batch, const KvBatch& kv,
                                    HookSink* capture);
  // The same with interventions (Executor::Forward's SequenceEdit).
  StatusOr<const float*> StepLogits(const Batch& batch, const KvBatch& kv,
                                    HookSink* capture,
                                    std::span<const SequenceEdit> edits);

  KvCache& cache() { return *cache_; }
  const Executor& executor() const { return *executor_; }
  const LogitsHead& head() const { return *head_; }
  int64_t context() const { return options_.context; }
  int64_t slots() const { return options_.slots; }
  int64_t prefill_chunk() const { return options_.prefill_chunk; }
  int64_t batch_tokens() const { return options_.batch_tokens; }

 private:
  class LastRowSink;
  Generator(const Model& model, const Options& options);
  const Model& model_;
  Options options_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<LogitsHead> head_;
  std::unique_ptr<LastRowSink> sink_;
  std::unique_ptr<Backend> owned_backend_;
  // Per step (sized at Create): ids [slots + prefill_chunk], sequence
  // offsets [slots + 1], slots and first positions [slots], the final-norm
  // row of each sequence's last token [slots, hidden].
  std::vector<int32_t> ids_;
  std::vector<int64_t> seq_start_, slot_, pos0_;
  std::vector<float> last_hidden_;
  std::vector<SequenceEdit> edits_;  // of one step (capacity reserved)
};

}  // namespace loom::eval

#endif  // LOOM_EVAL_GENERATE_H_
