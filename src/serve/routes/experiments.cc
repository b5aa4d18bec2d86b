// /experiments* (experiments.h).
#include "src/serve/routes/experiments.h"

#include "src/serve/experiments.h"
#include "src/serve/routes/common.h"

namespace loom::serve::routes {

void RegisterExperimentRoutes(HttpListeners& http, ServerContext& ctx) {
  auto reply = [](httplib::Response& res, StatusOr<json> out) {
    if (!out.ok()) return out.status();
    Reply(res, 200, *out);
    return Status();
  };
  ExperimentRoutes* x = &ctx.experiments;
  http.Get("/experiments",
           Route(ctx, "/experiments", [x, reply](const auto& req, auto& res) {
             return reply(res, x->List(req.params));
           }));
  http.Get(
      R"(/experiments/([^/]+))",
      Route(ctx, "/experiments/{id}", [x, reply](const auto& req, auto& res) {
        return reply(res, x->Get(req.matches[1]));
      }));
  http.Get(R"(/experiments/([^/]+)/conversations)",
           Route(ctx, "/experiments/{id}/conversations",
                 [x, reply](const auto& req, auto& res) {
                   return reply(res,
                                x->Conversations(req.matches[1], req.params));
                 }));
  http.Get(R"(/experiments/([^/]+)/hidden_states)",
           Route(ctx, "/experiments/{id}/hidden_states",
                 [x, reply](const auto& req, auto& res) {
                   return reply(res,
                                x->HiddenStates(req.matches[1], req.params));
                 }));
  http.Get(R"(/experiments/([^/]+)/metrics)",
           Route(ctx, "/experiments/{id}/metrics",
                 [x, reply](const auto& req, auto& res) {
                   return reply(res, x->Metrics(req.matches[1], req.params));
                 }));
  http.Post("/experiments/export",
            JsonRoute(ctx, "/experiments/export",
                      [x, reply](const auto& req, auto& res) {
                        ASSIGN_OR_RETURN(json b, ParseBody(req.body));
                        return reply(res, x->Export(b));
                      }));
  http.Post("/experiments/export/batch",
            JsonRoute(ctx, "/experiments/export/batch",
                      [x, reply](const auto& req, auto& res) {
                        ASSIGN_OR_RETURN(json b, ParseBody(req.body));
                        return reply(res, x->ExportBatch(b));
                      }));
  http.Post("/experiments/export/summary",
            JsonRoute(ctx, "/experiments/export/summary",
                      [x, reply](const auto& req, auto& res) {
                        ASSIGN_OR_RETURN(json b, ParseBody(req.body));
                        return reply(res, x->ExportSummary(b));
                      }));
}

}  // namespace loom::serve::routes
