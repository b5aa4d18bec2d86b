// Harness: what `loom serve` reads from clients and operators.
//   mode 0..9: the input is the body of a POST to one route of a server
//     running the bundled model (in process, on a loopback port). Every
//     reply must be a JSON (or SSE) reply with a 2xx, 4xx, 501 or 503 status:
//     a 500 means an unexpected failure inside Loom and is reported;
//   mode 10: the input is a `loom serve --config` YAML file;
//   mode 11: the input is environment overrides (one NAME=VALUE per line)
//     applied to the default configuration;
//   mode 12: the input is the `interventions` field of a /generate request
//     (spliced into a fixed body as raw JSON text), so that mutations stay
//     on request interventions: hostile vectors, hooks, positions, rows and
//     base64 must all be 4xx (or 501), never a 500 or a crash. The seeds of
//     modes 0..9 also carry `interventions`;
//   mode 13: the input is the body of a POST to /api/patching/run (a real
//     patching grid; the server's limits keep each run small), mode 14 to
//     /api/patching/configure: 2xx, 4xx, 501 or 503 only;
//   mode 15: the body of a POST to /v1/completions, mode 16 to
//     /v1/embeddings (OpenAI's routes): 2xx, 4xx, 501 or 503 only.
#include <httplib.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "src/serve/config.h"
#include "src/serve/server.h"

namespace loom::fuzz {
namespace {

struct Running {
  std::unique_ptr<serve::Server> server;
  std::thread thread;
  std::unique_ptr<httplib::Client> client;
};

Running* server_for_atexit = nullptr;

void StopServer() {
  Running* r = server_for_atexit;
  if (r == nullptr || !r->thread.joinable()) return;
  r->client.reset();
  r->server->Stop();
  r->thread.join();
}

Running& Get() {
  static Running* r = [] {
    auto* r = new Running;
    serve::ServerOptions o;
    o.port = 0;
    o.engine.precision = Precision::kF32;
    o.engine.slots = 2;
    o.engine.context = 128;
    o.engine.prefill_chunk = 16;
    o.engine.threads = 1;
    o.max_body_bytes = 1 << 20;
    o.threads = 4;
    o.patching.max_cells = 64;
    o.patching.max_seconds = 5;
    o.model_paths = {SourcePath("models/stories260K")};
    auto s = serve::Server::Create(o);
    if (!s.ok()) Fail("server: " + s.status().ToString());
    r->server = std::move(*s);
    auto id = r->server->LoadModel(SourcePath("models/stories260K"));
    if (!id.ok()) Fail("load: " + id.status().ToString());
    auto port = r->server->Bind();
    if (!port.ok()) Fail("bind: " + port.status().ToString());
    r->thread = std::thread([r] { (void)r->server->Run(); });
    r->client = std::make_unique<httplib::Client>("127.0.0.1", *port);
    r->client->set_keep_alive(true);
    r->client->set_read_timeout(30, 0);
    server_for_atexit = r;
    std::atexit(StopServer);
    return r;
  }();
  return *r;
}

constexpr const char* kRoutes[] = {"/generate",
                                   "/v1/generate",
                                   "/generate/stream",
                                   "/generate/batch",
                                   "/embed",
                                   "/embed/batch",
                                   "/v1/chat/completions",
                                   "/analyze",
                                   "/models/load",
                                   "/v1/chat/completions",
                                   "/api/patching/run",
                                   "/api/patching/configure",
                                   "/v1/completions",
                                   "/v1/embeddings"};

void Post(int route, std::string_view body) {
  Running& r = Get();
  const std::string path = kRoutes[route];
  auto res = r.client->Post(path, std::string(body), "application/json");
  if (!res) {
    Fail(path + ": no reply (" + httplib::to_string(res.error()) + ")");
  }
  const int status = res->status;
  if (status >= 500 && status != 501 && status != 503)
    Fail(path + ": status " + std::to_string(status) + ": " + res->body);
  const bool sse =
      res->get_header_value("Content-Type").find("text/event-stream") !=
      std::string::npos;
  if (!sse && nlohmann::json::parse(res->body, nullptr, false).is_discarded())
    Fail(path + ": the reply is not JSON: " + res->body.substr(0, 200));
}

}  // namespace
}  // namespace loom::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom;
  using namespace loom::fuzz;
  const auto in = TakeMode(data, size);
  const int mode = in.mode % 17;
  if (mode < 10) {
    Post(mode, in.rest);
  } else if (mode >= 13) {
    Post(mode - 3, in.rest);
  } else if (mode == 12) {
    Post(0, R"({"prompt": "Once", "max_tokens": 2, "temperature": 0, )"
            R"("interventions": )" +
                std::string(in.rest) + "}");
  } else if (mode == 10) {
    auto c = serve::ParseServeConfig(in.rest, "fuzz.yaml");
    if (c.ok() && !serve::ValidateServeConfig(*c).ok())
      Fail("ParseServeConfig accepted a configuration Validate refuses");
  } else {
    std::vector<std::string> env;
    for (std::string_view line : Split(in.rest, '\n', 64))
      env.emplace_back(line);
    auto c = serve::ParseServeConfig("", "empty.yaml");
    if (!c.ok()) Fail("empty config: " + c.status().ToString());
    (void)serve::ApplyEnvOverrides(env, *c);
  }
  return 0;
}
