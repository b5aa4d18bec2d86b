// CodeGen (Salesforce codegen-*-{mono,multi,nl}): GPT-J's block
// (ParseGptjBlock / DeclareGptjWeights, gptj.cc) with one fused qkv_proj in
// CodeGen's mp_num = 4 layout: 4 chunks of [q | v | k]
// (QkvLayout::kGroupedQvk). The rotary dimension is min(rotary_dim, n_ctx /
// n_head), as CodeGenModel computes it.
#include <string>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

constexpr int64_t kCodeGenMpNum = 4;  // CodeGenAttention's mp_num

Status Parse(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(const int64_t heads, r.Int("n_head"));
  ASSIGN_OR_RETURN(const int64_t positions, r.Int("n_positions"));
  ASSIGN_OR_RETURN(const int64_t n_ctx, r.Int("n_ctx", positions));
  if (heads <= 0 || heads % kCodeGenMpNum != 0)
    return InvalidArgumentError(r.source() +
                                ": n_head = " + std::to_string(heads) +
                                " does not divide into CodeGen's 4 qkv chunks");
  RETURN_IF_ERROR(ParseGptjBlock(r, /*rotary_cap=*/n_ctx / heads, c));
  c->fused_qkv = true;
  c->qkv_layout = QkvLayout::kGroupedQvk;
  c->qkv_groups = kCodeGenMpNum;
  return Status();
}

}  // namespace

const ArchDef kCodegen = {"codegen", Parse, DeclareGptjWeights,
                          /*runnable=*/true};

}  // namespace loom::arch
