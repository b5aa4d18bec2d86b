#include "src/model/inspect.h"

#include <filesystem>
#include <set>
#include <sstream>

#include "src/base/units.h"
#include "src/io/safetensors.h"
#include "src/model/bind.h"
#include "src/model/registry.h"

namespace loom {
namespace {

std::string RopeName(RopeConfig::Type t) {
  switch (t) {
    case RopeConfig::Type::kNone:
      return "none";
    case RopeConfig::Type::kDefault:
      return "default";
    case RopeConfig::Type::kLinear:
      return "linear";
    case RopeConfig::Type::kDynamic:
      return "dynamic";
    case RopeConfig::Type::kLlama3:
      return "llama3";
    case RopeConfig::Type::kYarn:
      return "yarn";
  }
  return "?";
}

}  // namespace

StatusOr<InspectReport> InspectModel(const std::string& dir) {
  InspectReport rep;
  ASSIGN_OR_RETURN(rep.config, LoadModelConfig(dir));
  const ArchDef* arch = FindArch(rep.config.model_type);
  rep.runnable = arch->runnable;
  const ArchWeights decl = arch->declare_weights(rep.config);
  const bool has_single = std::filesystem::exists(dir + "/model.safetensors");
  const bool has_index =
      std::filesystem::exists(dir + "/model.safetensors.index.json");
  if (!has_single && !has_index) {
    rep.problems.push_back(
        "no model.safetensors or model.safetensors.index.json in " + dir +
        " (parameter count from the declared shapes)");
    std::set<std::string> seen;
    for (const auto& s : decl.specs)
      if (s.tied_to.empty() || !rep.config.tie_word_embeddings)
        rep.num_parameters += s.shape.numel();
    return rep;
  }
  StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  if (!ckpt.ok()) {
    rep.problems.push_back(ckpt.status().message());
    for (const auto& s : decl.specs)
      if (s.tied_to.empty() || !rep.config.tie_word_embeddings)
        rep.num_parameters += s.shape.numel();
    return rep;
  }
  rep.weights_present = true;
  for (const auto& f : (*ckpt)->files())
    rep.files.push_back(std::filesystem::path(f->path()).filename().string());
  for (const auto& e : (*ckpt)->entries()) {
    rep.num_parameters += e.info.shape.numel();
    rep.bytes_by_dtype[std::string(DTypeName(e.info.dtype))] += e.info.bytes();
  }
  StatusOr<std::vector<MatchedWeight>> m =
      MatchCheckpoint(rep.config, decl, **ckpt);
  if (!m.ok()) {
    rep.problems.push_back(m.status().message());
    return rep;
  }
  for (const MatchedWeight& w : *m)
    if (w.present && !w.tied) ++rep.weights_by_format[w.format.ToString()];
  return rep;
}

nlohmann::json InspectReport::ToJson() const {
  const ModelConfig& c = config;
  nlohmann::json j;
  j["model_type"] = c.model_type;
  j["architecture"] = c.architecture;
  j["runnable"] = runnable;
  j["num_layers"] = c.num_layers;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = std::string(DTypeLongName(c.torch_dtype));
  j["rope"] = {{"type", RopeName(c.rope.type)},
               {"theta", c.rope.theta},
               {"rotary_dim", c.rope.rotary_dim}};
  j["sliding_window"] = c.sliding_window;
  j["num_parameters"] = num_parameters;
  j["bytes_by_dtype"] = bytes_by_dtype;
  j["weights_by_format"] = weights_by_format;
  j["quantization"] = c.quant.quantized()
                          ? nlohmann::json(c.quant.format.ToString())
                          : nlohmann::json(nullptr);
  j["weights_present"] = weights_present;
  j["files"] = files;
  j["problems"] = problems;
  return j;
}

std::string InspectReport::ToText() const {
  const ModelConfig& c = config;
  std::ostringstream o;
  o << "model_type        " << c.model_type
    << (c.architecture.empty() ? "" : " (" + c.architecture + ")")
    << (runnable ? "" : "  [plan/inspect only: forward not implemented]")
    << "\n";
  o << "layers            " << c.num_layers << "\n";
  o << "hidden            " << c.hidden_size << "  (intermediate "
    << c.intermediate_size << ")\n";
  o << "attention         " << c.num_heads << " heads x " << c.head_dim << ", "
    << c.num_kv_heads << " kv heads";
  int64_t windowed = 0;
  for (int64_t w : c.sliding_window) windowed += w > 0;
  if (windowed)
    o << ", sliding window on " << windowed << "/" << c.num_layers << " layers";
  o << "\n";
  o << "positions         "
    << (c.learned_positions ? "learned" : "rope " + RopeName(c.rope.type))
    << ", max " << c.max_position_embeddings << "\n";
  o << "vocab             " << c.vocab_size
    << (c.tie_word_embeddings ? "  (tied embeddings)" : "") << "\n";
  o << "parameters        " << num_parameters << "\n";
  for (const auto& [d, b] : bytes_by_dtype)
    o << "bytes " << d << std::string(12 - std::min<size_t>(11, d.size()), ' ')
      << b << "  (" << FormatBytes(b) << ")\n";
  if (c.quant.quantized())
    o << "quantization      " << c.quant.format.ToString() << " ("
      << c.quant.source << ")\n";
  for (const auto& [f, n] : weights_by_format)
    o << "weights " << f << std::string(10 - std::min<size_t>(9, f.size()), ' ')
      << n << "\n";
  if (!files.empty()) {
    o << "files            ";
    for (const auto& f : files) o << " " << f;
    o << "\n";
  }
  if (problems.empty()) {
    o << "checkpoint        OK\n";
  } else {
    for (const auto& p : problems) o << "PROBLEM           " << p << "\n";
  }
  return o.str();
}

}  // namespace loom
