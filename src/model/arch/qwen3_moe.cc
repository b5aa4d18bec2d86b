// Qwen3-MoE: Qwen3 attention (per-head q/k RMSNorm) with a
// sparse MoE feed-forward on the layers decoder_sparse_step / mlp_only_layers
// select: router `mlp.gate` [E, H] and E SiLU-gated experts
// `mlp.experts.{e}.{gate,up}_proj` [I_e, H], `down_proj` [H, I_e]
// (I_e = moe_intermediate_size); dense layers keep a gated MLP.
#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"
#include "src/model/arch/moe.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  RETURN_IF_ERROR(ParseQwen3Attention(r, c));
  MoeKeys keys;
  keys.expert_intermediate_size = "moe_intermediate_size";
  keys.qwen_sparse_layers = true;
  keys.read_norm_topk_prob = true;
  return ParseMoe(r, keys, c);
}

ArchWeights Declare(const ModelConfig& c) {
  return DeclareMoeDecoder(c, DecoderNames{}, MoeNames{});
}

}  // namespace

const ArchDef kQwen3Moe = {"qwen3_moe", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
