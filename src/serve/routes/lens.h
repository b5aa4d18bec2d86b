// Neuronpedia's lens route (docs/saes.md, "HTTP"): POST /v1/lens/prompt,
// the logit lens of a prompt (text, chat or token ids; optionally continued
// by a generation) at the layers asked (every layer by default; the last
// always): per position and layer the topN tokens and their probabilities
// (the softmax over the whole vocabulary of the lens's logits, rounded to 4
// decimals). NDJSON frames (meta, prompt, one per position, done) by
// default, or one JSON object with `stream: false`. The lens reads
// blocks.L.hook_resid_post through the model's own final norm and head
// (src/eval/lens.h): the last layer's is the model's own distribution.
#ifndef LOOM_SERVE_ROUTES_LENS_H_
#define LOOM_SERVE_ROUTES_LENS_H_

#include "src/serve/routes/context.h"
#include "src/serve/transport.h"

namespace loom::serve::routes {

// POST /v1/lens/prompt.
void RegisterLensRoutes(HttpListeners& http, ServerContext& ctx);

}  // namespace loom::serve::routes

#endif  // LOOM_SERVE_ROUTES_LENS_H_
