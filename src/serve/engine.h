// Engine: one loaded model behind `loom serve`, with a scheduler that packs
// every in-flight request into shared forwards (continuous batching) and an
// admission rule that keeps every byte inside what was planned at load.
//
// At Create the engine builds, once, everything a forward touches:
//   - the executor's arenas for `batch_tokens` tokens per forward (prefill
//     chunks and decode tokens packed together, no padding),
//   - the KV cache (the planner's kv term, src/plan/kv_layout.h): by
//     default paged: the global layers hold ceil(kv_tokens / page_size)
//     pages of `page_size` positions shared by the slots (sliding-window
//     layers keep one ring per slot), so the KV is planned for a declared
//     number of concurrent tokens (kv_tokens; 0 = slots x context) and a
//     request holds only the pages it needs; with page_size 0, every slot
//     holds `context` positions of its own,
//   - the logits head for one row per slot,
//   - a capture budget of `capture_bytes` host bytes for the hidden states
//     requests ask for.
// These are the engine's planned bytes (Memory()); nothing is allocated for
// a forward afterwards, and a request is admitted only when what it needs is
// free:
//   - one KV slot (a request's prompt must fit the context; generation stops
//     when the context is full, stop_reason "context"),
//   - with a paged cache, PagesFor(min(prompt + max_new_tokens, context))
//     free KV pages, reserved at admission and freed when it finishes,
//   - its capture bytes: rows x sum of hook widths x 4 (rows = 1 for the
//     last row; for every row: prompt + max_new_tokens - 1, at most the
//     context, as the last generated token is never fed), plus the bytes of
//     its intervention vectors (4 per value: they live as long as the
//     request and are read by every forward it is in), both from the one
//     capture budget.
// A request that does not fit now waits in a FIFO queue of at most
// `max_queue` requests (admitted in arrival order: a large request is not
// overtaken forever by small ones); past that Submit returns
// ResourceExhausted (the server's 503 + Retry-After). A request that could
// never fit (prompt longer than the context, captures larger than the whole
// budget, more KV pages than the whole pool) is refused at Submit with
// OutOfRange naming both numbers.
//
// Scheduling, one forward per iteration of the scheduler thread:
//   1. admit queued requests while a slot, their KV pages and their capture
//      bytes are free;
//   2. one token for every sequence that is decoding;
//   3. prefill chunks (at most `prefill_chunk` tokens each) of sequences still
//      reading their prompt, in admission order, while the forward's token
//      budget lasts;
//   4. the forward with the KV cache, then one token selected per sequence
//      whose prompt is complete; finished sequences free their slot, pages
//      and capture bytes before the next iteration.
// Interventions: each request carries its own (GenRequest::interventions);
// every forward edits each sequence it packs with that sequence's own, as
// Executor::Forward's SequenceEdits of its index in the forward (a prefill
// chunk: the prompt edits, positions counted in the whole prompt; a decode
// token: the edits of generated tokens). Nothing touches a neighbour's rows.
// The edit list is reserved at admission: nothing is allocated per forward.
//
// A prompt longer than a chunk is prefilled over several forwards carrying
// the KV cache: its hidden states equal a one-pass forward's to f32 round-off
// (docs/design/generation.md), unlike TheLoom's independent chunks.
//
// Thread-safety: Submit, Cancel, Stats, Memory and the const accessors may be
// called from any thread; the model, tokenizer and template are immutable.
#ifndef LOOM_SERVE_ENGINE_H_
#define LOOM_SERVE_ENGINE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "src/backend/backend.h"
#include "src/base/status.h"
#include "src/eval/generate.h"
#include "src/eval/session.h"
#include "src/model/hooks.h"
#include "src/model/interventions.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"
#include "src/tokenizer/chat_template.h"
#include "src/tokenizer/tokenizer.h"

