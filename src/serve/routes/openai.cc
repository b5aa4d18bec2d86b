// OpenAI's /v1/models, /v1/completions and /v1/embeddings (openai.h).
#include "src/serve/routes/openai.h"

#include <ctime>
#include <utility>
#include <vector>

#include "src/serve/routes/common.h"
#include "src/serve/routes/embed.h"
#include "src/serve/routes/generation.h"
#include "src/serve/routes/stream.h"

namespace loom::serve::routes {

namespace {

// its default: 400 naming the field, the value and what Loom does.
Status RefuseOpenAiField(const json& b, const char* field, const json& def,
                         const char* why) {
  if (!b.contains(field) || b[field].is_null() || b[field] == def)
    return Status();
  return InvalidArgumentError("field `" + std::string(field) + "`: " + why +
                              "; only " + Dump(def) + " is accepted, got " +
                              Dump(b[field]));
}

// OpenAI's inputs of /v1/completions (`prompt`) and /v1/embeddings
// (`input`): a string, a list of strings, a list of token ids, or a list
// of token-id lists; at most server.max_batch_prompts of them.
StatusOr<std::vector<json>> OpenAiInputs(ServerContext& ctx, const json& b,
                                         const std::string& field) {
  if (!b.contains(field) || b[field].is_null())
    return InvalidArgumentError("field `" + field + "` is required");
  const json& v = b[field];
  const std::string expected =
      "expected a string, a list of strings, a list of token ids or a list "
      "of token-id lists, got ";
  if (v.is_string()) return std::vector<json>{v};
  if (!v.is_array() || v.empty())
    return InvalidArgumentError("field `" + field + "`: " + expected +
                                (v.is_array() ? "[]" : v.type_name()));
  if (v[0].is_number()) return std::vector<json>{v};  // one token-id list
  if (static_cast<int64_t>(v.size()) > ctx.options.max_batch_prompts)
    return InvalidArgumentError(
        "field `" + field + "`: " + std::to_string(v.size()) +
        " inputs, more than server.max_batch_prompts = " +
        std::to_string(ctx.options.max_batch_prompts));
  for (size_t i = 0; i < v.size(); ++i)
    if (!v[i].is_string() && !v[i].is_array())
      return InvalidArgumentError("field `" + field + "`: item " +
                                  std::to_string(i) + ": " + expected +
                                  v[i].type_name());
  return std::vector<json>(v.begin(), v.end());
}

// POST /v1/embeddings: OpenAI's embeddings, each the pooled hidden state
// of one input (EmbedInputs), as floats or base64 of little-endian f32.
Status Embeddings(ServerContext& ctx, const httplib::Request& req,
                  httplib::Response& res) {
  std::optional<BodyFormat> format = Accepted(req, res);
  if (!format) return Status();
  ASSIGN_OR_RETURN(json b, ParseBody(req.body));
  ASSIGN_OR_RETURN(DType binary_dtype, BinaryDType(ctx.options, b));
  if (b.contains("dimensions") && !b["dimensions"].is_null())
    return InvalidArgumentError(
        "field `dimensions`: not supported: an embedding has the width of "
        "the model's hidden state (GET /models lists hidden_size), got " +
        Dump(b["dimensions"]));
  ASSIGN_OR_RETURN(std::string encoding,
                   GetString(b, "encoding_format", "float"));
  if (encoding != "float" && encoding != "base64")
    return InvalidArgumentError(
        "field `encoding_format`: expected \"float\" or \"base64\", got \"" +
        encoding + "\"");
  ASSIGN_OR_RETURN(auto e, ctx.models.EngineFor(b));
  ASSIGN_OR_RETURN(std::vector<json> inputs, OpenAiInputs(ctx, b, "input"));
  ASSIGN_OR_RETURN(Embedded m,
                   EmbedInputs(ctx.options, *e, b, inputs, "input"));
  const json usage = {{"prompt_tokens", m.tokens}, {"total_tokens", m.tokens}};
  if (*format != BodyFormat::kJson) {
    const std::vector<float> all = Rows(m.vectors);
    return ReplyBinary(
        req, res, *format,
        {{"embeddings",
          {static_cast<int64_t>(m.vectors.size()), m.width},
          all.data()}},
        binary_dtype,
        {{"object", "list"}, {"model", e->id()}, {"usage", usage}});
  }
  json data = json::array();
  for (size_t i = 0; i < m.vectors.size(); ++i) {
    const std::vector<float>& v = m.vectors[i];
    data.push_back(
        {{"object", "embedding"},
         {"index", i},
         {"embedding", encoding == "base64"
                           ? json(Base64Encode(v.data(), v.size() * 4))
                           : json(v)}});
  }
  Reply(res, 200,
        {{"object", "list"},
         {"data", std::move(data)},
         {"model", e->id()},
         {"usage", {{"prompt_tokens", m.tokens}, {"total_tokens", m.tokens}}}});
  return Status();
}

// POST /v1/completions: OpenAI's text completions (one choice per
// prompt), streamed as text_completion chunks when `stream` is true.
Status Completions(ServerContext& ctx, const httplib::Request& req,
                   httplib::Response& res) {
  ASSIGN_OR_RETURN(json b, ParseBody(req.body));
  RETURN_IF_ERROR(RefuseOpenAiFields(b));
  RETURN_IF_ERROR(PromptTokenIdsAsPrompt(&b));
  ASSIGN_OR_RETURN(auto e, ctx.models.EngineFor(b));
  ASSIGN_OR_RETURN(std::vector<json> prompts, OpenAiInputs(ctx, b, "prompt"));
  ASSIGN_OR_RETURN(bool stream, GetBool(b, "stream", false));
  if (stream && prompts.size() > 1)
    return InvalidArgumentError(
        "field `prompt`: a streamed completion takes one prompt, got " +
        std::to_string(prompts.size()));
  // OpenAI's defaults; hidden states only when asked for.
  const std::pair<const char*, json> defaults[] = {
      {"max_tokens", 16},
      {"temperature", 1.0},
      {"return_hidden_states", false}};
  for (const auto& [field, def] : defaults)
    if (!b.contains(field) || b[field].is_null()) b[field] = def;
  ASSIGN_OR_RETURN(bool special, GetBool(b, "add_special_tokens", true));
  ASSIGN_OR_RETURN(
      RequestInterventions ivs,
      Interventions(ctx.options, *e, b, static_cast<int64_t>(prompts.size())));
  std::vector<GenFields> fields;
  for (size_t i = 0; i < prompts.size(); ++i) {
    StatusOr<std::vector<int32_t>> ids =
        Tokens(ctx.options, *e, prompts[i], special);
    if (!ids.ok())
      return ids.status().WithContext("prompt " + std::to_string(i));
    ASSIGN_OR_RETURN(GenFields f, ParseGen(ctx.options, *e, b,
                                           std::move(ids).value(), true));
    if (Status s = Attach(ivs, static_cast<int64_t>(i), &f.request); !s.ok())
      return s.WithContext("prompt " + std::to_string(i));
    fields.push_back(std::move(f));
  }
  if (stream)
    return Stream(res, e, std::move(fields[0]), StreamKind::kOpenAiCompletion);
  ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Ticket>> tickets,
                   SubmitAll(*e, fields));
  json choices = json::array();
  size_t prompt_tokens = 0, completion_tokens = 0;
  for (size_t i = 0; i < tickets.size(); ++i) {
    StatusOr<GenResult> g = tickets[i]->Wait();
    if (!g.ok()) {
      for (size_t k = i + 1; k < tickets.size(); ++k) tickets[k]->Cancel();
      return g.status().WithContext("prompt " + std::to_string(i));
    }
    prompt_tokens += g->prompt_ids.size();
    completion_tokens += g->token_ids.size();
    json choice = {{"text", g->text},
                   {"index", i},
                   {"logprobs", nullptr},
                   {"finish_reason", FinishReason(g->stop_reason)}};
    ASSIGN_OR_RETURN(json body, GenResponse(*e, fields[i], *g));
    for (const char* extra :
         {"hidden_states", "activations", "attention_weights"})
      if (body.contains(extra)) choice[extra] = std::move(body[extra]);
    choices.push_back(std::move(choice));
  }
  Reply(res, 200,
        {{"id", "cmpl-" + std::to_string(std::time(nullptr))},
         {"object", "text_completion"},
         {"created", std::time(nullptr)},
         {"model", e->id()},
         {"choices", std::move(choices)},
         {"usage",
          {{"prompt_tokens", prompt_tokens},
           {"completion_tokens", completion_tokens},
           {"total_tokens", prompt_tokens + completion_tokens}}}});
  return Status();
}

// OpenAI's model object of a loaded model.
json OpenAiModel(ServerContext& ctx, const Engine& e) {
  return {{"id", e.id()},
          {"object", "model"},
          {"created", ctx.models.LoadedAt(e.id())},
          {"owned_by", "loom"}};
}

}  // namespace

