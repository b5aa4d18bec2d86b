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
//     /v1/embeddings (OpenAI's routes): 2xx, 4xx, 501 or 503 only;
//   mode 17: the body of a POST to /analyze/geometry, mode 18 to
//     /analyze/bilateral (TheLoom's analysis; mode 7 takes /analyze's text
//     and vector forms). An input with more than kMaxAnalysisRows '['
//     (a bound on the rows) or over kMaxAnalysisBytes is skipped: the
//     analysis keeps a rows x rows matrix, and one input must run fast;
//   modes 19..24 run on a second server (no model loaded; persistence
//     enabled in the harness's scratch directory, its store seeded with two
//     experiments, one holding conversations, metrics and hidden states).
//     In their input `{id}` and `{id2}` stand for the two experiments' ids.
//     mode 19: the first line is a GET path after "/experiments" (an id,
//     a sub-route, a query string; bytes outside printable ASCII are
//     percent-encoded); mode 20: the body of a POST to
//     /experiments/export, 21 to /experiments/export/batch, 22 to
//     /experiments/export/summary (the export folder is emptied after each);
//     mode 23: the first line is a GET path after "/loaders/probe/" (empty:
//     GET /loaders); mode 24: the body of a POST to /gpu/configure;
//   mode 25: a binary reply: the next byte picks /generate, /v1/generate,
//     /embed, /embed/batch or /v1/embeddings, then the Accept header up to
//     the first newline, then the body. A 200 must be the format asked for:
//     application/x-npy a .npy whose header describes exactly the body's
//     bytes, application/safetensors a valid safetensors file, else JSON;
//   mode 26: the input is the `hidden_state_layers` of a /generate request
//     with `return_attention` (spliced as raw JSON text);
//   mode 27: Neuronpedia's routes: the next byte picks
//     /v1/activation/topk-by-token, /v1/activation/all,
//     /v1/activation/single, /v1/tokenize, /v1/steer/completion,
//     /v1/steer/completion-chat or /v1/lens/prompt, the rest is the body. The
//     server serves an SAE written into the scratch directory as source
//     `2-res-fuzz` (and `1-res-fuzz`, set `res-fuzz`).
// Every reply of modes 17..27 must also be a 2xx, 4xx, 501 or 503.
#include <httplib.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "src/io/npy.h"
#include "src/io/safetensors.h"
#include "src/io/safetensors_writer.h"
#include "src/serve/config.h"
#include "src/serve/experiments.h"
#include "src/serve/server.h"

