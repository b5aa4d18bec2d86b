#include "src/serve/loaders.h"

#include <climits>
#include <utility>

#include "src/core/json_int.h"
#include "src/model/inspect.h"
#include "src/model/registry.h"

namespace loom::serve {
namespace {

using json = nlohmann::json;

std::string ListOfInts(const std::vector<int>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i)
    out += (i > 0 ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

// A device index: an integral number (1.0 too) within int's range; nullopt
// otherwise (casting a float beyond int would be undefined behaviour).
std::optional<int> DeviceIndex(const json& x) {
  const std::optional<int64_t> v = JsonInt64(x, true);
  if (!v || *v < INT_MIN || *v > INT_MAX) return std::nullopt;
  return static_cast<int>(*v);
}

}  // namespace

json LoadersJson() {
  json runnable = json::array(), inspect_only = json::array();
  for (const ArchDef& a : AllArchs())
    (a.runnable ? runnable : inspect_only).push_back(std::string(a.model_type));
  return {{"loaders",
           {{"loom",
             {{"name", "loom"},
              {"type", "LoomLoader"},
              {"description",
               "Loom reads Hugging Face checkpoint directories itself "
               "(config.json, safetensors, tokenizer), its own quantized "
               "formats included"},
              {"architectures", runnable},
              {"architectures_inspect_only", inspect_only}}}}},
          {"fallback_order", json::array({"loom"})}};
}

json ProbeJson(const std::string& model_id, const StatusOr<std::string>& dir) {
  json out = {{"model_id", model_id},
              {"configured_loader", nullptr},
              {"detected_loader", nullptr},
              {"can_load", {{"loom", false}}},
              {"selected_loader", "loom"}};
  if (!dir.ok()) {
    out["reason"] = dir.status().message();
    return out;
  }
  StatusOr<InspectReport> rep = InspectModel(*dir);
  if (!rep.ok()) {
    out["reason"] = rep.status().message();
    return out;
  }
  json formats = json::array();
  for (const auto& [format, n] : rep->weights_by_format)
    formats.push_back(format);
  const bool can =
      rep->runnable && rep->weights_present && rep->problems.empty();
  out["can_load"]["loom"] = can;
  if (can) out["detected_loader"] = "loom";
  out["architecture"] = rep->config.model_type;
  out["architectures"] = rep->config.architecture;
  out["runnable"] = rep->runnable;
  out["weights_present"] = rep->weights_present;
  out["weight_formats"] = formats;
  out["num_parameters"] = rep->num_parameters;
  out["problems"] = rep->problems;
  if (!can) {
    out["reason"] =
        !rep->runnable
            ? "architecture " + rep->config.model_type +
                  " can be inspected and planned by Loom but not yet run"
        : !rep->weights_present ? "no safetensors weights in the directory"
                                : rep->problems.front();
  }
  return out;
}

json GpuSelection::StateLocked() const {
  return {{"allowed_devices", allowed_},
          {"default_device",
           default_ ? "cuda:" + std::to_string(*default_) : "cpu"},
          {"available_devices", available_}};
}

StatusOr<json> GpuSelection::Configure(const json& b) {
  if (!b.is_object())
    return InvalidArgumentError("the request body must be a JSON object");
  const json allowed = b.value("allowed_devices", json(nullptr));
  const json def = b.value("default_device", json(nullptr));
  if (allowed.is_null() && def.is_null())
    return InvalidArgumentError(
        "At least one of 'allowed_devices' or 'default_device' must be "
        "provided");
  std::vector<int> list;
  if (!allowed.is_null()) {
    if (!allowed.is_array())
      return InvalidArgumentError(
          "field `allowed_devices`: expected a list of integers or null");
    for (const json& x : allowed) {
      const std::optional<int> d = DeviceIndex(x);
      if (!d)
        return InvalidArgumentError(
            "field `allowed_devices`: expected a list of integers, got " +
            x.dump());
      list.push_back(*d);
    }
  }
  std::optional<int> want;
  if (!def.is_null()) {
    want = DeviceIndex(def);
    if (!want)
      return InvalidArgumentError(
          "field `default_device`: expected an integer or null, got " +
          def.dump());
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> changes;
  const std::string no_gpu =
      " (loom serve computes on the CPU: it has no GPU device to select)";
  if (!allowed.is_null()) {
    std::vector<int> bad;
    for (int d : list) {
      bool ok = false;
      for (int a : available_) ok = ok || a == d;
      if (!ok) bad.push_back(d);
    }
    if (!bad.empty())
      return InvalidArgumentError(
          "Invalid device indices: " + ListOfInts(bad) +
          ". Available devices: " + ListOfInts(available_) +
          (available_.empty() ? no_gpu : ""));
    if (list.empty() && !available_.empty())
      return InvalidArgumentError(
          "allowed_devices cannot be empty when GPUs are available");
    allowed_ = list;
    allowed_set_ = true;
    if (default_) {
      bool still = false;
      for (int d : allowed_) still = still || d == *default_;
      if (!still) default_.reset();
    }
    changes.push_back("allowed_devices updated to " + ListOfInts(allowed_));
  }
  if (want) {
    const std::vector<int>& pool = allowed_set_ ? allowed_ : available_;
    bool ok = false;
    for (int d : pool) ok = ok || d == *want;
    if (!ok)
      return InvalidArgumentError(
          "Device " + std::to_string(*want) + " not in allowed_devices: " +
          ListOfInts(pool) + (available_.empty() ? no_gpu : ""));
    default_ = *want;
    changes.push_back("default_device updated to " + std::to_string(*want));
  }
  json out = StateLocked();
  std::string message;
  for (size_t i = 0; i < changes.size(); ++i)
    message += (i > 0 ? "; " : "") + changes[i];
  out["message"] = message;
  return out;
}

}  // namespace loom::serve