// Chat and completion fields of OpenAI's that Loom does not implement:
// 400 naming the field when given a value other than the default.
Status RefuseOpenAiFields(const json& b) {
  RETURN_IF_ERROR(
      RefuseOpenAiField(b, "n", 1, "loom serve returns one choice per prompt"));
  RETURN_IF_ERROR(RefuseOpenAiField(
      b, "best_of", 1, "loom serve returns one choice per prompt"));
  RETURN_IF_ERROR(RefuseOpenAiField(b, "echo", false,
                                    "echoing the prompt is not supported"));
  RETURN_IF_ERROR(RefuseOpenAiField(b, "suffix", nullptr,
                                    "suffixes (insertion) are not supported"));
  // Sampling knobs the sampler does not have: their no-op values only.
  for (const char* penalty : {"presence_penalty", "frequency_penalty"})
    RETURN_IF_ERROR(RefuseOpenAiField(
        b, penalty, 0, "penalties are not implemented by loom serve"));
  RETURN_IF_ERROR(RefuseOpenAiField(b, "logit_bias", json::object(),
                                    "logit biases are not implemented"));
  RETURN_IF_ERROR(RefuseOpenAiField(b, "top_logprobs", 0,
                                    "log probabilities are not returned"));
  // Tool calls and structured output: the model's text is returned as is.
  for (const char* tool : {"tools", "functions"})
    RETURN_IF_ERROR(RefuseOpenAiField(
        b, tool, json::array(), "tool and function calls are not supported"));
  for (const char* choice : {"tool_choice", "function_call"})
    RETURN_IF_ERROR(RefuseOpenAiField(
        b, choice, "none", "tool and function calls are not supported"));
  RETURN_IF_ERROR(RefuseOpenAiField(
      b, "response_format", json{{"type", "text"}},
      "structured output (json_object, json_schema) is not supported"));
  if (b.contains("logprobs") && !b["logprobs"].is_null() &&
      b["logprobs"] != false)
    return InvalidArgumentError(
        "field `logprobs`: log probabilities are not returned by loom "
        "serve (null or false), got " +
        Dump(b["logprobs"]));
  return Status();
}

