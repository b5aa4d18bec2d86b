// A generation streamed as server-sent events: /generate/stream's events,
// TheLoom's chat events, or OpenAI's chunks of a chat or a completion; and
// TheLoom's chat hidden states, which streamed and plain chats share.
#ifndef LOOM_SERVE_ROUTES_STREAM_H_
#define LOOM_SERVE_ROUTES_STREAM_H_

#include <httplib.h>

#include <functional>
#include <memory>
#include <string>

#include "src/base/status.h"
#include "src/serve/api.h"
#include "src/serve/engine.h"
#include "src/serve/routes/generation.h"

namespace loom::serve::routes {

// What a stream sends: /generate/stream's events, TheLoom's chat events, or
// OpenAI's chunks of a chat or a completion.
enum class StreamKind {
  kGenerate,
  kTheLoomChat,
  kOpenAiChat,
  kOpenAiCompletion
};

// Called with a stream's result once its last event is written (not when
// the client went away first).
using OnStreamEnd = std::function<void(const StatusOr<GenResult>&)>;

// Streams the generation `f` on `e` as server-sent events of `kind`;
// `on_end` (may be empty) then gets the result.
Status Stream(httplib::Response& res, std::shared_ptr<Engine> e, GenFields f,
              StreamKind kind, OnStreamEnd on_end = nullptr);

// OpenAI's finish_reason of a generation's stop_reason.
std::string FinishReason(const std::string& stop_reason);

// TheLoom's chat hidden state: the last layer listed.
json ChatHiddenState(const GenFields& f, const GenResult& g);
// Weaver's multi-layer map {key: {vector, shape, layer, dtype}} when
// several layers were asked for (TheLoom never sends it; Weaver reads it).
json ChatHiddenStates(const GenFields& f, const GenResult& g);

}  // namespace loom::serve::routes

#endif  // LOOM_SERVE_ROUTES_STREAM_H_
