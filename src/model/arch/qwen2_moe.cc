// Qwen2-MoE: Qwen2 attention (q/k/v biases) with a sparse MoE
// feed-forward: router `mlp.gate` [E, H], E SiLU-gated experts
// `mlp.experts.{e}.{gate,up,down}_proj` (I_e = moe_intermediate_size), plus a
// shared expert `mlp.shared_expert.*` (shared_expert_intermediate_size) whose
// output is scaled by sigmoid(`mlp.shared_expert_gate` [1, H] . x).
#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"
#include "src/model/arch/moe.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  c->qkv_bias = true;
  RETURN_IF_ERROR(ParseQwenSlidingWindow(r, c));
  MoeKeys keys;
  keys.expert_intermediate_size = "moe_intermediate_size";
  keys.qwen_sparse_layers = true;
  keys.read_norm_topk_prob = true;
  keys.shared_expert = true;
  return ParseMoe(r, keys, c);
}

ArchWeights Declare(const ModelConfig& c) {
  return DeclareMoeDecoder(c, DecoderNames{}, MoeNames{});
}

}  // namespace

const ArchDef kQwen2Moe = {"qwen2_moe", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
