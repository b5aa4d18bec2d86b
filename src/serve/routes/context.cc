// ModelRegistry and RequestCounts (context.h): which models are loaded,
// loading (admission by memory plan, least-recently-used eviction) and
// unloading them; the per-route reply counts.
#include "src/serve/routes/context.h"

#include <cctype>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "src/serve/routes/common.h"

namespace loom::serve::routes {

namespace {

namespace fs = std::filesystem;

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

}  // namespace

StatusOr<std::string> ModelRegistry::Resolve(const std::string& name,
                                             std::string* dir) {
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

std::shared_ptr<Engine> ModelRegistry::Find(const std::string& id) {
  std::lock_guard<std::mutex> lock(models_mu_);
  const auto it = models_.find(id);
  if (it == models_.end()) return nullptr;
  last_used_[id] = Clock::now();
  return it->second;
}

// Makes room for one more model under models.max_loaded, as TheLoom does:
// the least recently used model with nothing queued or running is
// unloaded. FailedPrecondition when every loaded model is busy.
Status ModelRegistry::MakeRoom(const std::string& id) {
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

StatusOr<std::shared_ptr<Engine>> ModelRegistry::Load(const std::string& name) {
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
                 static_cast<long long>(committed), o_.memory_warning_threshold,
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

Status ModelRegistry::Unload(const std::string& id) {
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
StatusOr<std::shared_ptr<Engine>> ModelRegistry::EngineFor(const json& body) {
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

std::vector<std::shared_ptr<Engine>> ModelRegistry::Engines() {
  std::lock_guard<std::mutex> lock(models_mu_);
  std::vector<std::shared_ptr<Engine>> out;
  for (const auto& [_, e] : models_) out.push_back(e);
  return out;
}

int64_t ModelRegistry::LoadedAt(const std::string& id) {
  std::lock_guard<std::mutex> lock(models_mu_);
  const auto it = loaded_at_.find(id);
  return it == loaded_at_.end() ? 0 : it->second;
}

void RequestCounts::Count(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[{route, status}];
}

std::map<std::pair<std::string, int>, int64_t> RequestCounts::Snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

}  // namespace loom::serve::routes
