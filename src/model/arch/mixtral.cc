// Mixtral: Llama attention with a sparse MoE feed-forward in
// every layer: a router `block_sparse_moe.gate` [E, H] and E SiLU-gated
// experts `block_sparse_moe.experts.{e}.w1` (gate) [I, H], `w3` (up) [I, H],
// `w2` (down) [H, I]; routing: softmax over all E logits, the top k,
// renormalised to sum 1.
#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"
#include "src/model/arch/moe.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  RETURN_IF_ERROR(ParseUniformSlidingWindow(r, c));
  MoeKeys keys;
  keys.num_experts = "num_local_experts";
  keys.norm_topk_prob = true;
  return ParseMoe(r, keys, c);
}

ArchWeights Declare(const ModelConfig& c) {
  MoeNames n;
  n.block = "block_sparse_moe.";
  n.gate = "w1";
  n.up = "w3";
  n.down = "w2";
  return DeclareMoeDecoder(c, DecoderNames{}, n);
}

}  // namespace

const ArchDef kMixtral = {"mixtral", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
