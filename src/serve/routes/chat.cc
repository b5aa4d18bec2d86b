// POST /v1/chat/completions (chat.h).
#include "src/serve/routes/chat.h"

#include <strings.h>

#include <cctype>
#include <ctime>
#include <utility>
#include <vector>

#include "src/serve/routes/common.h"
#include "src/serve/routes/generation.h"
#include "src/serve/routes/openai.h"
#include "src/serve/routes/persist.h"
#include "src/serve/routes/stream.h"

namespace loom::serve::routes {

namespace {

// Whether an Accept header names text/event-stream (any case).
bool AcceptsEventStream(std::string accept) {
  for (char& c : accept) c = static_cast<char>(std::tolower(c));
  return accept.find("text/event-stream") != std::string::npos;
}

// OpenAI's content parts ([{"type": "text", "text": ...}, ...], what the
// SDKs send for multi-part messages) joined into the one string every
// message then holds; a part of another type is refused by name.
Status FlattenContentParts(json* b) {
  if (!b->contains("messages") || !(*b)["messages"].is_array())
    return Status();  // ChatTokens says what `messages` must be
  json& messages = (*b)["messages"];
  for (size_t i = 0; i < messages.size(); ++i) {
    json& m = messages[i];
    if (!m.is_object() || !m.contains("content") || !m["content"].is_array())
      continue;
    std::string text;
    const json& parts = m["content"];
    for (size_t k = 0; k < parts.size(); ++k) {
      const json& part = parts[k];
      const std::string where = "field `messages[" + std::to_string(i) +
                                "].content[" + std::to_string(k) + "]`";
      if (!part.is_object() || !part.contains("type") ||
          !part["type"].is_string())
        return InvalidArgumentError(
            where +
            ": expected a {\"type\": \"text\", \"text\": ...} part, got " +
            Dump(part));
      if (part["type"] != "text")
        return InvalidArgumentError(where + ": parts of type " +
                                    Dump(part["type"]) +
                                    " are not supported (text only)");
      if (!part.contains("text") || !part["text"].is_string())
        return InvalidArgumentError(where +
                                    ": a text part needs a string "
                                    "`text`, got " +
                                    Dump(part));
      text += part["text"].get<std::string>();
    }
    m["content"] = text;
  }
  return Status();
}

StatusOr<std::vector<int32_t>> ChatTokens(const ServerOptions& o,
                                          const Engine& e, const json& b) {
  if (!b.contains("messages") || !b["messages"].is_array() ||
      b["messages"].empty())
    return InvalidArgumentError(
        "field `messages`: expected a non-empty list of {role, content}");
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  std::string plain;
  for (const json& m : b["messages"]) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
        !m.contains("content") || !m["content"].is_string())
      return InvalidArgumentError(
          "field `messages`: each message needs string `role` and "
          "`content`, got " +
          Dump(m));
    messages.push_back({{"role", m["role"].get<std::string>()},
                        {"content", m["content"].get<std::string>()}});
    std::string role = m["role"].get<std::string>();
    if (!role.empty()) role[0] = static_cast<char>(std::toupper(role[0]));
    plain += role + ": " + m["content"].get<std::string>() + "\n";
  }
  if (e.chat_template() == nullptr) {
    // TheLoom's fallback for models without a template.
    return Tokens(o, e, json(plain + "Assistant:"), true);
  }
  nlohmann::ordered_json ctx = {{"messages", messages},
                                {"add_generation_prompt", true}};
  ASSIGN_OR_RETURN(std::string text, e.chat_template()->Render(ctx));
  // The template writes the special tokens itself (as HF's
  // apply_chat_template(tokenize=True) does).
  return Tokens(o, e, json(text), false);
}

// The format of a streamed chat (docs/server.md, "Which stream format"):
// the request's `stream_format`, else server.chat_stream_format; `auto`
// tells the two kinds of clients apart by what they send, the first rule
// that matches deciding:
//   1. the OpenAI SDKs' marks: an X-Stainless-* header (every official
//      SDK sends X-Stainless-Lang and others) or a User-Agent starting
//      "OpenAI/" -> openai;
//   2. `stream_options` (an OpenAI-only field) -> openai;
//   3. a TheLoom-only field (return_hidden_states, hidden_state_layers,
//      device, loader) -> theloom;
//   4. Accept naming text/event-stream (TheLoom's Go client, Weaver, sends
//      it; the OpenAI SDKs send Accept: application/json) -> theloom;
//   5. anything else -> openai.
std::string ChatFormat(ServerContext& ctx, const httplib::Request& req,
                       const json& b, std::string f) {
  if (f.empty()) f = ctx.options.chat_stream_format;
  if (f != "auto") return f;
  for (const auto& [name, _] : req.headers)
    if (strncasecmp(name.c_str(), "x-stainless-", 12) == 0) return "openai";
  if (req.get_header_value("User-Agent").rfind("OpenAI/", 0) == 0)
    return "openai";
  if (b.contains("stream_options")) return "openai";
  for (const char* field :
       {"return_hidden_states", "hidden_state_layers", "device", "loader"})
    if (b.contains(field)) return "theloom";
  if (AcceptsEventStream(req.get_header_value("Accept"))) return "theloom";
  return "openai";
}

