#include "src/plan/program.h"

#include <algorithm>

namespace loom {
namespace {

using B = BufferId;
using S = StepId;

bool SameStep(const ProgramStep& a, const ProgramStep& b) {
  auto same_hooks = [](const std::vector<HookEmit>& x,
                       const std::vector<HookEmit>& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i].site != y[i].site || x[i].buffer != y[i].buffer) return false;
    return true;
  };
  return a.id == b.id && a.reads == b.reads && a.writes == b.writes &&
         same_hooks(a.hooks, b.hooks) && a.conditional == b.conditional &&
         a.condition == b.condition &&
         a.conditional_buffer == b.conditional_buffer;
}

bool SameSteps(const std::vector<ProgramStep>& a,
               const std::vector<ProgramStep>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!SameStep(a[i], b[i])) return false;
  return true;
}

// The attention branch: ln1 (after hook_resid_pre), q/k/v, attention and
// the output projection, ending in attention out.
void AddAttentionSteps(const LayerConfig& l, std::vector<ProgramStep>* s) {
  const B attn_in = l.pre_attn_norm ? B::kAttnIn : B::kResidual;
  ProgramStep ln1{
      S::kLn1, {B::kResidual}, {}, {{HookSite::kResidPre, B::kResidual}}};
  if (l.pre_attn_norm) {
    ln1.writes = {B::kAttnIn};
    ln1.hooks.push_back({HookSite::kLn1, B::kAttnIn});
  }
  s->push_back(ln1);
  if (l.is_mla()) {
    // Latents and projections, then q | k | v assembled in qkv; hook_v comes
    // from the unpadded v.
    s->push_back({S::kMlaProj,
                  {attn_in},
                  {B::kMlaQLatent, B::kMlaQ, B::kMlaKvA, B::kMlaKvLatent,
                   B::kMlaKv, B::kMlaV, B::kQkv},
                  {{HookSite::kQ, B::kQkv},
                   {HookSite::kK, B::kQkv},
                   {HookSite::kV, B::kMlaV}}});
  }
  ProgramStep qkv{S::kQkvProj,
                  {attn_in},
                  {B::kQkv},
                  {{HookSite::kQ, B::kQkv},
                   {HookSite::kK, B::kQkv},
                   {HookSite::kV, B::kQkv}}};
  // A per-head fused projection lands in its own buffer and is regrouped
  // into qkv within the step.
  if (l.fused_qkv && l.qkv_layout != QkvLayout::kConcat)
    qkv.writes = {B::kQkvPerHead, B::kQkv};
  if (!l.is_mla()) s->push_back(qkv);
  ProgramStep attn{S::kAttention, {B::kQkv, B::kSeqStart}, {B::kZ}, {}};
  if (l.rope_half > 0) {
    attn.reads.push_back(B::kRopeCos);
    attn.reads.push_back(B::kRopeSin);
    attn.hooks.push_back({HookSite::kRotQ, B::kQkv});
    attn.hooks.push_back({HookSite::kRotK, B::kQkv});
  }
  attn.hooks.push_back({HookSite::kPattern, B::kPattern});
  attn.hooks.push_back({HookSite::kZ, B::kZ});
  attn.conditional = true;
  attn.condition = HookSite::kPattern;
  attn.conditional_buffer = B::kPattern;
  s->push_back(attn);
  s->push_back(
      {S::kOProj, {B::kZ}, {B::kAttnOut}, {{HookSite::kAttnOut, B::kAttnOut}}});
}

