// TheLoom's `/api/patching/*` routes with a real patched path: the request
// and response shapes of TheLoom's patching API (docs/server.md, "Activation
// patching"), computed by eval::RunPatch (src/eval/patch.h): the clean
// prompt runs once capturing every grid hook, then each cell (hook, position)
// is the corrupted prompt with that hook's row at that position replaced by
// the clean one, and the metric is the logit difference at the last position.
//
// Mapping of TheLoom's fields: a layer L (negative: from the end) and a
// component name the hook blocks.L'.<site> (L' = L, or n + L); resid_pre,
// resid_post, attn (hook_attn_out: TheLoom's attn.hook_result summed over the
// heads), mlp_post (mlp.hook_post) and Loom's resid_mid, mlp_out, attn_z can
// be patched; attn_q, attn_k, attn_v, attn_pattern and mlp_pre are 501.
// Metrics: logit_diff only (TheLoom's token_diff needs patched generation,
// which RunPatch does not do: 501). causal_effect = m_patched - m_corrupted,
// recovery_rate = causal_effect / (m_clean - m_corrupted), null when the
// denominator is ~0 and the effect is not.
//
// Concurrency: one run at a time per server (a second is 503 with
// Retry-After); a run executes on the calling HTTP worker thread with an
// executor and a CPU backend of its own (its own oneDNN context, arenas and
// OpenMP thread count), reading the engine's immutable model: it never
// touches the engine's scheduler, KV cache or backend, but competes with it
// for cores. Bounds: grid cells, the patched logits' bytes, tokens per
// forward, and a time limit checked before every forward (PatchingOptions).
// State: at most max_experiments experiments, the least recently used idle
// one evicted for a new one; nothing persisted.
//
// Cache (TheLoom's `<experiment>_clean` and `<experiment>_corrupted`): after
// a run of an experiment whose cleanup_on_completion is false (ad hoc runs
// are), its un-patched runs are kept (the clean run's captures of every grid
// hook and both last-position logits: eval::PatchBaselines), at most
// max_cache_bytes in all, the least recently used evicted first. A later run
// of that experiment with the same model, prompts and grid reuses them
// instead of running the clean and corrupted prompts again (metadata
// `reused_baselines`). A completed run whose experiment has
// cleanup_on_completion true clears every cache, as TheLoom's does.
#ifndef LOOM_SERVE_PATCHING_H_
#define LOOM_SERVE_PATCHING_H_

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/eval/patch.h"
#include "src/serve/engine.h"

namespace loom::serve {

struct PatchingOptions {
  int64_t max_experiments = 64;  // kept; the LRU idle one is evicted
  int64_t max_cells = 4096;      // hooks x positions per run (400 past it)
  // Patched last-position logits kept by a run: cells x vocab x 4 bytes.
  int64_t max_logits_bytes = int64_t{256} << 20;
  int64_t batch_tokens = 1024;  // tokens per patched forward (arenas)
  double max_seconds = 300;     // a run past it stops before its next forward
  int threads = 0;              // CPU threads of a run (0 = all)
  // Kept un-patched runs, in bytes (0 = no cache).
  int64_t max_cache_bytes = int64_t{256} << 20;
};

// The token ids of a request's prompt field (text or ids); errors name
// `field`.
using PromptIdsFn = std::function<StatusOr<std::vector<int32_t>>(
    const nlohmann::json& value, const std::string& field)>;

class Patching {
 public:
  explicit Patching(const PatchingOptions& options) : o_(options) {}

  // POST /api/patching/configure.
  StatusOr<nlohmann::json> Configure(const nlohmann::json& body);
  // POST /api/patching/run on `engine`'s model; `stopping` is polled before
  // every forward (the server shutting down).
  StatusOr<nlohmann::json> Run(const nlohmann::json& body, const Engine& engine,
                               const PromptIdsFn& prompt_ids,
                               const std::function<bool()>& stopping);
  // GET /api/patching/results/{id} (metric_type "" = logit_diff).
  StatusOr<nlohmann::json> Results(const std::string& id,
                                   const std::string& metric_type,
                                   bool include_causal_effects);
  // GET /api/patching/experiments.
  nlohmann::json Experiments();
  // GET /api/patching/cache/status, DELETE /api/patching/cache/{id},
  // DELETE /api/patching/cache.
  nlohmann::json CacheStatus();
  StatusOr<nlohmann::json> DeleteCache(const std::string& id);
  nlohmann::json ClearCache();

 private:
  struct Experiment {
    std::string id, name;
    std::vector<int64_t> layers;
    std::vector<std::string> components;
    bool validate_shapes = true, cleanup_on_completion = true;
    nlohmann::json positions = "all";  // Loom: "all" | "last" | [ints]
    int64_t answer = -1, wrong = -1;   // Loom: answer_token_ids A / B
    std::string status = "configured";
    nlohmann::json record;  // the last completed run (null before)
  };
  // Adds `e` (evicting the least recently used idle experiment when full).
  Status Insert(Experiment e);
  // Moves `id` to the front (most recently used); nullptr if unknown.
  Experiment* Touch(const std::string& id);
  void SetStatus(const std::string& id, const std::string& status,
                 nlohmann::json record);

  // One experiment's kept un-patched runs, for the model `model`.
  // `runs` is shared with a run reading it and replaced, never changed.
  struct Cache {
    std::string experiment, model;
    std::shared_ptr<const eval::PatchBaselines> runs;
    int64_t bytes() const {
      return runs->clean_bytes() + runs->corrupted_bytes();
    }
  };
  // Keeps `runs` as `experiment`'s cache (replacing it), then evicts the
  // least recently used caches past max_cache_bytes. Caller holds mu_.
  void Keep(const std::string& experiment, const std::string& model,
            eval::PatchBaselines runs);
  // The cache of `experiment` for `model`, moved to the front; nullptr if
  // none. Caller holds mu_.
  Cache* FindCache(const std::string& experiment, const std::string& model);

  PatchingOptions o_;
  std::mutex mu_;              // guards lru_ and caches_
  std::list<Experiment> lru_;  // most recently used first
  std::list<Cache> caches_;    // most recently used first
  std::mutex run_mu_;          // held by the one run in progress
};

}  // namespace loom::serve

#endif  // LOOM_SERVE_PATCHING_H_
