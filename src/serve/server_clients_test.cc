// `loom serve` against what TheLoom's clients send and expect, over real
// HTTP with the bundled model:
//   - request bytes of Weaver (TheLoom's Go client) as Go's net/http writes
//     them, non-streaming and streaming chat, with and without hidden
//     states, `model: ""`; and the OpenAI SDK's streamed chat;
//   - chat hidden states in TheLoom's shape [1, hidden] and Weaver's
//     multi-layer `hidden_states` map;
//   - return_attention: the attention row of the last position fed equals
//     the pattern of a one-pass forward of the same tokens;
//   - binary replies (Accept: application/x-npy, application/safetensors).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "src/base/float16.h"
#include "src/io/npy.h"
#include "src/io/safetensors.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"
#include "src/serve/api.h"
#include "src/serve/binary_response.h"
#include "src/serve/raw_http_test_util.h"
#include "src/serve/running_server.h"
#include "src/serve/server.h"
#include "src/tokenizer/tokenizer.h"

namespace loom::serve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

ServerOptions Defaults() {
  ServerOptions o;
  o.engine.precision = Precision::kF32;
  o.engine.slots = 4;
  o.engine.context = 256;
  o.engine.prefill_chunk = 16;
  return o;
}

// Sends `request` byte for byte (it says "Connection: close") and reads the
// reply until the server closes the connection; a chunked body is
// de-chunked.
RawReply Raw(int port, const std::string& request) {
  RawReply out = RawExchange(port, request, 60);
  if (out.status == 0) return out;
  std::string lower = out.headers;
  for (char& c : lower) c = static_cast<char>(std::tolower(c));
  if (lower.find("transfer-encoding: chunked") != std::string::npos) {
    std::string body;
    size_t at = 0;
    while (at < out.body.size()) {
      const size_t eol = out.body.find("\r\n", at);
      if (eol == std::string::npos) break;
      const size_t len =
          std::strtoul(out.body.substr(at, eol - at).c_str(), nullptr, 16);
      if (len == 0) break;
      body += out.body.substr(eol + 2, len);
      at = eol + 2 + len + 2;
    }
    out.body = std::move(body);
  }
  // Go's transport asks for gzip itself and decodes it transparently.
  if (lower.find("content-encoding: gzip") != std::string::npos) {
    httplib::detail::gzip_decompressor gz;
    std::string plain;
    EXPECT_TRUE(gz.decompress(out.body.data(), out.body.size(),
                              [&](const char* d, size_t n) {
                                plain.append(d, n);
                                return true;
                              }));
    out.body = std::move(plain);
  }
  return out;
}

// An SSE event as Weaver's parser (Weaver/pkg/backend/loom.go) reads it:
// `event:` and `data:` lines (one leading space dropped), ended by a blank
// line, `:` lines comments, data lines joined with '\n'; the type is the
// event name, else the `type` field of the JSON data.
struct Event {
  std::string type, data;
};
std::vector<Event> WeaverEvents(const std::string& body) {
  std::vector<Event> out;
  std::string name, data;
  bool has_data = false;
  auto flush = [&] {
    if (!name.empty() || has_data) {
      std::string type = name;
      if (type.empty()) {
        const json j = json::parse(data, nullptr, false);
        if (j.is_object() && j.contains("type") && j["type"].is_string())
          type = j["type"];
      }
      out.push_back({type, data});
    }
    name.clear();
    data.clear();
    has_data = false;
  };
  size_t at = 0;
  while (at <= body.size()) {
    size_t nl = body.find('\n', at);
    if (nl == std::string::npos) nl = body.size();
    std::string line = body.substr(at, nl - at);
    at = nl + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) {
      flush();
      if (nl == body.size()) break;
      continue;
    }
    if (line[0] == ':') continue;
    auto value = [&](size_t from) {
      std::string v = line.substr(from);
      if (!v.empty() && v[0] == ' ') v.erase(0, 1);
      return v;
    };
    if (line.rfind("event:", 0) == 0) name = value(6);
    if (line.rfind("data:", 0) == 0) {
      data += (has_data ? "\n" : "") + value(5);
      has_data = true;
    }
  }
  flush();
  return out;
}

