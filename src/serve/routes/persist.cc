// The experiment record of a generation request (persist.h).
#include "src/serve/routes/persist.h"

#include <algorithm>
#include <utility>

#include "src/serve/routes/common.h"

namespace loom::serve::routes {

namespace {

// An experiment's config: the request's fields but its inputs (prompt,
// prompts, messages), `persist` and the interventions' vectors (their
// count instead), with the generation parameters as they were applied
// (defaults included).
json PersistConfig(const std::string& route, const json& b,
                   const GenFields& f) {
  json c = json::object();
  for (const auto& [k, v] : b.items())
    if (k != "prompt" && k != "prompts" && k != "messages" && k != "persist" &&
        k != "interventions")
      c[k] = v;
  if (b.contains("interventions") && b["interventions"].is_array())
    c["interventions"] = b["interventions"].size();
  const GenRequest& r = f.request;
  c["route"] = route;
  c["max_tokens"] = r.max_new_tokens;
  c["temperature"] = f.temperature;
  c["top_p"] = f.top_p;
  c["top_k"] = r.sampling.top_k;
  c["seed"] = r.sampling.seed;
  c["stop"] = r.stop_strings;
  c["return_hidden_states"] = f.return_hidden;
  json layers = json::array();
  for (const auto& [key, _] : f.layers) layers.push_back(std::stoll(key));
  c["hidden_state_layers"] = layers;
  c["return_full_sequence"] = f.full_sequence;
  c["return_attention"] = f.return_attention;
  c["hidden_state_format"] =
      f.format == ArrayFormat::kBase64 ? "base64" : "list";
  c["hidden_state_dtype"] = ReturnDTypeName(f.dtype);
  return c;
}

}  // namespace

// Whether a request is recorded: auto_persist on and the body's `persist`
// (default true; a non-boolean is a 400 either way).
StatusOr<bool> Persisting(const ServerContext& ctx, const json& b) {
  ASSIGN_OR_RETURN(bool persist, GetBool(b, "persist", true));
  return persist && ctx.recorder != nullptr;
}

// A plain prompt as a conversation message: its text, or the JSON list of
// its token ids.
std::vector<ExperimentRecord::Message> PromptInput(const json& p) {
  return {{"user", p.is_string() ? p.get<std::string>() : Dump(p)}};
}

// The experiment of one generation: `input` then the reply, the token
// counts and speed, and the hidden states the reply returned (the last
// position of each layer as [hidden]; with `sequence`, each layer's
// sequence_hidden_states as [tokens, hidden]). `done` is how the request
// ended: failed (its message in the notes) unless ok.
ExperimentRecord Record(const Engine& e, const std::string& route,
                        const json& b, const GenFields& f, bool chat,
                        std::vector<ExperimentRecord::Message> input,
                        const StatusOr<GenResult>& g, const Status& done) {
  ExperimentRecord r;
  r.model = e.id();
  r.config = PersistConfig(route, b, f);
  r.conversations = std::move(input);
  if (!done.ok() || !g.ok()) {
    r.status = "failed";
    r.notes = (done.ok() ? g.status() : done).message();
    return r;
  }
  r.conversations.push_back({"assistant", g->text});
  const double tokens = static_cast<double>(g->token_ids.size());
  r.metrics = {
      {"prompt_tokens", static_cast<double>(g->prompt_ids.size()), "tokens"},
      {"completion_tokens", tokens, "tokens"},
      {"latency_ms", g->queue_ms + g->run_ms, "ms"},
      {"tokens_per_second", g->run_ms > 0 ? tokens / (g->run_ms / 1000.0) : 0.0,
       "tokens/s"}};
  if (!f.return_hidden) return r;
  for (const auto& [key, hook] : f.layers) {
    int64_t w = 0;
    const float* rows = Capture(f, *g, hook, &w);
    const float* last = rows + (g->rows - 1) * w;
    r.hidden_states.push_back(
        {std::stoll(key), f.dtype, Shape({w}), {last, last + w}});
  }
  if (f.full_sequence && !chat)
    for (const auto& [key, hook] : f.layers) {
      int64_t w = 0;
      const float* rows = Capture(f, *g, hook, &w);
      const int64_t first = static_cast<int64_t>(g->prompt_ids.size()) - 1;
      const int64_t count =
          std::min<int64_t>(std::max<int64_t>(g->rows - first, 0),
                            static_cast<int64_t>(g->token_ids.size()));
      if (count <= 0) continue;
      r.hidden_states.push_back(
          {std::stoll(key),
           f.dtype,
           Shape({count, w}),
           {rows + first * w, rows + (first + count) * w}});
    }
  return r;
}

// Hands a record to the writer thread (never blocks on the store).
void Persist(ServerContext& ctx, ExperimentRecord r) {
  if (ctx.recorder != nullptr) ctx.recorder->Submit(std::move(r));
}

}  // namespace loom::serve::routes