// The reply of a chat that is not streamed.
Status ChatReply(httplib::Response& res, const Engine& engine,
                 const GenFields& f, const StatusOr<GenResult>& result) {
  if (!result.ok()) return result.status();
  const GenResult& g = *result;
  const Engine* e = &engine;
  ASSIGN_OR_RETURN(json body, GenResponse(*e, f, g));
  const std::string finish = FinishReason(g.stop_reason);
  json out = {{"id", "chatcmpl-" + std::to_string(std::time(nullptr))},
              {"object", "chat.completion"},
              {"created", std::time(nullptr)},
              {"model", e->id()},
              {"choices",
               {{{"index", 0},
                 {"message", {{"role", "assistant"}, {"content", g.text}}},
                 {"finish_reason", finish}}}},
              {"usage",
               {{"prompt_tokens", g.prompt_ids.size()},
                {"completion_tokens", g.token_ids.size()},
                {"total_tokens", g.prompt_ids.size() + g.token_ids.size()}}},
              {"text", g.text},
              {"metadata", body["metadata"]}};
  if (f.return_hidden) out["hidden_state"] = ChatHiddenState(f, g);
  if (f.return_hidden && f.layers.size() > 1)
    out["hidden_states"] = ChatHiddenStates(f, g);
  for (const char* extra : {"activations", "attention_weights"})
    if (body.contains(extra)) out[extra] = body[extra];
  Reply(res, 200, out);
  return Status();
}

Status Chat(ServerContext& ctx, const httplib::Request& req,
            httplib::Response& res) {
  ASSIGN_OR_RETURN(json b, ParseBody(req.body));
  ASSIGN_OR_RETURN(std::string sf, GetString(b, "stream_format", ""));
  if (!sf.empty() && sf != "openai" && sf != "theloom")
    return InvalidArgumentError(
        "field `stream_format`: expected \"openai\" or \"theloom\", got \"" +
        sf + "\"");
  RETURN_IF_ERROR(RefuseOpenAiFields(b));
  RETURN_IF_ERROR(FlattenContentParts(&b));
  ASSIGN_OR_RETURN(bool stream, GetBool(b, "stream", false));
  // Decided before the defaults below add fields.
  const std::string format = stream ? ChatFormat(ctx, req, b, sf) : "";
  // A chat's hidden state is the final layer's unless asked otherwise.
  if (!b.contains("hidden_state_layers")) b["hidden_state_layers"] = {-1};
  // OpenAI's newer name of max_tokens.
  if ((!b.contains("max_tokens") || b["max_tokens"].is_null()) &&
      b.contains("max_completion_tokens"))
    b["max_tokens"] = b["max_completion_tokens"];
  ASSIGN_OR_RETURN(auto e, ctx.models.EngineFor(b));
  ASSIGN_OR_RETURN(auto ids, ChatTokens(ctx.options, *e, b));
  ASSIGN_OR_RETURN(GenFields f,
                   ParseGen(ctx.options, *e, b, std::move(ids), true));
  ASSIGN_OR_RETURN(RequestInterventions ivs,
                   Interventions(ctx.options, *e, b, 1));
  RETURN_IF_ERROR(Attach(ivs, 0, &f.request));
  ASSIGN_OR_RETURN(const bool persist, Persisting(ctx, b));
  // The messages as given (ChatTokens checked them), for the experiment.
  std::vector<ExperimentRecord::Message> input;
  if (persist)
    for (const json& m : b["messages"])
      input.push_back(
          {m["role"].get<std::string>(), m["content"].get<std::string>()});
  if (stream) {
    OnStreamEnd persisted;
    if (persist)
      persisted = [&ctx, e, b, f, input,
                   path = req.path](const StatusOr<GenResult>& g) {
        Persist(ctx, Record(*e, path, b, f, true, input, g, Status()));
      };
    return Stream(
        res, e, std::move(f),
        format == "openai" ? StreamKind::kOpenAiChat : StreamKind::kTheLoomChat,
        std::move(persisted));
  }
  ASSIGN_OR_RETURN(auto ticket, e->Submit(f.request));
  const StatusOr<GenResult> result = ticket->Wait();
  const Status done = ChatReply(res, *e, f, result);
  if (persist)
    Persist(ctx,
            Record(*e, req.path, b, f, true, std::move(input), result, done));
  return done;
}

}  // namespace

void RegisterChatRoutes(HttpListeners& http, ServerContext& ctx) {
  http.Post("/v1/chat/completions",
            JsonRoute(ctx, "/v1/chat/completions",
                      [&ctx](const auto& req, auto& res) {
                        return Chat(ctx, req, res);
                      }));
}

}  // namespace loom::serve::routes