// The MLP branch from `mlp_in` to mlp out: dense, or routed experts (+ the
// shared expert).
void AddMlpSteps(const LayerConfig& l, B mlp_in, std::vector<ProgramStep>* s) {
  if (!l.moe()) {
    const bool plain = l.mlp == MlpKind::kPlain;
    const B up = plain ? B::kMlpFc : B::kMlpGateUp;
    const B act = plain ? B::kMlpFc : B::kMlpAct;
    s->push_back({S::kUpProj, {mlp_in}, {up}, {{HookSite::kMlpPre, up}}});
    s->push_back({S::kActivation, {up}, {act}, {{HookSite::kMlpPost, act}}});
    s->push_back(
        {S::kDownProj, {act}, {B::kMlpOut}, {{HookSite::kMlpOut, B::kMlpOut}}});
    return;
  }
  s->push_back({S::kRouter,
                {mlp_in},
                {B::kRouterLogits, B::kRouteIds, B::kRouteWeights},
                {{HookSite::kRouterLogits, B::kRouterLogits},
                 {HookSite::kExpertIds, B::kRouteIds},
                 {HookSite::kExpertWeights, B::kRouteWeights}}});
  s->push_back(
      {S::kExpertGather,
       {mlp_in, B::kRouteIds, B::kRouteWeights},
       {B::kExpertOffsets, B::kExpertRows, B::kExpertRowWeights, B::kExpertIn},
       {}});
  s->push_back({S::kExpertGateUp,
                {B::kExpertIn, B::kExpertOffsets},
                {B::kExpertGateUp},
                {}});
  s->push_back({S::kExpertActivation, {B::kExpertGateUp}, {B::kExpertAct}, {}});
  s->push_back({S::kExpertDown,
                {B::kExpertAct, B::kExpertOffsets},
                {B::kExpertOut},
                {}});
  s->push_back(
      {S::kExpertScatterAdd,
       {B::kExpertOut, B::kExpertOffsets, B::kExpertRows, B::kExpertRowWeights},
       {B::kMlpOut},
       {}});
  if (l.shared_expert()) {
    ProgramStep shared{
        S::kSharedExpert,
        {mlp_in, B::kMlpOut},
        {B::kSharedGateUp, B::kSharedAct, B::kSharedOut, B::kMlpOut},
        {}};
    if (l.shared_expert_gate) shared.writes.push_back(B::kSharedGateLogit);
    s->push_back(shared);
  }
}

// The steps of one layer, wired by its block kind (LayerConfig::block):
// sequential: attention, residual add (hook_resid_mid), ln2 of the updated
// residual, MLP, residual add; parallel: attention, ln2 of the block's input
// (the residual is not updated in between), MLP, one add of both branches;
// parallel with a shared norm: the MLP reads ln1's output (no ln2).
std::vector<ProgramStep> BlockSteps(const LayerConfig& l) {
  std::vector<ProgramStep> s;
  AddAttentionSteps(l, &s);
  if (!l.parallel())
    s.push_back({S::kAttnResidualAdd,
                 {B::kAttnOut, B::kResidual},
                 {B::kResidual},
                 {{HookSite::kLn1Post, B::kAttnOut},
                  {HookSite::kResidMid, B::kResidual}}});
  B mlp_in = l.pre_attn_norm ? B::kAttnIn : B::kResidual;
  if (l.block != BlockKind::kParallelSharedNorm) {
    mlp_in = l.pre_mlp_norm ? B::kMlpIn : B::kResidual;
    ProgramStep ln2{S::kLn2, {B::kResidual}, {}, {}};
    if (l.pre_mlp_norm) {
      ln2.writes = {B::kMlpIn};
      ln2.hooks.push_back({HookSite::kLn2, B::kMlpIn});
    }
    s.push_back(ln2);
  }
  AddMlpSteps(l, mlp_in, &s);
  // mlp.hook_out is delivered by the down projection of a dense MLP and at
  // the residual add of an MoE one (after the scatter-add and the shared
  // expert); it is listed once, at the step that produces it.
  std::vector<HookEmit> mlp_out_hook;
  if (l.moe()) mlp_out_hook.push_back({HookSite::kMlpOut, B::kMlpOut});
  if (l.parallel()) {
    ProgramStep add{S::kParallelResidualAdd,
                    {B::kAttnOut, B::kMlpOut, B::kResidual},
                    {B::kMlpOut, B::kResidual},
                    mlp_out_hook};
    add.hooks.push_back({HookSite::kResidPost, B::kResidual});
    s.push_back(add);
    return s;
  }
  ProgramStep add{S::kMlpResidualAdd,
                  {B::kMlpOut, B::kResidual},
                  {B::kResidual},
                  mlp_out_hook};
  add.hooks.push_back({HookSite::kLn2Post, B::kMlpOut});
  add.hooks.push_back({HookSite::kResidPost, B::kResidual});
  s.push_back(add);
  return s;
}

}  // namespace

