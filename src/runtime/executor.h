// Executor: runs the forward program (src/plan/program.h) of a Model over
// packed batches of variable-length sequences (no padding compute; a KV
// cache for generation, see KvBatch) through the Backend interface, calling a
// HookSink at every requested hook point.
//
// Placement: the layers run as contiguous segments, each on its own backend
// (device), with its own arenas sized by the plan; the residual stream, the
// positions, the sequence offsets and the RoPE tables are copied to the next
// segment's device at a boundary. The first segment also runs the embedding,
// the last the final norm and lm_head. One segment on one CPU backend is the
// default. A segment on a device backend (memory not the host's) reads its
// weights from one copy in that device's memory (DeviceWeights, made at
// Create); the host writes the batch's positions, sequence offsets and RoPE
// frequencies into small host buffers (sized at Create) and copies them over.
//
// Offload (ExecutorSegment::offload): the segment's layer weights stay in
// host memory, copied once at Create into one pinned host allocation
// (DeviceWeights::UploadStreamed), and are streamed into two device buffers
// of the largest layer; layer l always runs from buffer (l - first) % 2.
// The copies are issued on a second backend instance of the segment's device
// (the "copier", made by the executor through the registry at Create), and
// ordered against the compute instance with Backend::WaitFor:
//   copier: L0 -> buf0; compute waits; copier: L1 -> buf1;
//   for each layer l: compute runs l; compute waits for the copier (layer
//   l+1's copy, issued earlier); the copier waits for compute (layer l done,
//   buf[l % 2] free); copier: L(l+2) -> buf[l % 2].
// So the copy of layer l+1 overlaps the compute of layer l. On a synchronous
// (CPU) backend the copies are memcpys and the waits no-ops. Model-level
// weights (embeddings, final norm, lm_head) of an offloaded segment stay
// resident. Consecutive segments on one backend instance share one set of
// arenas. See docs/design/memory-plan.md, "CPU offload".
//
// All activation memory comes from arenas sized at Create() for the largest
// batch (max_tokens, max_seq_len); Forward() allocates nothing. The forward
// stops after the deepest layer any requested hook needs; the final norm and
// lm_head run only when ln_final / logits are requested.
//
// Not thread-safe: one Forward at a time per executor (and per backend).
#ifndef LOOM_RUNTIME_EXECUTOR_H_
#define LOOM_RUNTIME_EXECUTOR_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "src/backend/backend.h"
#include "src/base/status.h"
#include "src/model/hooks.h"
#include "src/model/interventions.h"
#include "src/plan/activations.h"
#include "src/plan/job.h"
#include "src/plan/program.h"
#include "src/runtime/arena.h"
#include "src/runtime/device_weights.h"
#include "src/runtime/kv_cache.h"
#include "src/runtime/model.h"