// What Go's net/http writes for Weaver's http.NewRequest + Header.Set calls
// (Weaver/pkg/backend/loom.go): the request line, Host, User-Agent,
// Content-Length, the headers Weaver set in sorted order (Accept only when
// streaming, Content-Type), then the transport's Accept-Encoding. No
// Connection header (HTTP/1.1 keep-alive); "Connection: close" is added
// last so that the reply ends.
std::string WeaverRequest(int port, const std::string& body, bool stream) {
  return "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:" +
         std::to_string(port) +
         "\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n" +
         (stream ? "Accept: text/event-stream\r\n" : "") +
         "Content-Type: application/json\r\nAccept-Encoding: gzip\r\n"
         "Connection: close\r\n\r\n" +
         body;
}

// Weaver's body (Go's encoding/json: struct field order, omitempty drops
// return_hidden_states/hidden_state_layers/device when unset, `name` on
// messages only when set, max_tokens 1024 for 0, temperature 0.7 for 0).
std::string WeaverBody(const std::string& model, const std::string& extra,
                       bool stream) {
  return R"({"model":")" + model +
         R"(","messages":[{"role":"system","content":"You are terse."},)"
         R"({"role":"user","content":"Tell me a story.","name":"alice"}],)"
         R"("max_tokens":6,"temperature":0.7)" +
         extra + (stream ? R"(,"stream":true)" : "") + "}";
}

std::vector<float> Floats(const json& a) {
  std::vector<float> v;
  for (const json& x : a) {
    EXPECT_TRUE(x.is_number()) << x.dump();
    v.push_back(x.get<float>());
  }
  return v;
}