namespace loom::fuzz {
namespace {

struct Running {
  std::unique_ptr<serve::Server> server;
  std::thread thread;
  std::unique_ptr<httplib::Client> client;
};

Running* server_for_atexit = nullptr;
Running* aux_for_atexit = nullptr;

void Stop(Running* r) {
  if (r == nullptr || !r->thread.joinable()) return;
  r->client.reset();
  r->server->Stop();
  r->thread.join();
}
void StopServer() { Stop(server_for_atexit); }
void StopAux() { Stop(aux_for_atexit); }

// Starts `r->server` on a loopback port and connects `r->client`.
void Start(Running* r) {
  auto port = r->server->Bind();
  if (!port.ok()) Fail("bind: " + port.status().ToString());
  r->thread = std::thread([r] { (void)r->server->Run(); });
  r->client = std::make_unique<httplib::Client>("127.0.0.1", *port);
  r->client->set_keep_alive(true);
  r->client->set_read_timeout(30, 0);
}

// A standard SAELens SAE of 16 features reading `hook` of the bundled model
// (width 64), in the scratch directory; returns its directory.
std::string WriteSae(const std::string& name, const std::string& hook) {
  constexpr int64_t d = 64, f = 16;
  std::vector<float> w_enc(d * f), w_dec(f * d), b_enc(f), b_dec(d);
  for (size_t i = 0; i < w_enc.size(); ++i) {
    w_enc[i] = static_cast<float>((i * 37) % 17) / 17.0f - 0.5f;
    w_dec[i] = static_cast<float>((i * 53) % 19) / 19.0f - 0.5f;
  }
  SafetensorsWriter w;
  Status s = w.Add("W_enc", DType::kF32, {d, f}, w_enc.data(), 4 * d * f);
  if (s.ok()) s = w.Add("W_dec", DType::kF32, {f, d}, w_dec.data(), 4 * d * f);
  if (s.ok()) s = w.Add("b_enc", DType::kF32, {f}, b_enc.data(), 4 * f);
  if (s.ok()) s = w.Add("b_dec", DType::kF32, {d}, b_dec.data(), 4 * d);
  const std::string dir = ScratchDir() + "/" + name;
  std::filesystem::create_directories(dir);
  if (s.ok()) s = w.Write(dir + "/sae_weights.safetensors");
  if (!s.ok()) Fail("sae: " + s.ToString());
  WriteScratch(name + "/cfg.json",
               R"({"architecture": "standard", "d_in": 64, "d_sae": 16, )"
               R"("dtype": "float32", "apply_b_dec_to_input": true, )"
               R"("metadata": {"sae_lens_version": "6.18.0", "hook_name": ")" +
                   hook + R"("}})");
  return dir;
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
    o.saes = {"2-res-fuzz=" + WriteSae("sae2", "blocks.2.hook_resid_post"),
              "1-res-fuzz=" + WriteSae("sae1", "blocks.1.hook_resid_post")};
    auto s = serve::Server::Create(o);
    if (!s.ok()) Fail("server: " + s.status().ToString());
    r->server = std::move(*s);
    auto id = r->server->LoadModel(SourcePath("models/stories260K"));
    if (!id.ok()) Fail("load: " + id.status().ToString());
    Start(r);
    server_for_atexit = r;
    std::atexit(StopServer);
    return r;
  }();
  return *r;
}

// The experiments of the second server's store ({id}, {id2} in inputs).
struct Aux {
  Running running;
  std::string id, id2;
  std::string export_dir;
};

