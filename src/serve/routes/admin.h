// The server's own routes: health, the models loaded (load, unload), the
// memory and request metrics, and TheLoom's loader and device routes
// (loaders.h).
#ifndef LOOM_SERVE_ROUTES_ADMIN_H_
#define LOOM_SERVE_ROUTES_ADMIN_H_

#include "src/serve/routes/context.h"
#include "src/serve/transport.h"

namespace loom::serve::routes {

// GET /health, GET /models, POST /models/load, DELETE /models/{id}, in that
// order.
void RegisterModelRoutes(HttpListeners& http, ServerContext& ctx);
// GET /gpu/status, GET /metrics (Prometheus' text format).
void RegisterStatusRoutes(HttpListeners& http, ServerContext& ctx);
// GET /loaders, GET /loaders/probe/{id}, POST /gpu/configure.
void RegisterLoaderRoutes(HttpListeners& http, ServerContext& ctx);

}  // namespace loom::serve::routes

#endif  // LOOM_SERVE_ROUTES_ADMIN_H_
