// Executor: runs the forward pass of a Model on the CPU backend over packed
// batches of variable-length sequences (no padding compute, no KV cache),
// calling a HookSink at every requested hook point.
//
// All activation memory comes from one arena sized at Create() for the
// largest batch (max_tokens, max_seq_len); Forward() allocates nothing. The
// forward stops after the deepest layer any requested hook needs; the final
// norm and lm_head run only when ln_final / logits are requested.
//
// Not thread-safe: one Forward at a time per executor (the kernels use all
// threads set by cpu::SetNumThreads).
#ifndef LOOM_RUNTIME_EXECUTOR_H_
#define LOOM_RUNTIME_EXECUTOR_H_

#include <cstdint>
#include <memory>
#include <span>

#include "src/base/status.h"
#include "src/model/hooks.h"
#include "src/plan/activations.h"
#include "src/plan/job.h"
#include "src/runtime/arena.h"
#include "src/runtime/model.h"

namespace loom {

namespace cpu {
class GemmContext;
}

// Packed sequences: sequence s is ids[seq_start[s] .. seq_start[s+1]); its
// positions are 0 .. length-1.
struct Batch {
  std::span<const int32_t> ids;  // [T]
  std::span<const int64_t>
      seq_start;  // [S + 1], seq_start[0] = 0, seq_start[S] = T
  int64_t num_tokens() const { return static_cast<int64_t>(ids.size()); }
  int64_t num_seqs() const {
    return static_cast<int64_t>(seq_start.size()) - 1;
  }
};

// Receives captured activations. `data` is valid only during the call.
// For token-major hooks: rows [row_begin, row_begin + rows) of the batch's
// packed tokens, each row `cols` f32 values, consecutive rows `ld` apart.
// For attn.hook_pattern: one call per sequence `seq`, data [heads, L, L] dense
// (rows = heads * L, cols = L, ld = L, row_begin = seq_start[seq]).
class HookSink {
 public:
  virtual ~HookSink() = default;
  virtual Status OnActivation(const HookPoint& hook, const Batch& batch,
                              int64_t seq, int64_t row_begin, int64_t rows,
                              int64_t cols, int64_t ld, const float* data) = 0;
};

struct ExecutorOptions {
  int64_t max_tokens = 0;   // largest batch (sum of sequence lengths)
  int64_t max_seq_len = 0;  // longest sequence (0 = max_tokens)
  // Logits are computed (and delivered) in chunks of this many rows, so
  // memory is O(chunk x vocab), never O(tokens x vocab).
  int64_t logits_chunk_rows = 256;
  // Round activations to bf16 where Hugging Face's bf16 forward stores them
  // (embeddings, norm outputs, projections, RoPE, attention output, residual
  // adds, MLP intermediates, logits), to reproduce HF's bf16 numbers. Off:
  // activations stay f32 and only GEMM inputs are rounded (more accurate).
  bool hf_bf16_activations = false;
};

// The model head on `rows` rows of final-norm output: logits [rows, V] =
// hidden [rows, H] x lm_head^T, then the final softcap (Gemma2). `workspace`
// holds cpu::GemmWorkspaceBytes(rows, H, lm_head dtype) bytes. Shared by the
// executor and the evaluation code that computes logits chunk by chunk.
void ComputeLogits(const Model& model, cpu::GemmContext& gemm,
                   const float* hidden, int64_t rows, float* logits,
                   void* workspace);

class Executor {
 public:
  static StatusOr<std::unique_ptr<Executor>> Create(
      const Model& model, const HookSet& hooks, const ExecutorOptions& options);
  ~Executor();

  // Runs one batch. Validates ids against the vocabulary and lengths against
  // the capacities and max_position_embeddings.
  Status Forward(const Batch& batch, HookSink* sink);

  // The planned layout this executor allocated (activations by liveness,
  // kernel workspace, logits chunk) and the bytes of its three arenas.
  const ActivationLayout& layout() const { return layout_; }
  int64_t arena_bytes() const {
    return act_.bytes() + ws_.bytes() + logits_.bytes();
  }
  // The job the layout was planned for (batch tokens, context, hooks, logits).
  static JobSpec MakeJob(const Model& model, const HookSet& hooks,
                         const ExecutorOptions& options);
  // The backend's workspace functions, for the planner.
  static KernelCosts CpuKernelCosts();
  const HookSet& hooks() const { return hooks_; }
  int64_t last_layer() const { return last_layer_; }

 private:
  Executor(const Model& model, const HookSet& hooks,
           const ExecutorOptions& options);
  struct Regions;
  Status RunLayer(int64_t layer, const Batch& batch, HookSink* sink);
  Status Emit(HookSite site, int64_t layer, const Batch& batch, int64_t cols,
              int64_t ld, const float* data, HookSink* sink);
  // `same_x`: x is the input of the previous Linear call, whose 16-bit copy in
  // the workspace is reused instead of converting x again.
  void Linear(const float* x, int64_t m, WeightRole w, WeightRole bias,
              int64_t layer, float* y, int64_t ldy, bool accumulate = false,
              bool same_x = false);
  void Norm(WeightRole w, WeightRole b, int64_t layer, const float* x, float* y,
            int64_t rows, int64_t dim);
  void ComputeRope(const Batch& batch);
  // Rounds rows x cols values (row stride ld) to bf16 in place when
  // options_.hf_bf16_activations is set.
  void RoundActivations(float* data, int64_t rows, int64_t cols,
                        int64_t ld) const;

  const Model& model_;
  const ModelConfig& c_;
  HookSet hooks_;
  ExecutorOptions options_;
  int64_t last_layer_ = -1;
  ActivationLayout layout_;
  Arena act_, ws_, logits_;
  std::unique_ptr<Regions> r_;
  std::unique_ptr<cpu::GemmContext> gemm_;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_EXECUTOR_H_
