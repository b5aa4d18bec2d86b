// POST /generate, /v1/generate, /generate/stream, /generate/batch
// (generate.h).
#include "src/serve/routes/generate.h"

#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "src/serve/routes/common.h"
#include "src/serve/routes/generation.h"
#include "src/serve/routes/persist.h"
#include "src/serve/routes/stream.h"

namespace loom::serve::routes {

namespace {

// The request of a /generate body's one `prompt` on `e`: its tokens, the
// generation fields and the body's interventions.
StatusOr<GenFields> PromptFields(ServerContext& ctx, const Engine& e,
                                 const json& b) {
  if (!b.contains("prompt"))
    return InvalidArgumentError("field `prompt` is required");
  ASSIGN_OR_RETURN(bool special, GetBool(b, "add_special_tokens", true));
  ASSIGN_OR_RETURN(auto ids, Tokens(ctx.options, e, b["prompt"], special));
  ASSIGN_OR_RETURN(GenFields f,
                   ParseGen(ctx.options, e, b, std::move(ids), false));
  ASSIGN_OR_RETURN(RequestInterventions ivs,
                   Interventions(ctx.options, e, b, 1));
  RETURN_IF_ERROR(Attach(ivs, 0, &f.request));
  return f;
}

// /generate/stream: a /generate request answered as events (token, done,
// error).
Status GenerateStream(ServerContext& ctx, const httplib::Request& req,
                      httplib::Response& res) {
  ASSIGN_OR_RETURN(json b, ParseBody(req.body));
  RETURN_IF_ERROR(PromptTokenIdsAsPrompt(&b));
  ASSIGN_OR_RETURN(auto e, ctx.models.EngineFor(b));
  ASSIGN_OR_RETURN(GenFields f, PromptFields(ctx, *e, b));
  ASSIGN_OR_RETURN(const bool persist, Persisting(ctx, b));
  OnStreamEnd persisted;
  if (persist)
    persisted = [&ctx, e, b, f, path = req.path](const StatusOr<GenResult>& g) {
      Persist(ctx, Record(*e, path, b, f, false, PromptInput(b["prompt"]), g,
                          Status()));
    };
  return Stream(res, e, std::move(f), StreamKind::kGenerate,
                std::move(persisted));
}

Status Batch(ServerContext& ctx, const httplib::Request& req,
             httplib::Response& res) {
  ASSIGN_OR_RETURN(json b, ParseBody(req.body));
  ASSIGN_OR_RETURN(auto e, ctx.models.EngineFor(b));
  if (!b.contains("prompts") || !b["prompts"].is_array() ||
      b["prompts"].empty())
    return InvalidArgumentError(
        "field `prompts`: expected a non-empty list of prompts");
  const size_t n = b["prompts"].size();
  if (static_cast<int64_t>(n) > ctx.options.max_batch_prompts)
    return InvalidArgumentError("field `prompts`: " + std::to_string(n) +
                                " prompts, more than "
                                "server.max_batch_prompts = " +
                                std::to_string(ctx.options.max_batch_prompts));
  ASSIGN_OR_RETURN(bool special, GetBool(b, "add_special_tokens", true));
  ASSIGN_OR_RETURN(const bool persist, Persisting(ctx, b));
  const Clock::time_point t0 = Clock::now();
  ASSIGN_OR_RETURN(RequestInterventions ivs,
                   Interventions(ctx.options, *e, b, static_cast<int64_t>(n)));
  std::vector<GenFields> fields;
  for (size_t i = 0; i < n; ++i) {
    StatusOr<std::vector<int32_t>> ids =
        Tokens(ctx.options, *e, b["prompts"][i], special);
    if (!ids.ok())
      return ids.status().WithContext("prompt " + std::to_string(i));
    ASSIGN_OR_RETURN(GenFields f, ParseGen(ctx.options, *e, b,
                                           std::move(ids).value(), false));
    if (Status s = Attach(ivs, static_cast<int64_t>(i), &f.request); !s.ok())
      return s.WithContext("prompt " + std::to_string(i));
    fields.push_back(std::move(f));
  }
  // Every prompt goes to the engine at once: they share forwards.
  ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Ticket>> tickets,
                   SubmitAll(*e, fields));
  // Each prompt's result, kept for its experiment.
  std::vector<StatusOr<GenResult>> outcomes;
  const Status done = [&]() -> Status {
    json results = json::array();
    int64_t total = 0;
    Status first_error;
    for (size_t i = 0; i < n; ++i) {
      outcomes.push_back(tickets[i]->Wait());
      const StatusOr<GenResult>& g = outcomes.back();
      if (!g.ok()) {
        if (first_error.ok()) first_error = g.status();
        continue;
      }
      total += static_cast<int64_t>(g->token_ids.size());
      ASSIGN_OR_RETURN(json r, GenResponse(*e, fields[i], *g));
      results.push_back(std::move(r));
    }
    RETURN_IF_ERROR(first_error);
    Reply(
        res, 200,
        {{"results", results},
         {"total_tokens", total},
         {"total_time_ms",
          std::chrono::duration<double, std::milli>(Clock::now() - t0).count()},
         {"prompts_processed", n}});
    return Status();
  }();
  // One experiment per prompt, as that prompt ended.
  if (persist)
    for (size_t i = 0; i < outcomes.size(); ++i) {
      ExperimentRecord r =
          Record(*e, req.path, b, fields[i], false,
                 PromptInput(b["prompts"][i]), outcomes[i], Status());
      r.config["batch_index"] = i;
      Persist(ctx, std::move(r));
    }
  return done;
}

}  // namespace