namespace loom {

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

// Generation: the KV cache slot and first position of each sequence of a
// batch. Sequence s's tokens take positions pos0[s], pos0[s] + 1, ... of
// cache slot slot[s] (distinct within a batch); pos0[s] <= the slot's
// length (positions before it are in the cache). The forward stores their
// keys and values there and attends over the slot's positions [0, pos0[s] +
// length), exactly as a pass over the whole prefix would.
// A paged cache (KvCache::paged) must have pages reserved for every
// position a sequence writes: pos0[s] + its length <=
// cache->reserved_positions(slot[s]) (KvCache::Reserve).
struct KvBatch {
  KvCache* cache = nullptr;
  std::span<const int64_t> slot;  // [S]
  std::span<const int64_t> pos0;  // [S]
};

// Receives captured activations as views of the device's buffers, valid only
// during the call (view.rows rows of view.cols values, view.ld apart, in
// view.dtype on view.device: f32 in host memory on the CPU backend).
// For token-major hooks: rows [row_begin, row_begin + view.rows) of the
// batch's packed tokens (seq = -1).
// For attn.hook_pattern: one call per sequence `seq`, [heads, L, L] dense
// (rows = heads * L, cols = L, ld = L, row_begin = seq_start[seq]).
class HookSink {
 public:
  virtual ~HookSink() = default;
  virtual Status OnActivation(const HookPoint& hook, const Batch& batch,
                              int64_t seq, int64_t row_begin,
                              const ActivationView& view) = 0;
};

// Sees a layer's buffers after each of its steps (Executor::ForwardLayer):
// the backward's recompute reads what it needs from `activations` (the
// device's arena; host memory) before the next step may overwrite it.
class StepTap {
 public:
  virtual ~StepTap() = default;
  virtual Status AfterStep(const ProgramStep& step, int64_t layer,
                           const Batch& batch, const Arena& activations) = 0;
};

// One intervention applied to one sequence of a batch (Forward's `edits`).
// `seq` indexes the batch's sequences. `length` is the whole sequence's token
// count: a batch may hold only a chunk of it (positions pos0 .. pos0 + chunk
// length), and "last" and negative positions count from `length`. The edit
// touches the positions of the sequence that the batch holds.
//
// Delivery at a hook point is: every edit at that point, in the order given
// (edits of different sequences touch different rows), then the bf16
// re-rounding of --hf-bf16, then the capture, so a captured value is the
// edited one and every later step reads it.
//
// kPatch: `edit->vector` holds one row per listed position ([n, width], in
// the list's order), and the list must be ascending and non-negative.
// every_position: the edit's own positions are ignored and every token of
// the sequence the batch holds is edited (a generated token fed back).
// patch_rows (kPatch only): the rows written, one per listed position
// ([n, width], borrowed), instead of edit->vector (e.g. a recorded run's
// activations, not copied per cell).
struct SequenceEdit {
  int64_t seq = 0;
  int64_t length = 0;
  const Intervention* edit = nullptr;  // borrowed, valid for the forward
  bool every_position = false;
  const float* patch_rows = nullptr;
};

// Appends the edits of the interventions in `list` that apply to input row
// `row` (AppliesToRow) and edit the prompt, run as sequence `seq` of a
// batch, `length` tokens in all; they borrow `list`.
void AddSequenceEdits(const std::vector<Intervention>& list, int64_t row,
                      int64_t seq, int64_t length,
                      std::vector<SequenceEdit>* edits);

// Generation: appends, for the token of input row `row` fed back as
// sequence `seq` (position length - 1), the edits of the interventions that
// apply to the row and edit generated tokens (every_position).
void AddGeneratedEdits(const std::vector<Intervention>& list, int64_t row,
                       int64_t seq, int64_t length,
                       std::vector<SequenceEdit>* edits);

// Layers [first_layer, last_layer] run on `backend` (not owned). `offload`:
// their weights are streamed from pinned host memory, layer by layer (see
// above; the plan's offloaded layers).
struct ExecutorSegment {
  Backend* backend = nullptr;
  int64_t first_layer = 0;
  int64_t last_layer = -1;
  bool offload = false;
  // The layers stream from the checkpoint's mapping (the disk tier): their
  // weights stay the file's pages, never repacked for the backend.
  bool from_disk = false;
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
  // One device: the backend every step runs on (not owned); null = a CPU
  // backend owned by the executor. Ignored when `segments` is given.
  Backend* backend = nullptr;
  // Placement: contiguous segments from layer 0 to the model's last layer
  // (e.g. the plan's layer -> device assignment). Segments whose layers are
  // not run (hooks stop earlier) get no arenas.
  std::vector<ExecutorSegment> segments = {};
  // Time every weight GEMM the forwards run (gemm_seconds()): `loom bench`'s
  // GEMM-only ceiling, measured on the forward's own path. A host backend's
  // GEMM returns when it is done; off, nothing is timed.
  bool time_gemms = false;
};

// The model head on `rows` rows of final-norm output: logits [rows, V] =
// hidden [rows, H] x lm_head^T, then the final softcap (Gemma2), with the
// lm_head of `weights` (the model's, or a device's copy). `workspace` holds
// backend.Costs().gemm_workspace(rows, H, lm_head dtype) bytes. Shared by the
// executor and the evaluation code that computes logits chunk by chunk.
void ComputeLogits(const ModelConfig& c, const BoundWeights& weights,
                   Backend& backend, const float* hidden, int64_t rows,
                   float* logits, void* workspace);

// A norm of `kind` on x [rows, dim] into y (row stride dim): RMSNorm
// (weight w (+ offset), or none), LayerNorm (w, b) or LayerNorm without
// affine; `hf_bf16` rounds as HF's bf16 Llama RMSNorm where that applies.
// One row's result depends on that row alone.
void ApplyNorm(NormKind kind, float eps, float offset, const TensorView* w,
               const TensorView* b, bool hf_bf16, Backend& be, const float* x,
               float* y, int64_t rows, int64_t dim);

// The model's final norm (ln_final) on x [rows, H] into y [rows, H], as the
// executor's final-norm step computes it, with the weights of `weights`.
void ComputeFinalNorm(const ModelConfig& c, const BoundWeights& weights,
                      Backend& backend, bool hf_bf16, const float* x, float* y,
                      int64_t rows);

class Executor {
 public:
  static StatusOr<std::unique_ptr<Executor>> Create(
      const Model& model, const HookSet& hooks, const ExecutorOptions& options);
  ~Executor();

