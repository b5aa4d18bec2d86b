// Neuronpedia's steering routes (docs/saes.md, "HTTP"): POST
// /v1/steer/completion (a text prompt) and /v1/steer/completion-chat (chat
// messages through the model's template). `features` ({source, index,
// strength}: W_dec[index] of a served SAE) or `vectors` ({steeringVector,
// strength, hook}) are added at their hook, times strengthMultiplier, at
// every position; `types` STEERED and DEFAULT are generated side by side
// (one forward packs both), with the same seed.
#ifndef LOOM_SERVE_ROUTES_STEER_H_
#define LOOM_SERVE_ROUTES_STEER_H_

#include "src/serve/routes/context.h"
#include "src/serve/transport.h"

namespace loom::serve::routes {

// POST /v1/steer/completion, /v1/steer/completion-chat.
void RegisterSteerRoutes(HttpListeners& http, ServerContext& ctx);

}  // namespace loom::serve::routes

#endif  // LOOM_SERVE_ROUTES_STEER_H_
