// OpenAI's routes beside /v1/chat/completions (chat.h): GET /v1/models,
// GET /v1/models/{id}, POST /v1/completions and POST /v1/embeddings.
#ifndef LOOM_SERVE_ROUTES_OPENAI_H_
#define LOOM_SERVE_ROUTES_OPENAI_H_

#include "src/base/status.h"
#include "src/serve/api.h"
#include "src/serve/routes/context.h"
#include "src/serve/transport.h"

namespace loom::serve::routes {

// Registers the routes above on `http`, in that order.
void RegisterOpenAiRoutes(HttpListeners& http, ServerContext& ctx);

// Chat and completion fields of OpenAI's that Loom does not implement:
// 400 naming the field when given a value other than the default.
Status RefuseOpenAiFields(const json& b);

}  // namespace loom::serve::routes

#endif  // LOOM_SERVE_ROUTES_OPENAI_H_
