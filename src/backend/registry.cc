#include "src/backend/registry.h"

#include "src/backend/cpu/cpu_backend.h"

namespace loom {

const std::vector<BackendEntry>& Backends() {
  static const std::vector<BackendEntry> kBackends = {
      {"cpu", [] { return std::unique_ptr<Backend>(new cpu::CpuBackend()); }},
  };
  return kBackends;
}

StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view name) {
  std::string known;
  for (const BackendEntry& e : Backends()) {
    if (e.name == name) return e.create();
    known += (known.empty() ? "" : ", ") + std::string(e.name);
  }
  return NotFoundError("no backend named '" + std::string(name) +
                       "' in this build (available: " + known + ")");
}

}  // namespace loom