// The second server of modes 19..24: persistence on, in the scratch
// directory (removed at exit, after the server stops: ScratchDir registers
// its removal first), no model loaded; models/ is its model_dirs (probes).
Aux& GetAux() {
  static Aux* a = [] {
    auto* a = new Aux;
    const std::string dir = ScratchDir() + "/experiments";
    serve::ServerOptions o;
    o.port = 0;
    o.threads = 4;
    o.max_body_bytes = 1 << 20;
    o.engine.threads = 1;
    o.model_dirs = {SourcePath("models")};
    o.model_paths = {SourcePath("models/stories260K")};
    o.persistence.enabled = true;
    o.persistence.db_path = dir + "/experiments.db";
    o.persistence.hidden_states_dir = dir + "/hidden_states";
    o.persistence.export_dir = dir + "/exports";
    a->export_dir = o.persistence.export_dir;
    {
      // Seeded before the server opens the database.
      auto store = serve::ExperimentStore::Open(
          o.persistence.db_path, o.persistence.hidden_states_dir);
      if (!store.ok()) Fail("store: " + store.status().ToString());
      serve::ExperimentStore& st = **store;
      auto id = st.CreateExperiment("stories260K", {{"temperature", 0.5}},
                                    "completed", "fuzz, \"quoted\"\n");
      auto id2 = st.CreateExperiment("other/model", nlohmann::json::object(),
                                     "running");
      if (!id.ok() || !id2.ok()) Fail("store: cannot create experiments");
      a->id = *id;
      a->id2 = *id2;
      const float v[8] = {1, -2, 0.5f, 0, 3, 4, -1e-3f, 7};
      const Status seeded[] = {
          st.AddConversation(*id, "user", "Hi, \"there\"").status(),
          st.AddConversation(*id, "assistant", "line\nbreak,comma").status(),
          st.AddMetric(*id, "loss", 0.25, "nats", {{"step", 3}}).status(),
          st.AddMetric(*id, "acc", 1.0).status(),
          st.SaveHiddenState(*id, -1, DType::kF32, Shape({2, 4}), v).status(),
          st.SaveHiddenState(*id, 2, DType::kF32, Shape({8}), v).status()};
      for (const Status& status : seeded)
        if (!status.ok()) Fail("store: cannot seed: " + status.ToString());
    }
    auto s = serve::Server::Create(o);
    if (!s.ok()) Fail("aux server: " + s.status().ToString());
    a->running.server = std::move(*s);
    Start(&a->running);
    aux_for_atexit = &a->running;
    std::atexit(StopAux);
    return a;
  }();
  return *a;
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

// A reply: status 2xx, 4xx, 501 or 503; JSON (or SSE, or NDJSON: a JSON
// object a line); a 200 in a binary format must be that format, whole.
void Check(const std::string& path, const httplib::Result& res) {
  if (!res) {
    Fail(path + ": no reply (" + httplib::to_string(res.error()) + ")");
  }
  const int status = res->status;
  if (status >= 500 && status != 501 && status != 503)
    Fail(path + ": status " + std::to_string(status) + ": " + res->body);
  const std::string type = res->get_header_value("Content-Type");
  if (status == 200 && type == "application/x-npy") {
    auto npy = ReadNpy(WriteScratch("reply.npy", res->body));
    if (!npy.ok()) Fail(path + ": bad .npy reply: " + npy.status().ToString());
    if (npy->header.data_offset + npy->header.data_bytes() !=
        static_cast<int64_t>(res->body.size()))
      Fail(path + ": the .npy reply's header does not describe its " +
           std::to_string(res->body.size()) + " bytes");
    return;
  }
  if (status == 200 && type == "application/safetensors") {
    auto h = ParseSafetensorsHeader(
        path, reinterpret_cast<const uint8_t*>(res->body.data()),
        static_cast<int64_t>(res->body.size()));
    if (!h.ok())
      Fail(path + ": bad safetensors reply: " + h.status().ToString());
    return;
  }
  if (type == "application/x-ndjson") {  // /v1/lens/prompt: a JSON a line
    for (std::string_view line : Split(res->body, '\n', 1 << 20))
      if (!line.empty() &&
          nlohmann::json::parse(line, nullptr, false).is_discarded())
        Fail(path + ": an NDJSON line is not JSON: " +
             std::string(line.substr(0, 200)));
    return;
  }
  const bool sse = type.find("text/event-stream") != std::string::npos;
  if (!sse && nlohmann::json::parse(res->body, nullptr, false).is_discarded())
    Fail(path + ": the reply is not JSON: " + res->body.substr(0, 200));
}

void Post(int route, std::string_view body) {
  Running& r = Get();
  const std::string path = kRoutes[route];
  Check(path, r.client->Post(path, std::string(body), "application/json"));
}

// Bounds of an analysis input (modes 17, 18).
constexpr size_t kMaxAnalysisBytes = 64 << 10;
constexpr size_t kMaxAnalysisRows = 300;

void PostAnalysis(const std::string& path, std::string_view body) {
  if (body.size() > kMaxAnalysisBytes ||
      static_cast<size_t>(std::count(body.begin(), body.end(), '[')) >
          kMaxAnalysisRows)
    return;
  Check(path, Get().client->Post(path, std::string(body), "application/json"));
}

// `text` with {id} and {id2} replaced by the seeded experiments' ids.
std::string WithIds(std::string_view text, const Aux& a) {
  std::string out(text);
  for (const auto& [from, to] :
       {std::pair<std::string, std::string>{"{id2}", a.id2},
        std::pair<std::string, std::string>{"{id}", a.id}})
    for (size_t p = 0; (p = out.find(from, p)) != std::string::npos;
         p += to.size())
      out.replace(p, from.size(), to);
  return out;
}

// A request path from fuzzed bytes: its first line, bytes outside printable
// ASCII (and '#') percent-encoded, so that it stays one request line.
std::string PathOf(std::string_view text) {
  text = text.substr(0, std::min(text.find('\n'), size_t{4096}));
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c >= 0x7f || c == '#') {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += ch;
    }
  }
  return out;
}

