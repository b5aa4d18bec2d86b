// TheLoom's persistence routes, /experiments* (src/serve/experiments.h
// answers them from the store).
#ifndef LOOM_SERVE_ROUTES_EXPERIMENTS_H_
#define LOOM_SERVE_ROUTES_EXPERIMENTS_H_

#include "src/serve/routes/context.h"
#include "src/serve/transport.h"

namespace loom::serve::routes {

// GET /experiments, /experiments/{id}, /experiments/{id}/conversations,
// /experiments/{id}/hidden_states, /experiments/{id}/metrics; POST
// /experiments/export, /experiments/export/batch,
// /experiments/export/summary; in that order.
void RegisterExperimentRoutes(HttpListeners& http, ServerContext& ctx);

}  // namespace loom::serve::routes

#endif  // LOOM_SERVE_ROUTES_EXPERIMENTS_H_
