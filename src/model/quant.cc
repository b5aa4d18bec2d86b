#include "src/model/quant.h"

#include <filesystem>
#include <regex>

namespace loom {
namespace {

// '*' matches any run of characters (dots included).
bool GlobMatch(std::string_view pattern, std::string_view s) {
  size_t p = 0, i = 0, star = std::string_view::npos, mark = 0;
  while (i < s.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = i;
    } else if (p < pattern.size() && pattern[p] == s[i]) {
      ++p;
      ++i;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      i = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

StatusOr<std::vector<std::string>> StringList(const ConfigReader& r,
                                              const std::string& key) {
  std::vector<std::string> out;
  if (!r.Has(key)) return out;
  const nlohmann::json& v = r.json().at(key);
  if (!v.is_array())
    return InvalidArgumentError(r.source() + ": key '" + key + "' is " +
                                v.dump().substr(0, 80) +
                                ", expected a list of module names");
  for (const auto& e : v) {
    if (!e.is_string())
      return InvalidArgumentError(r.source() + ": key '" + key + "' holds " +
                                  e.dump() + ", expected strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

// ModelOpt's quant_algo ("NVFP4", "FP8") -> format.
StatusOr<FormatKind> ModelOptAlgo(const ConfigReader& r,
                                  const std::string& algo) {
  if (algo == "NVFP4") return FormatKind::kNvfp4ModelOpt;
  if (algo == "FP8") return FormatKind::kFp8PerTensor;
  return UnimplementedError(r.source() + ": quant_algo '" + algo +
                            "' is not supported (NVFP4, FP8)");
}

Status ParseFp8(const ConfigReader& q, QuantConfig* out) {
  ASSIGN_OR_RETURN(std::string fmt, q.String("fmt", "e4m3"));
  if (fmt != "e4m3")
    return UnimplementedError(q.source() + ": fmt '" + fmt +
                              "' is not supported (e4m3)");
  if (!q.Has("weight_block_size")) {
    out->format.kind = FormatKind::kFp8PerTensor;
    return Status();
  }
  const nlohmann::json& b = q.json().at("weight_block_size");
  if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() ||
      !b[1].is_number_integer() || b[0].get<int64_t>() <= 0 ||
      b[1].get<int64_t>() <= 0)
    return InvalidArgumentError(q.source() + ": weight_block_size = " +
                                b.dump() + ", expected [block_out, block_in]");
  out->format.kind = FormatKind::kFp8Block;
  out->format.block_out = b[0].get<int64_t>();
  out->format.block_in = b[1].get<int64_t>();
  // The scale dtype is the checkpoint's choice (BF16 in Qwen3's, F32 in
  // DeepSeek-V3's and transformers' own): headers tell; without them the
  // planner assumes F32 and checks the index's total_size.
  out->format.scale_dtype = DType::kF32;
  return Status();
}

Status ParseCompressedTensors(const ConfigReader& q, QuantConfig* out) {
  ASSIGN_OR_RETURN(std::string format, q.String("format", ""));
  ASSIGN_OR_RETURN(std::optional<ConfigReader> groups,
                   q.Object("config_groups"));
  if (groups) {
    for (const auto& [name, g] : groups->json().items()) {
      if (g.is_object() && g.contains("format") && g["format"].is_string())
        format = g["format"].get<std::string>();
    }
  }
  if (format != "nvfp4-pack-quantized")
    return UnimplementedError(q.source() + ": compressed-tensors format '" +
                              format +
                              "' is not supported (nvfp4-pack-quantized)");
  out->format.kind = FormatKind::kNvfp4CompressedTensors;
  ASSIGN_OR_RETURN(out->excluded, StringList(q, "ignore"));
  return Status();
}

}  // namespace

bool QuantConfig::Excludes(const std::string& module) const {
  for (const std::string& p : excluded) {
    if (p.rfind("re:", 0) == 0) {
      try {
        if (std::regex_match(module, std::regex(p.substr(3)))) return true;
      } catch (const std::regex_error&) {
        // An unusable pattern excludes nothing (the config is then reported
        // as storing that module quantized, and the matcher names it).
      }
      continue;
    }
    // The module itself or any parent at a '.' boundary.
    const std::string_view m(module);
    if (GlobMatch(p, m)) return true;
    for (size_t i = 0; i < m.size(); ++i)
      if (m[i] == '.' && GlobMatch(p, m.substr(0, i))) return true;
  }
  return false;
}

Status ParseQuantizationConfig(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(std::optional<ConfigReader> q,
                   r.Object("quantization_config"));
  if (!q) return Status();
  QuantConfig out;
  out.source = q->source();
  ASSIGN_OR_RETURN(out.method, q->String("quant_method"));
  if (out.method == "mxfp4") {
    out.format.kind = FormatKind::kMxfp4;
    ASSIGN_OR_RETURN(out.excluded, StringList(*q, "modules_to_not_convert"));
  } else if (out.method == "fp8") {
    RETURN_IF_ERROR(ParseFp8(*q, &out));
    ASSIGN_OR_RETURN(out.excluded, StringList(*q, "modules_to_not_convert"));
  } else if (out.method == "modelopt") {
    ASSIGN_OR_RETURN(std::string algo, q->String("quant_algo"));
    ASSIGN_OR_RETURN(out.format.kind, ModelOptAlgo(*q, algo));
    ASSIGN_OR_RETURN(out.excluded, StringList(*q, "ignore"));
    out.kv_cache_scales = q->Has("kv_cache_scheme");
  } else if (out.method == "compressed-tensors") {
    RETURN_IF_ERROR(ParseCompressedTensors(*q, &out));
  } else {
    return UnimplementedError(
        q->source() + ": quant_method '" + out.method +
        "' is not supported (fp8, mxfp4, modelopt, compressed-tensors)");
  }
  c->quant = std::move(out);
  return Status();
}

Status ReadHfQuantConfig(const std::string& model_dir, ModelConfig* c) {
  if (c->quant.quantized()) return Status();
  const std::string path = model_dir + "/hf_quant_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return Status();
  ASSIGN_OR_RETURN(ConfigReader file, ConfigReader::FromFile(path));
  ASSIGN_OR_RETURN(std::optional<ConfigReader> q, file.Object("quantization"));
  if (!q) return NotFoundError(path + ": missing required key 'quantization'");
  QuantConfig out;
  out.source = q->source();
  ASSIGN_OR_RETURN(out.method, q->String("quant_algo"));
  ASSIGN_OR_RETURN(out.format.kind, ModelOptAlgo(*q, out.method));
  ASSIGN_OR_RETURN(out.excluded, StringList(*q, "exclude_modules"));
  out.kv_cache_scales = q->Has("kv_cache_quant_algo");
  c->quant = std::move(out);
  return Status();
}

}  // namespace loom