  // Runs one batch. Validates ids against the vocabulary and lengths against
  // the capacities and max_position_embeddings.
  Status Forward(const Batch& batch, HookSink* sink);
  // The same with a KV cache (generation, chunked prefill): positions start
  // at kv.pos0, the keys and values go to the cache, and attention runs over
  // the cached prefix (see KvBatch). The cache must live on the device every
  // segment runs on and hold exactly the layers this executor runs
  // (last_layer() + 1: every layer when the final norm or logits are
  // hooked); attention patterns cannot be hooked. On success each slot's
  // length becomes pos0 + its sequence's length.
  Status Forward(const Batch& batch, HookSink* sink, const KvBatch& kv);
  // Either of the above (kv null: none) with interventions (SequenceEdit).
  // Validated before anything runs: sequence indices, vector widths, heads
  // and positions (OutOfRange naming the sequence). On a device whose memory
  // is not the host's, the edited rows go through a host stage (below), so
  // every backend gives the host's bytes.
  Status Forward(const Batch& batch, HookSink* sink, const KvBatch* kv,
                 std::span<const SequenceEdit> edits);

  // Recompute of one layer (the backward's per-layer recompute): the
  // embedding step runs (positions, RoPE tables), the residual stream is set
  // to resid_in [T, H] (host memory), and only `layer`'s steps run, `tap`
  // seeing the buffers after each. No hooks are delivered, no edits applied.
  // One device whose memory is the host's, not offloaded (else
  // Unimplemented); `layer` <= last_layer().
  Status ForwardLayer(const Batch& batch, int64_t layer, const float* resid_in,
                      StepTap* tap);

  // The planned layout every device's arenas follow (activations by
  // liveness, kernel workspace; the logits chunk on the last device) and the
  // bytes of all arenas of all devices.
  const ActivationLayout& layout() const { return layout_; }
  int64_t arena_bytes() const;
  // With ExecutorOptions::time_gemms: seconds spent in the weight GEMMs
  // (dense and expert groups; not attention or the logits head) since the
  // last ResetGemmSeconds().
  double gemm_seconds() const { return gemm_seconds_; }
  void ResetGemmSeconds() { gemm_seconds_ = 0; }
  // The job the layout was planned for (batch tokens, context, hooks, logits).
  static JobSpec MakeJob(const Model& model, const HookSet& hooks,
                         const ExecutorOptions& options);
  const HookSet& hooks() const { return hooks_; }
  int64_t last_layer() const { return last_layer_; }
  const Program& program() const { return program_; }

