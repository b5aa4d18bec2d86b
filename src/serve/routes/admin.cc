// /health, /models*, /gpu/status, /metrics, /loaders* and /gpu/configure
// (admin.h).
#include "src/serve/routes/admin.h"

#include <chrono>
#include <cstdio>
#include <utility>
#include <vector>

#include "src/serve/loaders.h"
#include "src/serve/routes/common.h"

namespace loom::serve::routes {

namespace {

std::string Fmt(double x) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.17g", x);
  return b;
}

json ModelInfo(const Engine& e) {
  const ModelConfig& c = e.model().config();
  const EngineMemory m = e.Memory();
  return {{"model_id", e.id()},
          {"path", e.dir()},
          {"device", "cpu"},
          {"dtype", std::string(DTypeName(e.model().compute_dtype()))},
          {"architecture", c.model_type},
          {"hidden_size", c.hidden_size},
          {"num_layers", c.num_layers},
          {"vocab_size", c.vocab_size},
          {"context", e.context()},
          {"slots", e.options().slots},
          {"loader_type", "loom"},
          {"load_time_seconds", e.load_seconds()},
          {"has_chat_template", e.chat_template() != nullptr},
          {"has_tokenizer", e.tokenizer() != nullptr},
          {"memory_planned_bytes", m.planned()}};
}

json GpuStatus(ServerContext& ctx) {
  const int64_t total = HostMemoryBytes();
  const int64_t capacity = static_cast<int64_t>(static_cast<double>(total) *
                                                ctx.options.memory_fraction);
  int64_t planned = 0, used = 0;
  json models = json::array();
  for (const auto& e : ctx.models.Engines()) {
    const EngineMemory m = e->Memory();
    planned += m.planned();
    used += m.weights + m.arenas + m.head + m.kv_used + m.capture_used;
    models.push_back(
        {{"model_id", e->id()},
         {"planned_bytes",
          {{"weights", m.weights},
           {"arenas", m.arenas},
           {"kv", m.kv},
           {"head", m.head},
           {"capture", m.capture},
           {"total", m.planned()}}},
         {"used_bytes", {{"kv", m.kv_used}, {"capture", m.capture_used}}}});
  }
  const double usage =
      capacity > 0 ? static_cast<double>(planned) / capacity : 0.0;
  json warnings = json::array();
  if (usage > ctx.options.memory_warning_threshold)
    warnings.push_back(
        {{"device", "cpu"},
         {"message", "planned memory is above memory_warning_threshold"},
         {"usage_fraction", usage},
         {"threshold", ctx.options.memory_warning_threshold}});
  return {{"has_gpu", false},
          {"note", "loom serve computes on the CPU; the devices list the host"},
          {"memory_fraction", ctx.options.memory_fraction},
          {"memory_warning_threshold", ctx.options.memory_warning_threshold},
          {"devices",
           {{{"device", "cpu"},
             {"total_bytes", total},
             {"capacity_bytes", capacity},
             {"planned_bytes", planned},
             {"used_bytes", used},
             {"usage_fraction", usage},
             {"models", models}}}},
          {"warnings", warnings}};
}

std::string Metrics(ServerContext& ctx) {
  std::string s;
  auto family = [&](const char* name, const char* type, const char* help) {
    s += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " +
         type + "\n";
  };
  family("loom_http_requests_total", "counter",
         "HTTP requests by route and status code.");
  {
    for (const auto& [k, v] : ctx.requests.Snapshot())
      s += "loom_http_requests_total{route=\"" + k.first + "\",code=\"" +
           std::to_string(k.second) + "\"} " + std::to_string(v) + "\n";
  }
  if (ctx.recorder != nullptr) {  // persistence.auto_persist
    const ExperimentRecorder::Counts c = ctx.recorder->counts();
    family("loom_experiments_persisted_total", "counter",
           "Generation requests recorded as experiments.");
    s += "loom_experiments_persisted_total " + std::to_string(c.persisted) +
         "\n";
    family("loom_experiments_persist_errors_total", "counter",
           "Experiments not recorded: the store failed, or the write queue "
           "was full (dropped).");
    s += "loom_experiments_persist_errors_total " +
         std::to_string(c.errors + c.dropped) + "\n";
    family("loom_experiments_persist_dropped_total", "counter",
           "Experiments not recorded because the write queue was full.");
    s += "loom_experiments_persist_dropped_total " + std::to_string(c.dropped) +
         "\n";
    family("loom_experiments_persist_queue", "gauge",
           "Experiments waiting to be written.");
    s += "loom_experiments_persist_queue " + std::to_string(c.queued) + "\n";
  }
  const auto engines = ctx.models.Engines();
  family("loom_models_loaded", "gauge", "Models loaded.");
  s += "loom_models_loaded " + std::to_string(engines.size()) + "\n";
  struct Counter {
    const char* name;
    const char* type;
    const char* help;
    double (*get)(const EngineStats&);
  };
  static const Counter kCounters[] = {
      {"loom_requests_admitted_total", "counter", "Requests admitted.",
       [](const EngineStats& x) { return double(x.requests_admitted); }},
      {"loom_requests_completed_total", "counter", "Requests completed.",
       [](const EngineStats& x) { return double(x.requests_completed); }},
      {"loom_requests_failed_total", "counter", "Requests failed.",
       [](const EngineStats& x) { return double(x.requests_failed); }},
      {"loom_requests_rejected_total", "counter",
       "Requests refused because the queue was full (503).",
       [](const EngineStats& x) { return double(x.requests_rejected); }},
      {"loom_requests_cancelled_total", "counter", "Requests cancelled.",
       [](const EngineStats& x) { return double(x.requests_cancelled); }},
      {"loom_prompt_tokens_total", "counter", "Prompt tokens admitted.",
       [](const EngineStats& x) { return double(x.prompt_tokens); }},
      {"loom_generated_tokens_total", "counter", "Tokens generated.",
       [](const EngineStats& x) { return double(x.generated_tokens); }},
      {"loom_forwards_total", "counter", "Forwards run.",
       [](const EngineStats& x) { return double(x.forwards); }},
      {"loom_forward_tokens_total", "counter", "Tokens over all forwards.",
       [](const EngineStats& x) { return double(x.forward_tokens); }},
      {"loom_forward_sequences_total", "counter",
       "Sequences over all forwards (divide by forwards: the mean batch).",
       [](const EngineStats& x) { return double(x.forward_seqs); }},
      {"loom_forwards_mixed_interventions_total", "counter",
       "Forwards that edited a sequence (request interventions) beside "
       "other requests' sequences.",
       [](const EngineStats& x) { return double(x.mixed_edit_forwards); }},
      {"loom_intervention_edits_total", "counter",
       "Intervention edits applied over all forwards (one per sequence and "
       "intervention per forward).",
       [](const EngineStats& x) { return double(x.edits_applied); }},
      {"loom_forward_seconds_total", "counter", "Seconds in forwards.",
       [](const EngineStats& x) { return x.forward_seconds; }},
      {"loom_queue_depth", "gauge", "Requests waiting for admission.",
       [](const EngineStats& x) { return double(x.queued); }},
      {"loom_active_sequences", "gauge", "Sequences admitted.",
       [](const EngineStats& x) { return double(x.active); }},
  };
  std::vector<EngineStats> stats;
  for (const auto& e : engines) stats.push_back(e->Stats());
  for (const Counter& c : kCounters) {
    family(c.name, c.type, c.help);
    for (size_t i = 0; i < engines.size(); ++i)
      s += std::string(c.name) + "{model=\"" + engines[i]->id() + "\"} " +
           Fmt(c.get(stats[i])) + "\n";
  }
  family("loom_memory_planned_bytes", "gauge",
         "Bytes planned at load, by component.");
  for (const auto& e : engines) {
    const EngineMemory m = e->Memory();
    for (const auto& [k, v] :
         std::vector<std::pair<const char*, int64_t>>{{"weights", m.weights},
                                                      {"arenas", m.arenas},
                                                      {"kv", m.kv},
                                                      {"head", m.head},
                                                      {"capture", m.capture}})
      s += "loom_memory_planned_bytes{model=\"" + e->id() + "\",component=\"" +
           k + "\"} " + std::to_string(v) + "\n";
  }
  family("loom_memory_used_bytes", "gauge",
         "Bytes of the KV cache and capture budget in use.");
  for (const auto& e : engines) {
    const EngineMemory m = e->Memory();
    s += "loom_memory_used_bytes{model=\"" + e->id() + "\",component=\"kv\"} " +
         std::to_string(m.kv_used) + "\n";
    s += "loom_memory_used_bytes{model=\"" + e->id() +
         "\",component=\"capture\"} " + std::to_string(m.capture_used) + "\n";
  }
  return s;
}

}  // namespace

