#include "src/serve/server.h"

#include <httplib.h>
#include <netdb.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <set>
#include <thread>

#include "src/core/json_int.h"
#include "src/eval/generate.h"
#include "src/io/safetensors.h"
#include "src/model/registry.h"
#include "src/plan/kv_layout.h"
#include "src/serve/api.h"
#include "src/serve/binary_response.h"
#include "src/serve/experiment_recorder.h"
#include "src/serve/loaders.h"
#include "src/serve/theloom_analysis.h"
#include "src/serve/transport.h"

namespace loom::serve {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string Fmt(double x) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.17g", x);
  return b;
}

// Host memory in bytes (the device of a CPU engine).
int64_t HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<int64_t>(pages) * size : 0;
}

// A model name relative to a models directory: letters, digits, '.', '_',
// '-', '/' separating non-empty parts, none "." or "..".
bool SafeName(std::string_view id) {
  if (id.empty() || id.size() > 256 || id.front() == '/' || id.back() == '/')
    return false;
  size_t start = 0;
  while (start <= id.size()) {
    size_t end = id.find('/', start);
    if (end == std::string_view::npos) end = id.size();
    const std::string_view part = id.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    for (char c : part)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' &&
          c != '_' && c != '-')
        return false;
    start = end + 1;
  }
  return true;
}

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

std::string Dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The error body of a reply on `path`: OpenAI's error object on the OpenAI
// routes (/v1/...), else FastAPI's detail with the OpenAI fields beside.
json ErrorJson(std::string_view path, int status, std::string_view message) {
  return path.rfind("/v1/", 0) == 0 ? OpenAiErrorBody(status, message)
                                    : ErrorBody(status, message);
}

// What a stream sends: /generate/stream's events, TheLoom's chat events, or
// OpenAI's chunks of a chat or a completion.
enum class StreamKind {
  kGenerate,
  kTheLoomChat,
  kOpenAiChat,
  kOpenAiCompletion
};

bool IsOpenAi(StreamKind k) {
  return k == StreamKind::kOpenAiChat || k == StreamKind::kOpenAiCompletion;
}

// The id, creation time and model every OpenAI chunk of a stream repeats.
struct StreamIds {
  std::string id;
  int64_t created = 0;
  std::string model;
};

// OpenAI's finish_reason of a generation's stop_reason.
std::string FinishReason(const std::string& stop_reason) {
  return stop_reason == "max_tokens" || stop_reason == "context" ? "length"
                                                                 : "stop";
}

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

// Whether an Accept header names text/event-stream (any case).
bool AcceptsEventStream(std::string accept) {
  for (char& c : accept) c = static_cast<char>(std::tolower(c));
  return accept.find("text/event-stream") != std::string::npos;
}

// An OpenAI field Loom does not implement, present with a value other than
// its default: 400 naming the field, the value and what Loom does.
Status RefuseOpenAiField(const json& b, const char* field, const json& def,
                         const char* why) {
  if (!b.contains(field) || b[field].is_null() || b[field] == def)
    return Status();
  return InvalidArgumentError("field `" + std::string(field) + "`: " + why +
                              "; only " + Dump(def) + " is accepted, got " +
                              Dump(b[field]));
}

// What a generation request asks for, parsed once.
struct GenFields {
  GenRequest request;
  // temperature and top_p as given (or their defaults), before request's
  // sampling narrows them to float.
  double temperature = 0.0, top_p = 1.0;
  // TheLoom's hidden_state_layers: key (as requested) -> hook.
  std::vector<std::pair<std::string, HookPoint>> layers;
  // Loom's hooks + selectors.
  std::vector<HookPoint> hooks;
  std::vector<RowSelector> selectors;
  // return_attention: key (as requested in hidden_state_layers) -> block.
  std::vector<std::pair<std::string, int64_t>> attention;
  bool return_attention = false;
  bool return_hidden = true;
  bool full_sequence = false;
  ArrayFormat format = ArrayFormat::kList;
  DType dtype = DType::kF32;
};

