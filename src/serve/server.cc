#include "src/serve/server.h"

#include <httplib.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

#include "src/serve/experiment_recorder.h"
#include "src/serve/loaders.h"
#include "src/serve/routes/activation.h"
#include "src/serve/routes/admin.h"
#include "src/serve/routes/chat.h"
#include "src/serve/routes/common.h"
#include "src/serve/routes/context.h"
#include "src/serve/routes/embed.h"
#include "src/serve/routes/experiments.h"
#include "src/serve/routes/generate.h"
#include "src/serve/routes/attribute.h"
#include "src/serve/routes/lens.h"
#include "src/serve/routes/neuronpedia.h"
#include "src/serve/routes/openai.h"
#include "src/serve/routes/patching.h"
#include "src/serve/routes/steer.h"
#include "src/serve/sae_set.h"
#include "src/serve/transport.h"

// The server's lifecycle (Create, Bind, Run, Stop), its listeners and the
// order of its routes; the routes themselves are in src/serve/routes/, one
// family per file (docs/design/architecture.md, "Server routes").

namespace loom::serve {
namespace {

using Clock = std::chrono::steady_clock;

// Compares a presented secret with the expected one in time that depends on
// the lengths only.
bool SameSecret(std::string_view given, std::string_view want) {
  unsigned diff = given.size() == want.size() ? 0u : 1u;
  for (size_t i = 0; i < given.size(); ++i)
    diff |=
        static_cast<unsigned char>(given[i]) ^
        static_cast<unsigned char>(want[i % std::max<size_t>(want.size(), 1)]);
  return diff == 0;
}

// Why binding `host`:`port` failed, as the OS says it; the HTTP library
// reports only that it did. Resolves the host as the library does (any
// family, passive) and binds a probe socket of its own, closed at once:
// getaddrinfo's error for a host that names no address ("999.1.1.1"), else
// bind(2)'s on the last address tried (EADDRINUSE, EADDRNOTAVAIL, EACCES).
std::string BindFailure(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0)
    return std::string("getaddrinfo: ") +
           (rc == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(rc));
  std::string why = "getaddrinfo: no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = std::string("socket: ") + std::strerror(errno);
      continue;
    }
    const int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    const int bound = ::bind(fd, a->ai_addr, a->ai_addrlen);
    const int err = errno;
    ::close(fd);
    if (bound != 0) {
      why = std::string("bind: ") + std::strerror(err);
      continue;
    }
    why =
        "the HTTP library's bind failed, but binding again succeeds (the "
        "port was in use for a moment?)";
    break;
  }
  ::freeaddrinfo(found);
  return why;
}

}  // namespace

class Server::Impl {
 public:
  explicit Impl(const ServerOptions& o)
      : o_(o), patching_(PatchOptionsOf(o)), models_(o_) {}

  static PatchingOptions PatchOptionsOf(const ServerOptions& o) {
    PatchingOptions p = o.patching;
    if (p.threads == 0) p.threads = o.engine.threads;
    return p;
  }

  // Registers every route family on both listeners, in matching order.
  void Register();

  ServerOptions o_;
  Patching patching_;
  // The routes are registered on both listeners (transport.h); the ones
  // server.transport names are bound.
  HttpListeners http_;
  bool use_tcp_ = true, use_unix_ = false;
  UnixSocketFile unix_socket_;
  std::unique_ptr<ExperimentRoutes> experiments_;
  // persistence.auto_persist: the generation routes' experiments, written
  // on its own thread (null when off). Declared after experiments_: it is
  // destroyed first, writing what is queued into the store.
  std::unique_ptr<ExperimentRecorder> recorder_;
  GpuSelection gpu_selection_;
  routes::ModelRegistry models_;
  std::atomic<bool> draining_{false};
  routes::RequestCounts requests_;
  std::unique_ptr<SaeSet> saes_;  // ServerOptions::saes, loaded by Create
  Clock::time_point started_ = Clock::now();
  int listen_socket_ = -1;
  // What the routes' handlers hold (made by Register()).
  std::unique_ptr<routes::ServerContext> ctx_;
};

