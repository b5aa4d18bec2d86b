// `loom serve` over real HTTP on a loopback port with the bundled model:
// every route, hidden states equal to `loom extract`'s, the streaming
// formats, malformed requests of every kind, authentication, a full queue,
// and a bounded load test (64 concurrent clients).
#include "src/serve/server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "src/eval/extract.h"
#include "src/eval/generate.h"
#include "src/io/npy.h"
#include "src/serve/api.h"
#include "src/serve/raw_http_test_util.h"
#include "src/serve/running_server.h"
#include "tests/golden_util.h"

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

json Post(httplib::Client& c, const std::string& path, const json& body,
          int* status = nullptr) {
  auto r = c.Post(path, body.dump(), "application/json");
  EXPECT_TRUE(r) << path << ": no response";
  if (!r) return json();
  if (status != nullptr) *status = r->status;
  json j = json::parse(r->body, nullptr, false);
  return j;
}

std::vector<float> DecodeF32(const json& array) {
  EXPECT_EQ(array.value("encoding", ""), "base64");
  auto bytes = Base64Decode(array["data"].get<std::string>());
  EXPECT_TRUE(bytes.ok());
  std::vector<float> v(bytes->size() / 4);
  std::memcpy(v.data(), bytes->data(), bytes->size());
  return v;
}

// SSE events of a body: (event name, data).
std::vector<std::pair<std::string, std::string>> Events(const std::string& s) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find("\n\n", pos);
    if (end == std::string::npos) break;
    std::string block = s.substr(pos, end - pos), name, data;
    size_t line = 0;
    while (line < block.size()) {
      size_t nl = block.find('\n', line);
      if (nl == std::string::npos) nl = block.size();
      const std::string l = block.substr(line, nl - line);
      if (l.rfind("event: ", 0) == 0) name = l.substr(7);
      if (l.rfind("data: ", 0) == 0) data = l.substr(6);
      line = nl + 1;
    }
    out.emplace_back(name, data);
    pos = end + 2;
  }
  return out;
}

// Sends `request` byte for byte and reads the reply until the server closes
// the connection (10 s at most per read).
RawReply Raw(int port, const std::string& request) {
  return RawExchange(port, request, 10);
}

// A POST of `body` with these extra header lines ("" = none).
std::string RawPost(const std::string& path, const std::string& headers,
                    const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers +
         "Content-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

// `body` in chunks of 1000 bytes (Transfer-Encoding: chunked).
std::string RawChunkedPost(const std::string& path, const std::string& body) {
  std::string r = "POST " + path +
                  " HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: "
                  "chunked\r\nConnection: close\r\n\r\n";
  for (size_t at = 0; at < body.size(); at += 1000) {
    const std::string part = body.substr(at, 1000);
    char size[16];
    std::snprintf(size, sizeof(size), "%zx\r\n", part.size());
    r += size + part + "\r\n";
  }
  return r + "0\r\n\r\n";
}

std::string Detail(const RawReply& r) {
  const json j = json::parse(r.body, nullptr, false);
  return j.is_object() && j.contains("detail") ? j["detail"].get<std::string>()
                                               : "(no JSON detail) " + r.body;
}

// A body far over the limit still gets its 413: the server reads and drops
// the rest (closing with unread bytes would reset the connection, and the
// client, still sending, would see no reply at all).
TEST(ServeHttpTest, RefusedLargeBodyStillGetsTheReply) {
  ServerOptions o = Defaults();
  o.max_body_bytes = 64 << 10;
  Running s(o);
  const std::string big =
      json({{"prompt", "Once"}, {"padding", std::string(16 << 20, 'x')}})
          .dump();
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    auto c = s.Client();
    auto r = c.Post("/generate", big, "application/json");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 413);
    EXPECT_NE(r->body.find("larger than server.max_body_bytes = 65536"),
              std::string::npos)
        << r->body;
  }
}

// A declared Content-Length is judged on the header alone: a client that
// declares a huge or a malformed length and sends nothing more gets its
// reply at once (the server's read timeout is 30 s; the client here gives up
// after 10, and goes once it has the reply).
TEST(ServeHttpTest, DeclaredLengthJudgedOnTheHeaderAlone) {
  Running s(Defaults());
  auto head = [](const std::string& length, const std::string& extra) {
    return "POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
           "application/json\r\n" +
           extra + "Content-Length: " + length + "\r\n\r\n";
  };
  struct Case {
    std::string length, extra;
    int status;
    std::string detail;
  };
  const std::vector<Case> cases = {
      {"10000000000", "", 413,
       "request body of 10000000000 bytes is larger than "
       "server.max_body_bytes = 8388608"},
      {"99999999999999999999", "", 413,
       "request body of 99999999999999999999 bytes is larger than"},
      {"-5", "", 400, "invalid Content-Length `-5`: expected a count of bytes"},
      {"12abc", "", 400, "invalid Content-Length `12abc`"},
      // Over the route's limit but within the analysis routes' one: at
      // once for a client that waits for 100 Continue before sending.
      {"9000000", "Expect: 100-continue\r\n", 413,
       "request body of 9000000 bytes is larger than server.max_body_bytes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("Content-Length: " + c.length);
    const RawReply r =
        RawExchange(s.server().port(), head(c.length, c.extra), 10, true);
    EXPECT_EQ(r.status, c.status) << r.headers << r.body;
    EXPECT_NE(Detail(r).find(c.detail), std::string::npos) << Detail(r);
  }
  // Within the limits the body is read as before.
  const std::string body = json({{"prompt", "Once"}, {"max_tokens", 1}}).dump();
  EXPECT_EQ(Raw(s.server().port(), RawPost("/generate", "", body)).status, 200);
}

// curl -d sends application/x-www-form-urlencoded, which the HTTP library
// caps at 8 KiB when it reads a body itself: a JSON route reads its body as
// JSON whatever the Content-Type (or none), limited by max_body_bytes only,
// and the 413 names the limit that fired.
TEST(ServeHttpTest, JsonBodyWhateverTheContentType) {
  ServerOptions o = Defaults();
  o.max_body_bytes = 64 << 10;
  Running s(o);
  const int port = s.server().port();
  // Over 8 KiB: a field the route ignores pads it.
  const std::string body = json({{"prompt", "Once"},
                                 {"max_tokens", 1},
                                 {"temperature", 0},
                                 {"padding", std::string(10000, 'x')}})
                               .dump();
  ASSERT_GT(body.size(), 8192u);
  for (const std::string type : {"application/x-www-form-urlencoded", "",
                                 "text/plain", "application/json"}) {
    SCOPED_TRACE("Content-Type: " + type);
    const std::string header =
        type.empty() ? "" : "Content-Type: " + type + "\r\n";
    const RawReply r = Raw(port, RawPost("/generate", header, body));
    EXPECT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.body;
    EXPECT_EQ(j["token_count"], 1);
  }
  RawReply r = Raw(port, RawChunkedPost("/generate", body));
  EXPECT_EQ(r.status, 200) << r.body;
  // Over max_body_bytes, declared or chunked: 413 naming the limit.
  const std::string big =
      json({{"prompt", "Once"}, {"padding", std::string(70000, 'x')}}).dump();
  r = Raw(port,
          RawPost("/generate",
                  "Content-Type: application/x-www-form-urlencoded\r\n", big));
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(Detail(r), "request body of " + std::to_string(big.size()) +
                           " bytes is larger than server.max_body_bytes = "
                           "65536");
  r = Raw(port, RawChunkedPost("/generate", big));
  EXPECT_EQ(r.status, 413);
  EXPECT_NE(Detail(r).find("larger than server.max_body_bytes = 65536"),
            std::string::npos)
      << Detail(r);
  // Not a route: 404 whatever the body, not the library's form limit.
  r = Raw(port,
          RawPost("/nowhere",
                  "Content-Type: application/x-www-form-urlencoded\r\n", body));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(Detail(r), "no route POST /nowhere");
  // multipart/form-data: refused (its parts are not a JSON object).
  const std::string multipart =
      "--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nb\r\n"
      "--XyZ--\r\n";
  r = Raw(port, RawPost("/generate",
                        "Content-Type: multipart/form-data; boundary=XyZ\r\n",
                        multipart));
  EXPECT_EQ(r.status, 415);
  EXPECT_NE(Detail(r).find("multipart/form-data"), std::string::npos)
      << Detail(r);
  // An empty body, declared or not (no Content-Length: no body in HTTP/1.1;
  // it was a 30 s wait for the client to close, then a bare "HTTP 400").
  r = Raw(port, RawPost("/generate", "", ""));
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(Detail(r).find("the request body is empty: it must be a JSON "
                           "object"),
            std::string::npos)
      << Detail(r);
  r = Raw(port,
          "POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: "
          "close\r\n\r\n");
  EXPECT_EQ(r.status, 400);
  EXPECT_LT(r.seconds, 5.0);
  EXPECT_NE(Detail(r).find("the request body is empty"), std::string::npos)
      << Detail(r);
  // Still serving, and the refusals were counted.
  auto c = s.Client();
  int status = 0;
  Post(c, "/generate", {{"prompt", "a"}, {"max_tokens", 1}}, &status);
  EXPECT_EQ(status, 200);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find(
                "loom_http_requests_total{route=\"/generate\",code=\"413\"} 2"),
            std::string::npos)
      << m->body;
}

// Runs the threads created while it lives on one CPU (the first of the
// process's), as on a loaded machine; restores the mask after.
class OnOneCpu {
 public:
  OnOneCpu() {
    sched_getaffinity(0, sizeof(saved_), &saved_);
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &saved_)) {
        CPU_SET(c, &one);
        break;
      }
    sched_setaffinity(0, sizeof(one), &one);
  }
  ~OnOneCpu() { sched_setaffinity(0, sizeof(saved_), &saved_); }

 private:
  cpu_set_t saved_;
};

