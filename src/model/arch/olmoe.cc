// OLMoE: OLMo2's full-width q_norm / k_norm (RMSNorm over the whole q and k
// projections, before the head split and RoPE) in a pre-norm Llama layer
// whose MLP is a sparse MoE: router `mlp.gate` [E, H], E SiLU-gated experts
// `mlp.experts.{e}.{gate,up,down}_proj`; softmax over all E logits, the top
// k, renormalised only with norm_topk_prob (false in OLMoE's configs); no
// shared expert.
#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"
#include "src/model/arch/moe.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  ASSIGN_OR_RETURN(c->qkv_bias, r.Bool("attention_bias", false));
  c->o_bias = c->qkv_bias;
  c->qk_norm = QkNormKind::kFull;
  // OLMoE clamps q/k/v after the q/k norms; the executor clamps before them
  // (OLMo's order), so a clip is refused rather than run in the wrong order.
  ASSIGN_OR_RETURN(double clip, r.Float("clip_qkv", 0.0));
  if (clip != 0.0)
    return UnimplementedError(
        r.source() + ": clip_qkv = " + std::to_string(clip) +
        " is not supported for olmoe (it clamps after q_norm/k_norm); "
        "expected null");
  MoeKeys keys;
  keys.read_norm_topk_prob = true;
  return ParseMoe(r, keys, c);
}

ArchWeights Declare(const ModelConfig& c) {
  return DeclareMoeDecoder(c, DecoderNames{}, MoeNames{});
}

}  // namespace

const ArchDef kOlmoe = {"olmoe", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