void Server::Impl::Register() {
  ctx_ = std::make_unique<routes::ServerContext>(routes::ServerContext{
      o_, models_, patching_, *experiments_, recorder_.get(), gpu_selection_,
      requests_, *saes_, draining_, started_});
  routes::ServerContext& ctx = *ctx_;
  // cpp-httplib tries a method's routes in the order they were registered
  // and takes the first whose pattern matches the whole path.
  routes::RegisterModelRoutes(http_, ctx);        // /health, /models*
  routes::RegisterGenerateRoutes(http_, ctx);     // /generate*, /v1/generate
  routes::RegisterEmbedRoutes(http_, ctx);        // /embed, /embed/batch
  routes::RegisterChatRoutes(http_, ctx);         // /v1/chat/completions
  routes::RegisterOpenAiRoutes(http_, ctx);       // /v1/models*, completions...
  routes::RegisterStatusRoutes(http_, ctx);       // /gpu/status, /metrics
  routes::RegisterAnalyzeRoutes(http_, ctx);      // /analyze*
  routes::RegisterPatchingRoutes(http_, ctx);     // /api/patching/*
  routes::RegisterExperimentRoutes(http_, ctx);   // /experiments*
  routes::RegisterLoaderRoutes(http_, ctx);       // /loaders*, /gpu/configure
  routes::RegisterActivationRoutes(http_, ctx);   // /v1/activation/*
  routes::RegisterNeuronpediaRoutes(http_, ctx);  // /v1/tokenize, ...
  routes::RegisterSteerRoutes(http_, ctx);        // /v1/steer/*
  routes::RegisterLensRoutes(http_, ctx);         // /v1/lens/prompt
  routes::RegisterAttributeRoutes(http_, ctx);    // /v1/attribute
  // Last (routes match in order): any other POST: its body is read as a JSON
  // route's (the library's own reading would answer a form body over 8 KiB
  // with 413), then 404.
  http_.Post(".*", [&ctx](const httplib::Request& req, httplib::Response& res,
                          const httplib::ContentReader& reader) {
    std::string body;
    if (routes::ReadBody(ctx.options, req, reader, res, &body))
      routes::Reply(
          res, 404,
          routes::ErrorJson(req.path, 404,
                            "no route " + req.method + " " + req.path));
  });
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  Stop();
  for (const auto& e : impl_->models_.Engines()) e->Shutdown(true);
}

