// `loom serve --model DIR [--host H] [--port N] [--config FILE] [--threads N]
//  [--precision P] [--transport T] [--unix-socket PATH]`: TheLoom's HTTP API
//  (src/serve/server.h, docs/server.md).
// The configuration is the YAML file (src/serve/config.h), then
// LOOM_<SECTION>__<KEY> environment variables, then these flags (--precision
// sets memory.precision_mode). SIGTERM / SIGINT stop it gracefully: new
// requests get 503, requests in flight finish.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "src/base/units.h"
#include "src/runtime/model.h"
#include "src/serve/api.h"
#include "src/serve/config.h"
#include "src/serve/server.h"
#include "tools/cli/commands.h"
#include "tools/cli/flag_ranges.h"
#include "tools/cli/param_flags.h"
#include "tools/cli/plan_flags.h"

extern char** environ;

namespace loom::cli {
namespace {

struct ServeArgs {
  std::vector<std::string> models;
  std::string host;
  int port = -1;
  std::string config;
  int threads = 0;
  std::string precision;    // "" = memory.precision_mode of the configuration
  std::string transport;    // "" = server.transport
  std::string unix_socket;  // "" = server.unix_socket
  PlanFlags plan;           // --device --max-memory --reserve --show-plan
  std::vector<std::string> saes;  // --sae ID=PATH[@HOOK], after interp.saes
};

// memory.precision_mode's spelling of a --precision value (the YAML key takes
// fp32 / fp16 / bf16 / auto; the flag takes what every command's --precision
// takes).
StatusOr<std::string> PrecisionMode(const std::string& flag) {
  ASSIGN_OR_RETURN(Precision p, ParsePrecision(flag));
  switch (p) {
    case Precision::kF32:
      return std::string("fp32");
    case Precision::kBF16:
      return std::string("bf16");
    case Precision::kF16:
      return std::string("fp16");
    default:
      return std::string("auto");
  }
}

StatusOr<Precision> PrecisionOf(const serve::ServeConfig& c) {
  const std::string& mode = c.memory.precision_mode;
  std::string p = mode;
  if (mode == "auto") {
    const std::string& d = c.models.default_dtype;
    p = d == "float32" || d == "f32"     ? "f32"
        : d == "bfloat16" || d == "bf16" ? "bf16"
        : d == "float16" || d == "f16"   ? "f16"
                                         : "auto";
  } else if (mode == "fp32") {
    p = "f32";
  } else if (mode == "fp16") {
    p = "f16";
  }
  return ParsePrecision(p);
}

Status RunServe(const ServeArgs& args) {
  serve::ServeConfig config;
  if (!args.config.empty()) {
    ASSIGN_OR_RETURN(config, serve::LoadServeConfig(args.config));
  }
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e)
    env.emplace_back(*e);
  RETURN_IF_ERROR(serve::ApplyEnvOverrides(env, config));
  if (!args.host.empty()) config.server.http_host = args.host;
  if (args.port >= 0) config.server.http_port = args.port;
  if (!args.transport.empty()) config.server.transport = args.transport;
  if (!args.unix_socket.empty()) config.server.unix_socket = args.unix_socket;
  for (const std::string& s : args.saes) config.interp.saes.push_back(s);
  if (!args.precision.empty()) {
    ASSIGN_OR_RETURN(config.memory.precision_mode,
                     PrecisionMode(args.precision));
  }
  RETURN_IF_ERROR(serve::ValidateServeConfig(config));
  if (!config.logging.file.empty() &&
      std::freopen(config.logging.file.c_str(), "a", stderr) == nullptr)
    return IoError("logging.file: cannot open " + config.logging.file);
  for (const std::string& w : config.warnings)
    std::fprintf(stderr, "loom serve: warning: %s\n", w.c_str());
  if (args.models.empty() && config.models.preload.empty() &&
      config.models.dirs.empty())
    return InvalidArgumentError(
        "nothing to serve: give --model DIR, or models.dirs / models.preload "
        "in --config");