// Submits every request of `fields` to `e` at once (they share forwards);
// on a refusal the tickets already taken are cancelled and the error names
// the prompt.
StatusOr<std::vector<std::shared_ptr<Ticket>>> SubmitAll(
    Engine& e, const std::vector<GenFields>& fields) {
  std::vector<std::shared_ptr<Ticket>> tickets;
  for (size_t i = 0; i < fields.size(); ++i) {
    StatusOr<std::shared_ptr<Ticket>> t = e.Submit(fields[i].request);
    if (!t.ok()) {
      for (auto& s : tickets) s->Cancel();
      return t.status().WithContext("prompt " + std::to_string(i));
    }
    tickets.push_back(*t);
  }
  return tickets;
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
  explicit Impl(const ServerOptions& o) : o_(o), patching_(PatchOptionsOf(o)) {}

  static PatchingOptions PatchOptionsOf(const ServerOptions& o) {
    PatchingOptions p = o.patching;
    if (p.threads == 0) p.threads = o.engine.threads;
    return p;
  }

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
  std::mutex load_mu_;    // serializes loads (held while a model loads)
  std::mutex models_mu_;  // guards models_ (never held while loading)
  std::map<std::string, std::shared_ptr<Engine>> models_;
  std::map<std::string, Clock::time_point> last_used_;  // by model id
  std::map<std::string, int64_t> loaded_at_;  // Unix seconds, by model id
  std::atomic<bool> draining_{false};
  std::mutex metrics_mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;  // route, code
  int64_t models_loaded_total_ = 0;
  Clock::time_point started_ = Clock::now();
  int listen_socket_ = -1;

  // ---- Models

  StatusOr<std::string> Resolve(const std::string& name, std::string* dir) {
    for (const std::string& p : o_.model_paths) {
      fs::path path = fs::path(p).lexically_normal();
      if (path.filename().empty()) path = path.parent_path();  // "dir/"
      if (name == p || name == path.string() ||
          name == path.filename().string()) {
        *dir = path.string();
        return path.filename().string();
      }
    }
    if (!SafeName(name))
      return InvalidArgumentError(
          "model `" + name +
          "`: a model id is a name relative to a configured models directory "
          "(letters, digits, '.', '_', '-', '/'; no absolute path, no '..')");
    for (const std::string& root : o_.model_dirs) {
      std::error_code ec;
      const fs::path base = fs::weakly_canonical(root, ec);
      if (ec) continue;
      const fs::path candidate = fs::weakly_canonical(base / name, ec);
      if (ec) continue;
      const std::string b = base.string() + "/";
      if (candidate.string().compare(0, b.size(), b) != 0) continue;
      if (fs::exists(candidate / "config.json", ec)) {
        *dir = candidate.string();
        return name;
      }
    }
    return NotFoundError("model `" + name +
                         "` not found: not a loaded model, not the --model "
                         "directory, and not under models.dirs");
  }

  std::shared_ptr<Engine> Find(const std::string& id) {
    std::lock_guard<std::mutex> lock(models_mu_);
    const auto it = models_.find(id);
    if (it == models_.end()) return nullptr;
    last_used_[id] = Clock::now();
    return it->second;
  }

  // Makes room for one more model under models.max_loaded, as TheLoom does:
  // the least recently used model with nothing queued or running is
  // unloaded. FailedPrecondition when every loaded model is busy.
  Status MakeRoom(const std::string& id) {
    std::shared_ptr<Engine> victim;
    {
      std::lock_guard<std::mutex> lock(models_mu_);
      if (static_cast<int>(models_.size()) < o_.max_loaded) return Status();
      Clock::time_point oldest = Clock::time_point::max();
      for (const auto& [name, e] : models_) {
        const EngineStats st = e->Stats();
        if (st.active > 0 || st.queued > 0) continue;
        if (last_used_[name] < oldest) {
          oldest = last_used_[name];
          victim = e;
        }
      }
      if (victim == nullptr)
        return FailedPreconditionError(
            "cannot load `" + id +
            "`: models.max_loaded = " + std::to_string(o_.max_loaded) +
            " models are loaded and every one is busy");
      models_.erase(victim->id());
      last_used_.erase(victim->id());
    }
    std::fprintf(stderr,
                 "loom serve: unloading %s (least recently used) to load %s\n",
                 victim->id().c_str(), id.c_str());
    victim->Shutdown(true);
    return Status();
  }

  StatusOr<std::shared_ptr<Engine>> Load(const std::string& name) {
    if (auto e = Find(name)) return e;
    std::lock_guard<std::mutex> load_lock(load_mu_);
    std::string dir;
    ASSIGN_OR_RETURN(std::string id, Resolve(name, &dir));
    if (auto e = Find(id)) return e;
    RETURN_IF_ERROR(MakeRoom(id));
    const int64_t capacity = static_cast<int64_t>(
        static_cast<double>(HostMemoryBytes()) * o_.memory_fraction);
    // Refused before anything is allocated when the model's plan (its host
    // bytes and the capture budget) does not fit beside the loaded ones.
    EngineOptions eo = o_.engine;
    eo.admit = [&](const MemoryPlan& plan) -> Status {
      const int64_t need = PlannedHostBytes(plan) + eo.capture_bytes;
      int64_t committed = need;
      for (const auto& m : Engines()) committed += m->Memory().planned();
      if (capacity > 0 && committed > capacity)
        return ResourceExhaustedError(
            "cannot load `" + id + "`: its plan needs " + std::to_string(need) +
            " bytes on the host; with the loaded models " +
            std::to_string(committed) + " bytes, more than " +
            std::to_string(capacity) + " (host memory x gpu.memory_fraction)");
      return Status();
    };
    ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::Create(id, dir, eo));
    // Admission of the model itself: what is planned for every loaded model
    // must fit the host's memory x memory_fraction.
    int64_t committed = e->Memory().planned();
    for (const auto& m : Engines()) committed += m->Memory().planned();
    if (capacity > 0 && committed > capacity)
      return ResourceExhaustedError(
          "cannot load `" + id + "`: the loaded models would plan " +
          std::to_string(committed) + " bytes, more than " +
          std::to_string(capacity) + " (host memory x gpu.memory_fraction)");
    if (capacity > 0 &&
        static_cast<double>(committed) > o_.memory_warning_threshold * capacity)
      std::fprintf(stderr,
                   "loom serve: warning: planned memory %lld bytes is above "
                   "memory_warning_threshold %.2f of %lld bytes\n",
                   static_cast<long long>(committed),
                   o_.memory_warning_threshold,
                   static_cast<long long>(capacity));
    std::shared_ptr<Engine> shared(std::move(e));
    {
      std::lock_guard<std::mutex> lock(models_mu_);
      models_[id] = shared;
      last_used_[id] = Clock::now();
      loaded_at_[id] = std::time(nullptr);
      ++models_loaded_total_;
    }
    std::fprintf(stderr, "loom serve: loaded %s from %s (%.2f s)\n", id.c_str(),
                 dir.c_str(), shared->load_seconds());
    return shared;
  }

  Status Unload(const std::string& id) {
    std::shared_ptr<Engine> e;
    {
      std::lock_guard<std::mutex> lock(models_mu_);
      const auto it = models_.find(id);
      if (it == models_.end())
        return NotFoundError("model `" + id + "` is not loaded");
      e = it->second;
      models_.erase(it);
      last_used_.erase(id);
    }
    e->Shutdown(true);  // in-flight requests finish first
    return Status();
  }

  // The engine a request names (`model`), or the only one loaded.
  StatusOr<std::shared_ptr<Engine>> EngineFor(const json& body) {
    ASSIGN_OR_RETURN(std::string name, GetString(body, "model", ""));
    if (name.empty()) {
      // Missing, null or "" (Weaver's agents without a model send ""): the
      // only loaded model.
      std::lock_guard<std::mutex> lock(models_mu_);
      if (models_.size() == 1) return models_.begin()->second;
      std::string loaded;
      for (const auto& [id, _] : models_)
        loaded += (loaded.empty() ? "" : ", ") + id;
      return InvalidArgumentError(
          models_.empty()
              ? "field `model` is empty or missing and no model is loaded: "
                "name one"
              : "field `model` is empty or missing and " +
                    std::to_string(models_.size()) + " models are loaded (" +
                    loaded + "): name one of them");
    }
    return Load(name);
  }

  // ---- Requests

  StatusOr<std::vector<int32_t>> Tokens(const Engine& e, const json& prompt,
                                        bool add_special,
                                        const std::string& field = "prompt") {
    std::vector<int32_t> ids;
    if (prompt.is_string()) {
      // Refused as `loom extract` refuses an empty text row (and Python an
      // empty prompt), though BOS alone would give a token.
      if (prompt.get_ref<const std::string&>().empty())
        return InvalidArgumentError("field `" + field + "`: empty text");
      ASSIGN_OR_RETURN(
          tok::Encoding enc,
          e.tokenizer().Encode(prompt.get<std::string>(), add_special));
      ids = std::move(enc.ids);
    } else if (prompt.is_array()) {
      for (const json& t : prompt) {
        if (!t.is_number_integer())
          return InvalidArgumentError(
              "field `" + field +
              "`: expected a string or a list of token ids, got "
              "an element " +
              Dump(t));
        const int64_t v = JsonInt64(t).value_or(-1);
        if (v < 0 || v >= e.model().config().vocab_size)
          return InvalidArgumentError(
              "field `" + field + "`: token id " + Dump(t) +
              " outside the vocabulary [0, " +
              std::to_string(e.model().config().vocab_size) + ")");
        ids.push_back(static_cast<int32_t>(v));
      }
    } else {
      return InvalidArgumentError(
          "field `" + field +
          "`: expected a string or a list of token ids, got " +
          std::string(prompt.type_name()));
    }
    if (ids.empty())
      return InvalidArgumentError("field `" + field + "` has no tokens");
    const int64_t limit = o_.max_prompt_tokens > 0
                              ? std::min(o_.max_prompt_tokens, e.context())
                              : e.context();
    if (static_cast<int64_t>(ids.size()) > limit)
      return InvalidArgumentError(
          "the prompt has " + std::to_string(ids.size()) +
          " tokens, more than the limit of " + std::to_string(limit) +
          (o_.max_prompt_tokens > 0 ? " (server.max_prompt_tokens)"
                                    : " (the serving context)"));
    return ids;
  }

  StatusOr<GenFields> ParseGen(const Engine& e, const json& b,
                               std::vector<int32_t> prompt, bool chat) {
    GenFields f;
    GenRequest& r = f.request;
    r.prompt = std::move(prompt);
    ASSIGN_OR_RETURN(r.max_new_tokens, GetInt(b, "max_tokens", 256, 0, 8192));
    ASSIGN_OR_RETURN(
        double t, GetNumber(b, "temperature", 0.7, 0.0, eval::kMaxTemperature));
    ASSIGN_OR_RETURN(double p,
                     GetNumber(b, "top_p", chat ? 1.0 : 0.9, 0.0, 1.0));
    if (p == 0.0)
      return InvalidArgumentError(
          "field `top_p`: expected a number in (0, 1], got 0");
    ASSIGN_OR_RETURN(r.sampling.top_k, GetInt(b, "top_k", 0, 0, 1 << 30));
    ASSIGN_OR_RETURN(int64_t seed, GetInt(b, "seed", 0, 0,
                                          std::numeric_limits<int64_t>::max()));
    f.temperature = t;
    f.top_p = p;
    r.sampling.temperature = static_cast<float>(t);
    r.sampling.top_p = static_cast<float>(p);
    r.sampling.seed = static_cast<uint64_t>(seed);
    ASSIGN_OR_RETURN(r.stop_strings, GetStrings(b, "stop"));
    r.stop_ids = e.stop_ids();
    ASSIGN_OR_RETURN(bool ignore_eos, GetBool(b, "ignore_eos", false));
    if (ignore_eos) r.stop_ids.clear();
    ASSIGN_OR_RETURN(f.return_hidden, GetBool(b, "return_hidden_states", true));
    ASSIGN_OR_RETURN(f.full_sequence,
                     GetBool(b, "return_full_sequence", false));
    ASSIGN_OR_RETURN(f.return_attention, GetBool(b, "return_attention", false));
    ASSIGN_OR_RETURN(std::string fmt,
                     GetString(b, "hidden_state_format", "list"));
    ASSIGN_OR_RETURN(f.format, ParseArrayFormat(fmt));
    f.dtype = o_.hidden_dtype;
    ASSIGN_OR_RETURN(std::string dtype_name,
                     GetString(b, "hidden_state_dtype", ""));
    if (!dtype_name.empty()) {
      ASSIGN_OR_RETURN(f.dtype, ParseReturnDType(dtype_name));
    }
    // Layers: a list of ints, one int, or "all" (TheLoom: -n .. -1).
    std::vector<int64_t> layers = o_.default_layers;
    const int64_t n = e.model().config().num_layers;
    if (b.contains("hidden_state_layers") &&
        !b["hidden_state_layers"].is_null()) {
      const json& l = b["hidden_state_layers"];
      layers.clear();
      if (l.is_string() && l.get<std::string>() == "all") {
        for (int64_t i = -n; i <= -1; ++i) layers.push_back(i);
      } else if (JsonInt64(l)) {
        layers.push_back(*JsonInt64(l));
      } else if (l.is_array()) {
        for (const json& x : l) {
          const std::optional<int64_t> layer = JsonInt64(x);
          if (!layer)
            return InvalidArgumentError(
                "field `hidden_state_layers`: expected integers or \"all\", "
                "got " +
                Dump(l));
          layers.push_back(*layer);
        }
      } else {
        return InvalidArgumentError(
            "field `hidden_state_layers`: expected integers or \"all\", got " +
            Dump(l));
      }
    }
    if (f.return_hidden)
      for (int64_t l : layers) {
        ASSIGN_OR_RETURN(HookPoint h, e.LayerHook(l));
        f.layers.emplace_back(std::to_string(l), h);
      }
    // TheLoom's attention keys: the same layer list; index i >= 0 is block
    // i, i < 0 block n + i (so -1 is the last block, as for hidden states).
    if (f.return_attention)
      for (int64_t l : layers) {
        const int64_t block = l < 0 ? n + l : l;
        if (block < 0 || block >= n)
          return InvalidArgumentError(
              "return_attention: layer " + std::to_string(l) +
              " of hidden_state_layers is outside [" + std::to_string(-n) +
              ", " + std::to_string(n - 1) +
              "]: attention layer i >= 0 is "
              "block i, i < 0 is block " +
              std::to_string(n) + " + i");
        f.attention.emplace_back(std::to_string(l), block);
        auto& blocks = r.attention_layers;
        if (std::find(blocks.begin(), blocks.end(), block) == blocks.end())
          blocks.push_back(block);
      }
    ASSIGN_OR_RETURN(std::vector<std::string> hooks, GetStrings(b, "hooks"));
    if (!hooks.empty()) {
      ASSIGN_OR_RETURN(HookSet set,
                       ResolveHooks(hooks, {}, e.model().config()));
      f.hooks = set.hooks();
      ASSIGN_OR_RETURN(std::vector<std::string> sel, GetStrings(b, "select"));
      if (sel.empty()) sel = {"last"};
      for (const std::string& s : sel) {
        ASSIGN_OR_RETURN(RowSelector rs, ParseRowSelector(s));
        f.selectors.push_back(rs);
      }
    }
    bool all_rows = f.full_sequence;
    for (const RowSelector& s : f.selectors)
      all_rows |= s.kind != RowSelector::Kind::kLast;
    r.rows = all_rows ? CaptureRows::kAll : CaptureRows::kLast;
    for (const auto& [_, h] : f.layers)
      if (std::find(r.hooks.begin(), r.hooks.end(), h) == r.hooks.end())
        r.hooks.push_back(h);
    for (const HookPoint& h : f.hooks)
      if (std::find(r.hooks.begin(), r.hooks.end(), h) == r.hooks.end())
        r.hooks.push_back(h);
    return f;
  }

  // The request's `interventions` for `prompts` prompts, parsed once.
  StatusOr<RequestInterventions> Interventions(const Engine& e, const json& b,
                                               int64_t prompts) {
    return ParseRequestInterventions(b, e.model().config(), prompts,
                                     o_.max_intervention_floats);
  }

  // Gives prompt `row` of a request its interventions.
  static Status Attach(const RequestInterventions& ivs, int64_t row,
                       GenRequest* r) {
    if (ivs.list.empty()) return Status();
    ASSIGN_OR_RETURN(r->interventions,
                     InterventionsForPrompt(
                         ivs, row, static_cast<int64_t>(r->prompt.size())));
    return Status();
  }

  // The capture of `hook` in a result: [rows, width].
  static const float* Capture(const GenFields& f, const GenResult& g,
                              const HookPoint& hook, int64_t* width) {
    const auto& hooks = f.request.hooks;
    const size_t i = static_cast<size_t>(
        std::find(hooks.begin(), hooks.end(), hook) - hooks.begin());
    *width = g.widths[i];
    return g.captures[i].data();
  }

  // TheLoom's attention_weights: {key: {data (flat), shape [1, heads, keys],
  // dtype}} in the request's array format and dtype; null for no layers.
  static json AttentionWeights(const GenFields& f, const GenResult& g) {
    if (f.attention.empty()) return nullptr;
    json out = json::object();
    const auto& blocks = f.request.attention_layers;
    for (const auto& [key, block] : f.attention) {
      const size_t i = static_cast<size_t>(
          std::find(blocks.begin(), blocks.end(), block) - blocks.begin());
      if (i >= g.attention_heads.size()) continue;  // nothing was fed
      const int64_t heads = g.attention_heads[i];
      json a = EncodeArray(g.attention[i].data(), 1, heads * g.attention_keys,
                           true, f.dtype, f.format);
      a["shape"] = {1, heads, g.attention_keys};
      out[key] = std::move(a);
    }
    return out;
  }

  // TheLoom's generation response, plus Loom's fields; without `arrays`,
  // the fields beside the arrays (a binary reply's metadata).
  StatusOr<json> GenResponse(const Engine& e, const GenFields& f,
                             const GenResult& g, bool arrays = true) {
    json j;
    j["text"] = g.text;
    j["token_count"] = g.token_ids.size();
    j["token_ids"] = g.token_ids;
    j["stop_reason"] = g.stop_reason;
    if (!arrays) {
      if (!f.hooks.empty()) j["activation_rows"] = g.rows;
    } else if (f.return_hidden) {
      json hs = json::object(), seq = json::object();
      for (const auto& [key, hook] : f.layers) {
        int64_t w = 0;
        const float* rows = Capture(f, g, hook, &w);
        hs[key] =
            EncodeArray(rows + (g.rows - 1) * w, 1, w, true, f.dtype, f.format);
        if (f.full_sequence) {
          const int64_t first = static_cast<int64_t>(g.prompt_ids.size()) - 1;
          const int64_t count =
              std::min<int64_t>(std::max<int64_t>(g.rows - first, 0),
                                static_cast<int64_t>(g.token_ids.size()));
          seq[key] =
              EncodeArray(rows + first * w, count, w, false, f.dtype, f.format);
        }
      }
      j["hidden_states"] = std::move(hs);
      if (f.full_sequence) j["sequence_hidden_states"] = std::move(seq);
    }
    if (f.return_attention && arrays)
      j["attention_weights"] = AttentionWeights(f, g);
    if (!f.hooks.empty() && arrays) {
      json acts = json::object();
      for (const HookPoint& h : f.hooks) {
        int64_t w = 0;
        const float* rows = Capture(f, g, h, &w);
        json per = json::object();
        for (const RowSelector& s : f.selectors) {
          int64_t k = 0;
          ASSIGN_OR_RETURN(std::vector<float> sel,
                           SelectRows(s, rows, g.rows, w, &k));
          per[s.spec] = EncodeArray(sel.data(), k, w, false, f.dtype, f.format);
        }
        acts[HookName(h)] = std::move(per);
      }
      j["activations"] = std::move(acts);
      j["activation_rows"] = g.rows;
    }
    const double seconds = (g.queue_ms + g.run_ms) / 1000.0;
    j["metadata"] = {{"model", e.id()},
                     {"input_tokens", g.prompt_ids.size()},
                     {"output_tokens", g.token_ids.size()},
                     {"inference_time_ms", g.queue_ms + g.run_ms},
                     {"queue_time_ms", g.queue_ms},
                     {"tokens_per_second",
                      g.run_ms > 0 ? static_cast<double>(g.token_ids.size()) /
                                         (g.run_ms / 1000.0)
                                   : 0.0},
                     {"total_seconds", seconds}};
    return j;
  }

  // ---- Recording generations (persistence.auto_persist)

  // Whether a request is recorded: auto_persist on and the body's `persist`
  // (default true; a non-boolean is a 400 either way).
  StatusOr<bool> Persisting(const json& b) {
    ASSIGN_OR_RETURN(bool persist, GetBool(b, "persist", true));
    return persist && recorder_ != nullptr;
  }

  // A plain prompt as a conversation message: its text, or the JSON list of
  // its token ids.
  static std::vector<ExperimentRecord::Message> PromptInput(const json& p) {
    return {{"user", p.is_string() ? p.get<std::string>() : Dump(p)}};
  }

  // An experiment's config: the request's fields but its inputs (prompt,
  // prompts, messages), `persist` and the interventions' vectors (their
  // count instead), with the generation parameters as they were applied
  // (defaults included).
  static json PersistConfig(const std::string& route, const json& b,
                            const GenFields& f) {
    json c = json::object();
    for (const auto& [k, v] : b.items())
      if (k != "prompt" && k != "prompts" && k != "messages" &&
          k != "persist" && k != "interventions")
        c[k] = v;
    if (b.contains("interventions") && b["interventions"].is_array())
      c["interventions"] = b["interventions"].size();
    const GenRequest& r = f.request;
    c["route"] = route;
    c["max_tokens"] = r.max_new_tokens;
    c["temperature"] = f.temperature;
    c["top_p"] = f.top_p;
    c["top_k"] = r.sampling.top_k;
    c["seed"] = r.sampling.seed;
    c["stop"] = r.stop_strings;
    c["return_hidden_states"] = f.return_hidden;
    json layers = json::array();
    for (const auto& [key, _] : f.layers) layers.push_back(std::stoll(key));
    c["hidden_state_layers"] = layers;
    c["return_full_sequence"] = f.full_sequence;
    c["return_attention"] = f.return_attention;
    c["hidden_state_format"] =
        f.format == ArrayFormat::kBase64 ? "base64" : "list";
    c["hidden_state_dtype"] = ReturnDTypeName(f.dtype);
    return c;
  }

  // The experiment of one generation: `input` then the reply, the token
  // counts and speed, and the hidden states the reply returned (the last
  // position of each layer as [hidden]; with `sequence`, each layer's
  // sequence_hidden_states as [tokens, hidden]). `done` is how the request
  // ended: failed (its message in the notes) unless ok.
  ExperimentRecord Record(const Engine& e, const std::string& route,
                          const json& b, const GenFields& f, bool chat,
                          std::vector<ExperimentRecord::Message> input,
                          const StatusOr<GenResult>& g, const Status& done) {
    ExperimentRecord r;
    r.model = e.id();
    r.config = PersistConfig(route, b, f);
    r.conversations = std::move(input);
    if (!done.ok() || !g.ok()) {
      r.status = "failed";
      r.notes = (done.ok() ? g.status() : done).message();
      return r;
    }
    r.conversations.push_back({"assistant", g->text});
    const double tokens = static_cast<double>(g->token_ids.size());
    r.metrics = {
        {"prompt_tokens", static_cast<double>(g->prompt_ids.size()), "tokens"},
        {"completion_tokens", tokens, "tokens"},
        {"latency_ms", g->queue_ms + g->run_ms, "ms"},
        {"tokens_per_second",
         g->run_ms > 0 ? tokens / (g->run_ms / 1000.0) : 0.0, "tokens/s"}};
    if (!f.return_hidden) return r;
    for (const auto& [key, hook] : f.layers) {
      int64_t w = 0;
      const float* rows = Capture(f, *g, hook, &w);
      const float* last = rows + (g->rows - 1) * w;
      r.hidden_states.push_back(
          {std::stoll(key), f.dtype, Shape({w}), {last, last + w}});
    }
    if (f.full_sequence && !chat)
      for (const auto& [key, hook] : f.layers) {
        int64_t w = 0;
        const float* rows = Capture(f, *g, hook, &w);
        const int64_t first = static_cast<int64_t>(g->prompt_ids.size()) - 1;
        const int64_t count =
            std::min<int64_t>(std::max<int64_t>(g->rows - first, 0),
                              static_cast<int64_t>(g->token_ids.size()));
        if (count <= 0) continue;
        r.hidden_states.push_back(
            {std::stoll(key),
             f.dtype,
             Shape({count, w}),
             {rows + first * w, rows + (first + count) * w}});
      }
    return r;
  }

  // Hands a record to the writer thread (never blocks on the store).
  void Persist(ExperimentRecord r) {
    if (recorder_ != nullptr) recorder_->Submit(std::move(r));
  }

  // ---- HTTP plumbing

  void Reply(httplib::Response& res, int status, const json& body) {
    res.status = status;
    res.set_content(Dump(body), "application/json");
  }
  // An error reply on `path` (OpenAI's error object on /v1/ routes).
  void ReplyError(httplib::Response& res, const Status& s,
                  std::string_view path) {
    const int code = HttpStatusOf(s);
    if (s.code() == StatusCode::kResourceExhausted)
      res.set_header("Retry-After", "1");
    Reply(res, code, ErrorJson(path, code, s.message()));
  }

  // The body format the request's Accept header asks for (binary replies of
  // /generate, /embed, /v1/embeddings); when it asks for none this route
  // answers, replies 406 and returns nullopt.
  std::optional<BodyFormat> Accepted(const httplib::Request& req,
                                     httplib::Response& res) {
    StatusOr<BodyFormat> f = NegotiateBody(req.get_header_value("Accept"));
    if (f.ok()) return *f;
    NotAcceptable(req, res, f.status().message()).IgnoreError();
    return std::nullopt;
  }
  Status NotAcceptable(const httplib::Request& req, httplib::Response& res,
                       std::string_view message) {
    Reply(res, 406, ErrorJson(req.path, 406, message));
    return Status();
  }
  // A binary reply (binary_response.h): npy or safetensors of `arrays` in
  // `dtype`, `rest` in the safetensors metadata; 406 when npy cannot hold
  // the arrays.
  Status ReplyBinary(const httplib::Request& req, httplib::Response& res,
                     BodyFormat format, const std::vector<BinaryArray>& arrays,
                     DType dtype, const json& rest) {
    StatusOr<std::string> body = BinaryBody(format, arrays, dtype, rest);
    if (!body.ok() && body.status().code() == StatusCode::kInvalidArgument)
      return NotAcceptable(req, res, body.status().message());
    if (!body.ok()) return body.status();
    res.status = 200;
    res.set_content(std::move(body).value(),
                    std::string(ContentTypeOf(format)));
    return Status();
  }
  // The dtype of a binary embedding reply: `hidden_state_dtype`, else
  // hidden_states.precision.
  StatusOr<DType> BinaryDType(const json& b) {
    ASSIGN_OR_RETURN(std::string name, GetString(b, "hidden_state_dtype", ""));
    if (name.empty()) return o_.hidden_dtype;
    return ParseReturnDType(name);
  }

  // The arrays of a generation reply, named as its JSON fields:
  // hidden_states.<layer>, sequence_hidden_states.<layer>,
  // activations.<hook>.<selector>, attention_weights.<layer>.
  static std::vector<std::string> GenArrayNames(const GenFields& f) {
    std::vector<std::string> names;
    if (f.return_hidden) {
      for (const auto& [key, _] : f.layers)
        names.push_back("hidden_states." + key);
      if (f.full_sequence)
        for (const auto& [key, _] : f.layers)
          names.push_back("sequence_hidden_states." + key);
    }
    for (const HookPoint& h : f.hooks)
      for (const RowSelector& s : f.selectors)
        names.push_back("activations." + HookName(h) + "." + s.spec);
    for (const auto& [key, _] : f.attention)
      names.push_back("attention_weights." + key);
    return names;
  }
  // The arrays of GenArrayNames (values in `g`, or in *storage), with the
  // shapes of the JSON reply.
  static StatusOr<std::vector<BinaryArray>> GenArrays(
      const GenFields& f, const GenResult& g,
      std::vector<std::vector<float>>* storage) {
    const std::vector<std::string> names = GenArrayNames(f);
    std::vector<BinaryArray> out;
    size_t next = 0;
    auto add = [&](std::vector<int64_t> shape, const float* values) {
      out.push_back({names[next++], std::move(shape), values});
    };
    if (f.return_hidden) {
      for (const auto& [_, hook] : f.layers) {
        int64_t w = 0;
        const float* rows = Capture(f, g, hook, &w);
        add({w}, rows + (g.rows - 1) * w);
      }
      if (f.full_sequence)
        for (const auto& [_, hook] : f.layers) {
          int64_t w = 0;
          const float* rows = Capture(f, g, hook, &w);
          const int64_t first = static_cast<int64_t>(g.prompt_ids.size()) - 1;
          const int64_t count =
              std::min<int64_t>(std::max<int64_t>(g.rows - first, 0),
                                static_cast<int64_t>(g.token_ids.size()));
          add({count, w}, rows + first * w);
        }
    }
    storage->reserve(f.hooks.size() * f.selectors.size());
    for (const HookPoint& h : f.hooks) {
      int64_t w = 0;
      const float* rows = Capture(f, g, h, &w);
      for (const RowSelector& s : f.selectors) {
        int64_t k = 0;
        ASSIGN_OR_RETURN(std::vector<float> sel,
                         SelectRows(s, rows, g.rows, w, &k));
        storage->push_back(std::move(sel));
        add({k, w}, storage->back().data());
      }
    }
    const auto& blocks = f.request.attention_layers;
    for (const auto& [_, block] : f.attention) {
      const size_t i = static_cast<size_t>(
          std::find(blocks.begin(), blocks.end(), block) - blocks.begin());
      if (i >= g.attention_heads.size())
        return InternalError("no attention rows were computed");
      add({1, g.attention_heads[i], g.attention_keys}, g.attention[i].data());
    }
    return out;
  }

  void Count(const std::string& route, int status) {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    ++requests_[{route, status}];
  }

  using Handler =
      std::function<Status(const httplib::Request&, httplib::Response&)>;
  // Wraps a route: errors become JSON error replies, every reply is counted.
  httplib::Server::Handler Route(const std::string& name, Handler h) {
    return
        [this, name, h](const httplib::Request& req, httplib::Response& res) {
          Status s;
          try {
            s = h(req, res);
          } catch (const std::exception& e) {
            s = InternalError(std::string("unexpected exception: ") + e.what());
          } catch (...) {
            s = InternalError("unexpected exception");
          }
          if (!s.ok()) ReplyError(res, s, name);
          Count(name, res.status);
        };
  }

  // Why a body was too large: the limit that fired, and the size when the
  // request declared it.
  std::string TooLarge(const httplib::Request& req) const {
    const auto [bytes, key] = BodyLimit(req.path);
    const std::string limit = key + " = " + std::to_string(bytes);
    if (!req.has_header("Content-Length"))
      return "request body larger than " + limit +
             " (a chunked body; reading stopped at the limit)";
    const std::string length = req.get_header_value("Content-Length");
    if (std::strtoull(length.c_str(), nullptr, 10) >
        static_cast<uint64_t>(bytes))
      return "request body of " + length + " bytes is larger than " + limit;
    // Only where the library reads the body itself (a route that is not
    // one of the JSON routes): it caps form bodies on its own.
    if (req.get_header_value("Content-Type")
            .rfind("application/x-www-form-urlencoded", 0) == 0)
      return "request body of " + length +
             " bytes is larger than the HTTP library's limit of " +
             std::to_string(CPPHTTPLIB_FORM_URL_ENCODED_PAYLOAD_MAX_LENGTH) +
             " bytes for application/x-www-form-urlencoded bodies on " +
             req.method + " " + req.path;
    return "request body of " + length + " bytes is too large";
  }

  // The body limit of a route and its configuration key: the analysis routes
  // of many vectors (TheLoom's /analyze/geometry and /analyze/bilateral)
  // have their own, server.max_analysis_body_bytes.
  std::pair<int64_t, std::string> BodyLimit(const std::string& path) const {
    if (path == "/analyze/geometry" || path == "/analyze/bilateral")
      return {o_.max_analysis_body_bytes, "server.max_analysis_body_bytes"};
    return {o_.max_body_bytes, "server.max_body_bytes"};
  }

  // A body's bytes against its route's limit. Past the limit the rest is
  // still read (and dropped) for up to 5 s: closing with unread bytes makes
  // the kernel send a reset, which can discard the 413 before a client that
  // is still sending reads it.
  struct BodyBudget {
    uint64_t limit;
    uint64_t seen = 0;
    std::chrono::steady_clock::time_point drain_end{};
    bool over() const { return seen > limit; }
    // Counts n more bytes; false when reading should stop.
    bool Take(size_t n) {
      seen += n;
      if (!over()) return true;
      const auto now = std::chrono::steady_clock::now();
      if (drain_end == std::chrono::steady_clock::time_point{})
        drain_end = now + std::chrono::seconds(5);
      return now < drain_end;
    }
  };

  // Reads the body of a JSON route into *body through the library's content
  // reader, whatever the Content-Type (curl -d sends
  // application/x-www-form-urlencoded, which the library's own reading caps
  // at 8 KiB and parses as a form); the route's BodyLimit is the one limit.
  // On failure replies (413, 415 or 400, JSON) and returns false.
  bool ReadBody(const httplib::Request& req,
                const httplib::ContentReader& reader, httplib::Response& res,
                std::string* body) {
    const uint64_t limit = static_cast<uint64_t>(BodyLimit(req.path).first);
    BodyBudget budget{limit};
    auto refuse = [&](int status, const std::string& message) {
      // The rest of the body may be unread: end the connection after this.
      res.set_header("Connection", "close");
      Reply(res, status, ErrorJson(req.path, status, message));
      return false;
    };
    if (req.is_multipart_form_data()) {
      // Drained (not kept) so that the reply reaches the client; the
      // library's multipart parser needs both callbacks.
      reader([](const httplib::MultipartFormData&) { return true; },
             [&](const char*, size_t n) { return budget.Take(n); });
      if (budget.over() || res.status == 413) return refuse(413, TooLarge(req));
      return refuse(415,
                    "multipart/form-data bodies are not accepted: the body "
                    "must be a JSON object (Content-Type: application/json)");
    }
    const std::string encoding = req.get_header_value("Transfer-Encoding");
    const bool chunked = strcasecmp(encoding.c_str(), "chunked") == 0;
    // No Content-Length and not chunked: an HTTP/1.1 request has no body
    // (the library would wait for the client to close the connection).
    if (!chunked && !req.has_header("Content-Length")) return true;
    // One allocation for a declared length within the limit (an 80 MB
    // analysis body is not regrown as it arrives).
    if (!chunked) {
      const uint64_t declared = std::strtoull(
          req.get_header_value("Content-Length").c_str(), nullptr, 10);
      if (declared <= limit) body->reserve(static_cast<size_t>(declared));
    }
    const bool read = reader([&](const char* data, size_t n) {
      if (!budget.Take(n)) return false;
      if (!budget.over()) {
        body->append(data, n);
      } else if (body->capacity() > 0) {
        std::string().swap(*body);  // dropped: only the 413 follows
      }
      return true;
    });
    if (budget.over() || res.status == 413) return refuse(413, TooLarge(req));
    if (read) return true;
    return refuse(400,
                  "the request body could not be read (the connection "
                  "closed or timed out, or a malformed chunked encoding)");
  }

  // A POST route whose body is JSON: read by ReadBody, then `h` runs on a
  // copy of the request holding it.
  httplib::Server::HandlerWithContentReader JsonRoute(const std::string& name,
                                                      Handler h) {
    httplib::Server::Handler route = Route(name, std::move(h));
    return
        [this, name, route](const httplib::Request& req, httplib::Response& res,
                            const httplib::ContentReader& reader) {
          httplib::Request with_body = req;
          if (!ReadBody(req, reader, res, &with_body.body)) {
            Count(name, res.status);
            return;
          }
          route(with_body, res);
        };
  }

  std::vector<std::shared_ptr<Engine>> Engines() {
    std::lock_guard<std::mutex> lock(models_mu_);
    std::vector<std::shared_ptr<Engine>> out;
    for (const auto& [_, e] : models_) out.push_back(e);
    return out;
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
            {"memory_planned_bytes", m.planned()}};
  }

  // ---- Routes

  void Register() {
    http_.Get(
        "/health", Route("/health", [this](const auto&, auto& res) {
          json models = json::array();
          for (const auto& e : Engines()) models.push_back(e->id());
          Reply(
              res, 200,
              {{"status", draining_ ? "draining" : "healthy"},
               {"model_loaded", models.empty() ? json(nullptr) : models[0]},
               {"models", models},
               {"gpu_info", {{"has_gpu", false}}},
               {"uptime_seconds",
                std::chrono::duration<double>(Clock::now() - started_).count()},
               {"config", o_.config}});
          return Status();
        }));
    http_.Get("/models", Route("/models", [this](const auto&, auto& res) {
                json list = json::array();
                for (const auto& e : Engines()) list.push_back(ModelInfo(*e));
                Reply(res, 200,
                      {{"models", list},
                       {"loaded_count", list.size()},
                       {"max_loaded", o_.max_loaded}});
                return Status();
              }));
    http_.Post("/models/load",
               JsonRoute("/models/load", [this](const auto& req, auto& res) {
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
                 ASSIGN_OR_RETURN(auto e, Load(name));
                 Reply(res, 200, ModelInfo(*e));
                 return Status();
               }));
    http_.Delete(R"(/models/(.+))",
                 Route("/models/{id}", [this](const auto& req, auto& res) {
                   std::string id = req.matches[1];
                   for (size_t p; (p = id.find("--")) != std::string::npos;)
                     id.replace(p, 2, "/");
                   RETURN_IF_ERROR(Unload(id));
                   Reply(res, 200, {{"model_id", id}, {"unloaded", true}});
                   return Status();
                 }));
    auto generate = [this](const auto& req, auto& res) -> Status {
      std::optional<BodyFormat> format = Accepted(req, res);
      if (!format) return Status();
      ASSIGN_OR_RETURN(json b, ParseBody(req.body));
      ASSIGN_OR_RETURN(auto e, EngineFor(b));
      ASSIGN_OR_RETURN(GenFields f, PromptFields(*e, b));
      ASSIGN_OR_RETURN(const bool persist, Persisting(b));
      // npy holds one array: refused before the generation runs.
      if (const std::vector<std::string> names = GenArrayNames(f);
          *format == BodyFormat::kNpy && names.size() != 1) {
        std::string list;
        for (const std::string& n : names)
          list += (list.empty() ? "" : ", ") + n;
        return NotAcceptable(
            req, res,
            NpyNeedsOneArray(static_cast<int64_t>(names.size()), list));
      }
      ASSIGN_OR_RETURN(auto ticket, e->Submit(f.request));
      const StatusOr<GenResult> result = ticket->Wait();
      const Status done = [&]() -> Status {
        if (!result.ok()) return result.status();
        const GenResult& g = *result;
        if (*format != BodyFormat::kJson) {
          ASSIGN_OR_RETURN(json rest, GenResponse(*e, f, g, false));
          std::vector<std::vector<float>> storage;
          ASSIGN_OR_RETURN(std::vector<BinaryArray> arrays,
                           GenArrays(f, g, &storage));
          return ReplyBinary(req, res, *format, arrays, f.dtype, rest);
        }
        ASSIGN_OR_RETURN(json out, GenResponse(*e, f, g));
        Reply(res, 200, out);
        return Status();
      }();
      // After the reply is made; the writer thread does the writing.
      if (persist)
        Persist(Record(*e, req.path, b, f, false, PromptInput(b["prompt"]),
                       result, done));
      return done;
    };
    http_.Post("/generate", JsonRoute("/generate", generate));
    http_.Post("/v1/generate", JsonRoute("/v1/generate", generate));
    http_.Post(
        "/generate/stream",
        JsonRoute("/generate/stream", [this](const auto& req, auto& res) {
          return GenerateStream(req, res);
        }));
    http_.Post("/generate/batch",
               JsonRoute("/generate/batch", [this](const auto& req, auto& res) {
                 return Batch(req, res);
               }));
    http_.Post("/embed",
               JsonRoute("/embed", [this](const auto& req, auto& res) {
                 return Embed(req, res, false);
               }));
    http_.Post("/embed/batch",
               JsonRoute("/embed/batch", [this](const auto& req, auto& res) {
                 return Embed(req, res, true);
               }));
    http_.Post(
        "/v1/chat/completions",
        JsonRoute("/v1/chat/completions", [this](const auto& req, auto& res) {
          return Chat(req, res);
        }));
    RegisterOpenAi();
    http_.Get("/gpu/status",
              Route("/gpu/status", [this](const auto&, auto& res) {
                Reply(res, 200, GpuStatus());
                return Status();
              }));
    http_.Get("/metrics", Route("/metrics", [this](const auto&, auto& res) {
                res.set_content(Metrics(),
                                "text/plain; version=0.0.4; charset=utf-8");
                return Status();
              }));
    http_.Post("/analyze",
               JsonRoute("/analyze", [this](const auto& req, auto& res) {
                 return Analyze(req, res);
               }));
    http_.Post(
        "/analyze/geometry",
        JsonRoute("/analyze/geometry", [this](const auto& req, auto& res) {
          return AnalyzeGeometry(req, res);
        }));
    http_.Post(
        "/analyze/bilateral",
        JsonRoute("/analyze/bilateral", [this](const auto& req, auto& res) {
          return AnalyzeBilateral(req, res);
        }));
    RegisterPatching();
    RegisterExperiments();
    RegisterLoaders();
    // Last (routes match in order): any other POST: its body is read as a JSON
    // route's (the library's own reading would answer a form body over 8 KiB
    // with 413), then 404.
    http_.Post(".*", [this](const httplib::Request& req, httplib::Response& res,
                            const httplib::ContentReader& reader) {
      std::string body;
      if (ReadBody(req, reader, res, &body))
        Reply(res, 404,
              ErrorJson(req.path, 404,
                        "no route " + req.method + " " + req.path));
    });
  }

  // OpenAI's routes beside /v1/chat/completions: models, completions,
  // embeddings.
  void RegisterOpenAi() {
    http_.Get("/v1/models", Route("/v1/models", [this](const auto&, auto& res) {
                json data = json::array();
                for (const auto& e : Engines()) data.push_back(OpenAiModel(*e));
                Reply(res, 200, {{"object", "list"}, {"data", data}});
                return Status();
              }));
    http_.Get(R"(/v1/models/(.+))",
              Route("/v1/models/{id}", [this](const auto& req, auto& res) {
                const std::string id = req.matches[1];
                std::shared_ptr<Engine> e = Find(id);
                if (e == nullptr)
                  return NotFoundError("model `" + id + "` is not loaded");
                Reply(res, 200, OpenAiModel(*e));
                return Status();
              }));
    http_.Post("/v1/completions",
               JsonRoute("/v1/completions", [this](const auto& req, auto& res) {
                 return Completions(req, res);
               }));
    http_.Post("/v1/embeddings",
               JsonRoute("/v1/embeddings", [this](const auto& req, auto& res) {
                 return Embeddings(req, res);
               }));
  }

  // /experiments* (experiments.h): TheLoom's persistence routes.
  void RegisterExperiments() {
    auto reply = [this](httplib::Response& res, StatusOr<json> out) {
      if (!out.ok()) return out.status();
      Reply(res, 200, *out);
      return Status();
    };
    ExperimentRoutes* x = experiments_.get();
    http_.Get("/experiments",
              Route("/experiments", [x, reply](const auto& req, auto& res) {
                return reply(res, x->List(req.params));
              }));
    http_.Get(
        R"(/experiments/([^/]+))",
        Route("/experiments/{id}", [x, reply](const auto& req, auto& res) {
          return reply(res, x->Get(req.matches[1]));
        }));
    http_.Get(R"(/experiments/([^/]+)/conversations)",
              Route("/experiments/{id}/conversations",
                    [x, reply](const auto& req, auto& res) {
                      return reply(
                          res, x->Conversations(req.matches[1], req.params));
                    }));
    http_.Get(R"(/experiments/([^/]+)/hidden_states)",
              Route("/experiments/{id}/hidden_states",
                    [x, reply](const auto& req, auto& res) {
                      return reply(res,
                                   x->HiddenStates(req.matches[1], req.params));
                    }));
    http_.Get(R"(/experiments/([^/]+)/metrics)",
              Route("/experiments/{id}/metrics",
                    [x, reply](const auto& req, auto& res) {
                      return reply(res, x->Metrics(req.matches[1], req.params));
                    }));
    http_.Post("/experiments/export",
               JsonRoute("/experiments/export",
                         [x, reply](const auto& req, auto& res) {
                           ASSIGN_OR_RETURN(json b, ParseBody(req.body));
                           return reply(res, x->Export(b));
                         }));
    http_.Post("/experiments/export/batch",
               JsonRoute("/experiments/export/batch",
                         [x, reply](const auto& req, auto& res) {
                           ASSIGN_OR_RETURN(json b, ParseBody(req.body));
                           return reply(res, x->ExportBatch(b));
                         }));
    http_.Post("/experiments/export/summary",
               JsonRoute("/experiments/export/summary",
                         [x, reply](const auto& req, auto& res) {
                           ASSIGN_OR_RETURN(json b, ParseBody(req.body));
                           return reply(res, x->ExportSummary(b));
                         }));
  }

  // GET /loaders, GET /loaders/probe/{id}, POST /gpu/configure (loaders.h).
  void RegisterLoaders() {
    http_.Get("/loaders", Route("/loaders", [this](const auto&, auto& res) {
                Reply(res, 200, LoadersJson());
                return Status();
              }));
    http_.Get(R"(/loaders/probe/(.+))",
              Route("/loaders/probe/{id}", [this](const auto& req, auto& res) {
                std::string id = req.matches[1];
                for (size_t p; (p = id.find("--")) != std::string::npos;)
                  id.replace(p, 2, "/");
                std::string dir;
                StatusOr<std::string> resolved = Resolve(id, &dir);
                Reply(res, 200,
                      ProbeJson(id, resolved.ok() ? StatusOr<std::string>(dir)
                                                  : resolved.status()));
                return Status();
              }));
    http_.Post("/gpu/configure",
               JsonRoute("/gpu/configure", [this](const auto& req, auto& res) {
                 ASSIGN_OR_RETURN(json b, ParseBody(req.body));
                 ASSIGN_OR_RETURN(json out, gpu_selection_.Configure(b));
                 Reply(res, 200, out);
                 return Status();
               }));
  }

  // /api/patching/* (patching.h).
  void RegisterPatching() {
    auto reply = [this](httplib::Response& res, StatusOr<json> out) {
      if (!out.ok()) return out.status();
      Reply(res, 200, *out);
      return Status();
    };
    http_.Post("/api/patching/configure",
               JsonRoute("/api/patching/configure",
                         [this, reply](const auto& req, auto& res) {
                           ASSIGN_OR_RETURN(json b, ParseBody(req.body));
                           return reply(res, patching_.Configure(b));
                         }));
    http_.Post(
        "/api/patching/run",
        JsonRoute("/api/patching/run", [this, reply](const auto& req,
                                                     auto& res) {
          ASSIGN_OR_RETURN(json b, ParseBody(req.body));
          ASSIGN_OR_RETURN(auto e, EngineFor(b));
          ASSIGN_OR_RETURN(bool special,
                           GetBool(b, "add_special_tokens", true));
          const PromptIdsFn ids = [&](const json& v, const std::string& field) {
            return Tokens(*e, v, special, field);
          };
          return reply(res, patching_.Run(b, *e, ids,
                                          [this] { return draining_.load(); }));
        }));
    http_.Get(
        R"(/api/patching/results/([^/]+))",
        Route("/api/patching/results/{id}", [this, reply](const auto& req,
                                                          auto& res) {
          ASSIGN_OR_RETURN(bool effects,
                           QueryBool(req, "include_causal_effects", true));
          return reply(res, patching_.Results(
                                req.matches[1],
                                req.get_param_value("metric_type"), effects));
        }));
    http_.Get(
        "/api/patching/experiments",
        Route("/api/patching/experiments", [this](const auto&, auto& res) {
          Reply(res, 200, patching_.Experiments());
          return Status();
        }));
    http_.Get(
        "/api/patching/cache/status",
        Route("/api/patching/cache/status", [this](const auto&, auto& res) {
          Reply(res, 200, patching_.CacheStatus());
          return Status();
        }));
    http_.Delete(R"(/api/patching/cache/([^/]+))",
                 Route("/api/patching/cache/{id}",
                       [this, reply](const auto& req, auto& res) {
                         return reply(res,
                                      patching_.DeleteCache(req.matches[1]));
                       }));
    http_.Delete("/api/patching/cache",
                 Route("/api/patching/cache", [this](const auto&, auto& res) {
                   Reply(res, 200, patching_.ClearCache());
                   return Status();
                 }));
  }

  static StatusOr<bool> QueryBool(const httplib::Request& req,
                                  const std::string& name, bool def) {
    if (!req.has_param(name)) return def;
    const std::string v = req.get_param_value(name);
    if (v == "true" || v == "1") return true;
    if (v == "false" || v == "0") return false;
    return InvalidArgumentError("query parameter `" + name +
                                "`: expected true or false, got '" + v + "'");
  }

  // /generate/stream: a /generate request answered as events (token, done,
  // error).
  Status GenerateStream(const httplib::Request& req, httplib::Response& res) {
    ASSIGN_OR_RETURN(json b, ParseBody(req.body));
    ASSIGN_OR_RETURN(auto e, EngineFor(b));
    ASSIGN_OR_RETURN(GenFields f, PromptFields(*e, b));
    ASSIGN_OR_RETURN(const bool persist, Persisting(b));
    OnStreamEnd persisted;
    if (persist)
      persisted = [this, e, b, f,
                   path = req.path](const StatusOr<GenResult>& g) {
        Persist(Record(*e, path, b, f, false, PromptInput(b["prompt"]), g,
                       Status()));
      };
    return Stream(res, e, std::move(f), StreamKind::kGenerate,
                  std::move(persisted));
  }

  // The request of a /generate body's one `prompt` on `e`: its tokens, the
  // generation fields and the body's interventions.
  StatusOr<GenFields> PromptFields(const Engine& e, const json& b) {
    if (!b.contains("prompt"))
      return InvalidArgumentError("field `prompt` is required");
    ASSIGN_OR_RETURN(bool special, GetBool(b, "add_special_tokens", true));
    ASSIGN_OR_RETURN(auto ids, Tokens(e, b["prompt"], special));
    ASSIGN_OR_RETURN(GenFields f, ParseGen(e, b, std::move(ids), false));
    ASSIGN_OR_RETURN(RequestInterventions ivs, Interventions(e, b, 1));
    RETURN_IF_ERROR(Attach(ivs, 0, &f.request));
    return f;
  }

  // Called with a stream's result once its last event is written (not when
  // the client went away first).
  using OnStreamEnd = std::function<void(const StatusOr<GenResult>&)>;

  // Streams the generation `f` on `e` as server-sent events of `kind`;
  // `on_end` (may be empty) then gets the result.
  Status Stream(httplib::Response& res, std::shared_ptr<Engine> e, GenFields f,
                StreamKind kind, OnStreamEnd on_end = nullptr) {
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
        "text/event-stream", [this, st, ticket, e, f, kind, ids, on_end](
                                 size_t, httplib::DataSink& sink) {
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
      return OpenAiChunk(kind, ids,
                         {{"text", ""},
                          {"logprobs", nullptr},
                          {"finish_reason", finish}},
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

  // TheLoom's chat hidden state of layers[i] (the last position fed) under
  // `values` ("final" for hidden_state, "vector" in Weaver's hidden_states
  // map): a flat list (or base64) with TheLoom's shape [1, hidden].
  json ChatLayerState(const GenFields& f, const GenResult& g, size_t i,
                      const char* values) {
    int64_t w = 0;
    const float* rows = Capture(f, g, f.layers[i].second, &w);
    json a =
        EncodeArray(rows + (g.rows - 1) * w, 1, w, true, f.dtype, f.format);
    json out = {{values, std::move(a["data"])},
                {"shape", {1, w}},
                {"layer", std::stoll(f.layers[i].first)},
                {"dtype", a["dtype"]}};
    if (a.contains("encoding")) out["encoding"] = a["encoding"];
    return out;
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

  StatusOr<std::vector<int32_t>> ChatTokens(const Engine& e, const json& b) {
    if (!b.contains("messages") || !b["messages"].is_array() ||
        b["messages"].empty())
      return InvalidArgumentError(
          "field `messages`: expected a non-empty list of {role, content}");
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    std::string plain;
    for (const json& m : b["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
          !m.contains("content") || !m["content"].is_string())
        return InvalidArgumentError(
            "field `messages`: each message needs string `role` and "
            "`content`, got " +
            Dump(m));
      messages.push_back({{"role", m["role"].get<std::string>()},
                          {"content", m["content"].get<std::string>()}});
      std::string role = m["role"].get<std::string>();
      if (!role.empty()) role[0] = static_cast<char>(std::toupper(role[0]));
      plain += role + ": " + m["content"].get<std::string>() + "\n";
    }
    if (e.chat_template() == nullptr) {
      // TheLoom's fallback for models without a template.
      return Tokens(e, json(plain + "Assistant:"), true);
    }
    nlohmann::ordered_json ctx = {{"messages", messages},
                                  {"add_generation_prompt", true}};
    ASSIGN_OR_RETURN(std::string text, e.chat_template()->Render(ctx));
    // The template writes the special tokens itself (as HF's
    // apply_chat_template(tokenize=True) does).
    return Tokens(e, json(text), false);
  }

  // The format of a streamed chat (docs/server.md, "Which stream format"):
  // the request's `stream_format`, else server.chat_stream_format; `auto`
  // tells the two kinds of clients apart by what they send, the first rule
  // that matches deciding:
  //   1. the OpenAI SDKs' marks: an X-Stainless-* header (every official
  //      SDK sends X-Stainless-Lang and others) or a User-Agent starting
  //      "OpenAI/" -> openai;
  //   2. `stream_options` (an OpenAI-only field) -> openai;
  //   3. a TheLoom-only field (return_hidden_states, hidden_state_layers,
  //      device, loader) -> theloom;
  //   4. Accept naming text/event-stream (TheLoom's Go client, Weaver, sends
  //      it; the OpenAI SDKs send Accept: application/json) -> theloom;
  //   5. anything else -> openai.
  std::string ChatFormat(const httplib::Request& req, const json& b,
                         std::string f) {
    if (f.empty()) f = o_.chat_stream_format;
    if (f != "auto") return f;
    for (const auto& [name, _] : req.headers)
      if (strncasecmp(name.c_str(), "x-stainless-", 12) == 0) return "openai";
    if (req.get_header_value("User-Agent").rfind("OpenAI/", 0) == 0)
      return "openai";
    if (b.contains("stream_options")) return "openai";
    for (const char* field :
         {"return_hidden_states", "hidden_state_layers", "device", "loader"})
      if (b.contains(field)) return "theloom";
    if (AcceptsEventStream(req.get_header_value("Accept"))) return "theloom";
    return "openai";
  }

  // Chat and completion fields of OpenAI's that Loom does not implement:
  // 400 naming the field when given a value other than the default.
  static Status RefuseOpenAiFields(const json& b) {
    RETURN_IF_ERROR(RefuseOpenAiField(
        b, "n", 1, "loom serve returns one choice per prompt"));
    RETURN_IF_ERROR(RefuseOpenAiField(
        b, "best_of", 1, "loom serve returns one choice per prompt"));
    RETURN_IF_ERROR(RefuseOpenAiField(b, "echo", false,
                                      "echoing the prompt is not supported"));
    RETURN_IF_ERROR(RefuseOpenAiField(
        b, "suffix", nullptr, "suffixes (insertion) are not supported"));
    if (b.contains("logprobs") && !b["logprobs"].is_null() &&
        b["logprobs"] != false)
      return InvalidArgumentError(
          "field `logprobs`: log probabilities are not returned by loom "
          "serve (null or false), got " +
          Dump(b["logprobs"]));
    return Status();
  }

  Status Chat(const httplib::Request& req, httplib::Response& res) {
    ASSIGN_OR_RETURN(json b, ParseBody(req.body));
    ASSIGN_OR_RETURN(std::string sf, GetString(b, "stream_format", ""));
    if (!sf.empty() && sf != "openai" && sf != "theloom")
      return InvalidArgumentError(
          "field `stream_format`: expected \"openai\" or \"theloom\", got \"" +
          sf + "\"");
    RETURN_IF_ERROR(RefuseOpenAiFields(b));
    ASSIGN_OR_RETURN(bool stream, GetBool(b, "stream", false));
    // Decided before the defaults below add fields.
    const std::string format = stream ? ChatFormat(req, b, sf) : "";
    // A chat's hidden state is the final layer's unless asked otherwise.
    if (!b.contains("hidden_state_layers")) b["hidden_state_layers"] = {-1};
    // OpenAI's newer name of max_tokens.
    if ((!b.contains("max_tokens") || b["max_tokens"].is_null()) &&
        b.contains("max_completion_tokens"))
      b["max_tokens"] = b["max_completion_tokens"];
    ASSIGN_OR_RETURN(auto e, EngineFor(b));
    ASSIGN_OR_RETURN(auto ids, ChatTokens(*e, b));
    ASSIGN_OR_RETURN(GenFields f, ParseGen(*e, b, std::move(ids), true));
    ASSIGN_OR_RETURN(RequestInterventions ivs, Interventions(*e, b, 1));
    RETURN_IF_ERROR(Attach(ivs, 0, &f.request));
    ASSIGN_OR_RETURN(const bool persist, Persisting(b));
    // The messages as given (ChatTokens checked them), for the experiment.
    std::vector<ExperimentRecord::Message> input;
    if (persist)
      for (const json& m : b["messages"])
        input.push_back(
            {m["role"].get<std::string>(), m["content"].get<std::string>()});
    if (stream) {
      OnStreamEnd persisted;
      if (persist)
        persisted = [this, e, b, f, input,
                     path = req.path](const StatusOr<GenResult>& g) {
          Persist(Record(*e, path, b, f, true, input, g, Status()));
        };
      return Stream(res, e, std::move(f),
                    format == "openai" ? StreamKind::kOpenAiChat
                                       : StreamKind::kTheLoomChat,
                    std::move(persisted));
    }
    ASSIGN_OR_RETURN(auto ticket, e->Submit(f.request));
    const StatusOr<GenResult> result = ticket->Wait();
    const Status done = ChatReply(res, *e, f, result);
    if (persist)
      Persist(Record(*e, req.path, b, f, true, std::move(input), result, done));
    return done;
  }

  // The reply of a chat that is not streamed.
  Status ChatReply(httplib::Response& res, const Engine& engine,
                   const GenFields& f, const StatusOr<GenResult>& result) {
    if (!result.ok()) return result.status();
    const GenResult& g = *result;
    const Engine* e = &engine;
    ASSIGN_OR_RETURN(json body, GenResponse(*e, f, g));
    const std::string finish = FinishReason(g.stop_reason);
    json out = {{"id", "chatcmpl-" + std::to_string(std::time(nullptr))},
                {"object", "chat.completion"},
                {"created", std::time(nullptr)},
                {"model", e->id()},
                {"choices",
                 {{{"index", 0},
                   {"message", {{"role", "assistant"}, {"content", g.text}}},
                   {"finish_reason", finish}}}},
                {"usage",
                 {{"prompt_tokens", g.prompt_ids.size()},
                  {"completion_tokens", g.token_ids.size()},
                  {"total_tokens", g.prompt_ids.size() + g.token_ids.size()}}},
                {"text", g.text},
                {"metadata", body["metadata"]}};
    if (f.return_hidden) out["hidden_state"] = ChatHiddenState(f, g);
    if (f.return_hidden && f.layers.size() > 1)
      out["hidden_states"] = ChatHiddenStates(f, g);
    for (const char* extra : {"activations", "attention_weights"})
      if (body.contains(extra)) out[extra] = body[extra];
    Reply(res, 200, out);
    return Status();
  }

  Status Batch(const httplib::Request& req, httplib::Response& res) {
    ASSIGN_OR_RETURN(json b, ParseBody(req.body));
    ASSIGN_OR_RETURN(auto e, EngineFor(b));
    if (!b.contains("prompts") || !b["prompts"].is_array() ||
        b["prompts"].empty())
      return InvalidArgumentError(
          "field `prompts`: expected a non-empty list of prompts");
    const size_t n = b["prompts"].size();
    if (static_cast<int64_t>(n) > o_.max_batch_prompts)
      return InvalidArgumentError("field `prompts`: " + std::to_string(n) +
                                  " prompts, more than "
                                  "server.max_batch_prompts = " +
                                  std::to_string(o_.max_batch_prompts));
    ASSIGN_OR_RETURN(bool special, GetBool(b, "add_special_tokens", true));
    ASSIGN_OR_RETURN(const bool persist, Persisting(b));
    const Clock::time_point t0 = Clock::now();
    ASSIGN_OR_RETURN(RequestInterventions ivs,
                     Interventions(*e, b, static_cast<int64_t>(n)));
    std::vector<GenFields> fields;
    for (size_t i = 0; i < n; ++i) {
      StatusOr<std::vector<int32_t>> ids = Tokens(*e, b["prompts"][i], special);
      if (!ids.ok())
        return ids.status().WithContext("prompt " + std::to_string(i));
      ASSIGN_OR_RETURN(GenFields f,
                       ParseGen(*e, b, std::move(ids).value(), false));
      if (Status s = Attach(ivs, static_cast<int64_t>(i), &f.request); !s.ok())
        return s.WithContext("prompt " + std::to_string(i));
      fields.push_back(std::move(f));
    }
    // Every prompt goes to the engine at once: they share forwards.
    ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Ticket>> tickets,
                     SubmitAll(*e, fields));
    // Each prompt's result, kept for its experiment.
    std::vector<StatusOr<GenResult>> outcomes;
    const Status done = [&]() -> Status {
      json results = json::array();
      int64_t total = 0;
      Status first_error;
      for (size_t i = 0; i < n; ++i) {
        outcomes.push_back(tickets[i]->Wait());
        const StatusOr<GenResult>& g = outcomes.back();
        if (!g.ok()) {
          if (first_error.ok()) first_error = g.status();
          continue;
        }
        total += static_cast<int64_t>(g->token_ids.size());
        ASSIGN_OR_RETURN(json r, GenResponse(*e, fields[i], *g));
        results.push_back(std::move(r));
      }
      RETURN_IF_ERROR(first_error);
      Reply(res, 200,
            {{"results", results},
             {"total_tokens", total},
             {"total_time_ms",
              std::chrono::duration<double, std::milli>(Clock::now() - t0)
                  .count()},
             {"prompts_processed", n}});
      return Status();
    }();
    // One experiment per prompt, as that prompt ended.
    if (persist)
      for (size_t i = 0; i < outcomes.size(); ++i) {
        ExperimentRecord r =
            Record(*e, req.path, b, fields[i], false,
                   PromptInput(b["prompts"][i]), outcomes[i], Status());
        r.config["batch_index"] = i;
        Persist(std::move(r));
      }
    return done;
  }

  // Vectors of one width as the rows of one array.
  static std::vector<float> Rows(const std::vector<std::vector<float>>& v) {
    std::vector<float> out;
    for (const std::vector<float>& row : v)
      out.insert(out.end(), row.begin(), row.end());
    return out;
  }

  // Pooled hidden states of some inputs (/embed's machinery).
  struct Embedded {
    std::vector<std::vector<float>> vectors;
    int64_t width = 0;
    int64_t tokens = 0;  // prompt tokens over all inputs
    std::string pooling;
    bool normalize = false;
    int64_t layer = -1;
  };

  // Each input (a text or token ids; errors name `field` and the input's
  // index) as a prompt-only request capturing one layer, the inputs sharing
  // forwards, pooled. `layer`, `pooling`, `normalize` and
  // `add_special_tokens` come from `b`, defaulting to hidden_states.
  // embedding_* of the configuration.
  StatusOr<Embedded> EmbedInputs(Engine& e, const json& b,
                                 const std::vector<json>& inputs,
                                 const std::string& field) {
    Embedded out;
    ASSIGN_OR_RETURN(out.pooling,
                     GetString(b, "pooling", o_.embedding_pooling));
    ASSIGN_OR_RETURN(Pooling pooling, ParsePooling(out.pooling));
    ASSIGN_OR_RETURN(out.normalize,
                     GetBool(b, "normalize", o_.embedding_normalize));
    ASSIGN_OR_RETURN(out.layer,
                     GetInt(b, "layer", o_.embedding_layer, -100000, 100000));
    ASSIGN_OR_RETURN(HookPoint hook, e.LayerHook(out.layer));
    ASSIGN_OR_RETURN(bool special, GetBool(b, "add_special_tokens", true));
    ASSIGN_OR_RETURN(RequestInterventions ivs,
                     Interventions(e, b, static_cast<int64_t>(inputs.size())));
    std::vector<std::shared_ptr<Ticket>> tickets;
    auto fail = [&](const Status& s, size_t i) {
      for (auto& t : tickets) t->Cancel();
      // "text 2: ..." on /embed/batch as on /embed, "input 2: ..."
      return s.WithContext((field == "texts" ? "text" : field) + " " +
                           std::to_string(i));
    };
    for (size_t i = 0; i < inputs.size(); ++i) {
      StatusOr<std::vector<int32_t>> ids = Tokens(e, inputs[i], special, field);
      if (!ids.ok()) return fail(ids.status(), i);
      out.tokens += static_cast<int64_t>(ids->size());
      GenRequest r;
      r.prompt = std::move(ids).value();
      r.max_new_tokens = 0;
      r.hooks = {hook};
      r.rows = pooling == Pooling::kLastToken ? CaptureRows::kLast
                                              : CaptureRows::kAll;
      if (Status s = Attach(ivs, static_cast<int64_t>(i), &r); !s.ok())
        return fail(s, i);
      StatusOr<std::shared_ptr<Ticket>> t = e.Submit(std::move(r));
      if (!t.ok()) return fail(t.status(), i);
      tickets.push_back(*t);
    }
    for (auto& t : tickets) {
      ASSIGN_OR_RETURN(GenResult g, t->Wait());
      out.width = g.widths[0];
      out.vectors.push_back(Pool(g.captures[0].data(), g.rows, out.width,
                                 pooling, out.normalize));
    }
    return out;
  }

  // POST /analyze in either form: TheLoom's (`text`: the statistics of its
  // embedding, computed as /embed computes it but never normalised, with
  // TheLoom's field names and the embed metadata) or Loom's (`embedding`,
  // `vector` or `data`: the statistics of that vector).
  Status Analyze(const httplib::Request& req, httplib::Response& res) {
    ASSIGN_OR_RETURN(json b, ParseBody(req.body));
    if (b.contains("text") && !b["text"].is_null()) {
      ASSIGN_OR_RETURN(auto e, EngineFor(b));
      json raw = b;
      raw["normalize"] = false;  // TheLoom ignores `normalize` here
      const Clock::time_point t0 = Clock::now();
      ASSIGN_OR_RETURN(Embedded m, EmbedInputs(*e, raw, {b["text"]}, "text"));
      json out = theloom::HiddenStateStatistics(m.vectors[0]);
      out["layer"] = m.layer;
      out["pooling"] = m.pooling;
      out["inference_time_ms"] =
          std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      out["input_tokens"] = m.tokens;
      out["model_id"] = e->id();
      Reply(res, 200, out);
      return Status();
    }
    const char* key = b.contains("embedding") ? "embedding"
                      : b.contains("vector")  ? "vector"
                                              : "data";
    if (!b.contains(key) || !b[key].is_array())
      return InvalidArgumentError(
          "field `embedding`: expected a list of numbers (or `text` and "
          "`model`: the statistics of the text's embedding)");
    std::vector<double> v;
    for (const json& x : b[key]) {
      if (!x.is_number())
        return InvalidArgumentError(
            "field `embedding`: expected numbers, got " + Dump(x));
      v.push_back(x.get<double>());
    }
    ASSIGN_OR_RETURN(json out, AnalyzeVector(v));
    Reply(res, 200, out);
    return Status();
  }

  // POST /analyze/geometry (theloom_analysis.h): `vectors`, 3 to
  // theloom::kMaxVectors rows; `seed` (Loom's) for the random draws.
  Status AnalyzeGeometry(const httplib::Request& req, httplib::Response& res) {
    const Clock::time_point t0 = Clock::now();
    ASSIGN_OR_RETURN(theloom::AnalysisBody b,
                     theloom::ParseAnalysisBody(req.body, {"vectors"}, 3,
                                                theloom::kMaxVectors));
    ASSIGN_OR_RETURN(uint32_t seed, theloom::SeedOf(b.rest));
    json out = theloom::GeometryJson(
        theloom::AnalyzeGeometry(b.matrices[0], seed, o_.engine.threads));
    out["analysis_time_ms"] =
        std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    Reply(res, 200, out);
    return Status();
  }

  // POST /analyze/bilateral: `sender_vectors` and `receiver_vectors` of the
  // same width; `seed` as above (both sides' Wolf draws use it).
  Status AnalyzeBilateral(const httplib::Request& req, httplib::Response& res) {
    const Clock::time_point t0 = Clock::now();
    ASSIGN_OR_RETURN(theloom::AnalysisBody b,
                     theloom::ParseAnalysisBody(
                         req.body, {"sender_vectors", "receiver_vectors"}, 3,
                         theloom::kMaxVectors));
    ASSIGN_OR_RETURN(uint32_t seed, theloom::SeedOf(b.rest));
    const theloom::Matrix &s = b.matrices[0], &r = b.matrices[1];
    if (s.cols != r.cols)
      return InvalidArgumentError("Dimension mismatch: sender has " +
                                  std::to_string(s.cols) + ", receiver has " +
                                  std::to_string(r.cols));
    json out = theloom::BilateralJson(
        theloom::AnalyzeBilateral(s, r, seed, o_.engine.threads));
    out["analysis_time_ms"] =
        std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    Reply(res, 200, out);
    return Status();
  }

  // The inputs of /embed/batch (`texts`) and /embed (`text`).
  StatusOr<std::vector<json>> EmbedTexts(const json& b, bool batch) {
    if (!batch) {
      if (!b.contains("text"))
        return InvalidArgumentError("field `text` is required");
      return std::vector<json>{b["text"]};
    }
    if (!b.contains("texts") || !b["texts"].is_array() || b["texts"].empty())
      return InvalidArgumentError(
          "field `texts`: expected a non-empty list of strings");
    if (static_cast<int64_t>(b["texts"].size()) > o_.max_batch_prompts)
      return InvalidArgumentError(
          "field `texts`: " + std::to_string(b["texts"].size()) +
          " texts, more than server.max_batch_prompts = " +
          std::to_string(o_.max_batch_prompts));
    return std::vector<json>(b["texts"].begin(), b["texts"].end());
  }

  Status Embed(const httplib::Request& req, httplib::Response& res,
               bool batch) {
    std::optional<BodyFormat> format = Accepted(req, res);
    if (!format) return Status();
    ASSIGN_OR_RETURN(json b, ParseBody(req.body));
    ASSIGN_OR_RETURN(DType binary_dtype, BinaryDType(b));
    ASSIGN_OR_RETURN(auto e, EngineFor(b));
    ASSIGN_OR_RETURN(std::vector<json> texts, EmbedTexts(b, batch));
    const Clock::time_point t0 = Clock::now();
    ASSIGN_OR_RETURN(Embedded m,
                     EmbedInputs(*e, b, texts, batch ? "texts" : "text"));
    const json meta = {
        {"model", e->id()},
        {"pooling", m.pooling},
        {"normalized", m.normalize},
        {"layer", m.layer},
        {"input_tokens", m.tokens},
        {"inference_time_ms",
         std::chrono::duration<double, std::milli>(Clock::now() - t0).count()}};
    if (*format != BodyFormat::kJson) {
      const std::vector<float> all = Rows(m.vectors);
      const int64_t n = static_cast<int64_t>(m.vectors.size());
      return ReplyBinary(req, res, *format,
                         {{batch ? "embeddings" : "embedding",
                           batch ? std::vector<int64_t>{n, m.width}
                                 : std::vector<int64_t>{m.width},
                           all.data()}},
                         binary_dtype,
                         {{"shape", batch ? json::array({n, m.width})
                                          : json::array({m.width})},
                          {"metadata", meta}});
    }
    if (batch) {
      Reply(res, 200,
            {{"embeddings", m.vectors},
             {"shape", {m.vectors.size(), m.width}},
             {"metadata", meta}});
    } else {
      Reply(res, 200,
            {{"embedding", m.vectors[0]},
             {"shape", {m.width}},
             {"metadata", meta}});
    }
    return Status();
  }

  // OpenAI's inputs of /v1/completions (`prompt`) and /v1/embeddings
  // (`input`): a string, a list of strings, a list of token ids, or a list
  // of token-id lists; at most server.max_batch_prompts of them.
  StatusOr<std::vector<json>> OpenAiInputs(const json& b,
                                           const std::string& field) {
    if (!b.contains(field) || b[field].is_null())
      return InvalidArgumentError("field `" + field + "` is required");
    const json& v = b[field];
    const std::string expected =
        "expected a string, a list of strings, a list of token ids or a list "
        "of token-id lists, got ";
    if (v.is_string()) return std::vector<json>{v};
    if (!v.is_array() || v.empty())
      return InvalidArgumentError("field `" + field + "`: " + expected +
                                  (v.is_array() ? "[]" : v.type_name()));
    if (v[0].is_number()) return std::vector<json>{v};  // one token-id list
    if (static_cast<int64_t>(v.size()) > o_.max_batch_prompts)
      return InvalidArgumentError(
          "field `" + field + "`: " + std::to_string(v.size()) +
          " inputs, more than server.max_batch_prompts = " +
          std::to_string(o_.max_batch_prompts));
    for (size_t i = 0; i < v.size(); ++i)
      if (!v[i].is_string() && !v[i].is_array())
        return InvalidArgumentError("field `" + field + "`: item " +
                                    std::to_string(i) + ": " + expected +
                                    v[i].type_name());
    return std::vector<json>(v.begin(), v.end());
  }

  // POST /v1/embeddings: OpenAI's embeddings, each the pooled hidden state
  // of one input (EmbedInputs), as floats or base64 of little-endian f32.
  Status Embeddings(const httplib::Request& req, httplib::Response& res) {
    std::optional<BodyFormat> format = Accepted(req, res);
    if (!format) return Status();
    ASSIGN_OR_RETURN(json b, ParseBody(req.body));
    ASSIGN_OR_RETURN(DType binary_dtype, BinaryDType(b));
    if (b.contains("dimensions") && !b["dimensions"].is_null())
      return InvalidArgumentError(
          "field `dimensions`: not supported: an embedding has the width of "
          "the model's hidden state (GET /models lists hidden_size), got " +
          Dump(b["dimensions"]));
    ASSIGN_OR_RETURN(std::string encoding,
                     GetString(b, "encoding_format", "float"));
    if (encoding != "float" && encoding != "base64")
      return InvalidArgumentError(
          "field `encoding_format`: expected \"float\" or \"base64\", got \"" +
          encoding + "\"");
    ASSIGN_OR_RETURN(auto e, EngineFor(b));
    ASSIGN_OR_RETURN(std::vector<json> inputs, OpenAiInputs(b, "input"));
    ASSIGN_OR_RETURN(Embedded m, EmbedInputs(*e, b, inputs, "input"));
    const json usage = {{"prompt_tokens", m.tokens},
                        {"total_tokens", m.tokens}};
    if (*format != BodyFormat::kJson) {
      const std::vector<float> all = Rows(m.vectors);
      return ReplyBinary(
          req, res, *format,
          {{"embeddings",
            {static_cast<int64_t>(m.vectors.size()), m.width},
            all.data()}},
          binary_dtype,
          {{"object", "list"}, {"model", e->id()}, {"usage", usage}});
    }
    json data = json::array();
    for (size_t i = 0; i < m.vectors.size(); ++i) {
      const std::vector<float>& v = m.vectors[i];
      data.push_back(
          {{"object", "embedding"},
           {"index", i},
           {"embedding", encoding == "base64"
                             ? json(Base64Encode(v.data(), v.size() * 4))
                             : json(v)}});
    }
    Reply(
        res, 200,
        {{"object", "list"},
         {"data", std::move(data)},
         {"model", e->id()},
         {"usage", {{"prompt_tokens", m.tokens}, {"total_tokens", m.tokens}}}});
    return Status();
  }

  // POST /v1/completions: OpenAI's text completions (one choice per
  // prompt), streamed as text_completion chunks when `stream` is true.
  Status Completions(const httplib::Request& req, httplib::Response& res) {
    ASSIGN_OR_RETURN(json b, ParseBody(req.body));
    RETURN_IF_ERROR(RefuseOpenAiFields(b));
    ASSIGN_OR_RETURN(auto e, EngineFor(b));
    ASSIGN_OR_RETURN(std::vector<json> prompts, OpenAiInputs(b, "prompt"));
    ASSIGN_OR_RETURN(bool stream, GetBool(b, "stream", false));
    if (stream && prompts.size() > 1)
      return InvalidArgumentError(
          "field `prompt`: a streamed completion takes one prompt, got " +
          std::to_string(prompts.size()));
    // OpenAI's defaults; hidden states only when asked for.
    const std::pair<const char*, json> defaults[] = {
        {"max_tokens", 16},
        {"temperature", 1.0},
        {"return_hidden_states", false}};
    for (const auto& [field, def] : defaults)
      if (!b.contains(field) || b[field].is_null()) b[field] = def;
    ASSIGN_OR_RETURN(bool special, GetBool(b, "add_special_tokens", true));
    ASSIGN_OR_RETURN(
        RequestInterventions ivs,
        Interventions(*e, b, static_cast<int64_t>(prompts.size())));
    std::vector<GenFields> fields;
    for (size_t i = 0; i < prompts.size(); ++i) {
      StatusOr<std::vector<int32_t>> ids = Tokens(*e, prompts[i], special);
      if (!ids.ok())
        return ids.status().WithContext("prompt " + std::to_string(i));
      ASSIGN_OR_RETURN(GenFields f,
                       ParseGen(*e, b, std::move(ids).value(), true));
      if (Status s = Attach(ivs, static_cast<int64_t>(i), &f.request); !s.ok())
        return s.WithContext("prompt " + std::to_string(i));
      fields.push_back(std::move(f));
    }
    if (stream)
      return Stream(res, e, std::move(fields[0]),
                    StreamKind::kOpenAiCompletion);
    ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Ticket>> tickets,
                     SubmitAll(*e, fields));
    json choices = json::array();
    size_t prompt_tokens = 0, completion_tokens = 0;
    for (size_t i = 0; i < tickets.size(); ++i) {
      StatusOr<GenResult> g = tickets[i]->Wait();
      if (!g.ok()) {
        for (size_t k = i + 1; k < tickets.size(); ++k) tickets[k]->Cancel();
        return g.status().WithContext("prompt " + std::to_string(i));
      }
      prompt_tokens += g->prompt_ids.size();
      completion_tokens += g->token_ids.size();
      json choice = {{"text", g->text},
                     {"index", i},
                     {"logprobs", nullptr},
                     {"finish_reason", FinishReason(g->stop_reason)}};
      ASSIGN_OR_RETURN(json body, GenResponse(*e, fields[i], *g));
      for (const char* extra :
           {"hidden_states", "activations", "attention_weights"})
        if (body.contains(extra)) choice[extra] = std::move(body[extra]);
      choices.push_back(std::move(choice));
    }
    Reply(res, 200,
          {{"id", "cmpl-" + std::to_string(std::time(nullptr))},
           {"object", "text_completion"},
           {"created", std::time(nullptr)},
           {"model", e->id()},
           {"choices", std::move(choices)},
           {"usage",
            {{"prompt_tokens", prompt_tokens},
             {"completion_tokens", completion_tokens},
             {"total_tokens", prompt_tokens + completion_tokens}}}});
    return Status();
  }

  // OpenAI's model object of a loaded model.
  json OpenAiModel(const Engine& e) {
    std::lock_guard<std::mutex> lock(models_mu_);
    const auto it = loaded_at_.find(e.id());
    return {{"id", e.id()},
            {"object", "model"},
            {"created", it == loaded_at_.end() ? 0 : it->second},
            {"owned_by", "loom"}};
  }

  json GpuStatus() {
    const int64_t total = HostMemoryBytes();
    const int64_t capacity =
        static_cast<int64_t>(static_cast<double>(total) * o_.memory_fraction);
    int64_t planned = 0, used = 0;
    json models = json::array();
    for (const auto& e : Engines()) {
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
    if (usage > o_.memory_warning_threshold)
      warnings.push_back(
          {{"device", "cpu"},
           {"message", "planned memory is above memory_warning_threshold"},
           {"usage_fraction", usage},
           {"threshold", o_.memory_warning_threshold}});
    return {
        {"has_gpu", false},
        {"note", "loom serve computes on the CPU; the devices list the host"},
        {"memory_fraction", o_.memory_fraction},
        {"memory_warning_threshold", o_.memory_warning_threshold},
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

  std::string Metrics() {
    std::string s;
    auto family = [&](const char* name, const char* type, const char* help) {
      s += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name +
           " " + type + "\n";
    };
    family("loom_http_requests_total", "counter",
           "HTTP requests by route and status code.");
    {
      std::lock_guard<std::mutex> lock(metrics_mu_);
      for (const auto& [k, v] : requests_)
        s += "loom_http_requests_total{route=\"" + k.first + "\",code=\"" +
             std::to_string(k.second) + "\"} " + std::to_string(v) + "\n";
    }
    if (recorder_ != nullptr) {  // persistence.auto_persist
      const ExperimentRecorder::Counts c = recorder_->counts();
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
      s += "loom_experiments_persist_dropped_total " +
           std::to_string(c.dropped) + "\n";
      family("loom_experiments_persist_queue", "gauge",
             "Experiments waiting to be written.");
      s += "loom_experiments_persist_queue " + std::to_string(c.queued) + "\n";
    }
    const auto engines = Engines();
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
        s += "loom_memory_planned_bytes{model=\"" + e->id() +
             "\",component=\"" + k + "\"} " + std::to_string(v) + "\n";
    }
    family("loom_memory_used_bytes", "gauge",
           "Bytes of the KV cache and capture budget in use.");
    for (const auto& e : engines) {
      const EngineMemory m = e->Memory();
      s += "loom_memory_used_bytes{model=\"" + e->id() +
           "\",component=\"kv\"} " + std::to_string(m.kv_used) + "\n";
      s += "loom_memory_used_bytes{model=\"" + e->id() +
           "\",component=\"capture\"} " + std::to_string(m.capture_used) + "\n";
    }
    return s;
  }
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  Stop();
  for (const auto& e : impl_->Engines()) e->Shutdown(true);
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
    h.set_pre_routing_handler(
        [p](const httplib::Request& req, httplib::Response& res) {
          if (p->draining_ && req.path != "/health") {
            res.set_header("Retry-After", "5");
            p->Reply(res, 503,
                     ErrorJson(req.path, 503, "the server is shutting down"));
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
            p->Reply(res, 401,
                     ErrorJson(req.path, 401,
                               "missing or wrong bearer token "
                               "(Authorization: Bearer <token>)"));
            return httplib::Server::HandlerResponse::Handled;
          }
          return httplib::Server::HandlerResponse::Unhandled;
        });
    h.set_error_handler(
        [p](const httplib::Request& req, httplib::Response& res) {
          if (!res.body.empty()) return;  // a route's own error reply
          std::string msg = "HTTP " + std::to_string(res.status);
          if (res.status == 404)
            msg = "no route " + req.method + " " + req.path;
          if (res.status == 413) msg = p->TooLarge(req);
          p->Reply(res, res.status, ErrorJson(req.path, res.status, msg));
        });
  }
  p->Register();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

StatusOr<std::string> Server::LoadModel(const std::string& name) {
  ASSIGN_OR_RETURN(auto e, impl_->Load(name));
  return e->id();
}

Status Server::UnloadModel(const std::string& id) { return impl_->Unload(id); }

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
          for (const auto& e : impl_->Engines()) e->Shutdown(false);
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
  for (const auto& e : impl_->Engines()) e->Shutdown(true);
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