namespace loom::serve {

struct EngineOptions {
  Precision precision = Precision::kAuto;
  int64_t slots = 8;            // sequences decoded together
  int64_t context = 0;          // KV positions per slot; 0 = min(2048, max)
  int64_t prefill_chunk = 512;  // prompt tokens per forward per sequence
  int64_t batch_tokens = 0;     // tokens per forward; 0 = chunk + slots
  int64_t capture_bytes = 256 << 20;  // hidden states of in-flight requests
  int64_t max_queue = 256;            // requests waiting for admission
  // KV positions of the global layers shared by all slots: a paged cache of
  // ceil(kv_tokens / page_size) pages; 0 = slots x context.
  int64_t kv_tokens = 0;
  // Positions per KV page; 0 = no pages: every slot holds `context`
  // positions of its own (kv_tokens must then be 0).
  int64_t page_size = eval::kKvPageSize;
  // Hooks capturable besides TheLoom's hidden-state layers (every
  // blocks.K.hook_resid_pre and ln_final.hook_normalized): extract patterns
  // such as "blocks.*.hook_mlp_out".
  std::vector<std::string> extra_hooks;
  // What the user wrote extra_hooks as, named in errors about them: the
  // serve YAML key by default; `loom generate` sets its hooks flag.
  std::string extra_hooks_setting = "memory.activation_cache_filter";
  // Hooks captured where the model has them, skipped where it does not
  // (the server's: the hooks its SAEs read, the last hook_resid_post of the
  // logit lens), so that one server's models need not share their depth.
  std::vector<std::string> optional_hooks;
  int threads = 0;  // CPU threads (0 = all)
  // Placement (--device, --max-memory, --reserve; serve's YAML `devices` and
  // `memory` keys): the engine is planned like any job, and refused before
  // loading when it does not fit. The plan may split the layers across
  // devices, offload or stream them (each layer's KV cache lives on the
  // device that computes it).
  JobPlanOptions plan;
  // Tests: every layer runs on this backend (SessionParams'
  // compute_backend_for_tests: the host-as-device stand-in for a GPU).
  Backend* compute_backend_for_tests = nullptr;
  // The command, in messages ("loom serve: warning: ...").
  std::string command = "serve";
  // Asked with the model's plan once it fits, before anything is loaded
  // (SessionParams::admit): the server's admission beside the loaded models.
  std::function<Status(const MemoryPlan&)> admit;
  // Interventions of the whole engine (`loom generate --hooks`'s flags),
  // checked against the model when it opens; session().interventions()
  // holds them for the requests that carry them. The server leaves this
  // empty: its requests bring their own.
  InterventionSource interventions;
};

// Which captured rows a request keeps.
enum class CaptureRows {
  kLast,  // the last position fed to the model (the one that chose the last
          // token; for a prompt only: its last token)
  kAll,   // every position fed: the prompt, then each generated token but
          // the last (which is never fed)
};

struct GenRequest {
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 0;  // 0: the prompt's forward only (embeddings)
  eval::SamplingOptions sampling;
  std::vector<int32_t> stop_ids;
  std::vector<std::string> stop_strings;
  std::vector<HookPoint> hooks;  // each one of Engine::capturable()
  CaptureRows rows = CaptureRows::kLast;
  // Edits of this request's one sequence (src/model/interventions.h), in
  // order; the sequence is input row 0 for `rows` (leave it empty: the
  // server's InterventionsForPrompt selects a batch request's prompts and
  // clears it). Validated at Submit: sites, widths, finite values, heads and
  // prompt positions against the prompt.
  std::vector<Intervention> interventions;
  // Transformer blocks (0 <= b < num_layers) whose attention probabilities
  // of the last position fed are returned (TheLoom's return_attention):
  // GenResult::attention[i] for attention_layers[i]. They count in the
  // capture bytes: per block, one query row (q_heads x head_dim) and
  // q_heads x (the positions the request can feed) probabilities.
  std::vector<int64_t> attention_layers;
  // Called on the scheduler thread for every generated token with the text
  // it completes (UTF-8 held back until whole); keep it short.
  std::function<void(int32_t id, const std::string& piece)> on_token;
  // Called on the scheduler thread once the ticket holds the result.
  std::function<void()> on_finish;
};

struct GenResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> token_ids;  // generated ids
  std::string text;                // decoded token_ids
  // stop_id | stop_string | max_tokens | context | prompt (no generation
  // asked) | cancelled
  std::string stop_reason;
  // captures[h]: [rows, widths[h]] f32 for request.hooks[h].
  std::vector<std::vector<float>> captures;
  std::vector<int64_t> widths;
  int64_t rows = 0;
  // attention[i]: [attention_heads[i], attention_keys] f32, block
  // request.attention_layers[i]: the softmax probabilities of the last
  // position fed (the one that chose the last token) over every position
  // fed, the KV cache's keys as the forward saw them; 0 where masked (outside
  // a sliding window). A row sums to 1 (less the sink's share with
  // attention sinks).
  std::vector<std::vector<float>> attention;
  std::vector<int64_t> attention_heads;
  int64_t attention_keys = 0;
  double queue_ms = 0, run_ms = 0;  // waiting for admission; admitted to done
};

