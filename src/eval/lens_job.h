// The lens grid of one prompt: one forward capturing residual hooks, each
// read through the logit lens or a tuned lens (src/eval/lens.h) as the
// forward delivers it, so only one hook's rows and one chunk of [rows, V]
// logits exist at a time. What `loom lens` prints and Neuronpedia's
// /v1/lens/prompt returns: a (layer x position) grid of top-k tokens.
#ifndef LOOM_EVAL_LENS_JOB_H_
#define LOOM_EVAL_LENS_JOB_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/model/lens.h"
#include "src/plan/job.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"
#include "src/tokenizer/tokenizer.h"

namespace loom::eval {

struct LensGridOptions {
  // Hook patterns and layers (ResolveHooks); empty: the lens's usual rows,
  // blocks.0.hook_resid_pre then every blocks.i.hook_resid_post.
  std::vector<std::string> hooks, layers;
  int64_t topk = 10;
  // Rows whose logits are computed at a time ([chunk_rows, V] floats): 256
  // rows keep the head's GEMM near the forward's efficiency (docs/saes.md,
  // "Lenses": the measured cost).
  int64_t chunk_rows = 256;
  const TunedLens* tuned = nullptr;  // null: the logit lens
  // Also KL(final || lens) per hook and position: the final layer's
  // distribution (the model's own, the last blocks.i.hook_resid_post, which
  // the grid then always holds) against each hook's. Each hook's rows are
  // kept ([hooks, tokens, hidden] floats, LensGrid::kl_bytes) until the
  // final one is known; then, chunk by chunk, two [chunk_rows, V] blocks of
  // logits exist at a time, never [hooks, tokens, V].
  bool kl = false;
  bool hf_bf16_activations = false;
  std::vector<ExecutorSegment> segments;  // the session's placement
};

struct LensGrid {
  std::vector<HookPoint> hooks;  // the grid's rows, in execution order
  int64_t tokens = 0, topk = 0;
  std::vector<int32_t> topk_ids;   // [hooks, tokens, topk]
  std::vector<float> topk_logits;  // [hooks, tokens, topk]
  // With LensGridOptions::kl: [hooks, tokens] nats, KL(final || hook)
  // (accumulated in f64 from the f32 log-softmaxes); 0 at the final hook.
  std::vector<float> kl;
  int64_t executor_bytes = 0, lens_bytes = 0, kl_bytes = 0;
  double seconds = 0;       // the forward with the lens
  double lens_seconds = 0;  // of which inside the lens (head GEMMs, top-k)
};

// The grid's hooks: residual hooks only (a lens reads nothing else; the
// error names the hook), each with a translator when `tuned` is given.
StatusOr<std::vector<HookPoint>> LensGridHooks(const ModelConfig& c,
                                               const LensGridOptions& o);
// The forward's shape for the planner: `tokens` tokens, the grid's hooks.
StatusOr<JobSpec> LensGridJob(const ModelConfig& c, int64_t tokens,
                              const LensGridOptions& o);
StatusOr<LensGrid> RunLensGrid(const Model& model, std::span<const int32_t> ids,
                               const LensGridOptions& o);
// {"hooks", "input_ids", "topk_ids" [hooks][tokens][topk], "topk_logits",
// with kl "kl_to_final" [hooks][tokens], and with a tokenizer "tokens" and
// "topk_tokens" (each id decoded alone)}.
nlohmann::json LensGridJson(const LensGrid& g, std::span<const int32_t> ids,
                            const tok::Tokenizer* tokenizer);

}  // namespace loom::eval

#endif  // LOOM_EVAL_LENS_JOB_H_
