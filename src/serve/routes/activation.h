// Neuronpedia's activation routes (docs/saes.md, "HTTP"): the features of
// the SAEs named in interp.saes on a prompt, or a direction's projection.
//   POST /v1/activation/topk-by-token  {prompt, source, topK = 5,
//        ignoreBos = true} -> per position the topK features
//   POST /v1/activation/all  {prompt, sourceSet, selectedSources = [],
//        sortByTokenIndexes = [], ignoreBos = true, numResults = 25} -> the
//        features with the largest activation over the SAEs selected
//   POST /v1/activation/single  {prompt, source + index | vector + hook}
//        -> one feature's (or the direction's) value at every position
// Keys and replies as neuronpedia.h states.
#ifndef LOOM_SERVE_ROUTES_ACTIVATION_H_
#define LOOM_SERVE_ROUTES_ACTIVATION_H_

#include "src/serve/routes/context.h"
#include "src/serve/transport.h"

namespace loom::serve::routes {

// POST /v1/activation/topk-by-token, /v1/activation/all,
// /v1/activation/single, in that order.
void RegisterActivationRoutes(HttpListeners& http, ServerContext& ctx);

}  // namespace loom::serve::routes

#endif  // LOOM_SERVE_ROUTES_ACTIVATION_H_
