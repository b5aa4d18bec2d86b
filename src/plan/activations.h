// The activation, workspace and logits arenas of one device's forward pass,
// laid out by liveness.
//
// The steps and their buffers come from the forward program
// (src/plan/program.h), the same one the executor runs: the steps before the
// blocks (embedding), each distinct block once (every layer runs its block's
// steps on the same regions, one layer after another), and the steps after
// the blocks (final norm, logits). A region is live from the first step that
// touches it to the last; regions that carry values from layer to layer (the
// residual stream and positions over the whole program, the RoPE tables
// through the blocks) are live over that span. Regions whose
// lifetimes intersect never share bytes; the others may. Offsets are chosen
// greedily (largest region first, lowest 64-byte-aligned offset that does not
// collide), so the layout is deterministic and never larger than the sum of
// its regions.
//
// The sizes come only from the config, the job and the injected KernelCosts:
// nothing here calls a device or a backend (the backend passes its workspace
// functions in at the call site; see KernelCosts).
#ifndef LOOM_PLAN_ACTIVATIONS_H_
#define LOOM_PLAN_ACTIVATIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/dtype.h"
#include "src/core/format.h"
#include "src/model/config.h"
#include "src/model/hooks.h"
#include "src/plan/job.h"
#include "src/plan/program.h"

namespace loom {

// What a backend's kernels need, given to the planner by the caller (the
// dependency direction is plan -> backend, so the planner cannot ask).
struct KernelCosts {
  // Scratch bytes of one GEMM with an [m, k] input and weights of `w_dtype`
  // (cpu::GemmWorkspaceBytes: the rounded x and a packing slot per thread).
  // nullptr = none.
  int64_t (*gemm_workspace)(int64_t m, int64_t k, DType w_dtype) = nullptr;
  // Library scratch of one GEMM y[m, n] = x[m, k] W (W stored [n, k], or
  // [k, n] when `k_major`), e.g. cuBLASLt's workspace. nullptr = none.
  int64_t (*gemm_scratchpad)(int64_t m, int64_t n, int64_t k, DType w_dtype,
                             bool k_major) = nullptr;
  // Scratch bytes of attention over sequences up to `max_seq_len` with head
  // width `width` = max(q/k head_dim, v head width)
  // (cpu::AttentionWorkspaceBytes). nullptr = none.
  int64_t (*attention_workspace)(int64_t max_seq_len, int64_t q_heads,
                                 int64_t width, int num_threads) = nullptr;
  // Scratch bytes of attention over a KV cache (AttentionOp::k_cache) with
  // up to `context` positions per sequence (cpu::KvAttentionWorkspaceBytes).
  // nullptr = the backend has no such op.
  int64_t (*kv_attention_workspace)(int64_t context, int64_t q_heads,
                                    int64_t kv_heads, int64_t head_dim,
                                    int64_t v_head_dim,
                                    int num_threads) = nullptr;
  // Bytes one GEMM of an [n, k] weight stored in `kind` needs to decode its
  // weights into (in the compute dtype `compute`); 0 for dense weights
  // (the CUDA backend's decode panel). nullptr = none (the CPU decodes inside
  // its GEMM workspace).
  int64_t (*weight_decode_workspace)(int64_t n, int64_t k, FormatKind kind,
                                     DType compute) = nullptr;
  int num_threads = 1;
  // Bytes the backend's runtime holds on every GPU it computes on, outside
  // the planned arenas: the CUDA context with its loaded modules, the
  // library handles and the backend's fixed scratch (0 on the host). A
  // documented constant of the backend (docs/design/cuda-backend.md), checked
  // against cudaMemGetInfo by the `cuda` tests.
  int64_t device_runtime_bytes = 0;
  // Element type of the forward's activations (f32 on the CPU backend).
  DType activation_dtype = DType::kF32;
};

struct PlannedRegion {
  BufferId id = BufferId::kResidual;  // what the executor looks up
  std::string name;                   // display only: BufferName(id)
  std::string shape;  // "[T, Q+2KV] f32" with the numbers: "[2048, 6144] f32"
  int64_t bytes = 0;
  int64_t offset = 0;  // 64-byte aligned
  int first_step = 0;  // live over [first_step, last_step] of the program
  int last_step = 0;
  std::vector<HookSite> hooks;  // hook sites read from this region
};

struct ArenaPlan {
  static constexpr int64_t kAlign = 64;
  std::vector<PlannedRegion> regions;
  int64_t total_bytes = 0;  // the arena: max(offset + aligned bytes)
  int64_t naive_bytes = 0;  // sum of aligned region bytes (no reuse)
  // Index of the region of buffer `id`, or -1.
  int Find(BufferId id) const;
  // Adds a region of `bytes` after the others, live the whole time (a small
  // arena of its own: an evaluation head's, a lens's), and counts it in
  // total_bytes and naive_bytes.
  void Append(BufferId id, const char* name, int64_t bytes);
};

struct ActivationLayout {
  std::vector<std::string> steps;  // the program, in order (StepName)
  std::vector<StepId> step_ids;    // the same steps, typed
  int block_first_step = 0;        // the generic block's steps
  int block_last_step = 0;
  ArenaPlan activations;  // packed by liveness
  ArenaPlan workspace;    // kernel scratch (each kernel its own region)
  ArenaPlan logits;       // [chunk, V] (empty when no logits are computed)
};

// The layout for `job` on `c` (T = job.batch_tokens, L = job.MaxSeqLen()).
// Hooked tensors are live at least until they are copied: at their step for
// synchronous capture, to the end of the block for job.async_capture.
ActivationLayout PlanActivations(const ModelConfig& c, const JobSpec& job,
                                 const KernelCosts& costs);

// Assigns offsets by liveness (exposed for the property tests).
void PackArena(ArenaPlan* arena);

}  // namespace loom

#endif  // LOOM_PLAN_ACTIVATIONS_H_
