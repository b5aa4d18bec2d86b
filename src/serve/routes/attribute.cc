#include "src/serve/routes/attribute.h"

#include <cctype>
#include <mutex>
#include <string>
#include <vector>

#include "src/eval/attribute.h"
#include "src/model/interventions.h"
#include "src/serve/api.h"
#include "src/serve/routes/common.h"
#include "src/serve/routes/generation.h"

namespace loom::serve::routes {
namespace {

std::string Lower(std::string_view s) {
  std::string r(s);
  for (char& ch : r) ch = static_cast<char>(std::tolower(ch));
  return r;
}

// One run at a time (it takes every core it is given).
std::mutex running_mu;

// `positions`: a string as --positions reads it, or a list of ints.
StatusOr<InterventionPositions> Positions(const json& b) {
  if (!b.contains("positions") || b["positions"].is_null())
    return ParsePositionsText("all");
  const json& p = b["positions"];
  std::string text;
  if (p.is_string()) {
    text = p.get<std::string>();
  } else if (p.is_array()) {
    for (const json& v : p) {
      if (!v.is_number_integer())
        return InvalidArgumentError(
            "field `positions`: expected \"all\", \"last\" or a list of "
            "integers, got " +
            p.dump());
      text += (text.empty() ? "" : ",") + std::to_string(v.get<int64_t>());
    }
  } else {
    return InvalidArgumentError(
        "field `positions`: expected a string or a list of integers, got " +
        p.dump());
  }
  StatusOr<InterventionPositions> r = ParsePositionsText(text);
  if (!r.ok()) return r.status().WithContext("field `positions`");
  return r;
}

// The request's options (the fields named in attribute.h).
StatusOr<eval::AttributeOptions> Options(const json& b, int64_t vocab) {
  eval::AttributeOptions o;
  ASSIGN_OR_RETURN(std::vector<std::string> hooks, GetStrings(b, "hooks"));
  if (!hooks.empty()) o.hooks = hooks;
  ASSIGN_OR_RETURN(o.layers, GetStrings(b, "layers"));
  ASSIGN_OR_RETURN(o.positions, Positions(b));
  ASSIGN_OR_RETURN(const std::string metric,
                   GetString(b, "metric", "logit-diff"));
  ASSIGN_OR_RETURN(o.metric, ParseGradMetric(metric, "field `metric`"));
  ASSIGN_OR_RETURN(o.answer, GetInt(b, "answer", -1, -1, vocab - 1));
  ASSIGN_OR_RETURN(o.wrong, GetInt(b, "wrong", -1, -1, vocab - 1));
  ASSIGN_OR_RETURN(const std::vector<std::string> freeze,
                   GetStrings(b, "freeze"));
  RETURN_IF_ERROR(ParseFreeze(freeze, "field `freeze`", &o.freeze_attn_pattern,
                              &o.freeze_norm_scale));
  ASSIGN_OR_RETURN(o.per_head, GetBool(b, "per_head", false));
  ASSIGN_OR_RETURN(o.check_top, GetInt(b, "check_top", 0, 0, 4096));
  return o;
}

// method "ig": integrated gradients over `ids`.
StatusOr<json> RunIg(const json& b, const Engine& e,
                     const eval::AttributeOptions& o,
                     const std::vector<int32_t>& ids) {
  ASSIGN_OR_RETURN(const int64_t steps, GetInt(b, "steps", 32, 1, 1024));
  ASSIGN_OR_RETURN(
      const int64_t baseline,
      GetInt(b, "baseline_token", 0, 0, e.model().config().vocab_size - 1));
  const eval::IgOptions ig = eval::IgOptionsOf(o, steps, baseline);
  ASSIGN_OR_RETURN(eval::IgAttribution r,
                   eval::RunIntegratedGradients(e.model(), ids, ig));
  json j = eval::IgJson(r, ig);
  j["input_ids"] = ids;
  return j;
}

Status Attribute(ServerContext& ctx, const httplib::Request& req,
                 httplib::Response& res) {
  ASSIGN_OR_RETURN(json b, ParseBody(req.body));
  ASSIGN_OR_RETURN(auto e, ctx.models.EngineFor(b));
  const ModelConfig& c = e->model().config();
  ASSIGN_OR_RETURN(const std::string word, GetString(b, "method", "atp"));
  ASSIGN_OR_RETURN(const eval::AttributeMethod method,
                   eval::ParseAttributeMethod(word, "field `method`"));
  ASSIGN_OR_RETURN(eval::AttributeOptions o, Options(b, c.vocab_size));
  o.grad_drop = method == eval::AttributeMethod::kAtpStar;
  if (e->model().compute_dtype() != DType::kF32)
    return UnimplementedError(
        "/v1/attribute: model " + e->id() + " is served at " +
        Lower(DTypeName(e->model().compute_dtype())) +
        "; gradients run at f32 (serve it with --precision f32)");
  ASSIGN_OR_RETURN(const bool special, GetBool(b, "add_special_tokens", true));
  if (!b.contains("clean"))
    return InvalidArgumentError(
        "field `clean`: required (a text or a list "
        "of token ids)");
  ASSIGN_OR_RETURN(const std::vector<int32_t> clean,
                   Tokens(ctx.options, *e, b["clean"], special, "clean"));
  std::unique_lock<std::mutex> lock(running_mu, std::try_to_lock);
  if (!lock.owns_lock())
    return ResourceExhaustedError(
        "/v1/attribute: another attribution is running; retry later");
  json j;
  if (method == eval::AttributeMethod::kIg) {
    ASSIGN_OR_RETURN(j, RunIg(b, *e, o, clean));
  } else {
    if (!b.contains("corrupted"))
      return InvalidArgumentError(
          "field `corrupted`: required for method "
          "atp (a text or a list of token ids)");
    ASSIGN_OR_RETURN(
        const std::vector<int32_t> corrupted,
        Tokens(ctx.options, *e, b["corrupted"], special, "corrupted"));
    ASSIGN_OR_RETURN(eval::AttributeResult r,
                     eval::RunAttribute(e->model(), clean, corrupted, o));
    j = eval::AttributionJson(r, o);
    j["clean_input_ids"] = clean;
    j["corrupted_input_ids"] = corrupted;
  }
  j["model"] = e->id();
  Reply(res, 200, j);
  return Status();
}

}  // namespace

void RegisterAttributeRoutes(HttpListeners& http, ServerContext& ctx) {
  http.Post("/v1/attribute",
            JsonRoute(ctx, "/v1/attribute", [&ctx](const auto& req, auto& res) {
              return Attribute(ctx, req, res);
            }));
}

}  // namespace loom::serve::routes