  // The segments that run (clipped to the layers run), with their arenas.
  struct Device {
    Backend* backend = nullptr;
    int64_t first_layer = 0, last_layer = -1;
    Arena activations, workspace, logits;  // logits: last device only
    // The weights its steps read: the model's (host memory) or `uploaded`.
    const BoundWeights* weights = nullptr;
    std::unique_ptr<DeviceWeights> uploaded;
    // The backend's memory is the host's (the CPU backend).
    bool host_memory = true;
    // Offload: `uploaded` is streamed (its layers in pinned host memory, two
    // device buffers); `copier` (same device) issues the layer copies.
    bool offload = false;
    std::unique_ptr<Backend> copier;
    // Runs on the same backend instance as the previous device (e.g. a GPU's
    // resident layers, then its offloaded ones): its activation and
    // workspace arenas are the previous device's (one set per device, as
    // planned) and nothing is transferred between them.
    bool shares_arenas = false;
    int64_t bytes() const {
      return (shares_arenas ? 0 : activations.bytes() + workspace.bytes()) +
             logits.bytes();
    }
  };
  int num_devices() const { return static_cast<int>(devices_.size()); }
  // The backend computing each layer run, [last_layer() + 1] (a KV cache's
  // placement: KvCache::Create).
  std::vector<Backend*> LayerBackends() const;
  const Device& device(int i) const { return devices_[static_cast<size_t>(i)]; }
  // Bytes of weights copied to device memory (0 when every segment reads the
  // host's).
  int64_t uploaded_weight_bytes() const;
  // Bytes of offloaded layers' weights in pinned host memory (0 without an
  // offloaded segment).
  int64_t staged_weight_bytes() const;

