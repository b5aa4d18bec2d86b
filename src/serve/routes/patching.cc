// /api/patching/* (patching.h).
#include "src/serve/routes/patching.h"

#include <string>

#include "src/serve/patching.h"
#include "src/serve/routes/common.h"
#include "src/serve/routes/generation.h"

namespace loom::serve::routes {

namespace {

StatusOr<bool> QueryBool(const httplib::Request& req, const std::string& name,
                         bool def) {
  if (!req.has_param(name)) return def;
  const std::string v = req.get_param_value(name);
  if (v == "true" || v == "1") return true;
  if (v == "false" || v == "0") return false;
  return InvalidArgumentError("query parameter `" + name +
                              "`: expected true or false, got '" + v + "'");
}

}  // namespace

void RegisterPatchingRoutes(HttpListeners& http, ServerContext& ctx) {
  auto reply = [](httplib::Response& res, StatusOr<json> out) {
    if (!out.ok()) return out.status();
    Reply(res, 200, *out);
    return Status();
  };
  http.Post("/api/patching/configure",
            JsonRoute(ctx, "/api/patching/configure",
                      [&ctx, reply](const auto& req, auto& res) {
                        ASSIGN_OR_RETURN(json b, ParseBody(req.body));
                        return reply(res, ctx.patching.Configure(b));
                      }));
  http.Post("/api/patching/run",
            JsonRoute(ctx, "/api/patching/run",
                      [&ctx, reply](const auto& req, auto& res) {
                        ASSIGN_OR_RETURN(json b, ParseBody(req.body));
                        ASSIGN_OR_RETURN(auto e, ctx.models.EngineFor(b));
                        ASSIGN_OR_RETURN(
                            bool special,
                            GetBool(b, "add_special_tokens", true));
                        const PromptIdsFn ids = [&](const json& v,
                                                    const std::string& field) {
                          return Tokens(ctx.options, *e, v, special, field);
                        };
                        return reply(res, ctx.patching.Run(b, *e, ids, [&ctx] {
                          return ctx.draining.load();
                        }));
                      }));
  http.Get(
      R"(/api/patching/results/([^/]+))",
      Route(ctx, "/api/patching/results/{id}",
            [&ctx, reply](const auto& req, auto& res) {
              ASSIGN_OR_RETURN(bool effects,
                               QueryBool(req, "include_causal_effects", true));
              return reply(
                  res, ctx.patching.Results(req.matches[1],
                                            req.get_param_value("metric_type"),
                                            effects));
            }));
  http.Get(
      "/api/patching/experiments",
      Route(ctx, "/api/patching/experiments", [&ctx](const auto&, auto& res) {
        Reply(res, 200, ctx.patching.Experiments());
        return Status();
      }));
  http.Get(
      "/api/patching/cache/status",
      Route(ctx, "/api/patching/cache/status", [&ctx](const auto&, auto& res) {
        Reply(res, 200, ctx.patching.CacheStatus());
        return Status();
      }));
  http.Delete(R"(/api/patching/cache/([^/]+))",
              Route(ctx, "/api/patching/cache/{id}",
                    [&ctx, reply](const auto& req, auto& res) {
                      return reply(res,
                                   ctx.patching.DeleteCache(req.matches[1]));
                    }));
  http.Delete("/api/patching/cache",
              Route(ctx, "/api/patching/cache", [&ctx](const auto&, auto& res) {
                Reply(res, 200, ctx.patching.ClearCache());
                return Status();
              }));
}

}  // namespace loom::serve::routes