StatusOr<std::unique_ptr<Server>> Server::Create(const ServerOptions& o) {
  if (o.max_body_bytes <= 0 || o.max_analysis_body_bytes <= 0 ||
      o.max_loaded < 1 || o.max_batch_prompts < 1)
    return InvalidArgumentError(
        "serve: max_body_bytes, max_analysis_body_bytes, max_loaded and "
        "max_batch_prompts must be > 0");
  auto impl = std::make_unique<Impl>(o);
  Impl* p = impl.get();
  const size_t threads = o.threads > 0 ? static_cast<size_t>(o.threads)
                                       : static_cast<size_t>(std::min<int64_t>(
                                             o.engine.max_queue + 16, 512));
  if (o.transport != "http" && o.transport != "unix" && o.transport != "both")
    return InvalidArgumentError("serve: transport `" + o.transport +
                                "`: expected http, unix or both");
  p->use_tcp_ = o.transport != "unix";
  p->use_unix_ = o.transport != "http";
  ASSIGN_OR_RETURN(p->experiments_, ExperimentRoutes::Create(o.persistence));
  ASSIGN_OR_RETURN(p->saes_, SaeSet::Load(o.saes, "interp.saes"));
  // The models' engines capture the hooks the SAEs read where they have
  // them (a request naming an SAE a model lacks the hook of is its 400),
  // and the last hook_resid_post: the logit lens of the last layer
  // (/v1/lens/prompt; the lower layers': the next one's hook_resid_pre).
  p->o_.engine.optional_hooks = p->saes_->Hooks();
  p->o_.engine.optional_hooks.push_back("blocks.-1.hook_resid_post");
  if (p->experiments_->store() != nullptr && o.persistence.auto_persist)
    p->recorder_ =
        std::make_unique<ExperimentRecorder>(p->experiments_->store());
  // Both listeners get the same settings and routes; Bind() binds the ones
  // the transport names.
  for (httplib::Server* srv : {&p->http_.tcp, &p->http_.unix_socket}) {
    httplib::Server& h = *srv;
    h.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    // The largest route limit; ReadBody applies each route's own.
    h.set_payload_max_length(static_cast<size_t>(
        std::max(o.max_body_bytes, o.max_analysis_body_bytes)));
    // The library listens with a backlog of 5: a burst of clients would see
    // resets. Remember the listening socket (after setting the options the
    // library would have set) so that Bind() can listen again with a deep
    // backlog.
    if (&h == &p->http_.tcp) {
      h.set_socket_options([p](int sock) {
        int yes = 1;
        setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
        p->listen_socket_ = sock;
      });
    }
    h.set_keep_alive_timeout(5);
    h.set_read_timeout(30);
    h.set_write_timeout(30);
    h.set_pre_routing_handler([p](const httplib::Request& req,
                                  httplib::Response& res) {
      if (p->draining_ && req.path != "/health") {
        res.set_header("Retry-After", "5");
        routes::Reply(
            res, 503,
            routes::ErrorJson(req.path, 503, "the server is shutting down"));
        return httplib::Server::HandlerResponse::Handled;
      }
      bool cors = false;
      if (!p->o_.cors_origins.empty()) {
        const std::string origin = req.get_header_value("Origin");
        for (const std::string& allowed : p->o_.cors_origins)
          if (allowed == "*" || allowed == origin) {
            res.set_header("Access-Control-Allow-Origin",
                           allowed == "*" ? "*" : origin);
            if (p->o_.cors_allow_credentials)
              res.set_header("Access-Control-Allow-Credentials", "true");
            cors = true;
            break;
          }
      }
      if (req.method == "OPTIONS") {  // CORS preflight: no token needed
        if (cors) {
          res.set_header("Access-Control-Allow-Methods",
                         "GET, POST, DELETE, OPTIONS");
          res.set_header("Access-Control-Allow-Headers",
                         "Authorization, Content-Type");
        }
        res.status = cors ? 204 : 404;
        return httplib::Server::HandlerResponse::Handled;
      }
      if (!p->o_.auth_token.empty() && req.path != "/health" &&
          !SameSecret(req.get_header_value("Authorization"),
                      "Bearer " + p->o_.auth_token)) {
        res.set_header("WWW-Authenticate", "Bearer");
        routes::Reply(res, 401,
                      routes::ErrorJson(req.path, 401,
                                        "missing or wrong bearer token "
                                        "(Authorization: Bearer <token>)"));
        return httplib::Server::HandlerResponse::Handled;
      }
      std::string why;
      if (const int status =
              routes::DeclaredLengthRefusal(p->o_, req, false, &why)) {
        res.set_header("Connection", "close");
        routes::Reply(res, status, routes::ErrorJson(req.path, status, why));
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    // A client waiting for "100 Continue" before it sends a body over the
    // route's limit gets its 413 instead, having sent nothing.
    h.set_expect_100_continue_handler([p](const httplib::Request& req,
                                          httplib::Response& res) {
      std::string why;
      const int status = routes::DeclaredLengthRefusal(p->o_, req, true, &why);
      if (status == 0) return 100;
      res.set_header("Connection", "close");
      routes::Reply(res, status, routes::ErrorJson(req.path, status, why));
      return status;
    });
    h.set_error_handler(
        [p](const httplib::Request& req, httplib::Response& res) {
          if (!res.body.empty()) return;  // a route's own error reply
          std::string msg = "HTTP " + std::to_string(res.status);
          if (res.status == 404)
            msg = "no route " + req.method + " " + req.path;
          if (res.status == 413) msg = routes::TooLarge(p->o_, req);
          routes::Reply(res, res.status,
                        routes::ErrorJson(req.path, res.status, msg));
        });
  }
  p->Register();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

StatusOr<std::string> Server::LoadModel(const std::string& name) {
  ASSIGN_OR_RETURN(auto e, impl_->models_.Load(name));
  return e->id();
}

Status Server::UnloadModel(const std::string& id) {
  return impl_->models_.Unload(id);
}

StatusOr<int> Server::Bind() {
  Impl& p = *impl_;
  const ServerOptions& o = p.o_;
  if (p.use_tcp_) {
    if (o.port == 0) {
      const int port = p.http_.tcp.bind_to_any_port(o.host);
      if (port <= 0)
        return IoError("cannot bind " + o.host +
                       " to a free port: " + BindFailure(o.host, 0));
      port_ = port;
    } else {
      if (!p.http_.tcp.bind_to_port(o.host, o.port))
        return IoError("cannot bind " + o.host + ":" + std::to_string(o.port) +
                       ": " + BindFailure(o.host, o.port));
      port_ = o.port;
    }
    if (p.listen_socket_ >= 0) ::listen(p.listen_socket_, SOMAXCONN);
  }
  if (p.use_unix_) {
    RETURN_IF_ERROR(p.unix_socket_.Listen(o.unix_socket));
    RETURN_IF_ERROR(p.unix_socket_.Attach(p.http_.unix_socket));
  }
  bound_ = true;
  return port_;
}

Status Server::Run() {
  if (!bound_) return FailedPreconditionError("serve: Bind() first");
  std::vector<httplib::Server*> servers;
  if (impl_->use_tcp_) servers.push_back(&impl_->http_.tcp);
  if (impl_->use_unix_) servers.push_back(&impl_->http_.unix_socket);
  // Stop() may come before the listeners run (a signal during start-up):
  // a watcher stops each listener once it runs, and after
  // shutdown_timeout_seconds of draining ends what is still running.
  std::atomic<bool> listening_done{false};
  std::thread watcher([this, &listening_done, &servers] {
    std::vector<bool> stopped(servers.size(), false);
    bool cut = false;
    Clock::time_point since{};
    while (!listening_done.load()) {
      if (impl_->draining_) {
        if (since == Clock::time_point{}) since = Clock::now();
        for (size_t i = 0; i < servers.size(); ++i) {
          if (!stopped[i] && servers[i]->is_running()) {
            servers[i]->stop();
            stopped[i] = true;
          }
        }
        if (!cut &&
            Clock::now() - since >
                std::chrono::seconds(impl_->o_.shutdown_timeout_seconds)) {
          std::fprintf(stderr,
                       "loom serve: shutdown_timeout_seconds passed: ending "
                       "the requests still running\n");
          for (const auto& e : impl_->models_.Engines()) e->Shutdown(false);
          cut = true;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  // transport both: the unix socket's listener on a thread of its own.
  std::atomic<bool> ok{true};
  std::vector<std::thread> others;
  for (size_t i = 1; i < servers.size(); ++i)
    others.emplace_back([&ok, s = servers[i]] {
      if (!s->listen_after_bind()) ok = false;
    });
  if (!servers[0]->listen_after_bind()) ok = false;
  // One listener ending ends the others (the watcher stops them, even one
  // that has not started yet).
  const bool stopping = impl_->draining_;
  impl_->draining_ = true;
  for (std::thread& t : others) t.join();
  listening_done = true;
  watcher.join();
  // listen returns once the workers have finished their requests.
  for (const auto& e : impl_->models_.Engines()) e->Shutdown(true);
  impl_->unix_socket_.Remove();
  if (!ok && !stopping) return IoError("the HTTP server stopped unexpectedly");
  return Status();
}

void Server::Stop() {
  impl_->draining_ = true;
  impl_->http_.tcp.stop();
  impl_->http_.unix_socket.stop();
}

}  // namespace loom::serve