void RegisterOpenAiRoutes(HttpListeners& http, ServerContext& ctx) {
  http.Get("/v1/models",
           Route(ctx, "/v1/models", [&ctx](const auto&, auto& res) {
             json data = json::array();
             for (const auto& e : ctx.models.Engines())
               data.push_back(OpenAiModel(ctx, *e));
             Reply(res, 200, {{"object", "list"}, {"data", data}});
             return Status();
           }));
  http.Get(R"(/v1/models/(.+))",
           Route(ctx, "/v1/models/{id}", [&ctx](const auto& req, auto& res) {
             const std::string id = req.matches[1];
             std::shared_ptr<Engine> e = ctx.models.Find(id);
             if (e == nullptr)
               return NotFoundError("model `" + id + "` is not loaded");
             Reply(res, 200, OpenAiModel(ctx, *e));
             return Status();
           }));
  http.Post("/v1/completions", JsonRoute(ctx, "/v1/completions",
                                         [&ctx](const auto& req, auto& res) {
                                           return Completions(ctx, req, res);
                                         }));
  http.Post("/v1/embeddings", JsonRoute(ctx, "/v1/embeddings",
                                        [&ctx](const auto& req, auto& res) {
                                          return Embeddings(ctx, req, res);
                                        }));
}

}  // namespace loom::serve::routes