void AuxGet(const std::string& path) {
  Check(path, GetAux().running.client->Get(path));
}

void AuxPost(const std::string& path, const std::string& body) {
  Aux& a = GetAux();
  Check(path, a.running.client->Post(path, body, "application/json"));
}

// Mode 25: a binary reply by Accept.
void PostAccept(std::string_view input) {
  constexpr const char* kBinaryRoutes[] = {
      "/generate", "/v1/generate", "/embed", "/embed/batch", "/v1/embeddings"};
  const auto in =
      TakeMode(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  const std::string path = kBinaryRoutes[in.mode % 5];
  const size_t nl = in.rest.find('\n');
  std::string accept(in.rest.substr(0, nl));
  const std::string_view body = nl == std::string_view::npos
                                    ? std::string_view()
                                    : in.rest.substr(nl + 1);
  // A header value is one line of visible bytes (the client would refuse
  // or split the request otherwise).
  for (char& c : accept)
    if (c == '\r' || c == '\0') c = ' ';
  const httplib::Headers headers = {{"Accept", accept}};
  Check(path, Get().client->Post(path, headers, std::string(body),
                                 "application/json"));
}

// Mode 27: one of Neuronpedia's routes (the first byte), the body after it.
void PostNeuronpedia(std::string_view in) {
  constexpr const char* kNeuronpedia[] = {"/v1/activation/topk-by-token",
                                          "/v1/activation/all",
                                          "/v1/activation/single",
                                          "/v1/tokenize",
                                          "/v1/steer/completion",
                                          "/v1/steer/completion-chat",
                                          "/v1/lens/prompt"};
  if (in.empty()) return;
  const std::string path =
      kNeuronpedia[static_cast<uint8_t>(in[0]) % std::size(kNeuronpedia)];
  Check(path, Get().client->Post(path, std::string(in.substr(1)),
                                 "application/json"));
}

}  // namespace
}  // namespace loom::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom;
  using namespace loom::fuzz;
  const auto in = TakeMode(data, size);
  const int mode = in.mode % 28;
  if (mode < 10) {
    Post(mode, in.rest);
  } else if (mode == 17) {
    PostAnalysis("/analyze/geometry", in.rest);
  } else if (mode == 18) {
    PostAnalysis("/analyze/bilateral", in.rest);
  } else if (mode == 19) {
    AuxGet("/experiments" + PathOf(WithIds(in.rest, GetAux())));
  } else if (mode >= 20 && mode <= 22) {
    constexpr const char* kExports[] = {"/experiments/export",
                                        "/experiments/export/batch",
                                        "/experiments/export/summary"};
    Aux& a = GetAux();
    AuxPost(kExports[mode - 20], WithIds(in.rest, a));
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(a.export_dir, ec))
      std::filesystem::remove_all(e.path(), ec);
  } else if (mode == 23) {
    const std::string id = PathOf(in.rest);
    AuxGet(id.empty() ? "/loaders" : "/loaders/probe/" + id);
  } else if (mode == 24) {
    AuxPost("/gpu/configure", std::string(in.rest));
  } else if (mode == 25) {
    PostAccept(in.rest);
  } else if (mode == 27) {
    PostNeuronpedia(in.rest);
  } else if (mode == 26) {
    Post(0, R"({"prompt": "Once", "max_tokens": 2, "temperature": 0, )"
            R"("return_attention": true, "hidden_state_layers": )" +
                std::string(in.rest) + "}");
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
