#include "src/model/arch/moe.h"

#include <algorithm>
#include <filesystem>

#include "src/io/safetensors.h"

namespace loom {

bool MoEConfig::IsSparseLayer(int64_t layer) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) !=
      mlp_only_layers.end())
    return false;
  return decoder_sparse_step > 0 && (layer + 1) % decoder_sparse_step == 0;
}

namespace arch {

Status ParseMoe(const ConfigReader& r, const MoeKeys& keys, ModelConfig* c) {
  MoEConfig& m = c->moe;
  c->mlp = MlpKind::kMoE;
  ASSIGN_OR_RETURN(m.num_experts, r.Int(keys.num_experts));
  const std::string topk_key =
      !r.Has("num_experts_per_tok") && r.Has("experts_per_token")
          ? "experts_per_token"
          : "num_experts_per_tok";
  ASSIGN_OR_RETURN(m.experts_per_token, r.Int(topk_key));
  if (m.num_experts <= 0 || m.experts_per_token <= 0 ||
      m.experts_per_token > m.num_experts)
    return InvalidArgumentError(
        r.source() + ": " + topk_key + " = " +
        std::to_string(m.experts_per_token) + ", " + keys.num_experts + " = " +
        std::to_string(m.num_experts) + ", expected 0 < " + topk_key +
        " <= " + keys.num_experts);
  if (keys.expert_intermediate_size.empty()) {
    m.expert_intermediate_size = c->intermediate_size;
  } else {
    ASSIGN_OR_RETURN(m.expert_intermediate_size,
                     r.Int(keys.expert_intermediate_size));
    if (m.expert_intermediate_size <= 0)
      return InvalidArgumentError(
          r.source() + ": " + keys.expert_intermediate_size + " = " +
          std::to_string(m.expert_intermediate_size) + ", expected > 0");
  }
  if (keys.read_norm_topk_prob) {
    ASSIGN_OR_RETURN(m.norm_topk_prob, r.Bool("norm_topk_prob", false));
  } else {
    m.norm_topk_prob = keys.norm_topk_prob;
  }
  m.router_bias = keys.router_bias;
  if (keys.shared_expert) {
    ASSIGN_OR_RETURN(m.shared_expert_intermediate_size,
                     r.Int("shared_expert_intermediate_size"));
    if (m.shared_expert_intermediate_size <= 0)
      return InvalidArgumentError(
          r.source() + ": shared_expert_intermediate_size = " +
          std::to_string(m.shared_expert_intermediate_size) + ", expected > 0");
    m.shared_expert_gate = true;
  }
  if (keys.qwen_sparse_layers) {
    ASSIGN_OR_RETURN(m.decoder_sparse_step, r.Int("decoder_sparse_step", 1));
    if (m.decoder_sparse_step <= 0)
      return InvalidArgumentError(r.source() + ": decoder_sparse_step = " +
                                  std::to_string(m.decoder_sparse_step) +
                                  ", expected > 0");
    if (r.Has("mlp_only_layers")) {
      const nlohmann::json& v = r.json().at("mlp_only_layers");
      if (!v.is_array())
        return InvalidArgumentError(
            r.source() + ": mlp_only_layers = " + v.dump().substr(0, 80) +
            ", expected a list of layer indices");
      for (const auto& e : v) {
        if (!e.is_number_integer() || e.get<int64_t>() < 0 ||
            e.get<int64_t>() >= c->num_layers)
          return InvalidArgumentError(r.source() + ": mlp_only_layers holds " +
                                      e.dump() +
                                      ", expected layer indices in [0, " +
                                      std::to_string(c->num_layers) + ")");
        m.mlp_only_layers.push_back(e.get<int64_t>());
      }
    }
  }
  return Status();
}

Status DetectPackedExperts(const std::string& model_dir, ModelConfig* c) {
  if (c->mlp != MlpKind::kMoE || c->moe.expert_act != ExpertActKind::kGated)
    return Status();
  if (c->moe.packed_experts) {  // the architecture's only layout (GraniteMoE)
    if (c->quant.quantized())
      return UnimplementedError(
          model_dir + ": " + c->model_type +
          " stores its experts packed, and this checkpoint quantizes them (" +
          c->quant.method + ", " + c->quant.source +
          "); packed experts are supported dense only (F32, BF16, F16)");
    return Status();
  }
  namespace fs = std::filesystem;
  const std::string index = model_dir + "/model.safetensors.index.json";
  const std::string single = model_dir + "/model.safetensors";
  std::error_code ec;
  std::vector<std::string> names;
  if (fs::exists(index, ec)) {
    ASSIGN_OR_RETURN(SafetensorsIndex idx, ReadSafetensorsIndex(index));
    for (const auto& [name, shard] : idx.weight_map) names.push_back(name);
  } else if (fs::exists(single, ec)) {
    ASSIGN_OR_RETURN(SafetensorsHeader h, ReadSafetensorsHeader(single));
    for (const TensorInfo& t : h.tensors) names.push_back(t.name);
  }
  static const std::string kPacked = ".mlp.experts.gate_up_proj";
  for (const std::string& name : names) {
    if (name.size() < kPacked.size() ||
        name.compare(name.size() - kPacked.size(), kPacked.size(), kPacked) !=
            0)
      continue;
    if (c->quant.quantized())
      return UnimplementedError(
          model_dir + ": tensor " + name + " stores " + c->model_type +
          "'s experts packed, and quantized (" + c->quant.method + ", " +
          c->quant.source +
          "); packed experts are supported dense only (F32, BF16, F16)");
    c->moe.packed_experts = true;
    return Status();
  }
  return Status();
}

void DeclareMoeLayer(const ModelConfig& c, int64_t i, const MoeNames& n,
                     std::vector<WeightSpec>* specs) {
  const int64_t H = c.hidden_size, I = c.moe.expert_intermediate_size,
                E = c.moe.num_experts;
  // transformers 5 names every packed MoE block "mlp." (Mixtral included).
  const std::string p = "model.layers." + std::to_string(i) + "." +
                        (c.moe.packed_experts ? n.packed_block : n.block);
  auto add = [&](std::string name, WeightRole role, int64_t expert,
                 Shape shape) {
    AddSpec(specs, std::move(name), role, i, std::move(shape));
    specs->back().expert = expert;
    specs->back().linear = true;
  };
  add(p + n.router + ".weight", WeightRole::kRouter, kNoExpert, {E, H});
  if (c.moe.router_correction_bias) {
    AddSpec(specs, p + n.router + ".e_score_correction_bias",
            WeightRole::kRouterCorrectionBias, i, {E});
  }
  if (c.moe.packed_experts) {
    // Expert e's gate is rows [0, I) of gate_up[e], its up rows [I, 2I)
    // (WeightOperandOf serves kExpertGate / kExpertUp from them).
    add(p + n.packed_gate_up, WeightRole::kExpertGateUp, kAllExperts,
        {E, 2 * I, H});
    add(p + n.packed_down, WeightRole::kExpertDown, kAllExperts, {E, H, I});
  }
  for (int64_t e = 0; e < E && !c.moe.packed_experts; ++e) {
    const std::string x = p + "experts." + std::to_string(e) + ".";
    add(x + n.gate + ".weight", WeightRole::kExpertGate, e, {I, H});
    add(x + n.up + ".weight", WeightRole::kExpertUp, e, {I, H});
    add(x + n.down + ".weight", WeightRole::kExpertDown, e, {H, I});
  }
  const int64_t S = c.moe.shared_expert_intermediate_size;
  if (S > 0) {
    const std::string s = p + n.shared + ".";
    add(s + "gate_proj.weight", WeightRole::kSharedExpertGateProj, kNoExpert,
        {S, H});
    add(s + "up_proj.weight", WeightRole::kSharedExpertUp, kNoExpert, {S, H});
    add(s + "down_proj.weight", WeightRole::kSharedExpertDown, kNoExpert,
        {H, S});
  }
  if (c.moe.shared_expert_gate)
    add(p + "shared_expert_gate.weight", WeightRole::kSharedExpertGate,
        kNoExpert, {1, H});
}

ArchWeights DeclareMoeDecoder(const ModelConfig& c, const DecoderNames& names,
                              const MoeNames& moe) {
  ModelConfig dense = c;
  dense.mlp = MlpKind::kGated;
  dense.mlp_bias = false;
  ArchWeights decl = DeclareDecoderWeights(dense, names);
  std::vector<WeightSpec> specs;
  specs.reserve(decl.specs.size());
  for (WeightSpec& s : decl.specs) {
    const bool mlp = s.role == WeightRole::kGate || s.role == WeightRole::kUp ||
                     s.role == WeightRole::kDown;
    if (s.layer >= 0 && mlp && c.moe.IsSparseLayer(s.layer)) {
      if (s.role == WeightRole::kGate) DeclareMoeLayer(c, s.layer, moe, &specs);
      continue;
    }
    specs.push_back(std::move(s));
  }
  decl.specs = std::move(specs);
  return decl;
}

}  // namespace arch
}  // namespace loom