// One submitted request: its result, once done.
class Ticket {
 public:
  // Blocks until the request finishes (or fails).
  StatusOr<GenResult> Wait();
  // Asks the scheduler to stop the request at its next step (stop_reason
  // "cancelled"); a queued request is dropped.
  void Cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  friend class Engine;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
  GenResult result_;
  std::atomic<bool> cancelled_{false};
};

struct EngineStats {
  int64_t requests_admitted = 0, requests_completed = 0, requests_failed = 0,
          requests_rejected = 0, requests_cancelled = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  int64_t forwards = 0, forward_tokens = 0, forward_seqs = 0;
  int64_t max_forward_seqs = 0;
  double forward_seconds = 0;
  int64_t queued = 0, active = 0;
  int64_t capture_reserved = 0;
  // Forwards holding at least two sequences (requests), at least one of
  // them edited: proof that requests with different interventions (or
  // none) shared forwards.
  int64_t mixed_edit_forwards = 0;
  int64_t edits_applied = 0;  // SequenceEdits over all forwards
};

// Planned bytes of an engine (host memory), and what is in use now.
struct EngineMemory {
  int64_t weights = 0;  // the model's weights (mapped checkpoint and any
                        // converted copy)
  int64_t arenas = 0;   // executor activations + workspace + logits
  int64_t kv = 0;       // KV cache (slots x context, or the page pool and
                        // the window rings) + its workspace
  int64_t head = 0;     // logits head (one row per slot)
  int64_t capture = 0;  // capture budget
  int64_t planned() const { return weights + arenas + kv + head + capture; }
  // In use: KV of the occupied slots (paged: the reserved pages plus the
  // window rings of the occupied slots), captures reserved.
  int64_t kv_used = 0;
  int64_t capture_used = 0;
};

class Engine {
 public:
  // Loads `dir` (config.json, safetensors, tokenizer) under the name `id`,
  // plans and allocates everything, and starts the scheduler thread.
  static StatusOr<std::unique_ptr<Engine>> Create(const std::string& id,
                                                  const std::string& dir,
                                                  const EngineOptions& options);

  // Stops (Shutdown(true)) and frees.
  ~Engine();

  // Queues a request (see the header comment for the errors).
  StatusOr<std::shared_ptr<Ticket>> Submit(GenRequest request);
  // Stops accepting requests; with `drain` the queued and running ones
  // finish first, else they end with an error. Idempotent.
  void Shutdown(bool drain);

  // TheLoom's hidden-state layer index (HF's output_hidden_states index;
  // negative from the end: -1 = n = the final norm) as a hook.
  StatusOr<HookPoint> LayerHook(int64_t index) const;
  // Whether `hook` is captured by this engine's forwards, and which are.
  bool Capturable(const HookPoint& hook) const;
  const HookSet& capturable() const { return capturable_; }
  StatusOr<int64_t> HookWidthOf(const HookPoint& hook) const;

