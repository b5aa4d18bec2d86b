// Loom's attribution route (docs/attribution.md, "HTTP"): POST
// /v1/attribute runs `loom attribute` on a served model: AtP over a grid of
// hooks x positions from one backward (eval::RunAttribute), or integrated
// gradients over a prompt's tokens (method "ig"), and replies with the JSON
// `loom attribute` writes to attribution.json.
//
// Body: clean, corrupted (a text or a list of token ids; ig: clean only),
// hooks (default ["blocks.*.hook_resid_pre"]), layers, positions ("all",
// "last", "0,3,-1", or a list of ints), metric ("logit-diff" | "logprob"),
// answer, wrong (token ids; default loom patch's), freeze (["attn_pattern",
// "norm_scale"]), per_head, check_top, method ("atp" | "ig"), steps,
// baseline_token, add_special_tokens, model.
//
// Like TheLoom's patching runs, a run executes on the calling HTTP worker
// with a CPU backend and executor of its own, reading the engine's immutable
// model (which must be served at f32: 501 naming the precision otherwise);
// one at a time per server (a second is 503).
#ifndef LOOM_SERVE_ROUTES_ATTRIBUTE_H_
#define LOOM_SERVE_ROUTES_ATTRIBUTE_H_

#include "src/serve/routes/context.h"
#include "src/serve/transport.h"

namespace loom::serve::routes {

// POST /v1/attribute.
void RegisterAttributeRoutes(HttpListeners& http, ServerContext& ctx);

}  // namespace loom::serve::routes

#endif  // LOOM_SERVE_ROUTES_ATTRIBUTE_H_
