// The embedding and analysis routes: POST /embed, /embed/batch (pooled
// hidden states), /analyze, /analyze/geometry and /analyze/bilateral
// (theloom_analysis.h); and the pooling of inputs /v1/embeddings shares.
#ifndef LOOM_SERVE_ROUTES_EMBED_H_
#define LOOM_SERVE_ROUTES_EMBED_H_

#include <cstdint>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/serve/api.h"
#include "src/serve/engine.h"
#include "src/serve/routes/context.h"
#include "src/serve/server.h"
#include "src/serve/transport.h"

namespace loom::serve::routes {

// POST /embed, /embed/batch, in that order.
void RegisterEmbedRoutes(HttpListeners& http, ServerContext& ctx);
// POST /analyze, /analyze/geometry, /analyze/bilateral, in that order.
void RegisterAnalyzeRoutes(HttpListeners& http, ServerContext& ctx);

// Pooled hidden states of some inputs (/embed's machinery).
struct Embedded {
  std::vector<std::vector<float>> vectors;
  int64_t width = 0;
  int64_t tokens = 0;  // prompt tokens over all inputs
  std::string pooling;
  bool normalize = false;
  int64_t layer = -1;
};

// Each input (a text or token ids; errors name `field` and the input's
// index) pooled from one layer, the inputs sharing forwards; `layer`,
// `pooling`, `normalize` and `add_special_tokens` come from `b`.
StatusOr<Embedded> EmbedInputs(const ServerOptions& o, Engine& e, const json& b,
                               const std::vector<json>& inputs,
                               const std::string& field);
// Vectors of one width as the rows of one array.
std::vector<float> Rows(const std::vector<std::vector<float>>& v);

}  // namespace loom::serve::routes

#endif  // LOOM_SERVE_ROUTES_EMBED_H_