// Weaver's chat, non-streaming and streaming, from its request bytes:
// status 200, `text`, integer usage, `hidden_state.final` a numeric array of
// shape [1, hidden] when asked for (absent otherwise), the multi-layer
// `hidden_states` map for several layers, and a stream of
// content_block_delta events then one message_delta whose text adds up to
// the non-streaming reply's.
TEST(ServeClientsTest, WeaverChatFromItsRequestBytes) {
  Running s(Defaults());
  const int port = s.server().port();
  struct Case {
    std::string name, model, extra;
    std::vector<std::string> keys;  // layers of the hidden_states map
    int64_t layer;                  // hidden_state.layer (0: no hidden_state)
  };
  const std::vector<Case> cases = {
      // Weaver omits return_hidden_states when it wants none; omitted means
      // true to TheLoom and Loom (Weaver ignores what it did not ask for).
      {"no return_hidden_states, model \"\"", "", "", {}, -1},
      {"named model", "stories260K", "", {}, -1},
      {"return_hidden_states false",
       "",
       R"(,"return_hidden_states":false)",
       {},
       0},
      {"hidden states, \"all\"",
       "",
       R"(,"return_hidden_states":true,"hidden_state_layers":"all",)"
       R"("device":"cuda:0")",
       {"-5", "-4", "-3", "-2", "-1"},
       -1},
      {"hidden states, one int",
       "",
       R"(,"return_hidden_states":true,"hidden_state_layers":5)",
       {},
       5},
      {"hidden states, [0, -1]",
       "",
       R"(,"return_hidden_states":true,"hidden_state_layers":[0,-1])",
       {"0", "-1"},
       -1},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const RawReply r = Raw(
        port, WeaverRequest(port, WeaverBody(k.model, k.extra, false), false));
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.body;
    ASSERT_TRUE(j["text"].is_string());
    for (const char* u : {"prompt_tokens", "completion_tokens", "total_tokens"})
      EXPECT_TRUE(j["usage"][u].is_number_integer()) << u;
    EXPECT_EQ(j["usage"]["completion_tokens"], 6);
    EXPECT_TRUE(j["metadata"].is_object());
    if (k.layer == 0) {
      EXPECT_FALSE(j.contains("hidden_state")) << j.dump();
    } else {
      const json& h = j["hidden_state"];
      ASSERT_TRUE(h["final"].is_array()) << h.dump();
      EXPECT_EQ(Floats(h["final"]).size(), 64u);
      EXPECT_EQ(h["shape"], json({1, 64}));
      EXPECT_EQ(h["layer"], k.layer);
      EXPECT_EQ(h["dtype"], "float32");
    }
    if (k.keys.empty()) {
      EXPECT_FALSE(j.contains("hidden_states"));
    } else {
      ASSERT_EQ(j["hidden_states"].size(), k.keys.size());
      for (const std::string& key : k.keys) {
        const json& m = j["hidden_states"][key];
        ASSERT_TRUE(m["vector"].is_array()) << key;
        EXPECT_EQ(m["vector"].size(), 64u);
        EXPECT_EQ(m["shape"], json({1, 64}));
        EXPECT_EQ(m["layer"], std::stoll(key));
        EXPECT_EQ(m["dtype"], "float32");
      }
      // hidden_state is the last layer listed.
      EXPECT_EQ(j["hidden_states"][k.keys.back()]["vector"],
                j["hidden_state"]["final"]);
    }

    // The same request streamed, as Weaver sends it.
    const RawReply st = Raw(
        port, WeaverRequest(port, WeaverBody(k.model, k.extra, true), true));
    ASSERT_EQ(st.status, 200) << st.body;
    EXPECT_NE(st.headers.find("text/event-stream"), std::string::npos);
    const std::vector<Event> events = WeaverEvents(st.body);
    ASSERT_GE(events.size(), 2u) << st.body;
    std::string text;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      ASSERT_EQ(events[i].type, "content_block_delta") << events[i].data;
      const json d = json::parse(events[i].data);
      EXPECT_EQ(d["delta"]["type"], "text_delta");
      EXPECT_FALSE(d["delta"]["text"].get<std::string>().empty());
      text += d["delta"]["text"].get<std::string>();
    }
    // Weaver's sampling is seeded (seed 0): the same text as above.
    EXPECT_EQ(text, j["text"]);
    ASSERT_EQ(events.back().type, "message_delta");
    const json md = json::parse(events.back().data);
    EXPECT_EQ(md["delta"]["stop_reason"], "length");
    EXPECT_EQ(md["usage"], j["usage"]);
    EXPECT_TRUE(md["metadata"].contains("model"));
    if (k.layer == 0) {
      EXPECT_FALSE(md.contains("hidden_state"));
    } else {
      EXPECT_EQ(md["hidden_state"]["final"], j["hidden_state"]["final"]);
      EXPECT_EQ(md["hidden_state"]["shape"], json({1, 64}));
    }
    if (!k.keys.empty()) {
      EXPECT_EQ(md["hidden_states"], j["hidden_states"]);
    }
  }
}

