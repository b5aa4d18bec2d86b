// Neuronpedia's activation, tokenize and capabilities routes
// (neuronpedia.h).
#include "src/serve/routes/neuronpedia.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "src/serve/routes/common.h"
#include "src/serve/routes/generation.h"

namespace loom::serve::routes {

bool IsNeuronpediaPath(std::string_view path) {
  for (std::string_view p : {"/v1/activation/", "/v1/steer/", "/v1/lens/"})
    if (path.rfind(p, 0) == 0) return true;
  return path == "/v1/tokenize" || path == "/v1/capabilities";
}

std::string NpKey(const json& b, std::string_view camel,
                  std::string_view snake) {
  if (!b.contains(camel) && b.contains(snake)) return std::string(snake);
  return std::string(camel);
}

StatusOr<std::string> NpRequiredString(const json& b, const std::string& key) {
  if (!b.contains(key) || !b[key].is_string())
    return InvalidArgumentError("field `" + key + "`: expected a string, got " +
                                (b.contains(key) ? Dump(b[key]) : "nothing"));
  return b[key].get<std::string>();
}

StatusOr<std::shared_ptr<Engine>> NpEngine(ServerContext& ctx, const json& b) {
  ASSIGN_OR_RETURN(const std::string name, GetString(b, "model", ""));
  std::string dir;
  if (!name.empty() && ctx.models.Resolve(name, &dir).ok())
    return ctx.models.EngineFor(b);
  json unnamed = b;
  unnamed.erase("model");
  return ctx.models.EngineFor(unnamed);
}

json Prompt(const json& b) { return b.value("prompt", json()); }

StatusOr<std::vector<int32_t>> NpTokens(const ServerOptions& o, const Engine& e,
                                        const json& prompt,
                                        const std::string& field) {
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, Tokens(o, e, prompt, true, field));
  if (prompt.is_string()) SetLeadingBos(e, true, &ids);
  return ids;
}

bool StartsWithBos(const Engine& e, const std::vector<int32_t>& ids) {
  return e.tokenizer() != nullptr && e.tokenizer()->bos_id() >= 0 &&
         !ids.empty() && ids.front() == e.tokenizer()->bos_id();
}

bool SetLeadingBos(const Engine& e, bool want, std::vector<int32_t>* ids) {
  const bool has = StartsWithBos(e, *ids);
  if (want && !has && e.tokenizer() != nullptr && e.tokenizer()->bos_id() >= 0)
    ids->insert(ids->begin(), e.tokenizer()->bos_id());
  if (!want && has && ids->size() > 1) ids->erase(ids->begin());
  return StartsWithBos(e, *ids);
}

bool IsSpecialToken(const Engine& e, int32_t id) {
  return e.tokenizer() != nullptr && e.tokenizer()->IsSpecial(id);
}

StatusOr<nlohmann::ordered_json> NpMessages(const json& b,
                                            const std::string& key) {
  if (!b.contains(key) || !b[key].is_array() || b[key].empty())
    return InvalidArgumentError("field `" + key +
                                "`: expected a non-empty list of {role, "
                                "content}");
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (size_t i = 0; i < b[key].size(); ++i) {
    const json& m = b[key][i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
        !m.contains("content") || !m["content"].is_string())
      return InvalidArgumentError("field `" + key + "[" + std::to_string(i) +
                                  "]`: expected string `role` and `content`");
    messages.push_back({{"role", m["role"].get<std::string>()},
                        {"content", m["content"].get<std::string>()}});
  }
  return messages;
}

void NpPost(HttpListeners& http, ServerContext& ctx, const std::string& path,
            NpHandler f) {
  http.Post(path, JsonRoute(ctx, path, [&ctx, f](const auto& req, auto& res) {
              return f(ctx, req, res);
            }));
}

std::string TokenText(const Engine& e, int32_t id) {
  if (e.tokenizer() == nullptr) return std::to_string(id);
  StatusOr<std::string> s =
      e.tokenizer()->Decode(std::span<const int32_t>(&id, 1),
                            /*skip_special_tokens=*/false);
  return s.ok() ? *std::move(s) : "<" + std::to_string(id) + ">";
}

std::vector<std::string> TokenStrings(const Engine& e,
                                      const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(TokenText(e, id));
  return out;
}

namespace {

// POST /v1/tokenize: `prependBos` (default: the tokenizer's own rule)
// puts the BOS on or takes it off; the reply's says what was applied.
Status Tokenize(ServerContext& ctx, const httplib::Request& req,
                httplib::Response& res) {
  ASSIGN_OR_RETURN(json b, ParseBody(req.body));
  ASSIGN_OR_RETURN(auto e, NpEngine(ctx, b));
  if (!b.contains("text") || !b["text"].is_string())
    return InvalidArgumentError("field `text`: expected a string");
  ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                   Tokens(ctx.options, *e, b["text"], true, "text"));
  ASSIGN_OR_RETURN(const bool want,
                   GetBool(b, NpKey(b, "prependBos", "prepend_bos"),
                           StartsWithBos(*e, ids)));
  const bool applied = SetLeadingBos(*e, want, &ids);
  Reply(res, 200,
        {{"tokens", ids},
         {"tokenStrings", TokenStrings(*e, ids)},
         {"prependBos", applied}});
  return Status();
}

json Capabilities(ServerContext& ctx) {
  const auto engines = ctx.models.Engines();
  json c = {{"backend", "loom"},
            {"max_num_results", 1000},
            {"hooks_available", true},
            {"graph_replay", false},
            {"static_points", json::array()},
            {"static_writes", json::array()},
            {"generation_only", false},
            {"sae_sets", ctx.saes.Sets()}};
  c["model"] = nullptr;
  if (!engines.empty()) {
    const Engine& e = *engines.front();
    c["model"] = e.id();
    const MemoryPlan& plan = e.session().plan();
    c["device"] = plan.layer_device.empty()
                      ? "cpu"
                      : plan.devices[static_cast<size_t>(plan.layer_device[0])]
                            .device.name;
    c["max_tokens"] = e.context();
    const int64_t limit = ctx.options.max_prompt_tokens > 0
                              ? ctx.options.max_prompt_tokens
                              : e.context();
    c["token_limit"] = c["activation_token_limit"] = limit;
    c["num_layers"] = e.model().config().num_layers;
    json points = json::array();
    for (const HookPoint& h : e.capturable().hooks())
      points.push_back(HookName(h));
    c["capture_points"] = points;
  }
  c["endpoints"] = {{"tokenize", true},
                    {"activation_single", true},
                    {"activation_all", true},
                    {"activation_topk_by_token", true},
                    {"steer_completion", true},
                    {"steer_completion_chat", true},
                    {"activation_source", false},
                    {"activation_raw", false},
                    {"activation_attention", false},
                    {"dfa", false},
                    {"lens_logit", true},
                    {"lens_jacobian", false},
                    {"neurons", false}};
  return c;
}

}  // namespace

void RegisterNeuronpediaRoutes(HttpListeners& http, ServerContext& ctx) {
  NpPost(http, ctx, "/v1/tokenize", Tokenize);
  http.Get("/v1/capabilities",
           Route(ctx, "/v1/capabilities", [&ctx](const auto&, auto& res) {
             Reply(res, 200, Capabilities(ctx));
             return Status();
           }));
}

}  // namespace loom::serve::routes
