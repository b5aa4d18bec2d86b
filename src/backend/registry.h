// The backends this build has, by name ("cpu"). Adding a backend: its
// directory src/backend/<name>/ and one line in registry.cc.
#ifndef LOOM_BACKEND_REGISTRY_H_
#define LOOM_BACKEND_REGISTRY_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/backend/backend.h"
#include "src/base/status.h"

namespace loom {

using BackendFactory = std::unique_ptr<Backend> (*)();

struct BackendEntry {
  std::string_view name;
  BackendFactory create;
};

// Every registered backend, in registration order.
const std::vector<BackendEntry>& Backends();

// A new instance of backend `name`; NotFound naming the known backends.
StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view name);

}  // namespace loom

#endif  // LOOM_BACKEND_REGISTRY_H_