 private:
  Executor(const Model& model, const HookSet& hooks,
           const ExecutorOptions& options);
  // Runs one step of the program on device `d` (`layer` = -1 outside the
  // blocks): the step's function from a table indexed by StepId.
  Status RunStep(const ProgramStep& step, Device& d, int64_t layer,
                 const Batch& batch, HookSink* sink);
  // One function per StepId (src/plan/program.h); `l` is the layer (-1 for
  // the embedding, final norm and logits).
  // What a step function reads: its arguments, the layer's config (null
  // outside the blocks), and the device's buffers; each function starts with
  // `const auto& [step, d, l, batch, sink, lc, T, H, a, be, x] = s;`.
  struct StepArgs {
    const ProgramStep& step;
    Device& d;
    int64_t l;
    const Batch& batch;
    HookSink* sink;
    const LayerConfig* lc;
    int64_t T;       // tokens of the batch
    int64_t H;       // hidden size
    const Arena& a;  // the device's activations
    Backend& be;
    float* x;  // [T, H] the residual stream
    float* buf(BufferId id) const { return a.as<float>(id); }
  };
  using StepFn = Status (Executor::*)(const StepArgs& s);
  Status StepEmbed(const StepArgs& s);
  Status StepLn1(const StepArgs& s);
  Status StepQkvProj(const StepArgs& s);
  Status StepMlaProj(const StepArgs& s);
  Status StepAttention(const StepArgs& s);
  Status StepOProj(const StepArgs& s);
  Status StepAttnResidualAdd(const StepArgs& s);
  Status StepLn2(const StepArgs& s);
  Status StepUpProj(const StepArgs& s);
  Status StepActivation(const StepArgs& s);
  Status StepDownProj(const StepArgs& s);
  Status StepRouter(const StepArgs& s);
  Status StepExpertGather(const StepArgs& s);
  Status StepExpertGateUp(const StepArgs& s);
  Status StepExpertActivation(const StepArgs& s);
  Status StepExpertDown(const StepArgs& s);
  Status StepExpertScatterAdd(const StepArgs& s);
  Status StepSharedExpert(const StepArgs& s);
  Status StepMlpResidualAdd(const StepArgs& s);
  Status StepParallelResidualAdd(const StepArgs& s);
  Status StepFinalNorm(const StepArgs& s);
  Status StepLogits(const StepArgs& s);
  // Forward with an optional KV cache (kv_ and edits_ are set for its
  // duration).
  Status RunForward(const Batch& batch, HookSink* sink, const KvBatch* kv,
                    std::span<const SequenceEdit> edits);
  // Checks the edits of a forward against the batch and the model.
  Status CheckEdits(const Batch& batch,
                    std::span<const SequenceEdit> edits) const;
  // Checks a KvBatch against the batch and the cache.
  Status CheckKv(const Batch& batch, const KvBatch& kv) const;
  // First position of sequence s: 0, or kv_->pos0[s].
  int64_t Pos0(int64_t s) const {
    return kv_ == nullptr ? 0 : kv_->pos0[static_cast<size_t>(s)];
  }
  // Writes the batch's positions and sequence offsets into the first
  // device's arena.
  Status WriteBatchMetadata(const Batch& batch);
  // Copies the values carried across layers from device `from` to `to`.
  Status Transfer(const Device& from, Device& to, const Batch& batch);
  // Offload: issues the copy of `layer`'s weights into its buffer on the
  // copier; StartStream copies the segment's first two layers, AdvanceStream
  // (after `layer` ran) makes layer + 1 wait for its copy and copies
  // layer + 2 into the buffer `layer` has freed.
  Status CopyLayer(Device& d, int64_t layer);
  Status StartStream(Device& d);
  Status AdvanceStream(Device& d, int64_t layer);
  // The hook point (site, layer) of the token-major buffer `data` [T, cols]
  // (row stride ld): the forward's edits there, the re-rounding, the capture.
  Status Deliver(HookSite site, int64_t layer, const Batch& batch, Device& d,
                 int64_t cols, int64_t ld, float* data, HookSink* sink);
  // One edit's rows of the batch (edit_rows_) and its backend op: in place
  // on a host device; else through edit_stage_ with host_edits_.
  Status ApplyEdit(const SequenceEdit& e, const Batch& batch, Device& d,
                   int64_t cols, int64_t ld, float* data);
  // The op of `iv` on rows idx[0..n) of data [T, cols] (row stride ld) in
  // the memory of `be`; `first`: the patch source's first row (or -1).
  Status EditRows(Backend& be, const Intervention& iv, const float* patch_rows,
                  float* data, int64_t T, int64_t cols, int64_t ld,
                  const int32_t* idx, int64_t n, int64_t first) const;
  // `same_x`: x is the input of the previous Linear call, whose 16-bit copy in
  // the workspace is reused instead of converting x again.
  void Linear(Device& d, const float* x, int64_t m, WeightRole w,
              WeightRole bias, int64_t layer, float* y, int64_t ldy,
              bool same_x = false);
  // The same for expert `expert` of an expert role (its own tensor or its
  // slice of a stacked one: WeightOperandOf / BiasOf); kNoExpert = Linear.
  void ExpertLinear(Device& d, const float* x, int64_t m, WeightRole w,
                    WeightRole bias, int64_t layer, int64_t expert, float* y,
                    int64_t ldy, bool same_x = false);
  // Its GemmOp (the kGemmInputCopy workspace, no reuse).
  GemmOp ExpertGemmOp(Device& d, const float* x, int64_t m, WeightRole w,
                      WeightRole bias, int64_t layer, int64_t expert, float* y,
                      int64_t ldy) const;
  // Runs the GEMMs collected in expert_gemms_ (inputs: row ranges of x
  // [rows, k]) as one Backend::GemmGroup, then clears the list.
  void RunExpertGemms(Device& d, const float* x, int64_t rows);
  // y [T, H] = norm(x [T, H]) with weights `w` / bias `b` of `layer` (x and y
  // may alias), rounded where HF's bf16 forward rounds, delivered to `site`.
  Status Norm(Device& d, NormKind kind, float eps, float offset, WeightRole w,
              WeightRole b, int64_t layer, const float* x, float* y,
              HookSite site, const Batch& batch, HookSink* sink);
  Status ComputeRope(Device& d, const Batch& batch);
  // The end of a branch: the optional post-branch norm of `branch` [T, H] in
  // place (hook `post_site`), then residual x [T, H] += branch (hook
  // `resid_site`).
  Status BranchResidualAdd(Device& d, const LayerConfig& lc, bool post_norm,
                           WeightRole post_norm_role, HookSite post_site,
                           HookSite resid_site, int64_t layer, float* branch,
                           float* x, const Batch& batch, HookSink* sink);
  // Rounds rows x cols values (row stride ld) to bf16 in place when
  // options_.hf_bf16_activations is set.
  // The expert offsets of the last GroupByExpert, in host memory.
  const int32_t* HostExpertOffsets(const Device& d) const {
    return d.host_memory ? d.activations.as<int32_t>(BufferId::kExpertOffsets)
                         : host_expert_offsets_.data();
  }
  void RoundActivations(Device& d, float* data, int64_t rows, int64_t cols,
                        int64_t ld) const {
    if (options_.hf_bf16_activations)
      d.backend->RoundToBf16(data, rows, cols, ld);
  }