  serve::ServerOptions o;
  o.transport = config.server.transport;
  o.unix_socket = config.server.unix_socket;
  o.persistence.enabled = config.persistence.enabled;
  o.persistence.db_path = config.persistence.db_path;
  o.persistence.hidden_states_dir = config.persistence.hidden_states_dir;
  o.persistence.export_dir = config.persistence.export_dir;
  o.persistence.auto_persist = config.persistence.auto_persist;
  o.host = config.server.http_host;
  o.port = config.server.http_port;
  o.auth_token = config.server.auth_token;
  o.max_body_bytes = config.server.max_body_bytes;
  o.max_analysis_body_bytes = config.server.max_analysis_body_bytes;
  o.max_prompt_tokens = config.server.max_prompt_tokens;
  o.max_batch_prompts = config.server.max_batch_prompts;
  o.threads = config.server.threads;
  o.chat_stream_format = config.server.chat_stream_format;
  o.cors_origins = config.server.cors_origins;
  o.cors_allow_credentials = config.server.cors_allow_credentials;
  o.shutdown_timeout_seconds = config.server.shutdown_timeout_seconds;
  o.model_dirs = config.models.dirs;
  o.model_paths = args.models;
  o.max_loaded = config.models.max_loaded;
  o.default_layers = config.hidden_states.default_layers;
  o.embedding_layer = config.hidden_states.embedding_layer;
  o.embedding_pooling = config.hidden_states.embedding_pooling;
  o.embedding_normalize = config.hidden_states.embedding_normalize;
  ASSIGN_OR_RETURN(o.hidden_dtype,
                   serve::ParseReturnDType(config.hidden_states.precision));
  o.memory_fraction = config.gpu.memory_fraction;
  o.memory_warning_threshold = config.memory.memory_warning_threshold;
  ASSIGN_OR_RETURN(o.engine.precision, PrecisionOf(config));
  o.engine.slots = config.batching.slots;
  o.engine.context = config.batching.context;
  o.engine.prefill_chunk = config.memory.streaming_chunk_size;
  o.engine.batch_tokens = config.batching.batch_tokens;
  o.engine.capture_bytes = config.batching.capture_bytes;
  o.engine.kv_tokens = config.batching.kv_tokens;
  o.engine.page_size = config.batching.page_size;
  o.engine.max_queue = config.server.max_queue;
  o.engine.extra_hooks = config.memory.activation_cache_filter;
  o.saes = config.interp.saes;
  o.engine.threads = args.threads;
  o.engine.plan = args.plan;
  // gpu.default_device (else the first of gpu.devices) places the models
  // when no --device is given: every layer of a model runs on one device.
  if (o.engine.plan.devices.empty() && !config.gpu.devices.empty()) {
    const int gpu = config.gpu.default_device >= 0 ? config.gpu.default_device
                                                   : config.gpu.devices.front();
    o.engine.plan.devices = {"cuda:" + std::to_string(gpu)};
  }
  o.config = config.ToJson();

  // Signals go to one waiting thread only: block them here, before any
  // thread exists, so every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  ASSIGN_OR_RETURN(std::unique_ptr<serve::Server> server,
                   serve::Server::Create(o));
  for (const std::string& m : args.models)
    RETURN_IF_ERROR(server->LoadModel(m).status());
  for (const std::string& m : config.models.preload)
    RETURN_IF_ERROR(server->LoadModel(m).status());
  ASSIGN_OR_RETURN(int port, server->Bind());
  if (o.transport != "unix")
    std::fprintf(stderr, "loom serve: listening on http://%s:%d\n",
                 o.host.c_str(), port);
  if (o.transport != "http")
    std::fprintf(stderr, "loom serve: listening on unix socket %s\n",
                 o.unix_socket.c_str());
  std::fflush(stderr);

  std::atomic<bool> done{false};
  std::thread waiter([&] {
    const timespec tick{0, 200'000'000};
    while (!done.load()) {
      const int sig = sigtimedwait(&stop_signals, nullptr, &tick);
      if (sig == SIGTERM || sig == SIGINT) {
        std::fprintf(stderr,
                     "loom serve: %s: finishing the requests in flight\n",
                     sig == SIGTERM ? "SIGTERM" : "SIGINT");
        server->Stop();
        return;
      }
    }
  });
  const Status st = server->Run();
  done = true;
  waiter.join();
  std::fprintf(stderr, "loom serve: stopped\n");
  return st;
}

}  // namespace

void AddServeCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "Serve TheLoom's HTTP API (generation, hidden states, chat)");
  AddParamFlag(*cmd, {&eval::ModelParam("model"), &args->models, {}},
               "Model directory to load at start (repeatable); the "
               "`model` field of requests may then be omitted");
  cmd->add_option("--host", args->host,
                  "Address to bind (default 127.0.0.1; server.http_host)");
  cmd->add_option("--port", args->port,
                  "Port (default 8080; 0 = any free port; server.http_port)")
      ->check(IntRange(0, 65535));
  cmd->add_option("--config", args->config,
                  "YAML configuration (docs/design/serve-config.md)");
  cmd->add_option("--transport", args->transport,
                  "http, unix or both (default http; server.transport)")
      ->check(CLI::IsMember({"http", "unix", "both"}));
  cmd->add_option("--unix-socket", args->unix_socket,
                  "Path of the unix socket for --transport unix/both "
                  "(default /tmp/loom.sock; server.unix_socket)");
  cmd->add_option("--sae", args->saes,
                  "An SAE for Neuronpedia's routes, ID=PATH[@HOOK] "
                  "(repeatable; ID a source id such as 6-res-jb; added to "
                  "interp.saes)");
  AddThreadsFlag(*cmd, &args->threads);
  AddPrecisionFlag(*cmd, &args->precision, "every model loaded",
                   "memory.precision_mode; auto: models.default_dtype, then "
                   "as other commands' auto");
  AddPlanFlags(*cmd, &args->plan, PlanFlagUse::kServe);
  cmd->callback([args, exit_code] {
    *exit_code = ReportStatus("serve", RunServe(*args));
  });
}

}  // namespace loom::cli