void RegisterModelRoutes(HttpListeners& http, ServerContext& ctx) {
  http.Get("/health", Route(ctx, "/health", [&ctx](const auto&, auto& res) {
             json models = json::array();
             for (const auto& e : ctx.models.Engines())
               models.push_back(e->id());
             Reply(
                 res, 200,
                 {{"status", ctx.draining ? "draining" : "healthy"},
                  {"model_loaded", models.empty() ? json(nullptr) : models[0]},
                  {"models", models},
                  {"gpu_info", {{"has_gpu", false}}},
                  {"uptime_seconds",
                   std::chrono::duration<double>(Clock::now() - ctx.started)
                       .count()},
                  {"config", ctx.options.config}});
             return Status();
           }));
  http.Get("/models", Route(ctx, "/models", [&ctx](const auto&, auto& res) {
             json list = json::array();
             for (const auto& e : ctx.models.Engines())
               list.push_back(ModelInfo(*e));
             Reply(res, 200,
                   {{"models", list},
                    {"loaded_count", list.size()},
                    {"max_loaded", ctx.options.max_loaded}});
             return Status();
           }));
  http.Post("/models/load",
            JsonRoute(ctx, "/models/load", [&ctx](const auto& req, auto& res) {
              ASSIGN_OR_RETURN(json b, ParseBody(req.body));
              ASSIGN_OR_RETURN(std::string name, GetString(b, "model", ""));
              if (name.empty())
                return InvalidArgumentError("field `model` is required");
              ASSIGN_OR_RETURN(std::string device,
                               GetString(b, "device", "cpu"));
              if (device != "cpu" && device != "auto")
                return UnimplementedError(
                    "device `" + device +
                    "`: loom serve runs models on the CPU for now (the "
                    "CUDA backend has no KV-cache attention yet)");
              ASSIGN_OR_RETURN(auto e, ctx.models.Load(name));
              Reply(res, 200, ModelInfo(*e));
              return Status();
            }));
  http.Delete(R"(/models/(.+))",
              Route(ctx, "/models/{id}", [&ctx](const auto& req, auto& res) {
                std::string id = req.matches[1];
                for (size_t p; (p = id.find("--")) != std::string::npos;)
                  id.replace(p, 2, "/");
                RETURN_IF_ERROR(ctx.models.Unload(id));
                Reply(res, 200, {{"model_id", id}, {"unloaded", true}});
                return Status();
              }));
}

