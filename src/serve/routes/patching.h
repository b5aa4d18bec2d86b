// TheLoom's activation patching routes, /api/patching/* (src/serve/
// patching.h computes them).
#ifndef LOOM_SERVE_ROUTES_PATCHING_H_
#define LOOM_SERVE_ROUTES_PATCHING_H_

#include "src/serve/routes/context.h"
#include "src/serve/transport.h"

namespace loom::serve::routes {

// POST /api/patching/configure, /api/patching/run; GET
// /api/patching/results/{id}, /api/patching/experiments,
// /api/patching/cache/status; DELETE /api/patching/cache/{id},
// /api/patching/cache; in that order.
void RegisterPatchingRoutes(HttpListeners& http, ServerContext& ctx);

}  // namespace loom::serve::routes

#endif  // LOOM_SERVE_ROUTES_PATCHING_H_
