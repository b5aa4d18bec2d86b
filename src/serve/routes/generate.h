// TheLoom's generation routes: POST /generate (and its alias
// /v1/generate), /generate/stream (server-sent events) and /generate/batch.
#ifndef LOOM_SERVE_ROUTES_GENERATE_H_
#define LOOM_SERVE_ROUTES_GENERATE_H_

#include "src/serve/routes/context.h"
#include "src/serve/transport.h"

namespace loom::serve::routes {

// Registers the routes above on `http`, in that order.
void RegisterGenerateRoutes(HttpListeners& http, ServerContext& ctx);

}  // namespace loom::serve::routes

#endif  // LOOM_SERVE_ROUTES_GENERATE_H_
