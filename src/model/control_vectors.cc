#include "src/model/control_vectors.h"

#include <cmath>
#include <map>
#include <string_view>
#include <utility>

#include "src/core/tensor.h"
#include "src/io/gguf.h"

namespace loom {
namespace {

constexpr std::string_view kPrefix = "direction.";

// The layer N of a tensor named "direction.N" (decimal digits), or -1.
int64_t DirectionLayer(const std::string& name) {
  if (name.size() <= kPrefix.size() || name.compare(0, kPrefix.size(), kPrefix))
    return -1;
  int64_t n = 0;
  for (size_t i = kPrefix.size(); i < name.size(); ++i) {
    const char c = name[i];
    if (c < '0' || c > '9') return -1;
    if (n > (int64_t{1} << 40)) return -1;  // absurd; reported as unparsable
    n = n * 10 + (c - '0');
  }
  return n;
}

// The checks of one tensor of `path` (its layer, shape and width).
StatusOr<int64_t> CheckDirection(const std::string& path,
                                 const GgufTensorInfo& t,
                                 const ModelConfig& config) {
  const std::string what = path + ": tensor '" + t.name + "'";
  const int64_t layer = DirectionLayer(t.name);
  if (layer < 0)
    return InvalidArgumentError(
        what +
        " is not a control-vector direction (expected direction.N, "
        "N the layer)");
  if (layer == 0)
    return InvalidArgumentError(
        what +
        ": layer 0 gets no control vector (llama.cpp refuses "
        "direction.0 too; direction.N is added to the output of "
        "layer N)");
  if (layer >= config.num_layers)
    return InvalidArgumentError(
        what + ": layer " + std::to_string(layer) + " is outside the model's " +
        std::to_string(config.num_layers) + " layers (0 to " +
        std::to_string(config.num_layers - 1) + ")");
  if (t.dims.size() != 1)
    return InvalidArgumentError(what + " has shape " +
                                Shape(t.dims).ToString() +
                                ", expected one dimension [" +
                                std::to_string(config.hidden_size) + "]");
  if (t.dims[0] != config.hidden_size)
    return InvalidArgumentError(what + " has width " +
                                std::to_string(t.dims[0]) +
                                " but the model's hidden_size is " +
                                std::to_string(config.hidden_size));
  return layer;
}

// Adds `scale` times each direction of the file to `sum` (layer -> vector).
Status AddFile(const ControlVectorFile& file, const ModelConfig& config,
               std::map<int64_t, std::vector<float>>* sum) {
  if (!std::isfinite(file.scale))
    return InvalidArgumentError(file.path + ": scale " +
                                std::to_string(file.scale) + " is not finite");
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(file.path));
  const GgufHeader& h = gguf->header();
  if (h.tensors.empty())
    return InvalidArgumentError(file.path +
                                ": no direction.N tensors (not a control "
                                "vector file?)");
  for (const GgufTensorInfo& t : h.tensors) {
    ASSIGN_OR_RETURN(const int64_t layer, CheckDirection(file.path, t, config));
    ASSIGN_OR_RETURN(const std::vector<float> v, gguf->ReadF32(t));
    std::vector<float>& acc = (*sum)[layer];
    acc.resize(v.size(), 0.0f);
    for (size_t i = 0; i < v.size(); ++i) {
      if (!std::isfinite(v[i]))
        return InvalidArgumentError(file.path + ": tensor '" + t.name +
                                    "': element " + std::to_string(i) +
                                    " is not finite");
      acc[i] += v[i] * file.scale;
    }
  }
  return Status();
}

}  // namespace

StatusOr<std::vector<Intervention>> ControlVectorInterventions(
    const std::vector<ControlVectorFile>& files,
    const std::optional<ControlVectorLayerRange>& range,
    const ModelConfig& config) {
  std::vector<Intervention> out;
  if (files.empty()) return out;
  int64_t first = 1, last = config.num_layers - 1;
  if (range) {
    if (range->first > 0) first = range->first;
    if (range->last > 0) last = range->last;
    if (first > last)
      return InvalidArgumentError(
          "--control-vector-layer-range " + std::to_string(range->first) + " " +
          std::to_string(range->last) + ": the start (layer " +
          std::to_string(first) + ") is after the end (layer " +
          std::to_string(last) + ")");
  }
  // Per file, then across files, as llama.cpp sums them.
  std::map<int64_t, std::vector<float>> sum;
  for (const ControlVectorFile& f : files) {
    std::map<int64_t, std::vector<float>> one;
    RETURN_IF_ERROR(AddFile(f, config, &one));
    for (auto& [layer, v] : one) {
      std::vector<float>& acc = sum[layer];
      acc.resize(v.size(), 0.0f);
      for (size_t i = 0; i < v.size(); ++i) acc[i] += v[i];
    }
  }
  for (auto& [layer, v] : sum) {
    if (layer < first || layer > last) continue;
    for (float x : v)
      if (!std::isfinite(x))
        return InvalidArgumentError(
            "control vectors: the scaled sum for layer " +
            std::to_string(layer) + " is not finite");
    Intervention iv;
    iv.hook = HookPoint{HookSite::kResidPost, layer};
    iv.mode = InterventionMode::kAdd;
    iv.scale = 1.0f;
    iv.positions.kind = InterventionPositions::Kind::kAll;
    iv.apply_to = InterventionApplyTo::kBoth;
    iv.vector = std::move(v);
    out.push_back(std::move(iv));
  }
  return out;
}

}  // namespace loom
