// Harness: config.json -> ModelConfig for every registered architecture, and
// what is derived from it before any weight is read: the per-layer configs,
// the architecture's weight declaration and a memory plan of the model
// directory (config only, no weights: what `loom plan` does for a hub config).
#include <algorithm>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "src/model/layer_config.h"
#include "src/model/registry.h"
#include "src/plan/planner.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom;
  const std::string dir = fuzz::ScratchDir() + "/config";
  fuzz::WriteScratch(
      "config/config.json",
      std::string_view(reinterpret_cast<const char*>(data), size));
  auto config = LoadModelConfig(dir);
  if (!config.ok()) return 0;
  const std::vector<LayerConfig> layers = MakeLayerConfigs(*config);
  if (static_cast<int64_t>(layers.size()) != config->num_layers)
    fuzz::Fail("MakeLayerConfigs gave " + std::to_string(layers.size()) +
               " layers for num_layers " + std::to_string(config->num_layers));
  const ArchDef* arch = FindArch(config->model_type);
  if (arch == nullptr) fuzz::Fail("parsed an unregistered model_type");
  (void)arch->declare_weights(*config);
  // Planning a model of many thousand expert tensors (48 layers of 128
  // experts) takes seconds under the sanitizers: such configs are parsed and
  // declared, the rest are planned too.
  if (config->num_layers * std::max<int64_t>(1, config->moe.num_experts) > 1024)
    return 0;
  auto device = ParseDevice("cpu=1TiB", int64_t{1} << 40);
  if (!device.ok()) fuzz::Fail(device.status().ToString());
  JobSpec job;
  job.batch_tokens = 64;
  job.context = 64;
  (void)PlanModelDir(dir, job, {*device}, int64_t{1} << 40, KernelCosts{});
  return 0;
}