// The OpenAI SDK for JavaScript (its headers captured off the wire,
// `connection: close` for `keep-alive`), streamed chat: OpenAI's chunks,
// the role first, a last chunk with finish_reason and usage, then [DONE];
// no TheLoom events, also with Loom's return_hidden_states (extra_body).
TEST(ServeClientsTest, OpenAiSdkStreamedChatFromItsRequestBytes) {
  Running s(Defaults());
  const int port = s.server().port();
  for (const std::string extra : {"", R"(,"return_hidden_states":true)"}) {
    SCOPED_TRACE(extra);
    const std::string body =
        R"({"model":"stories260K","messages":[{"role":"user","content":)"
        R"("Tell me a story."}],"max_tokens":5,"stream":true)" +
        extra + "}";
    const std::string request =
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:" +
        std::to_string(port) +
        "\r\nconnection: close\r\naccept: application/json\r\n"
        "content-type: application/json\r\nuser-agent: OpenAI/JS 6.49.0\r\n"
        "x-stainless-lang: js\r\nx-stainless-package-version: 6.49.0\r\n"
        "x-stainless-os: Linux\r\nx-stainless-arch: x64\r\n"
        "x-stainless-runtime: node\r\nx-stainless-runtime-version: "
        "v20.20.2\r\nauthorization: Bearer sk-none\r\n"
        "x-stainless-retry-count: 0\r\nx-stainless-timeout: 600\r\n"
        "accept-language: *\r\nsec-fetch-mode: cors\r\n"
        "accept-encoding: gzip, deflate\r\ncontent-length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    const RawReply r = Raw(port, request);
    ASSERT_EQ(r.status, 200) << r.body;
    const std::vector<Event> events = WeaverEvents(r.body);
    ASSERT_GE(events.size(), 3u) << r.body;
    EXPECT_EQ(events.back().data, "[DONE]");
    const json first = json::parse(events[0].data);
    EXPECT_EQ(first["object"], "chat.completion.chunk");
    EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
    const json last = json::parse(events[events.size() - 2].data);
    EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(last["usage"]["completion_tokens"], 5);
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      // No event names, no TheLoom types: what Weaver would ignore.
      EXPECT_TRUE(events[i].type.empty()) << events[i].type;
      const json c = json::parse(events[i].data);
      EXPECT_EQ(c["object"], "chat.completion.chunk");
      EXPECT_FALSE(c.contains("hidden_state"));
    }
  }
}

// Captures the attention pattern [heads, L, L] of one block.
class PatternSink : public HookSink {
 public:
  Status OnActivation(const HookPoint& hook, const Batch&, int64_t, int64_t,
                      const ActivationView& view) override {
    const float* p = view.f32();
    rows = view.rows;
    cols = view.cols;
    values.assign(p, p + view.rows * view.cols);
    return Status();
  }
  std::vector<float> values;
  int64_t rows = 0, cols = 0;
};

// The probabilities of the last query row of a one-pass forward of `ids`
// (no KV cache) at `block`: [heads, ids.size()].
std::vector<float> LastPatternRow(const Model& m,
                                  const std::vector<int32_t>& ids,
                                  int64_t block) {
  HookSet hooks;
  hooks.Add({HookSite::kPattern, block});
  const int64_t T = static_cast<int64_t>(ids.size());
  ExecutorOptions eo;
  eo.max_tokens = T;
  auto ex = Executor::Create(m, hooks, eo);
  EXPECT_TRUE(ex.ok()) << ex.status().ToString();
  const std::vector<int64_t> starts = {0, T};
  PatternSink sink;
  const Status st = (*ex)->Forward(Batch{ids, starts}, &sink);
  EXPECT_TRUE(st.ok()) << st.ToString();
  const int64_t heads = sink.rows / T;
  std::vector<float> out;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < T; ++j)
      out.push_back(sink.values[static_cast<size_t>((h * T + T - 1) * T + j)]);
  return out;
}

