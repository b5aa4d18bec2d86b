// Neuronpedia's inference API (docs/saes.md, "HTTP"): POST
// /v1/activation/topk-by-token, /v1/activation/all, /v1/activation/single
// (activation.h: features of the SAEs named in interp.saes, or a
// direction), /v1/steer/* (steer.h), /v1/lens/prompt (lens.h), and here
// /v1/tokenize and GET /v1/capabilities. Request keys are
// read in Neuronpedia's camelCase or its older snake_case; replies use
// camelCase (capabilities: snake_case, as Neuronpedia's); errors are
// {"error": message}, 400 naming the field.
#ifndef LOOM_SERVE_ROUTES_NEURONPEDIA_H_
#define LOOM_SERVE_ROUTES_NEURONPEDIA_H_

#include <httplib.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/serve/api.h"
#include "src/serve/engine.h"
#include "src/serve/routes/context.h"
#include "src/serve/transport.h"

namespace loom::serve::routes {

// POST /v1/tokenize, GET /v1/capabilities (the activation routes:
// activation.h; steering: steer.h).
void RegisterNeuronpediaRoutes(HttpListeners& http, ServerContext& ctx);

// Whether `path` is one of Neuronpedia's routes (their error body).
bool IsNeuronpediaPath(std::string_view path);

// The key a Neuronpedia field is sent under: `camel` when present, else
// `snake` when present, else `camel` (for the messages of a missing one).
std::string NpKey(const json& b, std::string_view camel,
                  std::string_view snake);
// A required string field (400 naming it when missing or not a string).
StatusOr<std::string> NpRequiredString(const json& b, const std::string& key);
// The engine of a Neuronpedia request: `model` is a label of the server's
// model there (a pod serves one), so a name that is no model of this server
// picks the only loaded one.
StatusOr<std::shared_ptr<Engine>> NpEngine(ServerContext& ctx, const json& b);
// The request's `prompt` (null when missing).
json Prompt(const json& b);
// Whether `id` is a special token of e's tokenizer (false without one).
bool IsSpecialToken(const Engine& e, int32_t id);
// The prompt's tokens as Neuronpedia reads them: a text's are the
// tokenizer's, with its BOS put first when the tokenizer has one and did
// not add it; token ids (Loom's extension) are taken as they are.
StatusOr<std::vector<int32_t>> NpTokens(const ServerOptions& o, const Engine& e,
                                        const json& prompt,
                                        const std::string& field);
// The chat messages of field `key` of `b`: a non-empty list of {role,
// content} strings (400 naming the field and the entry otherwise).
StatusOr<nlohmann::ordered_json> NpMessages(const json& b,
                                            const std::string& key);
// Registers POST `path` (a JSON body) answered by `f`.
using NpHandler = Status (*)(ServerContext&, const httplib::Request&,
                             httplib::Response&);
void NpPost(HttpListeners& http, ServerContext& ctx, const std::string& path,
            NpHandler f);
// A token decoded alone (TransformerLens' to_str_tokens); "<id>" for an id
// the tokenizer does not know (a checkpoint's vocabulary padded past it),
// the id in decimal for a checkpoint without a tokenizer.
std::string TokenText(const Engine& e, int32_t id);
std::vector<std::string> TokenStrings(const Engine& e,
                                      const std::vector<int32_t>& ids);
// Whether `ids` starts with the tokenizer's BOS (false without one).
bool StartsWithBos(const Engine& e, const std::vector<int32_t>& ids);
// Puts the BOS first (`want`, when the tokenizer has one) or takes a
// leading one off (not `want`, leaving at least one token); returns whether
// `ids` now starts with it.
bool SetLeadingBos(const Engine& e, bool want, std::vector<int32_t>* ids);

}  // namespace loom::serve::routes

#endif  // LOOM_SERVE_ROUTES_NEURONPEDIA_H_