// The first chunk of every OpenAI-format chat stream carries delta.role. It
// was queued after Submit, when the scheduler thread may already have pushed
// content: the scheduler, woken by Submit on the HTTP thread's core, runs
// first now and then (about one stream in a hundred). The server's threads
// share one CPU here to make that likelier; 40 concurrent streams, then 160
// one after the other (with the role pushed after Submit, 10 runs in 10 of
// this test failed).
TEST(ServeHttpTest, OpenAiChatStreamsStartWithTheRole) {
  std::unique_ptr<Running> s;
  {
    OnOneCpu pin;
    ServerOptions o = Defaults();
    o.engine.slots = 16;
    o.engine.threads = 1;
    o.threads = 48;
    s = std::make_unique<Running>(o);
  }
  std::atomic<int> streams{0};
  std::mutex mu;
  std::vector<std::string> bad;
  auto client = [&](int i, int count) {
    auto c = s->Client();
    for (int k = 0; k < count; ++k) {
      auto r = c.Post(
          "/v1/chat/completions",
          json({{"messages",
                 {{{"role", "user"}, {"content", "Hi " + std::to_string(i)}}}},
                {"max_tokens", 4},
                {"temperature", 0},
                {"ignore_eos", true},
                {"stream", true}})
              .dump(),
          "application/json");
      ++streams;
      const auto events =
          r && r->status == 200 ? Events(r->body) : decltype(Events("")){};
      const json first = events.empty()
                             ? json()
                             : json::parse(events[0].second, nullptr, false);
      if (!first.is_object() ||
          first["choices"][0]["delta"].value("role", "") != "assistant") {
        std::lock_guard<std::mutex> lock(mu);
        bad.push_back(r ? r->body.substr(0, 300) : "no response");
      }
    }
  };
  std::vector<std::thread> clients;
  for (int i = 0; i < 40; ++i) clients.emplace_back(client, i, 1);
  for (auto& t : clients) t.join();
  clients.clear();
  client(0, 160);  // one after the other: Submit wakes the scheduler each time
  EXPECT_EQ(streams.load(), 200);
  EXPECT_TRUE(bad.empty()) << bad.size() << " streams, e.g.: " << bad[0];
  s->Stop();
}

// The front ends agree: `"prompt": ""` is refused as extract refuses an
// empty text row; the temperature range is generate's (eval::
// kMaxTemperature); max_tokens 0 stops with "prompt" as the generator does.
TEST(ServeHttpTest, FieldsAgreeWithTheOtherFrontEnds) {
  Running s(Defaults());
  auto c = s.Client();
  int status = 0;
  json e = Post(c, "/generate", {{"prompt", ""}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["detail"], "field `prompt`: empty text");
  e = Post(c, "/embed", {{"text", ""}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["detail"], "text 0: field `text`: empty text");
  e = Post(c, "/generate",
           {{"prompt", "a"},
            {"max_tokens", 1},
            {"temperature", eval::kMaxTemperature + 0.5}},
           &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(e["detail"].get<std::string>().find("temperature"),
            std::string::npos);
  Post(c, "/generate",
       {{"prompt", "a"},
        {"max_tokens", 1},
        {"temperature", eval::kMaxTemperature}},
       &status);
  EXPECT_EQ(status, 200);
  // The generation parameters' table (eval::GenerationParams): the same
  // ranges as `loom generate`'s flags and the Python keywords, the field
  // named; max_tokens capped per request.
  const std::tuple<std::string, json, std::string> bad[] = {
      {"top_p", 0, "field `top_p`: expected a number in (0, 1], got 0"},
      {"temperature", 3,
       "field `temperature`: expected a number in [0, 2], "
       "got 3"},
      {"top_k", -1,
       "field `top_k`: expected an integer in [0, 1073741824], "
       "got -1"},
      {"max_tokens", 9000,
       "field `max_tokens`: expected an integer in [0, 8192], got 9000"},
      {"seed", -1,
       "field `seed`: expected an integer in [0, 18446744073709551615], got "
       "-1"},
      {"stop", 5, "field `stop`: expected a string or a list, got 5"},
  };
  for (const auto& [field, value, want] : bad) {
    e = Post(c, "/generate", {{"prompt", "a"}, {field, value}}, &status);
    EXPECT_EQ(status, 400) << field;
    EXPECT_EQ(e["detail"], want);
  }
  eval::SamplingOptions hot;
  hot.temperature = eval::kMaxTemperature + 0.5f;
  EXPECT_FALSE(eval::ValidateSampling(hot).ok());
  hot.temperature = eval::kMaxTemperature;
  EXPECT_TRUE(eval::ValidateSampling(hot).ok());
  // max_tokens 0: the engine's and the generator's stop_reason agree.
  json g =
      Post(c, "/generate", {{"prompt", "Once"}, {"max_tokens", 0}}, &status);
  ASSERT_EQ(status, 200) << g.dump();
  auto model = Model::Load(Stories(), Precision::kF32);
  ASSERT_TRUE(model.ok());
  auto gen = eval::Generator::Create(**model, {});
  ASSERT_TRUE(gen.ok());
  eval::GenerateOptions none;
  none.max_new_tokens = 0;
  auto want = (*gen)->Generate({{1, 403}}, none);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  EXPECT_EQ(g["stop_reason"], (*want)[0].stop_reason);
  EXPECT_EQ(g["stop_reason"], "prompt");
}

TEST(ServeHttpTest, HealthModelsLoadUnload) {
  ServerOptions o = Defaults();
  Running s(o);
  auto c = s.Client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  json health = json::parse(h->body);
  EXPECT_EQ(health["status"], "healthy");
  EXPECT_EQ(health["model_loaded"], "stories260K");
  auto m = c.Get("/models");
  ASSERT_TRUE(m);
  json models = json::parse(m->body);
  ASSERT_EQ(models["models"].size(), 1u);
  EXPECT_EQ(models["models"][0]["num_layers"], 5);
  EXPECT_EQ(models["models"][0]["hidden_size"], 64);
  int status = 0;
  json loaded = Post(c, "/models/load", {{"model", "stories260K"}}, &status);
  EXPECT_EQ(status, 200) << loaded.dump();
  auto d = c.Delete("/models/stories260K");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->status, 200) << d->body;
  d = c.Delete("/models/stories260K");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->status, 404);
  // No model loaded and none named: a 400 saying so.
  json e = Post(c, "/generate", {{"prompt", "Once"}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(e["detail"].get<std::string>().find("no model is loaded"),
            std::string::npos);
  // Named: loaded on demand.
  json g = Post(c, "/generate",
                {{"model", "stories260K"},
                 {"prompt", "Once"},
                 {"max_tokens", 2},
                 {"temperature", 0}},
                &status);
  EXPECT_EQ(status, 200) << g.dump();
}

// models.max_loaded reached: the least recently used idle model is
// unloaded to make room (TheLoom's LRU); names resolve under models.dirs.
TEST(ServeHttpTest, MaxLoadedEvictsTheLeastRecentlyUsed) {
  const fs::path root = fs::temp_directory_path() / "loom_serve_models";
  fs::remove_all(root);
  fs::create_directories(root);
  for (const char* name : {"a", "b"})
    fs::copy(Stories(), root / name, fs::copy_options::recursive);
  ServerOptions o = Defaults();
  o.model_dirs = {root.string()};
  o.max_loaded = 1;
  Running s(o);  // stories260K (the --model directory) is loaded
  auto c = s.Client();
  int status = 0;
  const json req = {{"prompt", "Once"}, {"max_tokens", 2}, {"temperature", 0}};
  json a = req, b = req;
  a["model"] = "a";
  b["model"] = "b";
  Post(c, "/generate", a, &status);
  EXPECT_EQ(status, 200);
  auto m = c.Get("/models");
  ASSERT_TRUE(m);
  json models = json::parse(m->body)["models"];
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0]["model_id"], "a");
  json g = Post(c, "/generate", b, &status);
  EXPECT_EQ(status, 200) << g.dump();
  m = c.Get("/models");
  ASSERT_TRUE(m);
  models = json::parse(m->body)["models"];
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0]["model_id"], "b");
  s.Stop();
  fs::remove_all(root);
}

// A model with a chat template: the messages are rendered by it (special
// tokens written by the template, not added again) and generation continues
// the rendered prompt.
TEST(ServeHttpTest, ChatUsesTheModelsTemplate) {
  const fs::path dir = fs::temp_directory_path() / "loom_serve_chat" / "tpl";
  fs::remove_all(dir.parent_path());
  fs::create_directories(dir.parent_path());
  fs::copy(Stories(), dir, fs::copy_options::recursive);
  std::ofstream(dir / "chat_template.jinja")
      << "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content "
         "}}\n"
         "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}";
  ServerOptions o = Defaults();
  o.model_paths = {dir.string()};
  o.host = "127.0.0.1";
  o.port = 0;
  auto server = Server::Create(o);
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE((*server)->LoadModel(dir.string()).ok());
  ASSERT_TRUE((*server)->Bind().ok());
  std::thread run([&] { EXPECT_TRUE((*server)->Run().ok()); });
  httplib::Client c("127.0.0.1", (*server)->port());
  c.set_read_timeout(60);
  int status = 0;
  json chat = Post(c, "/v1/chat/completions",
                   {{"messages",
                     {{{"role", "system"}, {"content", "Be brief."}},
                      {{"role", "user"}, {"content", "Tell a story."}}}},
                    {"max_tokens", 6},
                    {"temperature", 0}},
                   &status);
  EXPECT_EQ(status, 200) << chat.dump();
  const std::string rendered =
      "<s>[system] Be brief.\n[user] Tell a story.\n[assistant] ";
  auto tok = tok::Tokenizer::Load(dir.string());
  ASSERT_TRUE(tok.ok());
  auto enc = (*tok)->Encode(rendered, false);
  ASSERT_TRUE(enc.ok());
  EXPECT_EQ(chat["usage"]["prompt_tokens"], enc->ids.size());
  ASSERT_FALSE(enc->ids.empty());
  EXPECT_EQ(enc->ids[0], (*tok)->bos_id());  // the template's BOS, once
  json gen = Post(c, "/generate",
                  {{"prompt", enc->ids}, {"max_tokens", 6}, {"temperature", 0}},
                  &status);
  EXPECT_EQ(gen["text"], chat["text"]);
  (*server)->Stop();
  run.join();
  fs::remove_all(dir.parent_path());
}

