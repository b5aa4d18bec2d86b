// The forward program: one description of the forward pass that the planner
// sizes and the executor runs.
//
// A Program is built once from the ModelConfig. It holds the steps before the
// blocks (embedding), one step list per distinct layer kind (a "block": every
// layer runs the steps of its block on the same buffers, one layer after
// another), and the steps after the blocks (final norm, logits). Each step
// names, by typed id, the buffers it reads and writes and the hook sites it
// delivers (from which buffer). The planner (PlanActivations) derives each
// buffer's size and liveness from these accesses; the executor dispatches the
// same steps and finds its buffers by the same ids. Names are for display
// only (plan tables and JSON); nothing looks a buffer up by name.
//
// Layers of one model share a block unless their step lists differ (a dense
// layer and an MoE layer do; two layers differing only in their attention
// window or RoPE parameters do not: those are LayerConfig data).
#ifndef LOOM_PLAN_PROGRAM_H_
#define LOOM_PLAN_PROGRAM_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "src/core/dtype.h"
#include "src/model/config.h"
#include "src/model/hooks.h"
#include "src/model/layer_config.h"

namespace loom {

// Every buffer the forward uses, in the order the planner declares them
// (ties in the arena packing are broken by this order).
enum class BufferId : uint8_t {
  // ---- Activations (the liveness-packed arena) ----
  kPositions,  // [T] i32, whole program
  kSeqStart,   // [T + 1] i64 sequence offsets, whole program
  kResidual,   // [T, H], whole program
  kPosEmbed,   // [T, H] learned position embeddings (GPT-2)
  // RoPE: one table, or [2, ...] for rope and rope_local (Gemma 3).
  kRopeInvFreq,  // [R/2] f32, to the end of the blocks
  kRopeCos,      // [T, R/2] f32, to the end of the blocks
  kRopeSin,      // [T, R/2] f32, to the end of the blocks
  kAttnIn,       // [T, H] ln1 output
  kQkvPerHead,   // [T, Q + 2 KV] fused projection, per head q_h | k_h | v_h
  kQkv,          // [T, Q + KV + V] q | k | v per token (V: MLA's v width)
  // Multi-head latent attention (LayerConfig::is_mla(), widths from MlaConfig):
  kMlaQLatent,    // [T, q_lora] q_a_proj output, q_a_layernorm in place
  kMlaQ,          // [T, heads qk] q_b_proj (or q_proj) output
  kMlaKvA,        // [T, kv_lora + rope] kv_a_proj_with_mqa output
  kMlaKvLatent,   // [T, kv_lora] the latent, kv_a_layernorm in place
  kMlaKv,         // [T, heads (nope + v)] kv_b_proj output
  kMlaV,          // [T, heads v] v per head (hook_v)
  kPattern,       // [heads, L, L] attention probabilities (hooked only)
  kZ,             // [T, q_heads v] attention output before o_proj
  kAttnOut,       // [T, H] o_proj output (post-attention norm in place)
  kMlpIn,         // [T, H] ln2 output
  kMlpFc,         // [T, I] plain MLP fc (activation in place)
  kMlpGateUp,     // [T, 2I] gated MLP gate | up
  kMlpAct,        // [T, I] act(gate) * up
  kRouterLogits,  // [T, E] f32 (+ router bias)
  kRouteIds,      // [T, k] i32 expert ids, in top-k slot order
  kRouteWeights,  // [T, k] f32 routing weights
  // Routed rows: the T * k (token, slot) pairs grouped by expert (stable in
  // token order); exactly T * k rows whatever the routing.
  kExpertOffsets,     // [E + 1] i32 first routed row of each expert
  kExpertRows,        // [T * k] i32 token of each routed row
  kExpertRowWeights,  // [T * k] f32 routing weight of each routed row
  kExpertIn,          // [T * k, H] gathered token rows, by expert
  kExpertGateUp,      // [T * k, 2 Ie] gate | up (gpt-oss: interleaved)
  kExpertAct,         // [T * k, Ie]
  kExpertOut,         // [T * k, H]
  kSharedGateUp,      // [T, 2 S]
  kSharedAct,         // [T, S]
  kSharedOut,         // [T, H]
  kSharedGateLogit,   // [T] f32 x . shared_expert_gate
  kMlpOut,            // [T, H] MLP output (post-MLP norm in place)
  kFinalNorm,         // [T, H]
  // ---- Kernel workspace (each kernel its own region, all resident) ----
  kGemmInputCopy,   // 16-bit copy of a GEMM input
  kGemmScratchpad,  // the GEMM library's scratch
  kWeightDecode,    // a panel of quantized weights decoded for one GEMM
  kAttnWorkspace,   // attention tiles
  // ---- Logits ----
  kLogitsChunk,  // [C, V] f32
};
inline constexpr int kNumBuffers = static_cast<int>(BufferId::kLogitsChunk) + 1;

// The planner's display name ("qkv", "residual", ...).
std::string_view BufferName(BufferId id);

enum class StepId : uint8_t {
  kEmbed,    // token (+ position) embeddings, positions, RoPE tables
  kLn1,      // pre-attention norm
  kQkvProj,  // q/k/v projections, clip, q/k norms
  // MLA: q_a / q_b, kv_a / kv_b with their latent norms, assembled into qkv
  kMlaProj,
  kAttention,         // RoPE on q/k, attention (probabilities when hooked)
  kOProj,             // output projection
  kAttnResidualAdd,   // post-attention norm, residual += attention out
  kLn2,               // pre-MLP norm
  kUpProj,            // dense: gate/up (or fc) projection
  kActivation,        // dense: act (gated: act(gate) * up)
  kDownProj,          // dense: down projection
  kRouter,            // MoE: router logits [T, E], top-k ids/weights [T, k]
  kExpertGather,      // MoE: group the T k routed rows by expert, gather them
  kExpertGateUp,      // MoE: gate/up GEMM(s) of each expert on its rows
  kExpertActivation,  // MoE: activation of all T k routed rows
  kExpertDown,        // MoE: down GEMM of each expert on its rows
  kExpertScatterAdd,  // MoE: mlp out = sum of weight * out, in expert order
  kSharedExpert,      // MoE: shared expert MLP (x its sigmoid gate, if any)
  kMlpResidualAdd,    // post-MLP norm, residual += mlp out
  // Parallel blocks: residual += (attention out + mlp out), the branch sum
  // first (in mlp out), as HF adds them.
  kParallelResidualAdd,
  kFinalNorm,  // final norm
  kLogits,     // lm_head (+ final softcap), chunk by chunk
};

// The planner's display name ("qkv proj", ...).
std::string_view StepName(StepId id);

// A hook site a step delivers, from which buffer.
struct HookEmit {
  HookSite site;
  BufferId buffer;
};

struct ProgramStep {
  StepId id;
  std::vector<BufferId> reads;
  std::vector<BufferId> writes;
  std::vector<HookEmit> hooks;
  // Written only when this hook site is requested at the layer (the
  // attention pattern); kNone-like sentinel: `conditional` false.
  bool conditional = false;
  HookSite condition = HookSite::kEmbed;
  BufferId conditional_buffer = BufferId::kPattern;
};

struct Program {
  std::vector<ProgramStep> prologue;  // embed
  // Distinct step lists; layer l runs blocks[layer_block[l]].
  std::vector<std::vector<ProgramStep>> blocks;
  std::vector<int> layer_block;       // [num_layers]
  std::vector<LayerConfig> layers;    // [num_layers]
  std::vector<ProgramStep> epilogue;  // final norm, logits

  const std::vector<ProgramStep>& LayerSteps(int64_t layer) const {
    return blocks[static_cast<size_t>(layer_block[static_cast<size_t>(layer)])];
  }
};

// The program of `c`.
Program BuildProgram(const ModelConfig& c);

// Dimensions and element type of a buffer for a batch of T tokens whose
// longest sequence has L tokens (`act` = the activation dtype). Workspace
// buffers have no dims (their bytes come from the backend's costs).
struct BufferShape {
  std::vector<int64_t> dims;
  DType dtype = DType::kF32;
};
BufferShape ShapeOf(BufferId id, const ModelConfig& c, int64_t T, int64_t L,
                    int64_t logits_rows, DType act);

}  // namespace loom

#endif  // LOOM_PLAN_PROGRAM_H_
