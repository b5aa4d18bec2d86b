#include "src/model/registry.h"

#include <algorithm>

#include "src/model/arch/archs.h"
#include "src/model/arch/moe.h"
#include "src/model/quant.h"

namespace loom {

const std::vector<ArchDef>& AllArchs() {
  // The registry: one row per architecture, in alphabetical order.
  static const std::vector<ArchDef>* const kArchs = new std::vector<ArchDef>{
      arch::kBloom,    arch::kCodegen,    arch::kCohere,     arch::kDeepseekV3,
      arch::kFalcon,   arch::kGlm,        arch::kGemma,      arch::kGemma2,
      arch::kGemma3,   arch::kGemma3Text, arch::kGpt2,       arch::kGptBigcode,
      arch::kGptNeo,   arch::kGptNeox,    arch::kGptOss,     arch::kGptj,
      arch::kGranite,  arch::kGranitemoe, arch::kLlama,      arch::kMistral,
      arch::kMixtral,  arch::kNemotron,   arch::kOlmo,       arch::kOlmo2,
      arch::kOlmoe,    arch::kOpt,        arch::kPersimmon,  arch::kPhi,
      arch::kPhi3,     arch::kQwen2,      arch::kQwen2Moe,   arch::kQwen3,
      arch::kQwen3Moe, arch::kStablelm,   arch::kStarcoder2,
  };
  return *kArchs;
}

const ArchDef* FindArch(std::string_view model_type) {
  for (const ArchDef& a : AllArchs())
    if (a.model_type == model_type) return &a;
  return nullptr;
}

std::string SupportedModelTypes() {
  std::vector<std::string> run, plan_only;
  for (const ArchDef& a : AllArchs())
    (a.runnable ? run : plan_only).emplace_back(a.model_type);
  auto join = [](std::vector<std::string> names) {
    std::sort(names.begin(), names.end());
    std::string s;
    for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
    return s;
  };
  std::string s = join(run);
  if (!plan_only.empty())
    s += " (planned and inspected only, not yet run: " + join(plan_only) + ")";
  return s;
}

StatusOr<ModelConfig> ParseModelConfig(const ConfigReader& reader) {
  ASSIGN_OR_RETURN(std::string model_type, reader.String("model_type"));
  const ArchDef* arch = FindArch(model_type);
  if (arch == nullptr)
    return UnimplementedError(
        reader.source() + ": model_type '" + model_type +
        "' is not supported; supported: " + SupportedModelTypes());
  ModelConfig config;
  config.model_type = model_type;
  if (reader.Has("architectures") &&
      reader.json().at("architectures").is_array() &&
      !reader.json().at("architectures").empty() &&
      reader.json().at("architectures")[0].is_string())
    config.architecture =
        reader.json().at("architectures")[0].get<std::string>();
  RETURN_IF_ERROR(arch->parse_config(reader, &config));
  RETURN_IF_ERROR(ParseQuantizationConfig(reader, &config));
  // transformers' MXFP4 quantizer loads the unconverted modules in bf16 when
  // config.json names no torch_dtype (gpt-oss's does not): they are stored so.
  if (config.quant.format.kind == FormatKind::kMxfp4 &&
      !reader.Has("torch_dtype"))
    config.torch_dtype = DType::kBF16;
  return config;
}

StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  ASSIGN_OR_RETURN(ConfigReader reader,
                   ConfigReader::FromFile(model_dir + "/config.json"));
  ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(reader));
  RETURN_IF_ERROR(ReadHfQuantConfig(model_dir, &config));
  RETURN_IF_ERROR(arch::DetectPackedExperts(model_dir, &config));
  return config;
}

}  // namespace loom
