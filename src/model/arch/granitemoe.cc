// GraniteMoE (ibm-granite/granite-3.0-1b-a400m, granite-3.0-3b-a800m,
// granite-3.1-*-a*m): Granite's attention and multipliers
// (ParseGraniteMultipliers, granite.cc) with a sparse MoE in every layer:
// a router block_sparse_moe.router.layer [E, H] whose top-k logits are
// softmaxed among themselves (RouterKind::kTopKSoftmax), and the experts
// stored packed as 3-D tensors, input_linear [E, 2 I, H] (each expert's gate
// rows, then its up rows; silu(gate) * up) and output_linear [E, H, I].
#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"
#include "src/model/arch/moe.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  RETURN_IF_ERROR(ParseGraniteMultipliers(r, c));
  MoeKeys keys;
  keys.num_experts = "num_local_experts";
  RETURN_IF_ERROR(ParseMoe(r, keys, c));
  c->moe.router = RouterKind::kTopKSoftmax;
  c->moe.packed_experts = true;
  return Status();
}

ArchWeights Declare(const ModelConfig& c) {
  MoeNames n;
  n.block = n.packed_block = "block_sparse_moe.";
  n.router = "router.layer";
  n.packed_gate_up = "input_linear.weight";
  n.packed_down = "output_linear.weight";
  return DeclareMoeDecoder(c, DecoderNames{}, n);
}

}  // namespace

const ArchDef kGranitemoe = {"granitemoe", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