std::string_view BufferName(BufferId id) {
  switch (id) {
    case B::kPositions:
      return "positions";
    case B::kSeqStart:
      return "sequence offsets";
    case B::kResidual:
      return "residual";
    case B::kPosEmbed:
      return "position embeddings";
    case B::kRopeInvFreq:
      return "rope inv_freq";
    case B::kRopeCos:
      return "rope cos";
    case B::kRopeSin:
      return "rope sin";
    case B::kAttnIn:
      return "attention input";
    case B::kQkvPerHead:
      return "qkv (as the fused projection orders it)";
    case B::kQkv:
      return "qkv";
    case B::kMlaQLatent:
      return "mla q latent";
    case B::kMlaQ:
      return "mla q";
    case B::kMlaKvA:
      return "mla kv_a (latent | k rope)";
    case B::kMlaKvLatent:
      return "mla kv latent";
    case B::kMlaKv:
      return "mla kv_b (k nope | v)";
    case B::kMlaV:
      return "mla v";
    case B::kPattern:
      return "attention pattern";
    case B::kZ:
      return "attention z";
    case B::kAttnOut:
      return "attention out";
    case B::kMlpIn:
      return "mlp input";
    case B::kMlpFc:
      return "mlp fc";
    case B::kMlpGateUp:
      return "mlp gate|up";
    case B::kMlpAct:
      return "mlp activated";
    case B::kRouterLogits:
      return "router logits";
    case B::kRouteIds:
      return "routes (expert ids)";
    case B::kRouteWeights:
      return "routes (weights)";
    case B::kExpertOffsets:
      return "expert row offsets";
    case B::kExpertRows:
      return "routed rows (token ids)";
    case B::kExpertRowWeights:
      return "routed rows (weights)";
    case B::kExpertIn:
      return "routed rows (input)";
    case B::kExpertGateUp:
      return "routed rows (gate|up)";
    case B::kExpertAct:
      return "routed rows (activated)";
    case B::kExpertOut:
      return "routed rows (out)";
    case B::kSharedGateUp:
      return "shared expert gate|up";
    case B::kSharedAct:
      return "shared expert activated";
    case B::kSharedOut:
      return "shared expert out";
    case B::kSharedGateLogit:
      return "shared expert gate logit";
    case B::kMlpOut:
      return "mlp out";
    case B::kFinalNorm:
      return "final norm";
    case B::kGemmInputCopy:
      return "gemm input copy";
    case B::kGemmScratchpad:
      return "gemm scratchpad";
    case B::kWeightDecode:
      return "weight decode workspace";
    case B::kAttnWorkspace:
      return "attention workspace";
    case B::kLogitsChunk:
      return "logits chunk";
  }
  return "?";
}

std::string_view StepName(StepId id) {
  switch (id) {
    case S::kEmbed:
      return "embed";
    case S::kLn1:
      return "ln1";
    case S::kQkvProj:
      return "qkv proj";
    case S::kMlaProj:
      return "mla q/kv proj";
    case S::kAttention:
      return "attention";
    case S::kOProj:
      return "o proj";
    case S::kAttnResidualAdd:
      return "attention residual add";
    case S::kLn2:
      return "ln2";
    case S::kUpProj:
      return "gate/up proj";
    case S::kActivation:
      return "activation";
    case S::kDownProj:
      return "down proj";
    case S::kRouter:
      return "router + top-k";
    case S::kExpertGather:
      return "experts: group + gather routed rows";
    case S::kExpertGateUp:
      return "experts: gate/up proj";
    case S::kExpertActivation:
      return "experts: activation";
    case S::kExpertDown:
      return "experts: down proj";
    case S::kExpertScatterAdd:
      return "experts: weighted scatter-add";
    case S::kSharedExpert:
      return "shared expert";
    case S::kMlpResidualAdd:
      return "mlp residual add";
    case S::kParallelResidualAdd:
      return "parallel residual add";
    case S::kFinalNorm:
      return "final norm";
    case S::kLogits:
      return "logits";
  }
  return "?";
}

Program BuildProgram(const ModelConfig& c) {
  Program p;
  p.layers = MakeLayerConfigs(c);
  const int64_t half =
      c.rope.type == RopeConfig::Type::kNone ? 0 : c.rope.rotary_dim / 2;
  ProgramStep embed{S::kEmbed,
                    {},
                    {B::kPositions, B::kSeqStart, B::kResidual},
                    {{HookSite::kEmbed, B::kResidual}}};
  if (c.learned_positions) {
    embed.writes.push_back(B::kPosEmbed);
    embed.reads.push_back(B::kPosEmbed);
    embed.hooks.push_back({HookSite::kPosEmbed, B::kPosEmbed});
  }
  if (half > 0)
    for (B b : {B::kRopeInvFreq, B::kRopeCos, B::kRopeSin})
      embed.writes.push_back(b);
  p.prologue.push_back(embed);

  // A model without layers still has one (unused) block, so the plan keeps
  // its shape.
  const std::vector<LayerConfig> one = {MakeLayerConfig(c, 0)};
  for (const LayerConfig& l : p.layers.empty() ? one : p.layers) {
    std::vector<ProgramStep> steps = BlockSteps(l);
    int found = -1;
    for (size_t i = 0; i < p.blocks.size(); ++i)
      if (SameSteps(p.blocks[i], steps)) found = static_cast<int>(i);
    if (found < 0) {
      p.blocks.push_back(std::move(steps));
      found = static_cast<int>(p.blocks.size()) - 1;
    }
    if (!p.layers.empty()) p.layer_block.push_back(found);
  }

  p.epilogue.push_back({S::kFinalNorm,
                        {B::kResidual},
                        {B::kFinalNorm},
                        {{HookSite::kFinalNorm, B::kFinalNorm}}});
  p.epilogue.push_back({S::kLogits,
                        {B::kFinalNorm},
                        {B::kLogitsChunk},
                        {{HookSite::kLogits, B::kLogitsChunk}}});
  return p;
}

