// `loom serve`: TheLoom's HTTP API, and OpenAI's /v1 routes (models, chat,
// completions, embeddings), over the batching engine (engine.h). Routes,
// fields, the stream-format rule and differences from TheLoom:
// docs/server.md.
//
// The server holds the loaded models (at most max_loaded), each an Engine
// with its own planned memory and scheduler; HTTP worker threads parse a
// request, submit it to the model's engine and wait for its ticket, so
// concurrent requests meet in the engine's shared forwards. Models load only
// from configured places: a directory given on the command line, or a name
// relative to one of `model_dirs` (no absolute paths, no `..`, no symlink
// leaving the directory).
//
// Safety: binds 127.0.0.1 unless told otherwise; with an auth token every
// route but /health needs "Authorization: Bearer <token>"; a POST body is
// read as JSON whatever its Content-Type (curl -d's form type too), with
// max_body_bytes the limit (max_analysis_body_bytes on /analyze/geometry and
// /analyze/bilateral; 413 naming it; multipart/form-data is 415);
// prompts over max_prompt_tokens get 400; malformed JSON,
// wrong types and unknown models get 4xx with a message; a full queue gets
// 503 with Retry-After. Stop() (SIGTERM in the CLI) refuses new requests,
// lets the in-flight ones finish, then unloads the models.
#ifndef LOOM_SERVE_SERVER_H_
#define LOOM_SERVE_SERVER_H_

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"
#include "src/serve/engine.h"
#include "src/serve/experiments.h"
#include "src/serve/patching.h"

namespace loom::serve {

struct ServerOptions {
  // http: TCP on host:port; unix: HTTP/1.1 on the unix socket `unix_socket`
  // (mode 0600, removed on shutdown); both: the two, sharing every route and
  // all state (transport.h, docs/server.md).
  std::string transport = "http";
  std::string unix_socket = "/tmp/loom.sock";
  std::string host = "127.0.0.1";
  int port = 8080;         // 0 = any free port (see Server::port())
  std::string auth_token;  // "" = none
  int64_t max_body_bytes = 8 << 20;
  // The body limit of /analyze/geometry and /analyze/bilateral: 1,000
  // vectors of width 4,096 as Go writes float64 are about 80 MB.
  int64_t max_analysis_body_bytes = int64_t{256} << 20;
  int64_t max_prompt_tokens = 0;  // 0 = the model's serving context
  int64_t max_batch_prompts = 100;
  // Vector values one request's `interventions` may carry, hook patterns
  // expanded (400 past it; docs/server.md).
  int64_t max_intervention_floats = 1 << 20;
  int threads = 0;  // HTTP workers; 0 = max_queue + 16, at most 512
  std::string chat_stream_format = "auto";  // auto | openai | theloom
  // Where models may come from: names relative to these directories, and
  // these exact model directories (the CLI's --model).
  std::vector<std::string> model_dirs;
  std::vector<std::string> model_paths;
  int max_loaded = 3;
  std::vector<int64_t> default_layers = {-1};
  // Defaults of /embed, /embed/batch and /v1/embeddings (a request's
  // `layer`, `pooling`, `normalize` override them): the layer pooled, the
  // pooling ("last_token" | "first_token" | "mean") and L2 normalisation.
  int64_t embedding_layer = -1;
  std::string embedding_pooling = "last_token";
  bool embedding_normalize = false;
  DType hidden_dtype = DType::kF32;
  double memory_fraction = 0.9;
  double memory_warning_threshold = 0.85;
  int64_t shutdown_timeout_seconds = 30;
  std::vector<std::string> cors_origins;  // "*" or origins; [] = no CORS
  bool cors_allow_credentials = false;
  EngineOptions engine;
  // /api/patching/*: limits of the experiments kept and of one run
  // (patching.h; threads 0 = engine.threads).
  PatchingOptions patching;
  // /experiments*: the store (experiments.h); disabled = 503.
  PersistenceOptions persistence;
  // Neuronpedia's routes: the SAEs by source id, "ID=PATH[@HOOK]"
  // (interp.saes, --sae; sae_set.h).
  std::vector<std::string> saes;
  nlohmann::json config;  // the effective configuration, echoed in /health
};

class Server {
 public:
  static StatusOr<std::unique_ptr<Server>> Create(const ServerOptions& options);
  ~Server();

  // Loads a model by id (a configured directory's name or a name under
  // model_dirs); returns its id. Loading an already loaded model is a no-op.
  StatusOr<std::string> LoadModel(const std::string& name);
  Status UnloadModel(const std::string& id);

  // Binds the listening sockets (the TCP port and/or the unix socket); the
  // port (useful with port 0), 0 for transport "unix".
  StatusOr<int> Bind();
  // Serves until Stop(); returns once in-flight requests are done and the
  // models are unloaded.
  Status Run();
  // Thread-safe; returns at once.
  void Stop();
  int port() const { return port_; }

 private:
  class Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  bool bound_ = false;
};

}  // namespace loom::serve

#endif  // LOOM_SERVE_SERVER_H_