// return_attention: TheLoom's attention_weights {key: {data (flat), shape
// [1, heads, keys], dtype}}, keys = positions fed; equal to a one-pass
// forward's pattern of the same tokens at the same block (i >= 0 block i,
// i < 0 block n + i), for a prompt only and after generating (the KV cache's
// keys); in base64 too; on chat; refused for a layer that is no block;
// counted in the capture budget.
TEST(ServeClientsTest, ReturnAttentionEqualsAOnePassForwardsPattern) {
  Running s(Defaults());
  auto c = s.Client();
  auto model = Model::Load(Stories(), Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto tokenizer = tok::Tokenizer::Load(Stories());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  auto enc = (*tokenizer)
                 ->Encode(
                     "Lily and Ben went to the park. They saw a big tree with "
                     "red apples.",
                     true);
  ASSERT_TRUE(enc.ok());
  const std::vector<int32_t> prompt = enc->ids;
  const int64_t n = model.value()->config().num_layers;
  const int64_t heads = model.value()->config().num_heads;
  for (const std::string format : {"list", "base64"})
    for (int max_tokens : {0, 5}) {
      SCOPED_TRACE(format + ", max_tokens " + std::to_string(max_tokens));
      const json req = {{"prompt", prompt},
                        {"max_tokens", max_tokens},
                        {"temperature", 0},
                        {"return_attention", true},
                        {"hidden_state_format", format},
                        {"hidden_state_layers", {0, 2, -1}}};
      auto r = c.Post("/generate", req.dump(), "application/json");
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << r->body;
      const json g = json::parse(r->body);
      // The positions fed: the prompt, then every generated token but the
      // last.
      std::vector<int32_t> fed = prompt;
      const std::vector<int32_t> generated = g["token_ids"];
      ASSERT_EQ(generated.size(), static_cast<size_t>(max_tokens));
      for (int i = 0; i + 1 < max_tokens; ++i) fed.push_back(generated[i]);
      const int64_t keys = static_cast<int64_t>(fed.size());
      ASSERT_TRUE(g.contains("attention_weights")) << g.dump();
      const json& aw = g["attention_weights"];
      ASSERT_EQ(aw.size(), 3u);
      for (const std::string key : {"0", "2", "-1"}) {
        SCOPED_TRACE("layer " + key);
        const json& a = aw[key];
        EXPECT_EQ(a["shape"], json({1, heads, keys}));
        EXPECT_EQ(a["dtype"], "float32");
        std::vector<float> got;
        if (format == "base64") {
          EXPECT_EQ(a["encoding"], "base64");
          auto bytes = Base64Decode(a["data"].get<std::string>());
          ASSERT_TRUE(bytes.ok());
          got.resize(bytes->size() / 4);
          std::memcpy(got.data(), bytes->data(), bytes->size());
        } else {
          got = Floats(a["data"]);  // flat, as TheLoom sends it
        }
        const int64_t l = std::stoll(key);
        const std::vector<float> want =
            LastPatternRow(**model, fed, l < 0 ? n + l : l);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 1e-5f) << "element " << i;
        for (int64_t h = 0; h < heads; ++h) {
          double sum = 0;
          for (int64_t j = 0; j < keys; ++j) sum += got[h * keys + j];
          EXPECT_NEAR(sum, 1.0, 1e-5) << "head " << h;
        }
      }
    }

  // Chat: attention_weights beside hidden_state.
  int status = 0;
  auto r = c.Post("/v1/chat/completions",
                  json({{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                        {"max_tokens", 3},
                        {"return_attention", true}})
                      .dump(),
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json chat = json::parse(r->body);
  EXPECT_EQ(chat["attention_weights"]["-1"]["shape"][1], heads);
  // Not a block: the final norm's hidden-state index.
  r = c.Post("/generate",
             json({{"prompt", "Hi"},
                   {"max_tokens", 1},
                   {"return_attention", true},
                   {"hidden_state_layers", {n}}})
                 .dump(),
             "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("return_attention: layer 5 of hidden_state_layers "
                         "is outside [-5, 4]"),
            std::string::npos)
      << r->body;
  (void)status;

  // The attention rows count in the capture budget (admission).
  ServerOptions small = Defaults();
  small.engine.capture_bytes = 4096;
  Running s2(small);
  auto c2 = s2.Client();
  const json req = {{"prompt", prompt},
                    {"max_tokens", 4},
                    {"return_attention", true},
                    {"hidden_state_layers", "all"}};
  r = c2.Post("/generate", req.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("capture budget"), std::string::npos) << r->body;
  json one = req;
  one["hidden_state_layers"] = {-1};
  one["return_hidden_states"] = false;
  r = c2.Post("/generate", one.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

// Accept negotiation: JSON by default and for wildcards, the binary types
// when named (q-values honoured, an exact type before a wildcard), an error
// (the server's 406) when nothing acceptable is named.
TEST(ServeClientsTest, AcceptNegotiation) {
  auto is = [](std::string_view accept, BodyFormat want) {
    StatusOr<BodyFormat> f = NegotiateBody(accept);
    EXPECT_TRUE(f.ok()) << accept << ": " << f.status().ToString();
    if (f.ok()) {
      EXPECT_EQ(*f, want) << accept;
    }
  };
  is("", BodyFormat::kJson);
  is("*/*", BodyFormat::kJson);
  is("application/json", BodyFormat::kJson);
  is("application/*", BodyFormat::kJson);
  is("application/x-npy", BodyFormat::kNpy);
  is("Application/X-NPY ; q=0.9", BodyFormat::kNpy);
  is("application/safetensors", BodyFormat::kSafetensors);
  is("*/*, application/safetensors", BodyFormat::kSafetensors);
  is("application/json;q=0.5, application/x-npy", BodyFormat::kNpy);
  is("application/x-npy;q=0.2, application/json", BodyFormat::kJson);
  is("text/html, application/json;q=0.1", BodyFormat::kJson);
  for (std::string_view bad :
       {"text/csv", "application/x-npy;q=0", "application/octet-stream"}) {
    StatusOr<BodyFormat> f = NegotiateBody(bad);
    ASSERT_FALSE(f.ok()) << bad;
    EXPECT_NE(f.status().message().find("application/safetensors"),
              std::string::npos);
  }
}

struct Reply {
  int status = 0;
  std::string type, body;
};

Reply PostAccept(httplib::Client& c, const std::string& path, const json& body,
                 const std::string& accept) {
  httplib::Headers h;
  if (!accept.empty()) h.emplace("Accept", accept);
  auto r = c.Post(path, h, body.dump(), "application/json");
  EXPECT_TRUE(r) << path;
  if (!r) return {};
  return {r->status, r->get_header_value("Content-Type"), r->body};
}

NpyHeader ParseNpy(const std::string& body, std::vector<uint8_t>* data) {
  const fs::path path = fs::temp_directory_path() / "loom_serve_reply.npy";
  std::ofstream(path, std::ios::binary) << body;
  auto a = ReadNpy(path.string());
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  fs::remove(path);
  if (!a.ok()) return {};
  // The reply is exactly the file: no bytes after the array.
  EXPECT_EQ(static_cast<int64_t>(body.size()),
            a->header.data_offset + a->header.data_bytes());
  *data = a->data;
  return a->header;
}

std::vector<float> AsF32(const std::vector<uint8_t>& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

struct Safetensors {
  SafetensorsHeader header;
  std::string body;
  std::vector<uint8_t> Bytes(const std::string& name) const {
    const TensorInfo* t = header.Find(name);
    EXPECT_NE(t, nullptr) << name;
    if (t == nullptr) return {};
    const char* p = body.data() + header.data_start + t->begin;
    return std::vector<uint8_t>(p, p + t->bytes());
  }
};

Safetensors ParseSafetensors(const std::string& body) {
  Safetensors s;
  s.body = body;
  auto h = ParseSafetensorsHeader("reply",
                                  reinterpret_cast<const uint8_t*>(body.data()),
                                  static_cast<int64_t>(body.size()));
  EXPECT_TRUE(h.ok()) << h.status().ToString();
  if (h.ok()) s.header = *h;
  return s;
}

// Binary replies: /embed, /embed/batch, /generate, /v1/embeddings answer
// npy or safetensors as Accept asks, with the values of the JSON reply, in
// the requested dtype; npy only for one array (406 otherwise, before
// generating); 406 for an Accept the route cannot answer.
TEST(ServeClientsTest, BinaryHiddenStates) {
  Running s(Defaults());
  auto c = s.Client();
  const json embed = {{"text", "The cat sat"}, {"pooling", "mean"}};
  Reply j = PostAccept(c, "/embed", embed, "");
  ASSERT_EQ(j.status, 200) << j.body;
  EXPECT_EQ(j.type, "application/json");
  const std::vector<float> want = Floats(json::parse(j.body)["embedding"]);

  Reply r = PostAccept(c, "/embed", embed, "application/x-npy");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.type, "application/x-npy");
  std::vector<uint8_t> data;
  NpyHeader h = ParseNpy(r.body, &data);
  EXPECT_EQ(h.descr, "<f4");
  EXPECT_EQ(h.shape, std::vector<int64_t>({64}));
  EXPECT_EQ(AsF32(data), want);

  // bf16: numpy's '<u2' holding the bf16 bits, as NpyWriter stores it.
  json bf16 = embed;
  bf16["hidden_state_dtype"] = "bf16";
  r = PostAccept(c, "/embed", bf16, "application/x-npy");
  ASSERT_EQ(r.status, 200) << r.body;
  h = ParseNpy(r.body, &data);
  EXPECT_EQ(h.descr, "<u2");
  ASSERT_EQ(data.size(), 128u);
  for (size_t i = 0; i < 64; ++i) {
    uint16_t bits;
    std::memcpy(&bits, data.data() + 2 * i, 2);
    EXPECT_EQ(bits, F32ToBf16(want[i])) << i;
  }

  // /embed/batch: one [texts, hidden] array.
  const json batch = {{"texts", {"The cat sat", "A dog"}}, {"layer", 2}};
  const json jb = json::parse(PostAccept(c, "/embed/batch", batch, "").body);
  r = PostAccept(c, "/embed/batch", batch, "application/x-npy");
  ASSERT_EQ(r.status, 200) << r.body;
  h = ParseNpy(r.body, &data);
  EXPECT_EQ(h.shape, std::vector<int64_t>({2, 64}));
  std::vector<float> rows = Floats(jb["embeddings"][0]);
  for (float x : Floats(jb["embeddings"][1])) rows.push_back(x);
  EXPECT_EQ(AsF32(data), rows);

  // /v1/embeddings as safetensors: "embeddings" and the other fields in the
  // metadata.
  const json oai = {{"input", {"The cat sat", "A dog"}}, {"layer", 2}};
  const json jo = json::parse(PostAccept(c, "/v1/embeddings", oai, "").body);
  r = PostAccept(c, "/v1/embeddings", oai, "application/safetensors");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.type, "application/safetensors");
  Safetensors st = ParseSafetensors(r.body);
  ASSERT_EQ(st.header.tensors.size(), 1u);
  EXPECT_EQ(st.header.tensors[0].name, "embeddings");
  EXPECT_EQ(st.header.tensors[0].dtype, DType::kF32);
  EXPECT_EQ(st.header.tensors[0].shape.dims(), std::vector<int64_t>({2, 64}));
  std::vector<float> orows = Floats(jo["data"][0]["embedding"]);
  for (float x : Floats(jo["data"][1]["embedding"])) orows.push_back(x);
  EXPECT_EQ(AsF32(st.Bytes("embeddings")), orows);
  EXPECT_EQ(st.header.metadata["format"], "loom-serve");
  const json meta = json::parse(st.header.metadata["response"]);
  EXPECT_EQ(meta["model"], "stories260K");
  EXPECT_EQ(meta["usage"], jo["usage"]);

  // /generate, one layer as npy: the JSON reply's hidden state.
  const json gen = {{"prompt", "Once upon a time"},
                    {"max_tokens", 4},
                    {"temperature", 0},
                    {"hidden_state_format", "base64"}};
  const json jg = json::parse(PostAccept(c, "/generate", gen, "").body);
  r = PostAccept(c, "/generate", gen, "application/x-npy");
  ASSERT_EQ(r.status, 200) << r.body;
  h = ParseNpy(r.body, &data);
  EXPECT_EQ(h.shape, std::vector<int64_t>({64}));
  EXPECT_EQ(data.size(), 256u);
  auto b64 = Base64Decode(jg["hidden_states"]["-1"]["data"].get<std::string>());
  ASSERT_TRUE(b64.ok());
  EXPECT_EQ(std::string(data.begin(), data.end()), *b64);

  // Several arrays: npy is refused (406, naming them), safetensors holds
  // them all, the rest of the reply in its metadata.
  const json many = {{"prompt", "Once upon a time"},
                     {"max_tokens", 4},
                     {"temperature", 0},
                     {"hidden_state_layers", {0, -1}},
                     {"return_full_sequence", true},
                     {"hooks", "blocks.2.hook_resid_pre"},
                     {"select", {"last", "mean"}},
                     {"return_attention", true},
                     {"hidden_state_dtype", "float16"}};
  r = PostAccept(c, "/generate", many, "application/x-npy");
  EXPECT_EQ(r.status, 406) << r.body;
  EXPECT_NE(r.body.find("holds exactly one array, and this reply has 8 "
                        "(hidden_states.0, hidden_states.-1, "
                        "sequence_hidden_states.0"),
            std::string::npos)
      << r.body;
  r = PostAccept(c, "/generate", many, "application/safetensors");
  ASSERT_EQ(r.status, 200) << r.body;
  st = ParseSafetensors(r.body);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"hidden_states.0", {64}},
      {"hidden_states.-1", {64}},
      {"sequence_hidden_states.0", {4, 64}},
      {"sequence_hidden_states.-1", {4, 64}},
      {"activations.blocks.2.hook_resid_pre.last", {1, 64}},
      {"activations.blocks.2.hook_resid_pre.mean", {1, 64}},
      {"attention_weights.0", {1, 8, 8}},
      {"attention_weights.-1", {1, 8, 8}}};
  ASSERT_EQ(st.header.tensors.size(), shapes.size());
  for (const auto& [name, shape] : shapes) {
    const TensorInfo* t = st.header.Find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, DType::kF16) << name;
    EXPECT_EQ(t->shape.dims(), shape) << name;
  }
  const json rest = json::parse(st.header.metadata["response"]);
  EXPECT_EQ(rest["token_ids"], jg["token_ids"]);
  EXPECT_EQ(rest["text"], jg["text"]);
  EXPECT_EQ(rest["activation_rows"], 8);
  for (const char* gone : {"hidden_states", "sequence_hidden_states",
                           "activations", "attention_weights"})
    EXPECT_FALSE(rest.contains(gone)) << gone;
  // The f16 values of the JSON reply (same request, JSON).
  json many_json = many;
  many_json["hidden_state_format"] = "base64";
  const json jm = json::parse(PostAccept(c, "/generate", many_json, "").body);
  auto f16 = Base64Decode(
      jm["sequence_hidden_states"]["-1"]["data"].get<std::string>());
  ASSERT_TRUE(f16.ok());
  const std::vector<uint8_t> got = st.Bytes("sequence_hidden_states.-1");
  EXPECT_EQ(std::string(got.begin(), got.end()), *f16);

  // Nothing to put in an npy; Accept that no route answers.
  json none = gen;
  none["return_hidden_states"] = false;
  EXPECT_EQ(PostAccept(c, "/generate", none, "application/x-npy").status, 406);
  for (const std::string path : {"/generate", "/embed", "/v1/embeddings"}) {
    r = PostAccept(c, path,
                   path == "/generate" ? gen
                   : path == "/embed"  ? embed
                                       : oai,
                   "text/csv");
    EXPECT_EQ(r.status, 406) << path << " " << r.body;
    EXPECT_NE(r.body.find("Accept: text/csv: this route answers"),
              std::string::npos)
        << r.body;
  }
  // Other routes keep answering JSON whatever Accept says.
  r = PostAccept(c, "/v1/chat/completions",
                 {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                  {"max_tokens", 1}},
                 "application/x-npy");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.type, "application/json");
}

}  // namespace
}  // namespace loom::serve
