// Server-sent events of a generation (stream.h).
#include "src/serve/routes/stream.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <deque>
#include <mutex>
#include <utility>

#include "src/serve/routes/common.h"

namespace loom::serve::routes {

namespace {

// Events of one streamed response, filled by the scheduler thread and
// drained by the HTTP worker that writes them.
struct StreamState {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> events;
  bool finished = false;
  void Push(std::string e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(std::move(e));
    }
    cv.notify_all();
  }
  void Finish() {
    {
      std::lock_guard<std::mutex> lock(mu);
      finished = true;
    }
    cv.notify_all();
  }
};

std::string Sse(std::string_view event, const json& data) {
  std::string s;
  if (!event.empty()) s += "event: " + std::string(event) + "\n";
  s += "data: " + data.dump(-1, ' ', false, json::error_handler_t::replace) +
       "\n\n";
  return s;
}

bool IsOpenAi(StreamKind k) {
  return k == StreamKind::kOpenAiChat || k == StreamKind::kOpenAiCompletion;
}

// The id, creation time and model every OpenAI chunk of a stream repeats.
struct StreamIds {
  std::string id;
  int64_t created = 0;
  std::string model;
};

// One OpenAI chunk: `choice` holds the fields of its one choice (index 0).
std::string OpenAiChunk(StreamKind kind, const StreamIds& s, json choice,
                        const json& usage = nullptr) {
  choice["index"] = 0;
  json j = {{"id", s.id},
            {"object", kind == StreamKind::kOpenAiChat ? "chat.completion.chunk"
                                                       : "text_completion"},
            {"created", s.created},
            {"model", s.model},
            {"choices", json::array({std::move(choice)})}};
  if (!usage.is_null()) j["usage"] = usage;
  return Sse("", j);
}

// The event of one non-empty piece of generated text (chat and completion
// streams).
std::string PieceEvent(StreamKind kind, const StreamIds& s,
                       const std::string& piece) {
  if (kind == StreamKind::kOpenAiChat)
    return OpenAiChunk(
        kind, s, {{"delta", {{"content", piece}}}, {"finish_reason", nullptr}});
  if (kind == StreamKind::kOpenAiCompletion)
    return OpenAiChunk(
        kind, s,
        {{"text", piece}, {"logprobs", nullptr}, {"finish_reason", nullptr}});
  return Sse("content_block_delta",
             {{"type", "content_block_delta"},
              {"index", 0},
              {"delta", {{"type", "text_delta"}, {"text", piece}}}});
}

// TheLoom's chat hidden state of layers[i] (the last position fed) under
// `values` ("final" for hidden_state, "vector" in Weaver's hidden_states
// map): a flat list (or base64) with TheLoom's shape [1, hidden].
json ChatLayerState(const GenFields& f, const GenResult& g, size_t i,
                    const char* values) {
  int64_t w = 0;
  const float* rows = Capture(f, g, f.layers[i].second, &w);
  json a = EncodeArray(rows + (g.rows - 1) * w, 1, w, true, f.dtype, f.format);
  json out = {{values, std::move(a["data"])},
              {"shape", {1, w}},
              {"layer", std::stoll(f.layers[i].first)},
              {"dtype", a["dtype"]}};
  if (a.contains("encoding")) out["encoding"] = a["encoding"];
  return out;
}

// The last event of a stream: /generate/stream's done, TheLoom's
// message_delta, or OpenAI's last chunk (finish_reason, usage) and
// [DONE]; an error event (OpenAI's error object) when the request failed.
std::string FinalEvent(const Engine& e, const GenFields& f,
                       const StatusOr<GenResult>& g, StreamKind kind,
                       const StreamIds& ids) {
  StatusOr<json> body =
      g.ok() ? GenResponse(e, f, *g) : StatusOr<json>(g.status());
  if (!body.ok()) {
    const int code = HttpStatusOf(body.status());
    if (IsOpenAi(kind))
      return Sse("", OpenAiErrorBody(code, body.status().message())) +
             "data: [DONE]\n\n";
    return Sse(
        "error",
        {{"type", "error"},
         {"error", {{"message", body.status().message()}, {"code", code}}}});
  }
  if (kind == StreamKind::kGenerate) return Sse("done", *body);
  const json usage = {
      {"prompt_tokens", g->prompt_ids.size()},
      {"completion_tokens", g->token_ids.size()},
      {"total_tokens", g->prompt_ids.size() + g->token_ids.size()}};
  const std::string finish = FinishReason(g->stop_reason);
  if (kind == StreamKind::kOpenAiChat)
    return OpenAiChunk(kind, ids,
                       {{"delta", json::object()}, {"finish_reason", finish}},
                       usage) +
           "data: [DONE]\n\n";
  if (kind == StreamKind::kOpenAiCompletion)
    return OpenAiChunk(
               kind, ids,
               {{"text", ""}, {"logprobs", nullptr}, {"finish_reason", finish}},
               usage) +
           "data: [DONE]\n\n";
  json delta = {{"type", "message_delta"},
                {"delta", {{"stop_reason", finish}}},
                {"usage", usage},
                {"metadata", (*body)["metadata"]}};
  if (f.return_hidden) delta["hidden_state"] = ChatHiddenState(f, *g);
  if (f.return_hidden && f.layers.size() > 1)
    delta["hidden_states"] = ChatHiddenStates(f, *g);
  return Sse("message_delta", delta);
}

}  // namespace