void RegisterStatusRoutes(HttpListeners& http, ServerContext& ctx) {
  http.Get("/gpu/status",
           Route(ctx, "/gpu/status", [&ctx](const auto&, auto& res) {
             Reply(res, 200, GpuStatus(ctx));
             return Status();
           }));
  http.Get("/metrics", Route(ctx, "/metrics", [&ctx](const auto&, auto& res) {
             res.set_content(Metrics(ctx),
                             "text/plain; version=0.0.4; charset=utf-8");
             return Status();
           }));
}

void RegisterLoaderRoutes(HttpListeners& http, ServerContext& ctx) {
  http.Get("/loaders", Route(ctx, "/loaders", [&ctx](const auto&, auto& res) {
             Reply(res, 200, LoadersJson());
             return Status();
           }));
  http.Get(
      R"(/loaders/probe/(.+))",
      Route(ctx, "/loaders/probe/{id}", [&ctx](const auto& req, auto& res) {
        std::string id = req.matches[1];
        for (size_t p; (p = id.find("--")) != std::string::npos;)
          id.replace(p, 2, "/");
        std::string dir;
        StatusOr<std::string> resolved = ctx.models.Resolve(id, &dir);
        Reply(res, 200,
              ProbeJson(id, resolved.ok() ? StatusOr<std::string>(dir)
                                          : resolved.status()));
        return Status();
      }));
  http.Post(
      "/gpu/configure",
      JsonRoute(ctx, "/gpu/configure", [&ctx](const auto& req, auto& res) {
        ASSIGN_OR_RETURN(json b, ParseBody(req.body));
        ASSIGN_OR_RETURN(json out, ctx.gpu_selection.Configure(b));
        Reply(res, 200, out);
        return Status();
      }));
}

}  // namespace loom::serve::routes