BufferShape ShapeOf(BufferId id, const ModelConfig& c, int64_t T, int64_t L,
                    int64_t logits_rows, DType A) {
  // Attention widths come from the layer geometry (every layer shares it).
  const LayerConfig g = MakeLayerConfig(c, 0);
  const MlaConfig& mla = g.mla;
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const int64_t half =
      c.rope.type == RopeConfig::Type::kNone ? 0 : c.rope.rotary_dim / 2;
  const int64_t E = c.moe.num_experts, K = c.moe.experts_per_token,
                Ie = c.moe.expert_intermediate_size,
                Sh = c.moe.shared_expert_intermediate_size;
  switch (id) {
    case B::kPositions:
      return {{T}, DType::kI32};
    case B::kSeqStart:
      return {{T + 1}, DType::kI64};
    case B::kResidual:
    case B::kPosEmbed:
    case B::kAttnIn:
    case B::kAttnOut:
    case B::kMlpIn:
    case B::kMlpOut:
    case B::kFinalNorm:
    case B::kSharedOut:
      return {{T, H}, A};
    case B::kRopeInvFreq:  // [tables, half]: rope, then rope_local's
      return c.rope_tables() == 1
                 ? BufferShape{{half}, DType::kF32}
                 : BufferShape{{c.rope_tables(), half}, DType::kF32};
    case B::kRopeCos:
    case B::kRopeSin:
      return c.rope_tables() == 1
                 ? BufferShape{{T, half}, DType::kF32}
                 : BufferShape{{c.rope_tables(), T, half}, DType::kF32};
    case B::kQkvPerHead:
    case B::kQkv:
      return {{T, g.qkv_width()}, A};
    case B::kMlaQLatent:
      return {{T, mla.q_lora_rank}, A};
    case B::kMlaQ:
      return {{T, g.q_width()}, A};
    case B::kMlaKvA:
      return {{T, mla.kv_lora_rank + mla.qk_rope_head_dim}, A};
    case B::kMlaKvLatent:
      return {{T, mla.kv_lora_rank}, A};
    case B::kMlaKv:
      return {{T, g.q_heads * (mla.qk_nope_head_dim + g.v_head_dim)}, A};
    case B::kMlaV:
      return {{T, g.v_width()}, A};
    case B::kPattern:
      return {{c.num_heads, L, L}, A};
    case B::kZ:
      return {{T, g.z_width()}, A};
    case B::kMlpFc:
    case B::kMlpAct:
      return {{T, I}, A};
    case B::kMlpGateUp:
      return {{T, 2 * I}, A};
    case B::kRouterLogits:
      return {{T, E}, DType::kF32};
    case B::kRouteIds:
      return {{T, K}, DType::kI32};
    case B::kRouteWeights:
      return {{T, K}, DType::kF32};
    // Routed rows: every token's k (token, expert) pairs, grouped by expert:
    // exactly T * k rows per layer whatever the routing.
    case B::kExpertOffsets:
      return {{E + 1}, DType::kI32};
    case B::kExpertRows:
      return {{T * K}, DType::kI32};
    case B::kExpertRowWeights:
      return {{T * K}, DType::kF32};
    case B::kExpertIn:
    case B::kExpertOut:
      return {{T * K, H}, A};
    case B::kExpertGateUp:
      return {{T * K, 2 * Ie}, A};
    case B::kExpertAct:
      return {{T * K, Ie}, A};
    case B::kSharedGateLogit:
      return {{T}, DType::kF32};
    case B::kSharedGateUp:
      return {{T, 2 * Sh}, A};
    case B::kSharedAct:
      return {{T, Sh}, A};
    case B::kLogitsChunk:
      return {{logits_rows, c.vocab_size}, DType::kF32};
    case B::kGemmInputCopy:
    case B::kGemmScratchpad:
    case B::kWeightDecode:
    case B::kAttnWorkspace:
      return {{}, DType::kU8};
  }
  return {};
}

}  // namespace loom