// OpenAI's finish_reason of a generation's stop_reason.
std::string FinishReason(const std::string& stop_reason) {
  return stop_reason == "max_tokens" || stop_reason == "context" ? "length"
                                                                 : "stop";
}

// Streams the generation `f` on `e` as server-sent events of `kind`;
// `on_end` (may be empty) then gets the result.
Status Stream(httplib::Response& res, std::shared_ptr<Engine> e, GenFields f,
              StreamKind kind, OnStreamEnd on_end) {
  auto st = std::make_shared<StreamState>();
  const StreamIds ids{
      (kind == StreamKind::kOpenAiCompletion ? "cmpl-" : "chatcmpl-") +
          std::to_string(std::time(nullptr)) + "-" +
          std::to_string(reinterpret_cast<uintptr_t>(st.get()) % 100000),
      std::time(nullptr), e->id()};
  auto index = std::make_shared<int64_t>(0);
  f.request.on_token = [st, kind, ids, index](int32_t tok,
                                              const std::string& piece) {
    if (kind == StreamKind::kGenerate) {
      st->Push(
          Sse("token",
              {{"token", piece}, {"token_id", tok}, {"index", (*index)++}}));
    } else if (!piece.empty()) {
      st->Push(PieceEvent(kind, ids, piece));
    }
  };
  f.request.on_finish = [st] { st->Finish(); };
  // OpenAI's first chat chunk carries the role. It is queued before
  // Submit: from Submit on, the scheduler thread may push content chunks
  // at any moment (pushed after Submit, it sometimes came after them).
  if (kind == StreamKind::kOpenAiChat)
    st->Push(OpenAiChunk(kind, ids,
                         {{"delta", {{"role", "assistant"}, {"content", ""}}},
                          {"finish_reason", nullptr}}));
  ASSIGN_OR_RETURN(auto ticket, e->Submit(f.request));
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st, ticket, e, f, kind, ids, on_end](size_t, httplib::DataSink& sink) {
        std::unique_lock<std::mutex> lock(st->mu);
        st->cv.wait_for(lock, std::chrono::milliseconds(200),
                        [&] { return !st->events.empty() || st->finished; });
        while (!st->events.empty()) {
          std::string ev = std::move(st->events.front());
          st->events.pop_front();
          lock.unlock();
          if (!sink.write(ev.data(), ev.size())) {
            ticket->Cancel();
            return false;
          }
          lock.lock();
        }
        if (!st->finished) {
          if (!sink.is_writable()) {
            ticket->Cancel();
            return false;
          }
          return true;
        }
        lock.unlock();
        const StatusOr<GenResult> g = ticket->Wait();
        const std::string last = FinalEvent(*e, f, g, kind, ids);
        sink.write(last.data(), last.size());
        sink.done();
        if (on_end) on_end(g);
        return true;
      });
  return Status();
}

// TheLoom's chat hidden state: the last layer listed.
json ChatHiddenState(const GenFields& f, const GenResult& g) {
  if (f.layers.empty()) return nullptr;
  return ChatLayerState(f, g, f.layers.size() - 1, "final");
}

// Weaver's multi-layer map {key: {vector, shape, layer, dtype}} when
// several layers were asked for (TheLoom never sends it; Weaver reads it).
json ChatHiddenStates(const GenFields& f, const GenResult& g) {
  json out = json::object();
  for (size_t i = 0; i < f.layers.size(); ++i)
    out[f.layers[i].first] = ChatLayerState(f, g, i, "vector");
  return out;
}

}  // namespace loom::serve::routes
