// The state the route families share (docs/design/architecture.md, "Server
// routes"): the options, the loaded models (ModelRegistry), the patching and
// experiment stores, the generation recorder and the request counts.
// server.cc owns all of it; every family's handlers hold the ServerContext
// that points at it.
#ifndef LOOM_SERVE_ROUTES_CONTEXT_H_
#define LOOM_SERVE_ROUTES_CONTEXT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "src/base/status.h"
#include "src/serve/api.h"
#include "src/serve/engine.h"
#include "src/serve/experiment_recorder.h"
#include "src/serve/experiments.h"
#include "src/serve/loaders.h"
#include "src/serve/patching.h"
#include "src/serve/sae_set.h"
#include "src/serve/server.h"

namespace loom::serve::routes {

using Clock = std::chrono::steady_clock;

// The loaded models by id: loaded on first use (admitted by their memory
// plan), the least recently used idle one unloaded under models.max_loaded.
class ModelRegistry {
 public:
  explicit ModelRegistry(const ServerOptions& o) : o_(o) {}
  ModelRegistry(const ModelRegistry&) = delete;
  ModelRegistry& operator=(const ModelRegistry&) = delete;

  // The id of the model `name` names (a configured model directory, or a
  // name under models.dirs) and, in *dir, its directory.
  StatusOr<std::string> Resolve(const std::string& name, std::string* dir);
  // A loaded model (marked used now), or null.
  std::shared_ptr<Engine> Find(const std::string& id);
  // A loaded model, loaded first when it is not.
  StatusOr<std::shared_ptr<Engine>> Load(const std::string& name);
  // Unloads a model once its in-flight requests finish.
  Status Unload(const std::string& id);
  // The engine a request names (`model`), or the only one loaded.
  StatusOr<std::shared_ptr<Engine>> EngineFor(const json& body);
  std::vector<std::shared_ptr<Engine>> Engines();
  // When `id` was loaded (Unix seconds), 0 when never.
  int64_t LoadedAt(const std::string& id);

 private:
  Status MakeRoom(const std::string& id);

  const ServerOptions& o_;
  std::mutex load_mu_;    // serializes loads (held while a model loads)
  std::mutex models_mu_;  // guards models_ (never held while loading)
  std::map<std::string, std::shared_ptr<Engine>> models_;
  std::map<std::string, Clock::time_point> last_used_;  // by model id
  std::map<std::string, int64_t> loaded_at_;  // Unix seconds, by model id
  int64_t models_loaded_total_ = 0;
};

// The replies so far by route and HTTP status (/metrics).
class RequestCounts {
 public:
  void Count(const std::string& route, int status);
  std::map<std::pair<std::string, int>, int64_t> Snapshot();

 private:
  std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> counts_;  // route, code
};

// What a route's handler may use; everything it points at is the server's
// (Server::Impl) and outlives the routes.
struct ServerContext {
  const ServerOptions& options;
  ModelRegistry& models;
  Patching& patching;
  ExperimentRoutes& experiments;
  // persistence.auto_persist: the generation routes' experiments, written
  // on its own thread (null when off).
  ExperimentRecorder* recorder;
  GpuSelection& gpu_selection;
  RequestCounts& requests;
  // interp.saes: the SAEs of Neuronpedia's routes by source id.
  SaeSet& saes;
  const std::atomic<bool>& draining;
  Clock::time_point started;
};

}  // namespace loom::serve::routes

#endif  // LOOM_SERVE_ROUTES_CONTEXT_H_
