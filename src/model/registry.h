// The architecture registry: one explicit table (registry.cc) mapping HF
// `model_type` to the architecture's config parser and weight declaration.
#ifndef LOOM_MODEL_REGISTRY_H_
#define LOOM_MODEL_REGISTRY_H_

#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/model/config.h"
#include "src/model/config_reader.h"
#include "src/model/weights.h"

namespace loom {

struct ArchDef {
  std::string_view model_type;
  // Fills `config` from config.json (the registry sets model_type first).
  Status (*parse_config)(const ConfigReader& reader, ModelConfig* config);
  ArchWeights (*declare_weights)(const ModelConfig& config);
  // False for architectures that can be planned and inspected but not yet run.
  bool runnable;
};

const ArchDef* FindArch(std::string_view model_type);
// "gemma, gemma2, gpt2, ... (planned and inspected only, not yet run:
// gemma3, gemma3_text)" (sorted), for error messages.
std::string SupportedModelTypes();
const std::vector<ArchDef>& AllArchs();

// Reads `model_dir`/config.json and parses it with the registered
// architecture. Unknown model_type -> Unimplemented listing the supported ones.
StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);
StatusOr<ModelConfig> ParseModelConfig(const ConfigReader& reader);

}  // namespace loom

#endif  // LOOM_MODEL_REGISTRY_H_
