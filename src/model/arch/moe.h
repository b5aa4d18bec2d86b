// Mixture-of-experts building blocks shared by the MoE architectures
// (mixtral.cc, qwen2_moe.cc, qwen3_moe.cc, gpt_oss.cc): the config keys are
// parsed and validated once (ParseMoe), and a layer's router / experts /
// shared expert are declared by one loop (DeclareMoeLayer).
#ifndef LOOM_MODEL_ARCH_MOE_H_
#define LOOM_MODEL_ARCH_MOE_H_

#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/model/arch/common.h"
#include "src/model/config.h"
#include "src/model/config_reader.h"
#include "src/model/weights.h"

namespace loom::arch {

// Which config.json keys an architecture spells its MoE with.
struct MoeKeys {
  // "num_local_experts" (Mixtral, gpt-oss) or "num_experts" (Qwen).
  std::string num_experts = "num_experts";
  // "moe_intermediate_size"; empty: experts use intermediate_size.
  std::string expert_intermediate_size;
  // Qwen: decoder_sparse_step and mlp_only_layers say which layers are sparse.
  bool qwen_sparse_layers = false;
  // Qwen2-MoE: shared_expert_intermediate_size (required, > 0) and its sigmoid
  // gate.
  bool shared_expert = false;
  // Read norm_topk_prob (default false); otherwise it is `norm_topk_prob`.
  bool read_norm_topk_prob = false;
  bool norm_topk_prob = true;
  bool router_bias = false;
};

// Sets c->mlp = kMoE and fills c->moe. num_experts_per_tok (gpt-oss's older
// configs: experts_per_token) and the expert sizes are validated here: every
// error names the file, the keys and their values.
Status ParseMoe(const ConfigReader& r, const MoeKeys& keys, ModelConfig* c);

// Names inside "model.layers.{i}." of one sparse layer's tensors.
struct MoeNames {
  std::string block = "mlp.";  // Mixtral: "block_sparse_moe."
  std::string router = "gate";
  std::string gate = "gate_proj";        // Mixtral: w1
  std::string up = "up_proj";            // Mixtral: w3
  std::string down = "down_proj";        // Mixtral: w2
  std::string shared = "shared_expert";  // DeepSeek-V3: shared_experts
  // Packed experts (MoEConfig::packed_experts): the block and the stacked
  // [E, 2 I_e, H] gate_up and [E, H, I_e] down tensors; transformers 5 names
  // them so for every packed MoE, GraniteMoE stores its experts so always
  // (block_sparse_moe.input_linear.weight / output_linear.weight).
  std::string packed_block = "mlp.";
  std::string packed_gate_up = "experts.gate_up_proj";
  std::string packed_down = "experts.down_proj";
};

// Sets c->moe.packed_experts when the checkpoint in `model_dir` stores a
// kGated MoE's experts packed (a tensor name ending in
// ".mlp.experts.gate_up_proj"; names from model.safetensors.index.json, else
// model.safetensors' header; none present: per expert). Unimplemented for a
// packed checkpoint whose experts are quantized.
Status DetectPackedExperts(const std::string& model_dir, ModelConfig* c);

// Appends layer `layer`'s router [E, H] (and its correction bias [E] when
// MoEConfig::router_correction_bias), E experts' gate/up [I_e, H] and down
// [H, I_e] (packed: the stacked gate_up [E, 2 I_e, H] and down [E, H, I_e]
// under "mlp.", MoEConfig::packed_experts), and the shared expert
// (gate/up/down and its [1, H] gate) when configured.
void DeclareMoeLayer(const ModelConfig& c, int64_t layer, const MoeNames& n,
                     std::vector<WeightSpec>* specs);

// The Llama-style declaration (DeclareDecoderWeights) with the MLP of every
// sparse layer (MoEConfig::IsSparseLayer) replaced by DeclareMoeLayer; dense
// layers keep a gated MLP of intermediate_size.
ArchWeights DeclareMoeDecoder(const ModelConfig& c, const DecoderNames& names,
                              const MoeNames& moe);

}  // namespace loom::arch

#endif  // LOOM_MODEL_ARCH_MOE_H_