  const std::string& id() const { return id_; }
  const std::string& dir() const { return dir_; }
  const Model& model() const { return session_->model(); }
  // The model's tokenizer; null for a checkpoint without one, which serves
  // token-id prompts only (tokenizer_error() says why there is none).
  const tok::Tokenizer* tokenizer() const { return session_->tokenizer(); }
  const std::string& tokenizer_error() const {
    return session_->tokenizer_error();
  }
  // The session the engine runs in: its plan, devices and model.
  const Session& session() const { return *session_; }
  // The model's chat template, if it has one.
  const tok::ChatTemplate* chat_template() const {
    return chat_template_ ? &*chat_template_ : nullptr;
  }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  const EngineOptions& options() const { return options_; }
  int64_t context() const { return context_; }
  double load_seconds() const { return load_seconds_; }
  EngineStats Stats() const;
  EngineMemory Memory() const;

 private:
  struct Pending;
  struct Seq;
  class CaptureSink;
  Engine(const std::string& id, const std::string& dir,
         const EngineOptions& options);
  void Loop();
  // One scheduler iteration (admission, forward, token selection).
  Status Step();
  void Admit();
  void Finish(Seq& s, Status status);
  int64_t CaptureNeed(const GenRequest& r) const;
  // The hook of the query rows block `layer`'s attention reads: rotated q
  // (attn.hook_rot_q) with rotary embeddings, else attn.hook_q.
  HookPoint AttentionQueryHook(int64_t layer) const;
  // s.result.attention from the captured query rows and the KV cache of
  // s's slot (before the slot is reset).
  void AttentionRows(Seq& s);
  // InvalidArgument when `r`'s interventions cannot run on this engine (a
  // bad site, width, head, value, or a prompt position outside the prompt):
  // a failing forward would fail its neighbours too.
  Status CheckInterventions(const GenRequest& r) const;
  // The edits of this step's sequences into edits_ (reserved).
  void BuildEdits(const std::vector<Seq*>& step);
  // KV pages a request reserves (0 without paging).
  int64_t PagesNeed(const GenRequest& r) const;
  int64_t WidthOf(const HookPoint& hook) const;
  // Text of generated ids (scheduler thread only).
  StatusOr<std::string> DecodeText(const std::vector<int32_t>& ids);

  const std::string id_, dir_;
  EngineOptions options_;
  std::unique_ptr<Session> session_;
  std::optional<tok::ChatTemplate> chat_template_;
  std::vector<int32_t> stop_ids_;
  std::unique_ptr<eval::Generator> gen_;
  std::unique_ptr<CaptureSink> sink_;
  HookSet capturable_;
  int64_t context_ = 0;
  double load_seconds_ = 0;
  EngineMemory memory_;

  mutable std::mutex mu_;  // guards the queue, flags and stats
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Pending>> queue_;
  bool accepting_ = true, stop_ = false, drain_ = true;
  EngineStats stats_;
  // Scheduler-thread state.
  std::vector<std::unique_ptr<Seq>> active_;
  std::vector<Seq*> step_seqs_, done_seqs_;  // one step's sequences (Step)
  std::vector<int64_t> free_slots_;
  // This forward's edits; capacity >= the interventions of the admitted
  // requests (active_interventions_), grown at admission only.
  std::vector<SequenceEdit> edits_;
  int64_t active_interventions_ = 0;
  int64_t pages_reserved_ = 0;  // guarded by mu_ (Memory reads it)
  std::unique_ptr<eval::SamplingScratch> scratch_;
  std::vector<int32_t> ids_, decode_ids_;
  std::vector<int64_t> seq_start_, slot_, pos0_;
  std::thread thread_;
};

}  // namespace loom::serve

#endif  // LOOM_SERVE_ENGINE_H_