// A checkpoint without a tokenizer is served for token-id prompts (`prompt`
// as ids, or vLLM's `prompt_token_ids`), with the same tokens as the model
// with its tokenizer; text and stop strings are the request's 400.
TEST(ServeHttpTest, ATokenizerlessCheckpointServesTokenIds) {
  loom::testing::TempDir dir;
  const std::string model = dir.File("notok");
  fs::create_directories(model);
  for (const char* f :
       {"config.json", "model.safetensors", "generation_config.json"})
    fs::copy_file(fs::path(Stories()) / f, fs::path(model) / f);
  const json ids = {1, 403, 407};
  json want;
  {
    Running with(Defaults());
    auto c = with.Client();
    int status = 0;
    want = Post(c, "/generate", {{"prompt", ids}, {"max_tokens", 5}}, &status);
    ASSERT_EQ(status, 200) << want.dump();
  }
  Running s(Defaults(), model);
  auto c = s.Client();
  int status = 0;
  json got =
      Post(c, "/generate", {{"prompt", ids}, {"max_tokens", 5}}, &status);
  ASSERT_EQ(status, 200) << got.dump();
  EXPECT_EQ(got["token_ids"], want["token_ids"]);
  EXPECT_EQ(got["text"], "");
  got = Post(c, "/generate", {{"prompt_token_ids", ids}, {"max_tokens", 5}},
             &status);
  ASSERT_EQ(status, 200) << got.dump();
  EXPECT_EQ(got["token_ids"], want["token_ids"]);
  got = Post(c, "/v1/completions",
             {{"prompt_token_ids", ids}, {"max_tokens", 5}, {"temperature", 0}},
             &status);
  EXPECT_EQ(status, 200) << got.dump();
  EXPECT_EQ(got["usage"]["completion_tokens"], 5) << got.dump();
  const std::pair<json, std::string> refused[] = {
      {{{"prompt", "Once upon"}},
       "field `prompt`: text needs a tokenizer, and model notok has none ("},
      {{{"prompt", ids}, {"stop", {"x"}}},
       "stop strings need a tokenizer, and model notok has none"},
      {{{"prompt", ids}, {"prompt_token_ids", ids}},
       "fields `prompt` and `prompt_token_ids`: give one of them, not both"},
      {{{"prompt_token_ids", "1 2"}},
       "field `prompt_token_ids`: expected a list of token ids, got string"},
  };
  for (const auto& [body, message] : refused) {
    SCOPED_TRACE(body.dump());
    got = Post(c, "/generate", body, &status);
    EXPECT_EQ(status, 400) << got.dump();
    EXPECT_NE(got.value("detail", "").find(message), std::string::npos)
        << got.dump();
  }
  auto models = c.Get("/models");
  ASSERT_TRUE(models);
  EXPECT_NE(models->body.find("\"has_tokenizer\":false"), std::string::npos)
      << models->body;
}

// A model whose plan (weights, KV cache, activations, capture budget)
// exceeds host memory x memory_fraction is refused before anything is
// allocated.
TEST(ServeHttpTest, LoadRefusedBeforeAllocatingWhenThePlanCannotFit) {
  ServerOptions o = Defaults();
  o.host = "127.0.0.1";
  o.port = 0;
  o.model_paths = {Stories()};
  o.memory_fraction = 1e-7;  // a few hundred bytes to a few KiB
  auto server = Server::Create(o);
  ASSERT_TRUE(server.ok());
  auto id = (*server)->LoadModel(Stories());
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(id.status().message().find("its plan needs "), std::string::npos)
      << id.status().message();
}

TEST(ServeHttpTest, GreedyGenerateMatchesTheGenerator) {
  Running s(Defaults());
  auto c = s.Client();
  int status = 0;
  json g = Post(c, "/generate",
                {{"prompt", "Once upon a time"},
                 {"max_tokens", 20},
                 {"temperature", 0},
                 {"hidden_state_layers", {-1, 0, 3}},
                 {"return_full_sequence", true}},
                &status);
  ASSERT_EQ(status, 200) << g.dump();
  auto model = Model::Load(Stories(), Precision::kF32);
  auto tok = tok::Tokenizer::Load(Stories());
  ASSERT_TRUE(model.ok() && tok.ok());
  auto enc = (*tok)->Encode("Once upon a time", true);
  eval::Generator::Options go;
  go.context = 256;
  auto gen = eval::Generator::Create(**model, go);
  eval::GenerateOptions opts;
  opts.max_new_tokens = 20;
  opts.stop_ids = *eval::LoadStopIds(**model);
  auto want = (*gen)->Generate({enc->ids}, opts, tok->get());
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(g["token_ids"].get<std::vector<int32_t>>(), (*want)[0].token_ids);
  EXPECT_EQ(g["text"], (*want)[0].text);
  EXPECT_EQ(g["token_count"], (*want)[0].token_ids.size());
  for (const char* key : {"-1", "0", "3"}) {
    EXPECT_EQ(g["hidden_states"][key]["shape"], json::array({64}));
    EXPECT_EQ(g["hidden_states"][key]["data"].size(), 64u);
    EXPECT_EQ(g["sequence_hidden_states"][key]["shape"],
              json::array({(*want)[0].token_ids.size(), 64}));
  }
  EXPECT_GT(g["metadata"]["tokens_per_second"].get<double>(), 0.0);
}

// The hidden states of /generate (prompt only, Loom's hooks + selectors)
// equal `loom extract`'s for the same prompt, to chunked-prefill round-off.
TEST(ServeHttpTest, HiddenStatesEqualLoomExtract) {
  Running s(Defaults());
  auto c = s.Client();
  const std::string prompt =
      "Lily and Ben went to the park. They saw a big tree with red apples, "
      "and Lily wanted one, so Ben climbed up to get it for her.";
  const fs::path dir = fs::temp_directory_path() / "loom_serve_extract";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "in.jsonl") << json({{"text", prompt}}).dump() << "\n";
  ExtractOptions eo;
  eo.model_dir = Stories();
  eo.input_path = (dir / "in.jsonl").string();
  eo.out_dir = (dir / "out").string();
  eo.hooks = {"blocks.2.hook_resid_pre", "blocks.4.hook_mlp_out",
              "ln_final.hook_normalized"};
  eo.selectors = {"last", "mean", "all", "pos:0,-2"};
  eo.precision = Precision::kF32;
  auto sum = RunExtract(eo);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  const json request = {{"prompt", prompt},
                        {"max_tokens", 0},
                        {"hooks", eo.hooks},
                        {"select", eo.selectors},
                        {"hidden_state_format", "base64"}};
  int status = 0;
  json g = Post(c, "/generate", request, &status);
  // blocks.4.hook_mlp_out is not capturable without activation_cache_filter.
  EXPECT_EQ(status, 400) << g.dump();
  EXPECT_NE(g["detail"].get<std::string>().find("blocks.4.hook_mlp_out"),
            std::string::npos);
  s.Stop();

  ServerOptions o = Defaults();
  o.engine.extra_hooks = {"blocks.*.hook_mlp_out"};
  Running s2(o);
  auto c2 = s2.Client();
  g = Post(c2, "/generate", request, &status);
  ASSERT_EQ(status, 200) << g.dump();
  for (const std::string& hook : eo.hooks)
    for (const std::string sel : {"last", "mean", "all", "pos:0,-2"}) {
      SCOPED_TRACE(hook + " " + sel);
      std::string file = sel == std::string("pos:0,-2") ? "pos_0_-2" : sel;
      auto npy = ReadNpy((dir / "out" / (hook + "." + file + ".npy")).string());
      ASSERT_TRUE(npy.ok()) << npy.status().ToString();
      std::vector<float> want(npy->data.size() / 4);
      std::memcpy(want.data(), npy->data.data(), npy->data.size());
      const std::vector<float> got = DecodeF32(g["activations"][hook][sel]);
      ASSERT_EQ(got.size(), want.size());
      float scale = 0;
      for (float v : want) scale = std::max(scale, std::fabs(v));
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 2e-5f * scale) << "element " << i;
    }
  fs::remove_all(dir);
}

