// What the generation routes (/generate, /generate/batch, chat,
// /v1/completions) share: a request's fields parsed once (GenFields), its
// prompt's tokens, and the reply's JSON and binary arrays.
#ifndef LOOM_SERVE_ROUTES_GENERATION_H_
#define LOOM_SERVE_ROUTES_GENERATION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"
#include "src/serve/api.h"
#include "src/serve/binary_response.h"
#include "src/serve/engine.h"
#include "src/serve/server.h"

namespace loom::serve::routes {

// The most tokens one generation request may ask for (`max_tokens`).
inline constexpr int64_t kMaxRequestTokens = 8192;

// What a generation request asks for, parsed once.
struct GenFields {
  GenRequest request;
  // temperature and top_p as given (or their defaults), before request's
  // sampling narrows them to float.
  double temperature = 0.0, top_p = 1.0;
  // TheLoom's hidden_state_layers: key (as requested) -> hook.
  std::vector<std::pair<std::string, HookPoint>> layers;
  // Loom's hooks + selectors.
  std::vector<HookPoint> hooks;
  std::vector<RowSelector> selectors;
  // return_attention: key (as requested in hidden_state_layers) -> block.
  std::vector<std::pair<std::string, int64_t>> attention;
  bool return_attention = false;
  bool return_hidden = true;
  bool full_sequence = false;
  ArrayFormat format = ArrayFormat::kList;
  DType dtype = DType::kF32;
};

// Submits every request of `fields` to `e` at once (they share forwards);
// on a refusal the tickets already taken are cancelled and the error names
// the prompt.
StatusOr<std::vector<std::shared_ptr<Ticket>>> SubmitAll(
    Engine& e, const std::vector<GenFields>& fields);

// vLLM's `prompt_token_ids` (a list of token ids) moved into `prompt`, where
// every route reads a prompt; with both given, a 400 naming them.
Status PromptTokenIdsAsPrompt(json* body);

// A prompt (text, or a list of token ids; errors name `field`) as token
// ids, within server.max_prompt_tokens and the serving context.
StatusOr<std::vector<int32_t>> Tokens(const ServerOptions& o, const Engine& e,
                                      const json& prompt, bool add_special,
                                      const std::string& field = "prompt");
// The generation fields of body `b` for `prompt` (chat: OpenAI's top_p
// default).
StatusOr<GenFields> ParseGen(const ServerOptions& o, const Engine& e,
                             const json& b, std::vector<int32_t> prompt,
                             bool chat);
// The request's `interventions` for `prompts` prompts, parsed once.
StatusOr<RequestInterventions> Interventions(const ServerOptions& o,
                                             const Engine& e, const json& b,
                                             int64_t prompts);
// Gives prompt `row` of a request its interventions.
Status Attach(const RequestInterventions& ivs, int64_t row, GenRequest* r);
// The capture of `hook` in a result: [rows, width].
const float* Capture(const GenFields& f, const GenResult& g,
                     const HookPoint& hook, int64_t* width);
// TheLoom's generation response, plus Loom's fields; without `arrays`,
// the fields beside the arrays (a binary reply's metadata).
StatusOr<json> GenResponse(const Engine& e, const GenFields& f,
                           const GenResult& g, bool arrays = true);
// The arrays of a generation reply, named as its JSON fields.
std::vector<std::string> GenArrayNames(const GenFields& f);
// The arrays of GenArrayNames (values in `g`, or in *storage).
StatusOr<std::vector<BinaryArray>> GenArrays(
    const GenFields& f, const GenResult& g,
    std::vector<std::vector<float>>* storage);

}  // namespace loom::serve::routes

#endif  // LOOM_SERVE_ROUTES_GENERATION_H_
