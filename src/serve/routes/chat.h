// POST /v1/chat/completions: a chat in OpenAI's shape with TheLoom's fields
// (hidden states), streamed as OpenAI chunks or TheLoom's events
// (docs/server.md, "Which stream format").
#ifndef LOOM_SERVE_ROUTES_CHAT_H_
#define LOOM_SERVE_ROUTES_CHAT_H_

#include "src/serve/routes/context.h"
#include "src/serve/transport.h"

namespace loom::serve::routes {

void RegisterChatRoutes(HttpListeners& http, ServerContext& ctx);

}  // namespace loom::serve::routes

#endif  // LOOM_SERVE_ROUTES_CHAT_H_