void RegisterGenerateRoutes(HttpListeners& http, ServerContext& ctx) {
  auto generate = [&ctx](const auto& req, auto& res) -> Status {
    std::optional<BodyFormat> format = Accepted(req, res);
    if (!format) return Status();
    ASSIGN_OR_RETURN(json b, ParseBody(req.body));
    RETURN_IF_ERROR(PromptTokenIdsAsPrompt(&b));
    ASSIGN_OR_RETURN(auto e, ctx.models.EngineFor(b));
    ASSIGN_OR_RETURN(GenFields f, PromptFields(ctx, *e, b));
    ASSIGN_OR_RETURN(const bool persist, Persisting(ctx, b));
    // npy holds one array: refused before the generation runs.
    if (const std::vector<std::string> names = GenArrayNames(f);
        *format == BodyFormat::kNpy && names.size() != 1) {
      std::string list;
      for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
      return NotAcceptable(
          req, res, NpyNeedsOneArray(static_cast<int64_t>(names.size()), list));
    }
    ASSIGN_OR_RETURN(auto ticket, e->Submit(f.request));
    const StatusOr<GenResult> result = ticket->Wait();
    const Status done = [&]() -> Status {
      if (!result.ok()) return result.status();
      const GenResult& g = *result;
      if (*format != BodyFormat::kJson) {
        ASSIGN_OR_RETURN(json rest, GenResponse(*e, f, g, false));
        std::vector<std::vector<float>> storage;
        ASSIGN_OR_RETURN(std::vector<BinaryArray> arrays,
                         GenArrays(f, g, &storage));
        return ReplyBinary(req, res, *format, arrays, f.dtype, rest);
      }
      ASSIGN_OR_RETURN(json out, GenResponse(*e, f, g));
      Reply(res, 200, out);
      return Status();
    }();
    // After the reply is made; the writer thread does the writing.
    if (persist)
      Persist(ctx, Record(*e, req.path, b, f, false, PromptInput(b["prompt"]),
                          result, done));
    return done;
  };
  http.Post("/generate", JsonRoute(ctx, "/generate", generate));
  http.Post("/v1/generate", JsonRoute(ctx, "/v1/generate", generate));
  http.Post(
      "/generate/stream",
      JsonRoute(ctx, "/generate/stream", [&ctx](const auto& req, auto& res) {
        return GenerateStream(ctx, req, res);
      }));
  http.Post("/generate/batch", JsonRoute(ctx, "/generate/batch",
                                         [&ctx](const auto& req, auto& res) {
                                           return Batch(ctx, req, res);
                                         }));
}

}  // namespace loom::serve::routes