TEST(ServeHttpTest, StreamBatchEmbedChatAnalyze) {
  Running s(Defaults());
  auto c = s.Client();
  int status = 0;
  const json req = {
      {"prompt", "The cat"}, {"max_tokens", 12}, {"temperature", 0}};
  json single = Post(c, "/generate", req, &status);
  ASSERT_EQ(status, 200);

  // SSE: token events, then done with the same text.
  auto r = c.Post("/generate/stream", req.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"),
            std::string::npos);
  auto events = Events(r->body);
  ASSERT_GE(events.size(), 2u);
  std::string streamed;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_EQ(events[i].first, "token");
    streamed += json::parse(events[i].second)["token"].get<std::string>();
  }
  EXPECT_EQ(events.back().first, "done");
  EXPECT_EQ(json::parse(events.back().second)["text"], single["text"]);
  EXPECT_EQ(streamed, single["text"]);

  // Batch: the same results as one at a time.
  json batch = Post(c, "/generate/batch",
                    {{"prompts", {"The cat", "A dog ran", "The cat"}},
                     {"max_tokens", 12},
                     {"temperature", 0}},
                    &status);
  ASSERT_EQ(status, 200) << batch.dump();
  ASSERT_EQ(batch["results"].size(), 3u);
  EXPECT_EQ(batch["results"][0]["token_ids"], single["token_ids"]);
  EXPECT_EQ(batch["results"][2]["token_ids"], single["token_ids"]);
  EXPECT_EQ(batch["prompts_processed"], 3);

  // Embeddings: mean pooling of the final norm, normalized.
  json emb =
      Post(c, "/embed",
           {{"text", "The cat sat"}, {"pooling", "mean"}, {"normalize", true}},
           &status);
  ASSERT_EQ(status, 200) << emb.dump();
  EXPECT_EQ(emb["shape"], json::array({64}));
  double norm = 0;
  for (double x : emb["embedding"]) norm += x * x;
  EXPECT_NEAR(norm, 1.0, 1e-5);
  json gen_all = Post(c, "/generate",
                      {{"prompt", "The cat sat"},
                       {"max_tokens", 0},
                       {"return_full_sequence", true}},
                      &status);
  ASSERT_EQ(status, 200);
  json eb =
      Post(c, "/embed/batch",
           {{"texts", {"The cat sat", "A dog"}}, {"pooling", "last_token"}},
           &status);
  ASSERT_EQ(status, 200) << eb.dump();
  EXPECT_EQ(eb["shape"], json::array({2, 64}));
  json last = Post(c, "/generate",
                   {{"prompt", "The cat sat"}, {"max_tokens", 0}}, &status);
  for (size_t i = 0; i < 64; ++i)
    EXPECT_FLOAT_EQ(eb["embeddings"][0][i].get<float>(),
                    last["hidden_states"]["-1"]["data"][i].get<float>());

  // Chat, OpenAI and TheLoom shapes in one response.
  json chat = Post(c, "/v1/chat/completions",
                   {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                    {"max_tokens", 5},
                    {"temperature", 0}},
                   &status);
  ASSERT_EQ(status, 200) << chat.dump();
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(chat["choices"][0]["message"]["content"], chat["text"]);
  EXPECT_EQ(chat["usage"]["completion_tokens"].get<int>() +
                chat["usage"]["prompt_tokens"].get<int>(),
            chat["usage"]["total_tokens"].get<int>());
  EXPECT_EQ(chat["hidden_state"]["final"].size(), 64u);
  EXPECT_EQ(chat["hidden_state"]["layer"], -1);
  // Content as the SDKs' list of text parts: the same chat.
  json parts = Post(c, "/v1/chat/completions",
                    {{"messages",
                      {{{"role", "user"},
                        {"content",
                         {{{"type", "text"}, {"text", "H"}},
                          {{"type", "text"}, {"text", "i"}}}}}}},
                     {"max_tokens", 5},
                     {"temperature", 0}},
                    &status);
  ASSERT_EQ(status, 200) << parts.dump();
  EXPECT_EQ(parts["text"], chat["text"]);
  // What the server does not implement is a 400 naming the field, never
  // silently ignored; the no-op values pass.
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"tools", json::array({{{"type", "function"}}})},
           {"response_format", {{"type", "json_object"}}},
           {"logit_bias", {{"5", 10}}},
           {"presence_penalty", 0.5},
           {"frequency_penalty", -1}}) {
    json bad = Post(c, "/v1/chat/completions",
                    {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                     {"max_tokens", 1},
                     {field, value}},
                    &status);
    EXPECT_EQ(status, 400) << field;
    EXPECT_NE(bad.dump().find("field `" + field + "`"), std::string::npos)
        << bad.dump();
  }
  json image =
      Post(c, "/v1/chat/completions",
           {{"messages",
             {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}},
            {"max_tokens", 1}},
           &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(image.dump().find("messages[0].content[0]"), std::string::npos)
      << image.dump();
  json noop = Post(c, "/v1/chat/completions",
                   {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                    {"max_tokens", 1},
                    {"presence_penalty", 0},
                    {"tools", json::array()},
                    {"response_format", {{"type", "text"}}}},
                   &status);
  EXPECT_EQ(status, 200) << noop.dump();
  // Streams: OpenAI chunks then [DONE]; TheLoom's events.
  r = c.Post("/v1/chat/completions",
             json({{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                   {"max_tokens", 5},
                   {"temperature", 0},
                   {"stream", true}})
                 .dump(),
             "application/json");
  ASSERT_TRUE(r);
  events = Events(r->body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back().second, "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json chunk = json::parse(events[i].second);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    text += chunk["choices"][0]["delta"].value("content", "");
  }
  EXPECT_EQ(text, chat["text"]);
  r = c.Post("/v1/chat/completions",
             json({{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                   {"max_tokens", 5},
                   {"temperature", 0},
                   {"stream", true},
                   {"return_hidden_states", true}})
                 .dump(),
             "application/json");
  ASSERT_TRUE(r);
  events = Events(r->body);
  ASSERT_GE(events.size(), 1u);
  text.clear();
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_EQ(events[i].first, "content_block_delta");
    text += json::parse(events[i].second)["delta"]["text"].get<std::string>();
  }
  EXPECT_EQ(text, chat["text"]);
  EXPECT_EQ(events.back().first, "message_delta");
  json md = json::parse(events.back().second);
  EXPECT_EQ(md["hidden_state"]["final"].size(), 64u);
  EXPECT_EQ(md["usage"]["completion_tokens"],
            chat["usage"]["completion_tokens"]);

  // /analyze, against values worked out by hand.
  json a =
      Post(c, "/analyze", {{"embedding", {1.0, 2.0, 3.0, 4.0, 0.0}}}, &status);
  ASSERT_EQ(status, 200) << a.dump();
  EXPECT_DOUBLE_EQ(a["mean"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(a["std"].get<double>(), std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(a["l2_norm"].get<double>(), std::sqrt(30.0));
  EXPECT_DOUBLE_EQ(a["sparsity"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(a["quartiles"]["q1"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(a["quartiles"]["median"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(a["quartiles"]["q3"].get<double>(), 3.0);

  // /gpu/status and /metrics.
  auto gs = c.Get("/gpu/status");
  ASSERT_TRUE(gs);
  json gpu = json::parse(gs->body);
  const json& host = gpu["devices"][0];
  EXPECT_GT(host["planned_bytes"].get<int64_t>(), 0);
  EXPECT_LE(host["used_bytes"].get<int64_t>(),
            host["planned_bytes"].get<int64_t>());
  auto me = c.Get("/metrics");
  ASSERT_TRUE(me);
  EXPECT_NE(me->body.find("loom_http_requests_total{route=\"/generate\","
                          "code=\"200\"}"),
            std::string::npos);
  EXPECT_NE(me->body.find("loom_generated_tokens_total{model=\"stories260K\"}"),
            std::string::npos);
}

// A chunked (Transfer-Encoding: chunked) body decoded.
std::string Dechunk(const std::string& body) {
  std::string out;
  size_t at = 0;
  while (at < body.size()) {
    const size_t eol = body.find("\r\n", at);
    if (eol == std::string::npos) break;
    const size_t n =
        std::strtoul(body.substr(at, eol - at).c_str(), nullptr, 16);
    if (n == 0) break;
    out += body.substr(eol + 2, n);
    at = eol + 2 + n + 2;
  }
  return out;
}

// The OpenAI routes beside chat: /v1/models, /v1/completions (prompts of
// every form, streamed), /v1/embeddings (equal to /embed's vectors, floats
// and base64), OpenAI's error objects, refusals of what Loom lacks.
TEST(ServeHttpTest, OpenAiModelsCompletionsEmbeddings) {
  Running s(Defaults());
  auto c = s.Client();
  int status = 0;
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  const json list = json::parse(models->body);
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0]["id"], "stories260K");
  EXPECT_EQ(list["data"][0]["object"], "model");
  EXPECT_EQ(list["data"][0]["owned_by"], "loom");
  EXPECT_GT(list["data"][0]["created"].get<int64_t>(), 0);
  auto one = c.Get("/v1/models/stories260K");
  ASSERT_TRUE(one);
  EXPECT_EQ(json::parse(one->body), list["data"][0]);
  auto none = c.Get("/v1/models/nope");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 404);
  EXPECT_EQ(json::parse(none->body)["error"]["code"], "model_not_found");

  // Completions: the text of /generate, greedy; every prompt form.
  const json gen = Post(
      c, "/generate",
      {{"prompt", "Once upon a time"}, {"max_tokens", 6}, {"temperature", 0}},
      &status);
  ASSERT_EQ(status, 200);
  json cmpl = Post(c, "/v1/completions",
                   {{"model", ""},
                    {"prompt", "Once upon a time"},
                    {"max_tokens", 6},
                    {"temperature", 0}},
                   &status);
  ASSERT_EQ(status, 200) << cmpl.dump();
  EXPECT_EQ(cmpl["object"], "text_completion");
  EXPECT_EQ(cmpl["choices"][0]["text"], gen["text"]);
  EXPECT_EQ(cmpl["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(cmpl["choices"][0]["logprobs"].is_null());
  EXPECT_FALSE(cmpl["choices"][0].contains("hidden_states"));
  EXPECT_EQ(cmpl["usage"]["completion_tokens"], 6);
  EXPECT_EQ(cmpl["usage"]["prompt_tokens"], gen["metadata"]["input_tokens"]);
  json ids = gen["token_ids"];  // any ids will do
  json many = Post(c, "/v1/completions",
                   {{"prompt", {"Once upon a time", "The cat"}},
                    {"max_tokens", 6},
                    {"temperature", 0}},
                   &status);
  ASSERT_EQ(status, 200) << many.dump();
  ASSERT_EQ(many["choices"].size(), 2u);
  EXPECT_EQ(many["choices"][0]["text"], gen["text"]);
  EXPECT_EQ(many["choices"][1]["index"], 1);
  json by_ids =
      Post(c, "/v1/completions",
           {{"prompt", {{1, 403, 407}, {1, 403}}}, {"max_tokens", 2}}, &status);
  ASSERT_EQ(status, 200) << by_ids.dump();
  EXPECT_EQ(by_ids["usage"]["prompt_tokens"], 5);
  by_ids = Post(c, "/v1/completions",
                {{"prompt", {1, 403, 407}}, {"max_tokens", 0}}, &status);
  ASSERT_EQ(status, 200) << by_ids.dump();
  EXPECT_EQ(by_ids["choices"].size(), 1u);
  // Streamed: text_completion chunks, the same text, then [DONE].
  auto r = c.Post("/v1/completions",
                  json({{"prompt", "Once upon a time"},
                        {"max_tokens", 6},
                        {"temperature", 0},
                        {"stream", true}})
                      .dump(),
                  "application/json");
  ASSERT_TRUE(r);
  auto events = Events(r->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back().second, "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json chunk = json::parse(events[i].second);
    EXPECT_EQ(chunk["object"], "text_completion");
    text += chunk["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, gen["text"]);
  const json last = json::parse(events[events.size() - 2].second);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(last["usage"]["completion_tokens"], 6);

  // Embeddings: /embed's vectors; base64 of little-endian f32.
  const json emb =
      Post(c, "/embed/batch", {{"texts", {"The cat sat", "A dog"}}}, &status);
  ASSERT_EQ(status, 200);
  json oe = Post(
      c, "/v1/embeddings",
      {{"model", "stories260K"}, {"input", {"The cat sat", "A dog"}}}, &status);
  ASSERT_EQ(status, 200) << oe.dump();
  EXPECT_EQ(oe["object"], "list");
  EXPECT_EQ(oe["model"], "stories260K");
  ASSERT_EQ(oe["data"].size(), 2u);
  EXPECT_EQ(oe["data"][1]["index"], 1);
  EXPECT_EQ(oe["data"][1]["object"], "embedding");
  EXPECT_EQ(oe["data"][0]["embedding"], emb["embeddings"][0]);
  EXPECT_EQ(oe["data"][1]["embedding"], emb["embeddings"][1]);
  EXPECT_EQ(oe["usage"]["prompt_tokens"], emb["metadata"]["input_tokens"]);
  EXPECT_EQ(oe["usage"]["total_tokens"], oe["usage"]["prompt_tokens"]);
  json b64 =
      Post(c, "/v1/embeddings",
           {{"input", "The cat sat"}, {"encoding_format", "base64"}}, &status);
  ASSERT_EQ(status, 200) << b64.dump();
  auto bytes = Base64Decode(b64["data"][0]["embedding"].get<std::string>());
  ASSERT_TRUE(bytes.ok());
  ASSERT_EQ(bytes->size(), 64u * 4);
  std::vector<float> v(64);
  std::memcpy(v.data(), bytes->data(), bytes->size());
  for (size_t i = 0; i < 64; ++i)
    EXPECT_EQ(v[i], emb["embeddings"][0][i].get<float>()) << i;
  json tok = Post(c, "/v1/embeddings", {{"input", {{1, 403}, {1, 403, 407}}}},
                  &status);
  ASSERT_EQ(status, 200) << tok.dump();
  EXPECT_EQ(tok["usage"]["prompt_tokens"], 5);
  tok = Post(c, "/v1/embeddings",
             {{"input", {1, 403}}, {"pooling", "mean"}, {"layer", 2}}, &status);
  ASSERT_EQ(status, 200) << tok.dump();
  EXPECT_EQ(tok["data"].size(), 1u);

  // Refusals: OpenAI's error object naming the field.
  const std::vector<std::pair<std::string, json>> refused = {
      {"/v1/completions", {{"prompt", "a"}, {"n", 2}}},
      {"/v1/completions", {{"prompt", "a"}, {"best_of", 3}}},
      {"/v1/completions", {{"prompt", "a"}, {"echo", true}}},
      {"/v1/completions", {{"prompt", "a"}, {"logprobs", 2}}},
      {"/v1/completions", {{"prompt", {"a", "b"}}, {"stream", true}}},
      {"/v1/completions", {{"prompt", json::array()}}},
      {"/v1/completions", {{"max_tokens", 2}}},
      {"/v1/chat/completions",
       {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"n", 2}}},
      {"/v1/chat/completions", {{"messages", json::array()}}},
      {"/v1/embeddings", {{"input", "a"}, {"dimensions", 32}}},
      {"/v1/embeddings", {{"input", "a"}, {"encoding_format", "int8"}}},
      {"/v1/embeddings", {{"input", {"a", 5}}}},
      {"/v1/embeddings", {{"input", ""}}},
  };
  for (const auto& [path, body] : refused) {
    SCOPED_TRACE(path + " " + body.dump());
    const json e = Post(c, path, body, &status);
    EXPECT_EQ(status, 400);
    ASSERT_TRUE(e.contains("error")) << e.dump();
    EXPECT_EQ(e["error"]["type"], "invalid_request_error");
    EXPECT_TRUE(e["error"]["message"].is_string());
    EXPECT_TRUE(e["error"].contains("param"));
    EXPECT_TRUE(e["error"]["code"].is_null());
  }
  json e =
      Post(c, "/v1/embeddings", {{"input", "a"}, {"dimensions", 32}}, &status);
  EXPECT_EQ(e["error"]["param"], "dimensions");
  e = Post(c, "/v1/completions", {{"prompt", "a"}, {"n", 2}}, &status);
  EXPECT_EQ(e["error"]["message"],
            "field `n`: loom serve returns one choice per prompt; only 1 is "
            "accepted, got 2");
  e = Post(c, "/v1/chat/completions",
           {{"model", "nope"},
            {"messages", {{{"role", "user"}, {"content", "Hi"}}}}},
           &status);
  EXPECT_EQ(status, 404);
  EXPECT_EQ(e["error"]["code"], "model_not_found");
  // An unknown /v1 route: OpenAI's shape too; TheLoom's routes keep theirs.
  e = Post(c, "/v1/nowhere", json::object(), &status);
  EXPECT_EQ(status, 404);
  EXPECT_TRUE(e["error"].contains("param"));
  e = Post(c, "/generate", {{"max_tokens", 2}}, &status);
  EXPECT_EQ(e["error"]["code"], 400);
}

// `model` "" or missing: the only loaded model; with several loaded, a 400
// listing them.
TEST(ServeHttpTest, EmptyModelMeansTheOnlyLoadedOne) {
  const fs::path root = fs::temp_directory_path() / "loom_serve_empty_model";
  fs::remove_all(root);
  fs::create_directories(root);
  fs::copy(Stories(), root / "other", fs::copy_options::recursive);
  ServerOptions o = Defaults();
  o.model_dirs = {root.string()};
  Running s(o);
  auto c = s.Client();
  int status = 0;
  const json chat = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                     {"max_tokens", 2}};
  for (const json& model : {json(""), json(nullptr)}) {
    json b = chat;
    b["model"] = model;
    const json r = Post(c, "/v1/chat/completions", b, &status);
    EXPECT_EQ(status, 200) << r.dump();
    EXPECT_EQ(r["model"], "stories260K");
  }
  Post(c, "/models/load", {{"model", "other"}}, &status);
  ASSERT_EQ(status, 200);
  json b = chat;
  b["model"] = "";
  for (const std::string path : {"/v1/chat/completions", "/generate"}) {
    const json r =
        Post(c, path,
             path == "/generate" ? json({{"prompt", "a"}, {"model", ""}}) : b,
             &status);
    EXPECT_EQ(status, 400) << r.dump();
    EXPECT_EQ(r["detail"],
              "field `model` is empty or missing and 2 models are loaded "
              "(other, stories260K): name one of them");
  }
  fs::remove_all(root);
}

// Which stream format a streamed chat gets with the default configuration
// (chat_stream_format: auto), from request bytes as the clients send them:
//   - the OpenAI SDK for JavaScript 6.49.0, captured off the wire
//     (`connection: keep-alive` made `close` so that the reply ends);
//   - Weaver, TheLoom's Go client (Weaver/pkg/backend/loom.go), as Go's
//     net/http writes its request: Host, User-Agent, Content-Length, then
//     its headers sorted, then the transport's Accept-Encoding (Connection:
//     close added likewise); `model` "", no return_hidden_states (Go's
//     omitempty drops a false one);
//   - curl's defaults.
TEST(ServeHttpTest, StreamFormatFromWhatTheClientSends) {
  Running s(Defaults());
  const int port = s.server().port();
  const std::string host = "127.0.0.1:" + std::to_string(port);
  auto request = [&](const std::string& head, const std::string& body) {
    return "POST /v1/chat/completions HTTP/1.1\r\n" + head +
           "content-length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  };
  const std::string openai_head =
      "host: " + host +
      "\r\nconnection: close\r\naccept: application/json\r\n"
      "user-agent: OpenAI/JS 6.49.0\r\nx-stainless-retry-count: 0\r\n"
      "x-stainless-lang: js\r\nx-stainless-package-version: 6.49.0\r\n"
      "x-stainless-os: Linux\r\nx-stainless-arch: x64\r\n"
      "x-stainless-runtime: node\r\nx-stainless-runtime-version: v20.20.2\r\n"
      "authorization: Bearer none\r\ncontent-type: application/json\r\n"
      "accept-language: *\r\nsec-fetch-mode: cors\r\n"
      "accept-encoding: gzip, deflate\r\n";
  const std::string openai_body =
      R"({"model":"","messages":[{"role":"user","content":"Hi"}],)"
      R"("max_tokens":4,"stream":true})";
  // The SDK with Loom's extra field (extra_body): still OpenAI's chunks.
  const std::string openai_hidden_body =
      R"({"model":"","messages":[{"role":"user","content":"Hi"}],)"
      R"("max_tokens":4,"stream":true,"return_hidden_states":true})";
  auto go_head = [&](size_t length) {
    return "Host: " + host +
           "\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: " +
           std::to_string(length) +
           "\r\nAccept: text/event-stream\r\nContent-Type: "
           "application/json\r\nAccept-Encoding: gzip\r\nConnection: "
           "close\r\n\r\n";
  };
  const std::string weaver_body =
      R"({"model":"","messages":[{"role":"user","content":"Hi"}],)"
      R"("max_tokens":4,"temperature":0.7,"stream":true})";
  const std::string weaver_hidden_body =
      R"({"model":"","messages":[{"role":"user","content":"Hi"}],)"
      R"("max_tokens":4,"temperature":0.7,"return_hidden_states":true,)"
      R"("hidden_state_layers":"all","device":"cuda:0","stream":true})";
  const std::string curl_head =
      "Host: " + host +
      "\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\nContent-Type: "
      "application/json\r\nConnection: close\r\n";
  struct Case {
    std::string name, bytes;
    bool theloom;
  };
  const std::vector<Case> cases = {
      {"OpenAI SDK", request(openai_head, openai_body), false},
      {"OpenAI SDK + return_hidden_states",
       request(openai_head, openai_hidden_body), false},
      {"Weaver",
       "POST /v1/chat/completions HTTP/1.1\r\n" + go_head(weaver_body.size()) +
           weaver_body,
       true},
      {"Weaver + hidden states",
       "POST /v1/chat/completions HTTP/1.1\r\n" +
           go_head(weaver_hidden_body.size()) + weaver_hidden_body,
       true},
      {"curl", request(curl_head, openai_body), false},
      {"curl + stream_format",
       request(curl_head,
               R"({"messages":[{"role":"user","content":"Hi"}],)"
               R"("max_tokens":4,"stream":true,"stream_format":"theloom"})"),
       true},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const RawReply r = Raw(port, k.bytes);
    ASSERT_EQ(r.status, 200) << r.body;
    const auto events = Events(Dechunk(r.body));
    ASSERT_GE(events.size(), 2u) << r.body;
    if (k.theloom) {
      for (size_t i = 0; i + 1 < events.size(); ++i)
        EXPECT_EQ(events[i].first, "content_block_delta");
      EXPECT_EQ(events.back().first, "message_delta");
      const json md = json::parse(events.back().second);
      EXPECT_EQ(md["type"], "message_delta");
      EXPECT_EQ(md["usage"]["completion_tokens"], 4);
    } else {
      EXPECT_EQ(events.back().second, "[DONE]");
      for (size_t i = 0; i + 1 < events.size(); ++i) {
        EXPECT_EQ(events[i].first, "");
        EXPECT_EQ(json::parse(events[i].second)["object"],
                  "chat.completion.chunk");
      }
    }
  }
}

TEST(ServeHttpTest, MalformedRequestsGet4xx) {
  ServerOptions o = Defaults();
  o.max_body_bytes = 4096;
  o.max_prompt_tokens = 50;
  Running s(o);
  auto c = s.Client();
  struct Case {
    std::string path, body;
    int status;
    std::string needle;  // in the message
  };
  const std::vector<Case> cases = {
      // Where the JSON stops, without the parser library's internals.
      {"/generate", "{not json", 400,
       "malformed JSON body at line 1, column 3 (byte offset 2): syntax error "
       "while parsing object key"},
      {"/generate", "[1,2]", 400, "JSON object"},
      {"/generate", "{}", 400, "prompt"},
      {"/generate", R"({"prompt": 5})", 400, "prompt"},
      {"/generate", R"({"prompt": "a", "max_tokens": "ten"})", 400,
       "max_tokens"},
      {"/generate", R"({"prompt": "a", "max_tokens": -1})", 400, "max_tokens"},
      {"/generate", R"({"prompt": "a", "temperature": 5})", 400, "temperature"},
      {"/generate", R"({"prompt": "a", "top_p": 0})", 400, "top_p"},
      {"/generate", R"({"prompt": "a", "hidden_state_layers": [9]})", 400,
       "outside"},
      {"/generate", R"({"prompt": "a", "hidden_state_layers": "some"})", 400,
       "hidden_state_layers"},
      {"/generate", R"({"prompt": "a", "hidden_state_format": "xml"})", 400,
       "hidden_state_format"},
      {"/generate",
       R"({"prompt": "a", "return_attention": true, "hidden_state_layers": [5]})",
       400, "return_attention: layer 5"},
      {"/generate", R"({"prompt": "a", "hooks": ["blocks.99.hook_z"]})", 400,
       "99"},
      {"/generate",
       R"({"prompt": "a", "hooks": ["hook_resid_pre"], "select": ["pos:7"], "max_tokens": 0})",
       400, ""},
      // A selector no run can satisfy: refused before generating, streams
      // too.
      {"/generate/stream",
       R"({"prompt": [1, 5], "hooks": ["blocks.0.hook_resid_pre"], "select": ["pos:40"], "max_tokens": 4})",
       400, "selector 'pos:40': position 40 is outside the at most 5 rows"},
      {"/generate",
       R"({"prompt": [1, 5], "hooks": ["blocks.0.hook_resid_pre"], "select": ["span:0:9"], "max_tokens": 4})",
       400, "selector 'span:0:9'"},
      {"/generate", R"({"prompt": [1, 99999]})", 400, "99999"},
      {"/generate", R"({"model": "../etc", "prompt": "a"})", 400, "model"},
      {"/generate", R"({"model": "/etc", "prompt": "a"})", 400, "model"},
      {"/generate", R"({"model": "nope", "prompt": "a"})", 404, "nope"},
      {"/generate",
       json({{"prompt", std::string(300, 'a') + " b c d e f g h"}}).dump(), 400,
       "max_prompt_tokens"},
      {"/generate", json({{"prompt", std::string(5000, 'a')}}).dump(), 413,
       "max_body_bytes"},
      {"/generate/batch", R"({"prompts": []})", 400, "prompts"},
      {"/embed", R"({"text": "a", "pooling": "median"})", 400, "pooling"},
      {"/embed/batch", R"({"texts": "a"})", 400, "texts"},
      {"/v1/chat/completions", R"({"messages": [{"role": 1}]})", 400,
       "messages"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}], "stream_format": "x"})",
       400, "stream_format"},
      {"/analyze", R"({"embedding": ["x"]})", 400, "embedding"},
      {"/analyze", R"({"embedding": []})", 400, "empty"},
      {"/models/load", R"({"model": "stories260K", "device": "cuda:0"})", 501,
       "cuda"},
      {"/nowhere", "{}", 404, "no route"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.path + " " + k.body.substr(0, 100));
    auto r = c.Post(k.path, k.body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, k.status) << r->body;
    json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    EXPECT_EQ(j["detail"].get<std::string>().find("json.exception"),
              std::string::npos)
        << r->body;
    EXPECT_NE(j["detail"].get<std::string>().find(k.needle), std::string::npos)
        << j["detail"];
  }
  // The server is still serving.
  int status = 0;
  Post(c, "/generate", {{"prompt", "a"}, {"max_tokens", 1}}, &status);
  EXPECT_EQ(status, 200);
}

// The one mapping of error-model.md, code by code.
TEST(ServeHttpTest, HttpStatusOfEveryCode) {
  const std::vector<std::pair<Status, int>> cases = {
      {Status(), 200},
      {InvalidArgumentError("x"), 400},
      {OutOfRangeError("x"), 400},
      {NotFoundError("x"), 404},
      {ResourceExhaustedError("x"), 503},
      {FailedPreconditionError("x"), 503},
      {UnavailableError("x"), 503},
      {UnimplementedError("x"), 501},
      {DataLossError("x"), 500},
      {IoError("x"), 500},
      {InternalError("x"), 500},
  };
  for (const auto& [status, http] : cases)
    EXPECT_EQ(HttpStatusOf(status), http) << status.ToString();
}

// The classes no malformed request reaches, over HTTP: a model under
// models.dirs that is corrupt (DATA_LOSS) or unreadable (IO_ERROR) is a 500
// whose body names the file; one that does not fit is a 503 with
// Retry-After naming both byte counts.
TEST(ServeHttpTest, ErrorClassesGetTheirHttpStatus) {
  const fs::path root = fs::temp_directory_path() /
                        ("loom_serve_classes_" + std::to_string(::getpid()));
  fs::remove_all(root);
  for (const std::string name : {"corrupt", "unreadable"}) {
    fs::create_directories(root / name);
    fs::copy_file(Stories() + "/model.safetensors",
                  root / name / "model.safetensors");
  }
  std::ofstream(root / "corrupt" / "config.json") << "{\"model_type\": ";
  fs::create_directory(root / "unreadable" / "config.json");
  ServerOptions o = Defaults();
  o.model_dirs = {root.string()};
  {
    Running s(o);
    auto c = s.Client();
    struct Case {
      std::string model, needle;
    };
    for (const Case& k :
         {Case{"corrupt", "/corrupt/config.json: not valid JSON"},
          Case{"unreadable", "/unreadable/config.json: read: " +
                                 std::string(std::strerror(EISDIR))}}) {
      SCOPED_TRACE(k.model);
      auto r = c.Post("/models/load", json({{"model", k.model}}).dump(),
                      "application/json");
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 500) << r->body;
      EXPECT_FALSE(r->has_header("Retry-After"));
      const json j = json::parse(r->body, nullptr, false);
      ASSERT_TRUE(j.is_object()) << r->body;
      EXPECT_NE(j["detail"].get<std::string>().find(k.needle),
                std::string::npos)
          << j["detail"];
      EXPECT_EQ(j["error"]["message"], j["detail"]);
      EXPECT_EQ(j["error"]["type"], "server_error");
      EXPECT_EQ(j["error"]["code"], 500);
    }
  }
  // A server whose budget holds no model: loading one is refused.
  o.memory_fraction = 1e-7;  // a few KiB
  o.host = "127.0.0.1";
  o.port = 0;
  o.model_dirs = {LOOM_MODELS_DIR};
  auto server = Server::Create(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ASSERT_TRUE((*server)->Bind().ok());
  std::thread run([&] { EXPECT_TRUE((*server)->Run().ok()); });
  httplib::Client c("127.0.0.1", (*server)->port());
  c.set_read_timeout(60);
  auto r =
      c.Post("/models/load", R"({"model": "stories260K"})", "application/json");
  (*server)->Stop();
  run.join();
  fs::remove_all(root);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_TRUE(r->has_header("Retry-After"));
  const json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r->body;
  const std::string detail = j["detail"];
  EXPECT_NE(detail.find("cannot load `stories260K`"), std::string::npos)
      << detail;
  EXPECT_NE(detail.find("its plan needs "), std::string::npos) << detail;
  EXPECT_NE(detail.find(" bytes, more than "), std::string::npos) << detail;
  EXPECT_EQ(j["error"]["type"], "overloaded");
}

TEST(ServeHttpTest, BearerToken) {
  ServerOptions o = Defaults();
  o.auth_token = "s3cret";
  Running s(o);
  auto c = s.Client();
  auto r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);  // health stays open for probes
  r = c.Get("/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  c.set_bearer_token_auth("wrong");
  r = c.Get("/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  c.set_bearer_token_auth("s3cret");
  r = c.Get("/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(ServeHttpTest, CorsPreflightAndStopBeforeRun) {
  ServerOptions o = Defaults();
  o.cors_origins = {"http://app.example"};
  o.auth_token = "t";
  Running s(o);
  auto c = s.Client();
  httplib::Headers h = {{"Origin", "http://app.example"},
                        {"Access-Control-Request-Method", "POST"}};
  auto r = c.Options("/generate", h);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 204);
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"),
            "http://app.example");
  EXPECT_NE(
      r->get_header_value("Access-Control-Allow-Headers").find("Authorization"),
      std::string::npos);
  s.Stop();
  // A Stop() before Run() (a signal during start-up) is not lost.
  ServerOptions d = Defaults();
  d.host = "127.0.0.1";
  d.port = 0;
  auto server = Server::Create(d);
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE((*server)->Bind().ok());
  (*server)->Stop();
  std::thread run([&] { EXPECT_TRUE((*server)->Run().ok()); });
  run.join();  // returns: the watcher stops the listener once it runs
}

TEST(ServeHttpTest, FullQueueGets503WithRetryAfter) {
  ServerOptions o = Defaults();
  o.engine.slots = 1;
  o.engine.max_queue = 0;
  o.threads = 16;
  Running s(o);
  std::atomic<int> ok{0}, busy{0}, other{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i)
    clients.emplace_back([&] {
      auto c = s.Client();
      auto r = c.Post("/generate",
                      json({{"prompt", "Once"},
                            {"max_tokens", 60},
                            {"temperature", 0},
                            {"ignore_eos", true}})
                          .dump(),
                      "application/json");
      if (r && r->status == 200) {
        ++ok;
      } else if (r && r->status == 503 && r->has_header("Retry-After")) {
        ++busy;
      } else {
        ++other;
      }
    });
  for (auto& t : clients) t.join();
  EXPECT_GE(ok.load(), 1);
  EXPECT_GE(busy.load(), 1);
  EXPECT_EQ(other.load(), 0);
}

// 64 concurrent clients, 256 requests: all finish with 200 (or a documented
// 503), requests share forwards, memory stays within the plan.
TEST(ServeHttpTest, LoadTest64Clients) {
  ServerOptions o = Defaults();
  o.engine.slots = 16;
  o.engine.max_queue = 256;
  Running s(o);
  std::atomic<int> ok{0}, busy{0}, other{0};
  std::atomic<int64_t> max_used{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 64; ++i)
    clients.emplace_back([&, i] {
      auto c = s.Client();
      for (int k = 0; k < 4; ++k) {
        auto r = c.Post(
            "/generate",
            json({{"prompt", "Once upon a time " + std::to_string(i * 7 + k)},
                  {"max_tokens", 16},
                  {"temperature", 0.8},
                  {"seed", i},
                  {"hidden_state_layers", {-1, 2}}})
                .dump(),
            "application/json");
        if (r && r->status == 200) {
          ++ok;
        } else if (r && r->status == 503) {
          ++busy;
        } else {
          ++other;
          ADD_FAILURE() << "k=" << k << " "
                        << (r ? std::to_string(r->status) + " " + r->body
                              : "no response: " +
                                    httplib::to_string(r.error()));
        }
        if (k == 1) {
          auto g = c.Get("/gpu/status");
          if (g) {
            json d = json::parse(g->body)["devices"][0];
            int64_t used = d["used_bytes"], planned = d["planned_bytes"];
            EXPECT_LE(used, planned);
            int64_t prev = max_used.load();
            while (used > prev && !max_used.compare_exchange_weak(prev, used)) {
            }
          }
        }
      }
    });
  for (auto& t : clients) t.join();
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(ok.load() + busy.load(), 256);
  EXPECT_GE(ok.load(), 200);
  auto c = s.Client();
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  // Requests met in forwards: more sequences than forwards on average.
  auto value = [&](const std::string& name) {
    const std::string key = name + "{model=\"stories260K\"} ";
    const size_t p = m->body.find(key);
    EXPECT_NE(p, std::string::npos) << name;
    return p == std::string::npos ? 0.0
                                  : std::stod(m->body.substr(p + key.size()));
  };
  EXPECT_GT(value("loom_forward_sequences_total"),
            2 * value("loom_forwards_total"));
  EXPECT_EQ(value("loom_active_sequences"), 0);
}

TEST(ServeHttpTest, StopFinishesInFlightRequests) {
  ServerOptions o = Defaults();
  Running s(o);
  std::atomic<int> status{0};
  std::string text;
  std::thread client([&] {
    auto c = s.Client();
    auto r = c.Post("/generate",
                    json({{"prompt", "Once"},
                          {"max_tokens", 200},
                          {"temperature", 0},
                          {"ignore_eos", true}})
                        .dump(),
                    "application/json");
    status = r ? r->status : -1;
  });
  // Stop once the request is admitted (it is then in flight).
  auto c = s.Client();
  bool admitted = false;
  for (int i = 0; i < 1000 && !admitted; ++i) {
    auto m = c.Get("/metrics");
    admitted =
        m && m->body.find("loom_active_sequences{model=\"stories260K\"} 1") !=
                 std::string::npos;
    if (!admitted) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(admitted);
  s.Stop();
  client.join();
  EXPECT_EQ(status.load(), 200);
}

// ---- Interventions (docs/server.md, "Interventions")

// The rows of `hook` selected "all" in a /generate result: [rows, width].
std::vector<float> AllRows(const json& result, const std::string& hook) {
  return DecodeF32(result["activations"][hook]["all"]);
}

std::string B64(const std::vector<float>& v) {
  return Base64Encode(v.data(), v.size() * sizeof(float));
}

// The value of a Prometheus sample of /metrics (-1 when absent).
double Metric(httplib::Client& c, const std::string& sample) {
  auto r = c.Get("/metrics");
  if (!r) return -1;
  const size_t at = r->body.find(sample + " ");
  if (at == std::string::npos) return -1;
  return std::strtod(r->body.c_str() + at + sample.size() + 1, nullptr);
}

// Row b, positions [0, n), of a golden [B, T, W] tensor.
std::vector<float> GoldenRows(const loom::testing::GoldenFile& g,
                              const std::string& name, int64_t b, int64_t n) {
  Shape shape;
  const std::vector<float> all = g.F32(name, &shape);
  const int64_t T = shape[1], W = shape[2];
  return std::vector<float>(all.begin() + (b * T) * W,
                            all.begin() + (b * T + n) * W);
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float d = std::abs(got[i] - want[i]);
    ASSERT_LE(d, 1e-4f + 1e-4f * std::abs(want[i])) << what << " index " << i;
    worst = std::max(worst, d);
  }
}

// The golden mixed batch (shared/golden/interventions/llama__batch_mixed):
// three prompts in one /generate/batch, row 0 steered at
// blocks.1.hook_resid_post (vector_b64), row 1 untouched, row 2 with its
// residual inputs ablated at every layer (an inline vector, a hook pattern).
// Prompts are prefilled in chunks of 2 tokens, so the rows share forwards
// (the metrics prove it); every row's residuals and final norm equal Hugging
// Face's to 1e-4 and its greedy token is HF's argmax; row 1 equals the
// un-intervened baseline.
TEST(ServeInterventionsTest, GoldenMixedBatchInOneSharedBatch) {
  const std::string shared = loom::testing::SharedGoldenDir();
  if (shared.empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: ../shared/golden is absent: the golden "
                    "mixed-batch interventions through loom serve are NOT "
                    "checked";
  const std::string dir = shared + "/interventions/llama__batch_mixed";
  const json spec = loom::testing::ReadJson(dir + "/spec.json");
  auto golden = loom::testing::GoldenFile::Open(dir + "/expected.safetensors");
  ASSERT_NE(golden, nullptr);
  const std::string model = shared + "/tiny/llama";
  ServerOptions o = Defaults();
  o.engine.prefill_chunk = 2;
  o.engine.extra_hooks = {"blocks.*.hook_resid_post"};
  Running s(o, model);
  auto c = s.Client();
  const int64_t L = 3;
  json prompts = json::array();
  std::vector<int64_t> lens;
  for (size_t b = 0; b < spec["input_ids"].size(); ++b) {
    json ids = json::array();
    for (size_t t = 0; t < spec["input_ids"][b].size(); ++t)
      if (spec["attention_mask"][b][t] == 1)
        ids.push_back(spec["input_ids"][b][t]);
    lens.push_back(static_cast<int64_t>(ids.size()));
    prompts.push_back(ids);
  }
  const std::vector<float> v = golden->F32("intervention.0.vector");
  const std::vector<float> r = golden->F32("intervention.1.vector");
  json hooks = json::array({"ln_final.hook_normalized"});
  for (int64_t l = 0; l < L; ++l) {
    hooks.push_back("blocks." + std::to_string(l) + ".hook_resid_pre");
    hooks.push_back("blocks." + std::to_string(l) + ".hook_resid_post");
  }
  const json body = {{"prompts", prompts},
                     {"max_tokens", 2},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"return_hidden_states", false},
                     {"hooks", hooks},
                     {"select", {"all"}},
                     {"hidden_state_format", "base64"},
                     {"interventions",
                      {{{"hook", "blocks.1.hook_resid_post"},
                        {"mode", "add"},
                        {"scale", 4.0},
                        {"rows", {0}},
                        {"vector_b64", B64(v)}},
                       {{"hook", "blocks.*.hook_resid_pre"},
                        {"mode", "project_out"},
                        {"rows", {2}},
                        {"vector", r}}}}};
  int status = 0;
  const json out = Post(c, "/generate/batch", body, &status);
  ASSERT_EQ(status, 200) << out.dump();
  ASSERT_EQ(out["results"].size(), 3u);
  Shape ls;
  const std::vector<float> logits = golden->F32("logits", &ls);
  const int64_t T = ls[1], V = ls[2];
  for (int64_t b = 0; b < 3; ++b) {
    const json& res = out["results"][b];
    const int64_t n = lens[static_cast<size_t>(b)];
    const std::string row = "row " + std::to_string(b) + " ";
    for (const std::string prefix : {"", "baseline."}) {
      if (!prefix.empty() && b != 1) continue;  // row 1: also the baseline
      for (int64_t l = 0; l < L; ++l)
        for (const std::string site : {"resid_pre", "resid_post"}) {
          std::vector<float> got =
              AllRows(res, "blocks." + std::to_string(l) + ".hook_" + site);
          ASSERT_GE(static_cast<int64_t>(got.size()), n * 64);
          got.resize(static_cast<size_t>(n * 64));  // the prompt's rows
          ExpectClose(got,
                      GoldenRows(*golden,
                                 prefix + site + "." + std::to_string(l), b, n),
                      row + prefix + site + "." + std::to_string(l));
        }
      std::vector<float> norm = AllRows(res, "ln_final.hook_normalized");
      norm.resize(static_cast<size_t>(n * 64));
      ExpectClose(norm, GoldenRows(*golden, prefix + "final_norm", b, n),
                  row + prefix + "final_norm");
    }
    const float* last = logits.data() + (b * T + n - 1) * V;
    const int64_t argmax = std::max_element(last, last + V) - last;
    EXPECT_EQ(res["token_ids"][0], argmax) << row;
  }
  EXPECT_GT(
      Metric(c, "loom_forwards_mixed_interventions_total{model=\"llama\"}"), 0)
      << "the three rows never shared a forward";
  EXPECT_GT(Metric(c, "loom_intervention_edits_total{model=\"llama\"}"), 0);
}

// Hostile `interventions` get a 400 naming the entry and field; none reaches
// a forward (the server goes on answering).
TEST(ServeInterventionsTest, HostileRequestsGet400NamingTheField) {
  ServerOptions o = Defaults();
  o.max_intervention_floats = 1000;
  Running s(o);
  auto c = s.Client();
  const std::vector<float> ok(64, 0.125f);
  std::vector<float> nan = ok;
  nan[3] = std::nanf("");
  struct Case {
    const char* route;
    std::vector<json> interventions;  // a vector: {x} is never x itself
    const char* want;
  };
  const json add = {{"hook", "blocks.1.hook_resid_post"}, {"mode", "add"}};
  auto with = [&](json j, const char* key, json value) {
    j[key] = std::move(value);
    return j;
  };
  const std::vector<Case> cases = {
      {"/generate",
       {with(add, "vector", std::vector<float>(63, 1.0f))},
       "interventions[0].vector: has 63 values but blocks.1.hook_resid_post "
       "is 64 wide"},
      {"/generate",
       {with(add, "vector_b64", B64(nan))},
       "interventions[0].vector_b64: value 3 of 64 is nan"},
      {"/generate",
       {with(add, "vector_b64", "abc")},
       "interventions[0].vector_b64: base64"},
      {"/generate",
       {with(add, "vector", std::vector<float>(2000, 1.0f))},
       "2000 vector values"},
      {"/generate",
       {with(with(add, "vector", ok), "hook", "blocks.*.hook_resid_pre"),
        with(with(add, "vector", ok), "hook", "blocks.*.hook_resid_post"),
        with(with(add, "vector", ok), "hook", "blocks.*.hook_resid_mid"),
        with(with(add, "vector", ok), "hook", "blocks.*.hook_mlp_out")},
       "more than the server's limit of 1000"},
      {"/generate",
       {with(with(add, "vector", ok), "hook", "blocks.9.hook_x")},
       "interventions[0].hook"},
      {"/generate",
       {with(add, "vector_file", "/etc/hostname")},
       "interventions[0].vector_file: no request can read server files"},
      {"/generate",
       {with(with(add, "sae", "/etc"), "feature", 1)},
       "interventions[0].sae: no request can read server files"},
      {"/generate",
       {with(add, "vector", ok),
        with(with(add, "vector", ok), "positions", json::array({0, 99}))},
       "interventions[1].positions: position 99"},
      {"/generate",
       {with(with(add, "vector", ok), "positions", "middle")},
       "interventions[0].positions"},
      {"/generate",
       {with(with(add, "vector", ok), "rows", {1})},
       "interventions[0].rows: row 1 is outside the request's 1 prompt"},
      {"/generate",
       {json::object({{"hook", "blocks.0.attn.hook_z"},
                      {"mode", "zero_head"},
                      {"head", 8}})},
       "interventions[0].head: 8 is outside [0, 8)"},
      {"/generate",
       {json::object({{"hook", "blocks.0.attn.hook_z"},
                      {"mode", "patch_head"},
                      {"head", 1},
                      {"positions", {0}},
                      {"vector", ok}})},
       "interventions[0].mode: patch_head is not served on the generation "
       "routes"},
      {"/generate/stream",
       {with(add, "vector", {1, 2})},
       "interventions[0].vector"},
      {"/embed", {with(add, "vector", {1, 2})}, "interventions[0].vector"},
      {"/v1/chat/completions",
       {with(add, "vector", {1, 2})},
       "interventions[0].vector"},
      {"/generate/batch",
       {with(with(add, "vector", ok), "rows", {0, 2})},
       "interventions[0].rows: row 2 is outside the request's 2 prompts"},
  };
  for (const Case& k : cases) {
    json body = {{"max_tokens", 2}, {"interventions", json::array()}};
    for (const json& iv : k.interventions) body["interventions"].push_back(iv);
    const std::string route = k.route;
    if (route == "/generate/batch") {
      body["prompts"] = {"Once", "The cat"};
    } else if (route == "/embed") {
      body["text"] = "Once";
    } else if (route == "/v1/chat/completions") {
      body["messages"] = {{{"role", "user"}, {"content", "Hi"}}};
    } else {
      body["prompt"] = "Once";
    }
    int status = 0;
    const json out = Post(c, route, body, &status);
    EXPECT_EQ(status, 400) << route << " "
                           << body["interventions"].dump().substr(0, 200)
                           << " -> " << out.dump();
    EXPECT_NE(out.value("detail", "").find(k.want), std::string::npos)
        << "want \"" << k.want << "\" in: " << out.value("detail", "");
  }
  int status = 0;
  const json not_list =
      Post(c, "/generate", {{"prompt", "Once"}, {"interventions", "steer"}},
           &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(not_list.value("detail", "").find("field `interventions`"),
            std::string::npos)
      << not_list.dump();
  Post(c, "/generate", {{"prompt", "Once"}, {"max_tokens", 1}}, &status);
  EXPECT_EQ(status, 200);
}

// Steering changes the generated text; apply_to "generated" leaves the
// prompt's hidden states as they are and "prompt" changes them; the same
// vector as a list or base64 gives the same result; /embed and chat take
// interventions too.
TEST(ServeInterventionsTest, SteeringChangesTextAndApplyToDiffers) {
  Running s(Defaults());
  auto c = s.Client();
  std::vector<float> v(64);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>((i * 37 % 11)) / 11.0f - 0.5f;
  const json base = {{"prompt", "Once upon a time"},
                     {"max_tokens", 8},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"return_hidden_states", false},
                     {"hooks", {"blocks.4.hook_resid_pre"}},
                     {"select", {"all"}},
                     {"hidden_state_format", "base64"}};
  auto run = [&](const json& interventions) {
    json b = base;
    if (!interventions.is_null()) b["interventions"] = interventions;
    int status = 0;
    json out = Post(c, "/generate", b, &status);
    EXPECT_EQ(status, 200) << out.dump();
    return out;
  };
  auto steer = [&](const char* apply_to, bool b64) {
    json iv = {{"hook", "blocks.2.hook_resid_post"},
               {"mode", "add"},
               {"scale", 8.0},
               {"apply_to", apply_to}};
    if (b64) {
      iv["vector_b64"] = B64(v);
    } else {
      iv["vector"] = v;
    }
    return json::array({iv});
  };
  const json none = run(nullptr);
  const json both = run(steer("both", false));
  const json both64 = run(steer("both", true));
  const json prompt = run(steer("prompt", false));
  const json generated = run(steer("generated", true));
  EXPECT_NE(both["text"], none["text"]);
  EXPECT_EQ(both64["token_ids"], both["token_ids"]);
  EXPECT_EQ(AllRows(both64, "blocks.4.hook_resid_pre"),
            AllRows(both, "blocks.4.hook_resid_pre"));
  const size_t n = none["metadata"]["input_tokens"].get<size_t>() * 64;
  auto prompt_rows = [&](const json& out) {
    std::vector<float> r = AllRows(out, "blocks.4.hook_resid_pre");
    r.resize(n);
    return r;
  };
  EXPECT_EQ(prompt_rows(generated), prompt_rows(none));
  EXPECT_NE(prompt_rows(prompt), prompt_rows(none));
  EXPECT_NE(generated["token_ids"], prompt["token_ids"]);
  EXPECT_NE(AllRows(generated, "blocks.4.hook_resid_pre"),
            AllRows(none, "blocks.4.hook_resid_pre"));
  // /embed and chat.
  int status = 0;
  const json e0 = Post(c, "/embed", {{"text", "Once upon a time"}}, &status);
  ASSERT_EQ(status, 200);
  const json e1 = Post(
      c, "/embed",
      {{"text", "Once upon a time"}, {"interventions", steer("prompt", false)}},
      &status);
  ASSERT_EQ(status, 200) << e1.dump();
  EXPECT_NE(e0["embedding"], e1["embedding"]);
  const json chat = Post(c, "/v1/chat/completions",
                         {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                          {"max_tokens", 4},
                          {"temperature", 0},
                          {"interventions", steer("both", true)}},
                         &status);
  EXPECT_EQ(status, 200) << chat.dump();
}

}  // namespace
}  // namespace loom::serve
