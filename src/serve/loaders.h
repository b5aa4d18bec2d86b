// TheLoom's loader and device routes, answered for Loom (docs/server.md,
// "Loaders and devices"):
//   GET /loaders              one loader, `loom`: Loom reads checkpoints
//                             itself (safetensors, its own quantized
//                             formats), whatever the architecture's origin;
//   GET /loaders/probe/{id}   whether Loom can load a model id (resolved as a
//                             load would: a --model directory or a name under
//                             models.dirs), with its architecture, storage
//                             formats and the checkpoint's problems;
//   POST /gpu/configure       TheLoom's device selection, validated against
//                             the devices loom serve computes on: none, since
//                             it serves on the CPU, so any device index is a
//                             400 and the only default is "cpu".
#ifndef LOOM_SERVE_LOADERS_H_
#define LOOM_SERVE_LOADERS_H_

#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "src/base/status.h"

namespace loom::serve {

// GET /loaders: {loaders: {loom: {name, type, ...}}, fallback_order: [loom]}.
nlohmann::json LoadersJson();

// GET /loaders/probe/{id}. `model_id` as requested ("--" already turned into
// "/"); `dir` the model directory it resolves to, or why it does not.
nlohmann::json ProbeJson(const std::string& model_id,
                         const StatusOr<std::string>& dir);

// POST /gpu/configure's state. Thread-safe.
class GpuSelection {
 public:
  // `available`: the device indices loom serve can compute on (none today).
  explicit GpuSelection(std::vector<int> available = {})
      : available_(std::move(available)), allowed_(available_) {}

  // Applies {allowed_devices, default_device} as TheLoom does (allowed
  // first; a failed check is InvalidArgument with TheLoom's reason) and
  // returns {allowed_devices, default_device, available_devices, message}.
  StatusOr<nlohmann::json> Configure(const nlohmann::json& body);

 private:
  nlohmann::json StateLocked() const;

  std::mutex mu_;
  const std::vector<int> available_;
  std::vector<int> allowed_;  // starts as every available device
  bool allowed_set_ = false;
  std::optional<int> default_;
};

}  // namespace loom::serve

#endif  // LOOM_SERVE_LOADERS_H_