  const Model& model_;
  const ModelConfig& c_;
  HookSet hooks_;
  ExecutorOptions options_;
  int64_t last_layer_ = -1;
  Program program_;
  ActivationLayout layout_;
  std::unique_ptr<Backend> owned_backend_;
  std::vector<Device> devices_;
  // Host-side staging of per-batch values for device backends (sized at
  // Create): positions [max_tokens] i32, sequence offsets [max_tokens + 1]
  // i64, RoPE inv_freq [rotary_dim / 2] f32, expert offsets [E + 1] i32.
  std::vector<int32_t> host_positions_;
  std::vector<int64_t> host_seq_start_;
  std::vector<float> host_inv_freq_;
  std::vector<int32_t> host_expert_offsets_;
  // ALiBi's [num_heads] slopes (ModelConfig::alibi; empty otherwise).
  std::vector<float> alibi_slopes_;
  // One layer's expert GEMMs (capacity 2 E, reserved at Create).
  std::vector<GemmOp> expert_gemms_;
  double gemm_seconds_ = 0;  // options_.time_gemms
  // Runs `gemm`, timed into gemm_seconds_ when options_.time_gemms is set.
  template <typename Fn>
  void TimedGemm(Fn gemm) {
    if (!options_.time_gemms) return gemm();
    const auto t0 = std::chrono::steady_clock::now();
    gemm();
    gemm_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
  }
  // The KV cache of the forward in progress (null: none).
  const KvBatch* kv_ = nullptr;
  // The edits of the forward in progress, and the row indices of one edit
  // (capacity max_tokens, reserved at Create), 0 .. max_tokens - 1 (a
  // head patch's source rows) and a zero row (zero / head ablation's source,
  // as wide as the widest editable hook).
  std::span<const SequenceEdit> edits_;
  std::vector<int32_t> edit_rows_;
  std::vector<int32_t> source_rows_;
  std::vector<float> zero_row_;
  // A device whose memory is not the host's: its edited rows are edited in
  // edit_stage_ [kEditStageRows, widest editable hook] (host memory, the
  // plan's EditStageBytes) by host_edits_ (a CPU backend); empty and null
  // when every device is the host's.
  std::vector<float> edit_stage_;
  std::unique_ptr<Backend> host_edits_;
  // A paged cache: the page tables of the forward's sequences, [S,
  // pages_per_seq] (AttentionOp::kv_page_table).
  std::vector<int32_t> kv_page_rows_;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_EXECUTOR_H_
