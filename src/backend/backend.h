// Backend: the interface between the forward program and a device.
//
// A Backend instance is one device (or the host) plus the state one stream of
// work needs there (e.g. the CPU's cached GEMM primitives). It owns memory
// (device, host and pinned host buffers), runs the ops the forward program
// needs, tells the planner what each op costs in scratch bytes (Costs) and
// says what it can compute (Capabilities). The runtime (executor, logits
// head) and the evaluation code call only this interface; only a backend's
// own directory (src/backend/<name>/) includes its kernels.
//
// Conventions (every op):
//   - Activations are row-major arrays of the backend's activation dtype
//     (Costs().activation_dtype; f32 on the CPU backend, hence float*), in
//     this device's memory, with explicit sizes and row strides.
//   - Weights are passed with their storage format (WeightStorage): the
//     backend converts or dequantizes as it computes. Ops never allocate;
//     scratch comes from caller-provided workspaces sized by Costs().
//   - Ops are issued in order on the instance's stream. On a synchronous
//     backend (the CPU) an op has finished when it returns; elsewhere the
//     results are visible after Synchronize() (or to later ops on the same
//     instance).
//   - An instance is not thread-safe: one stream of work at a time. Create
//     one instance per consumer (executor segment, logits head).
//
// Optional slots have synchronous default implementations: CopyAsync (=
// Copy), Synchronize and WaitFor (= nothing to wait for). A device backend
// overrides them to overlap copies with compute (two instances on one device:
// one copies, one computes, ordered with WaitFor).
#ifndef LOOM_BACKEND_BACKEND_H_
#define LOOM_BACKEND_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"
#include "src/core/format.h"
#include "src/core/quant_codes.h"
#include "src/model/bind.h"
#include "src/model/config.h"
#include "src/model/sae.h"
#include "src/model/weights.h"
#include "src/plan/activations.h"
#include "src/plan/devices.h"

namespace loom {

// Where a buffer lives: a device of some kind and its index ("cuda:1" =
// {kCuda, 1}); the host is {kCpu, 0}.
struct DeviceRef {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
  bool operator==(const DeviceRef&) const = default;
};

enum class MemoryKind {
  kDevice,      // the backend's device memory (the host's RAM on the CPU)
  kHost,        // ordinary host memory
  kPinnedHost,  // page-locked host memory (fast device <-> host copies)
};

// An owned allocation; freed by the backend that made it when the last copy
// of the Buffer goes away.
struct Buffer {
  std::shared_ptr<void> memory;
  int64_t bytes = 0;
  MemoryKind kind = MemoryKind::kDevice;
  DeviceRef device;
  void* data() const { return memory.get(); }
};

// A hooked activation as the consumer sees it: rows of `cols` values, row r
// at data + r * ld elements, in `dtype`, in the memory of `device`. A device
// backend hands out device views, so a consumer can select rows on the device
// before anything is copied; f32() is for host-resident f32 views.
struct ActivationView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  DeviceRef device;
  int64_t rows = 0, cols = 0, ld = 0;

  bool host_f32() const {
    return dtype == DType::kF32 && device.kind == DeviceKind::kCpu;
  }
  // The data as host f32 (checked: the view must be host_f32()).
  const float* f32() const;
};

// ---- Weight operands
// ---------------------------------------------------------

// How a GEMM weight operand is stored: a row of the format table
// (src/core/format.h; kDense = plain `dtype` values, f32/bf16/f16; the
// block-quantized kinds keep their scales in WeightOperand::scales), the
// dtype of the values and the matrix layout. Backends list the storages they
// take in Capabilities::weight_formats.
struct WeightStorage {
  FormatKind kind = FormatKind::kDense;
  DType dtype = DType::kF32;
  MatrixLayout layout = MatrixLayout::kOutIn;  // [N, K] or [K, N]
  bool operator==(const WeightStorage&) const = default;
};

// y[m, n] = x[m, k] W^T: W is [n, k] (kOutIn) or [k, n] (kInOut).
//
// Quantized weights (format.kind != kDense) are views of the stored bytes:
// `data` holds the codes (format.dtype = their element type, kF8E4M3 or
// kF4E2M1; layout kOutIn [n, k]), `scales` the block scales (scales_dtype:
// kF8E8M0 for MXFP4, kF8E4M3 for NVFP4, kBF16/kF32 for FP8 block), each
// covering [block_out, block_in] values, and `global_scale` the per-tensor
// (per-expert) scale, divided when `divide_global` (compressed-tensors).
// The backend decodes them (src/core/quant_codes.h) to `decode_dtype`, the
// model's compute dtype, as it multiplies.
struct WeightOperand {
  const void* data = nullptr;
  WeightStorage format;
  int64_t n = 0, k = 0;
  const void* scales = nullptr;  // quantized formats only
  DType scales_dtype = DType::kF32;
  int64_t block_out = 1, block_in = 0;
  float global_scale = 1.0f;
  bool divide_global = false;
  DType decode_dtype = DType::kF32;
  bool quantized() const { return format.kind != FormatKind::kDense; }
  // The dtype the GEMM multiplies in: the stored one, or decode_dtype.
  DType gemm_dtype() const { return quantized() ? decode_dtype : format.dtype; }
};

// y = x W^T (+ bias) (+ y if accumulate).
struct GemmOp {
  const float* x = nullptr;  // [m, k] row stride k
  int64_t m = 0;
  WeightOperand w;
  const void* bias = nullptr;  // [n] in bias_dtype, may be null
  DType bias_dtype = DType::kF32;
  float* y = nullptr;  // [m, n] row stride ldy (0 = n)
  int64_t ldy = 0;
  bool accumulate = false;
  // Scratch of Costs().gemm_workspace(m, k, dtype) bytes.
  void* workspace = nullptr;
  // The previous Gemm on this instance had the same x contents, m, k, weight
  // dtype and workspace: its converted copy of x in the workspace is reused.
  bool reuse_x_workspace = false;
};

// Several GEMMs whose inputs are row ranges of one x (the routed experts of
// a layer: rows grouped by expert). Every item's x lies in [x, x + rows * k)
// with its own weight, bias and output; all items share k and the weight's
// compute dtype. A backend may run them together (the CPU backend runs all
// their tiles in one parallel region); results equal one Gemm per item.
struct GemmGroupOp {
  const float* x = nullptr;  // [rows, k] row stride k
  int64_t rows = 0;
  const GemmOp* items = nullptr;  // [count]; their workspace is not read
  int64_t count = 0;
  // Scratch of Costs().gemm_workspace(rows, k, dtype) bytes.
  void* workspace = nullptr;
};

// ---- Attention
// ---------------------------------------------------------------

// Causal self-attention over packed variable-length sequences; see
// cpu::AttentionArgs for the exact semantics of every field.
struct AttentionOp {
  const float* q = nullptr;  // [T, q_heads, head_dim], row stride q_rs
  int64_t q_rs = 0;
  const float* k = nullptr;  // [T, kv_heads, head_dim], row stride k_rs
  int64_t k_rs = 0;
  const float* v = nullptr;  // [T, kv_heads, dv], row stride v_rs
  int64_t v_rs = 0;
  float* z = nullptr;                  // [T, q_heads * dv] dense
  const int64_t* seq_start = nullptr;  // [num_seqs + 1] (host memory)
  // The same offsets in this backend's memory (a device backend reads
  // these; null on the host backend).
  const int64_t* seq_start_device = nullptr;
  int64_t num_seqs = 0;
  // Longest sequence of the op (0: computed from seq_start).
  int64_t max_seq_len = 0;
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;  // GQA: q_heads % kv_heads
  // dv, the v and z head width: 0 = head_dim (MLA: v_head_dim < head_dim). A
  // backend without distinct widths returns Unimplemented for dv != head_dim.
  int64_t v_head_dim = 0;
  float scale = 1.0f;
  float softcap = 0.0f;  // 0 = none
  int64_t window = 0;    // sliding window; 0 = global
  // [q_heads] per-head sink logits (gpt-oss) in sinks_dtype, null = none. A
  // backend without sinks returns Unimplemented.
  const void* sinks = nullptr;
  DType sinks_dtype = DType::kF32;
  // [q_heads] ALiBi slopes in host memory (BLOOM), null = none: head h's
  // score of key position j (within its sequence) is scale q.k + slope_h j.
  // A backend without ALiBi returns Unimplemented.
  const float* alibi_slopes = nullptr;
  // The model's compute dtype: a device backend may run q k^T and p v in it
  // (rounding q, k, v and p to it, f32 accumulation) when it is 16-bit; f32
  // = f32 arithmetic throughout (what the CPU backend always does).
  DType compute = DType::kF32;
  float* probs = nullptr;  // [q_heads, L, L] of sequence probs_seq, or null
  int64_t probs_seq = -1;
  void* workspace = nullptr;  // Costs().attention_workspace(...) bytes
  // ---- KV cache (generation; k_cache null = the plain op above) ----
  // Sequence s's tokens are new tokens at positions q_pos0[s] + i of cache
  // slot kv_slot[s]; k/v hold only their rows. The op stores the new K/V
  // rows into the slot's cache, and each new query at position p attends to
  // the slot's keys at positions [0, p] (window: (p - window, p]): earlier
  // positions from the cache, the new ones from k/v. The cache must hold the
  // slot's positions [q_pos0[s] - kv_capacity, q_pos0[s]) (those a query
  // can see). probs must be null. workspace: Costs().kv_attention_workspace
  // bytes (instead of attention_workspace). A backend without it returns
  // Unimplemented.
  float* k_cache = nullptr;  // [slots, kv_capacity, kv_heads * head_dim]
  float* v_cache = nullptr;  // [slots, kv_capacity, kv_heads * dv]
  // Positions per slot; position p is row p % kv_capacity (a ring when
  // smaller than the positions seen: sliding-window layers).
  int64_t kv_capacity = 0;
  const int64_t* kv_slot = nullptr;  // [num_seqs] host memory
  const int64_t* q_pos0 = nullptr;   // [num_seqs] host memory
  // Paged layer (kv_page_size > 0): k_cache / v_cache are
  // [kv_num_pages, kv_page_size, kv_heads * head_dim] shared pools, and
  // sequence s's position p is row kv_page_table[s * kv_pages_per_seq + p /
  // kv_page_size] * kv_page_size + p % kv_page_size (kv_slot is then not
  // used to address rows). kv_capacity is the positions a sequence can hold
  // (<= kv_pages_per_seq * kv_page_size); the table must hold valid page ids
  // for every position up to q_pos0[s] + its length.
  const int32_t* kv_page_table = nullptr;  // [num_seqs, kv_pages_per_seq]
                                           // host memory
  int64_t kv_pages_per_seq = 0;
  int64_t kv_page_size = 0;  // 0 = not paged
  int64_t kv_num_pages = 0;
};

enum class ActivationFn { kSilu, kGeluTanh, kGeluExact, kRelu, kReluSquared };
ActivationFn ToActivationFn(ActKind act);

// How TopKRoute turns a row of router logits into k (expert, weight) pairs:
// the router's kind and its data (see RouterKind).
struct RouteOp {
  RouterKind kind = RouterKind::kSoftmaxTopK;
  // kSoftmaxTopK / kSigmoidGroupTopK: divide the k weights by their sum
  // (kSigmoidGroupTopK: sum + 1e-20).
  bool renormalize = false;
  // kSigmoidGroupTopK only. correction_bias [experts] in its dtype, this
  // backend's memory (null = zeros), is added to the choice values; experts
  // split into `groups` consecutive groups of experts / groups (>= 2 each),
  // of which the `keep_groups` with the largest sum of their top-2 choice
  // values are kept (equal sums: lower group first).
  const void* correction_bias = nullptr;
  DType correction_bias_dtype = DType::kF32;
  int64_t groups = 1;
  int64_t keep_groups = 1;
  // Multiplies the final weights (routed_scaling_factor; 1 otherwise).
  float scale = 1.0f;
};
// InvalidArgument naming the values unless 0 < k <= experts and, for
// kSigmoidGroupTopK, experts % groups == 0, experts / groups >= 2 and
// 0 < keep_groups <= groups.
Status CheckRouteOp(const RouteOp& op, int64_t experts, int64_t k);

// The weight storages both backends take: dense f32 / bf16 / f16 in either
// layout, FP8 (per-tensor, block) and the FP4 formats (MXFP4, NVFP4) as
// [n, k] codes, decoded to the compute dtype.
std::vector<WeightStorage> StandardWeightFormats();

// What a backend computes.
struct BackendCapabilities {
  std::vector<DType> compute_dtypes;          // GEMM compute precisions
  std::vector<WeightStorage> weight_formats;  // GEMM weight operands
  bool attention_sinks = false;
  bool async_copy = false;  // CopyAsync overlaps with compute
  // TopKRoute takes at most this many experts per token (0 = no MoE).
  int64_t max_route_experts = 0;
};

// ---- Backward (vector-Jacobian products with respect to activations) ----
// Weights are constants: no weight gradients. Each op's math and its
// invariances are stated in src/backend/cpu/backward_cpu.h.

// dx [m, k] (+)= dy [m, n] W: the transposed product of Gemm's weight (w
// in any storage the backend's Gemm takes, decoded on the fly, never a
// dequantized copy of the matrix). Row strides ldy (0 = n) and ldx (0 = k).
struct GemmBackwardOp {
  const float* dy = nullptr;
  int64_t ldy = 0;
  int64_t m = 0;
  WeightOperand w;
  float* dx = nullptr;
  int64_t ldx = 0;
  bool accumulate = false;
  void* workspace = nullptr;
};

// A norm's VJP on rows: x, dy, dx [rows, dim] dense (dx may alias dy, not
// x); w [dim] in w_dtype (null: no gain), offset as the forward's. LayerNorm
// (layer_norm) subtracts the mean; RMSNorm does not. freeze_scale: the
// 1/rms (1/std) factor is a constant (circuit-tracer's linearization), so
// dx = scale * (g - [mean(g)]) with g = dy * (w + offset).
struct NormBackwardOp {
  const float* x = nullptr;
  const float* dy = nullptr;
  float* dx = nullptr;
  int64_t rows = 0, dim = 0;
  const void* w = nullptr;
  DType w_dtype = DType::kF32;
  float offset = 0.0f, eps = 1e-5f;
  bool layer_norm = false;
  bool freeze_scale = false;
  bool accumulate = false;  // dx += instead of dx =
};

// Attention's VJP over the packed sequences of the forward (AttentionOp's
// fields; q and k as the forward read them, after RoPE): from dz [T,
// q_heads * dv] dense, dq [T, q_heads, head_dim] (row stride q_rs), dk [T,
// kv_heads, head_dim] and dv [T, kv_heads, dv] (row strides k_rs, v_rs) are
// written (not accumulated). The probabilities are recomputed from q and k.
// freeze_pattern: they are constants (dq = dk = 0, dv = P^T dz).
struct AttentionBackwardOp {
  AttentionOp fwd;  // q, k, v, geometry, scale, softcap, window, sinks
  const float* dz = nullptr;
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  bool freeze_pattern = false;
  // AttentionBackwardWorkspaceBytes(fwd) bytes.
  void* workspace = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;
  virtual DeviceRef device() const = 0;
  // A new, independent instance on the same device (its own stream and
  // library state): a second consumer there (the logits head, the offload
  // copier).
  virtual StatusOr<std::unique_ptr<Backend>> NewInstance() const = 0;
  virtual BackendCapabilities Capabilities() const = 0;
  // What each op costs in scratch bytes, for the planner.
  virtual KernelCosts Costs() const = 0;
  // Threads the backend's host-side work uses (0 = all cores); returns the
  // count used.
  virtual int SetNumThreads(int n) = 0;
  virtual int NumThreads() const = 0;

  // ---- Memory ----
  // `bytes` (at least 64), 64-byte aligned, zero-filled and resident.
  virtual StatusOr<Buffer> Allocate(int64_t bytes, MemoryKind kind) = 0;
  // Copies `bytes` from `src` (memory of `src_device`) to `dst` (memory of
  // `dst_device`); one of them is this backend's device or the host.
  virtual Status Copy(void* dst, DeviceRef dst_device, const void* src,
                      DeviceRef src_device, int64_t bytes) = 0;
  // Optional: a copy ordered on this instance's stream that may still be in
  // flight when it returns (complete after Synchronize()).
  virtual Status CopyAsync(void* dst, DeviceRef dst_device, const void* src,
                           DeviceRef src_device, int64_t bytes) {
    return Copy(dst, dst_device, src, src_device, bytes);
  }
  // Optional: waits for everything issued on this instance.
  virtual Status Synchronize() { return Status(); }
  // Optional: work issued on this instance after the call starts only once
  // all work issued on `other` so far has finished (the host does not wait).
  // `other` may be another instance on the same device (a copier beside a
  // compute instance) or on another device. Allocates nothing (each device
  // instance records into one event made at construction). On a synchronous
  // backend everything issued has finished already: nothing to do.
  virtual Status WaitFor(Backend& other) {
    (void)other;
    return Status();
  }

  // ---- GEMM ----
  // Library scratch used by every Gemm of this instance (borrowed; sized by
  // Costs().gemm_scratchpad over the shapes that will run).
  virtual void SetGemmScratchpad(void* scratch, int64_t bytes) = 0;
  // Workspace every Gemm of a quantized weight decodes into (borrowed; sized
  // by Costs().weight_decode_workspace over the quantized GEMMs that run).
  virtual void SetWeightDecodeWorkspace(void* workspace, int64_t bytes) {
    (void)workspace;
    (void)bytes;
  }
  virtual void Gemm(const GemmOp& op) = 0;
  // Optional: the layout this backend would rather read a dense [n, k]
  // (out, in) GEMM weight of `dtype` in, and the rewrite into it: `data`'s
  // n k elements into `out` (== data: in place), the same size, a slice of
  // rows at a multiple of 16 staying a slice. kOutIn: keep it as stored.
  virtual MatrixLayout RepackedLayout(int64_t n, int64_t k, DType dtype) const {
    (void)n;
    (void)k;
    (void)dtype;
    return MatrixLayout::kOutIn;
  }
  virtual void RepackWeight(const void* data, int64_t n, int64_t k, DType dtype,
                            void* out) const {
    (void)data;
    (void)n;
    (void)k;
    (void)dtype;
    (void)out;
  }
  // The items one by one (each rounds its x into the workspace) unless a
  // backend groups them.
  virtual void GemmGroup(const GemmGroupOp& op);

  // ---- Norms: x, y [rows, dim] dense (may alias); w, b [dim] in w_dtype ----
  // y = x * rsqrt(mean(x^2) + eps) * (w + offset); w may be null.
  virtual void RmsNorm(const float* x, const void* w, DType w_dtype,
                       float offset, float eps, float* y, int64_t rows,
                       int64_t dim) = 0;
  // Hugging Face's bf16 Llama RMSNorm: y = bf16(w * bf16(normalized)), w bf16.
  virtual void RmsNormBf16(const float* x, const void* w, float eps, float* y,
                           int64_t rows, int64_t dim) = 0;
  // RMSNorm of `groups` groups of `dim` values in each of `tokens` rows
  // (row stride ld): q/k norms per head (groups = heads) or over the whole
  // projection (groups = 1). In place. x: [tokens, groups * dim] stride ld.
  // The gain is (w + offset) (1: Gemma 3's q/k norms).
  virtual void RmsNormRows(float* x, int64_t tokens, int64_t ld, int64_t groups,
                           int64_t dim, const void* w, DType w_dtype,
                           float offset, float eps) = 0;
  // LayerNorm on `groups` groups of `dim` values in each of `tokens` rows
  // (row stride ld), in place, gain w and bias b [dim] (either may be null):
  // the q/k LayerNorms of StableLM (per head, one call per head's own
  // weights) and Persimmon (one norm shared by the heads).
  virtual void LayerNormRows(float* x, int64_t tokens, int64_t ld,
                             int64_t groups, int64_t dim, const void* w,
                             const void* b, DType w_dtype, float eps) = 0;
  // y = (x - mean) * rsqrt(var + eps) * (w + offset) + b; w, b may be null
  // (offset 1: Nemotron's LayerNorm1P).
  virtual void LayerNorm(const float* x, const void* w, const void* b,
                         DType w_dtype, float offset, float eps, float* y,
                         int64_t rows, int64_t dim) = 0;

  // ---- RoPE ----
  // cos/sin [tokens, half] for positions [tokens] and inv_freq [half].
  virtual void RopeTables(const int32_t* positions, int64_t tokens,
                          const float* inv_freq, int64_t half,
                          float attention_scaling, float* cos, float* sin) = 0;
  // In place on x [tokens, heads, head_dim] (row stride row_stride).
  virtual void ApplyRope(float* x, int64_t tokens, int64_t heads,
                         int64_t head_dim, int64_t row_stride, const float* cos,
                         const float* sin, int64_t half) = 0;
  // The same with the adjacent pairs (x[2i], x[2i+1]) of the first 2 half
  // elements rotating in place by frequency i (HF's rotate_every_two: GPT-J,
  // CodeGen). Unimplemented (naming the op) on a backend without it.
  virtual Status ApplyRopePairs(float* x, int64_t tokens, int64_t heads,
                                int64_t head_dim, int64_t row_stride,
                                const float* cos, const float* sin,
                                int64_t half);

  // ---- Attention ----
  virtual Status Attention(const AttentionOp& op) = 0;

  // ---- Elementwise ----
  // x: [n] in place.
  virtual void Activation(ActivationFn fn, float* x, int64_t n) = 0;
  // out[r, i] = fn(gate[r, i]) * up[r, i]; gate/up row strides gate_rs/up_rs,
  // out dense [rows, n].
  virtual void GatedActivation(ActivationFn fn, const float* gate,
                               int64_t gate_rs, const float* up, int64_t up_rs,
                               float* out, int64_t rows, int64_t n) = 0;
  virtual void Add(const float* x, float* y, int64_t n) = 0;  // y += x, [n]
  virtual void Scale(float* x, int64_t n, float s) = 0;       // x *= s, [n]
  virtual void Softcap(float* x, int64_t n, float cap) = 0;   // [n]
  // x[r, j] = clamp(x[r, j], lo, hi); x [rows, cols] row stride ld.
  virtual void Clamp(float* x, int64_t rows, int64_t cols, int64_t ld, float lo,
                     float hi) = 0;
  // x[r, j] = bf16(x[r, j]) (round to nearest even, kept as f32);
  // x [rows, cols] row stride ld.
  virtual void RoundToBf16(float* x, int64_t rows, int64_t cols,
                           int64_t ld) = 0;

  // ---- Gather / scatter ----
  // Embedding: out[t, :] = table[ids[t], :]; table [vocab, dim] in
  // table_dtype, ids [tokens] (validated by the caller), out [tokens, dim].
  virtual void Gather(const void* table, DType table_dtype, const int32_t* ids,
                      int64_t tokens, int64_t dim, float* out) = 0;
  // Regroups blocks of `width` columns part-major: x [rows, groups * parts *
  // width] (row stride ldx) holds, per row, `groups` groups of `parts`
  // blocks; y [rows, parts * groups * width] (row stride ldy) gets
  // y[r, (p * groups + g) * width + i] = x[r, (g * parts + p) * width + i]
  // (a fused projection whose parts are interleaved per head, groups =
  // heads, becomes one run per part). Exact; x and y do not overlap.
  virtual void DeinterleaveBlocks(const float* x, int64_t ldx, int64_t rows,
                                  int64_t groups, int64_t parts, int64_t width,
                                  float* y, int64_t ldy) = 0;
  // A copy over three strided levels: for r < rows, g < groups, i < n,
  // y[r * ldy + g * gsy + i * isy] = x[r * ldx + g * gsx + i * isx]. A zero
  // source stride broadcasts (MLA's one rope key head to every head), isx = 2
  // picks every other element (de-interleaving rope pairs). Exact; the
  // destinations are distinct and x and y do not overlap.
  virtual void StridedCopy(const float* x, int64_t ldx, int64_t gsx,
                           int64_t isx, float* y, int64_t ldy, int64_t gsy,
                           int64_t isy, int64_t rows, int64_t groups,
                           int64_t n) = 0;
  // Experts: out[i, :] = x[rows[i], :]; x row stride ldx, out [n, cols].
  virtual void GatherRows(const float* x, int64_t ldx, const int32_t* rows,
                          int64_t n, int64_t cols, float* out) = 0;
  // Experts: y[rows[i], :] += weights[i] * x[i, :]; x [n, cols] dense,
  // y row stride ldy; weights may be null (= 1).
  virtual void ScatterAddRows(const float* x, const int32_t* rows,
                              const float* weights, int64_t n, int64_t cols,
                              float* y, int64_t ldy) = 0;

  // ---- Row edits (interventions) ----
  // Each edits rows idx[0..n) of an activation x [rows, cols] (row stride ld,
  // this backend's memory) in place. idx [n] i32 (this backend's memory) must
  // be strictly increasing and in [0, rows): otherwise InvalidArgument naming
  // the first bad entry, with x unchanged. Rows are edited independently, so
  // the result does not depend on the thread count. A backend without them
  // returns Unimplemented naming the op. No model knowledge: the caller maps
  // hooks, positions and heads to rows and columns.
  //
  // Steering: x[idx[i], :] += scale * v[:] (the product rounded to f32, then
  // added). v: [cols]. norm_match: each edited row is then rescaled to its
  // pre-edit L2 norm (cpu/kernels_rows.h states the roundings).
  // SAEs and transcoders (src/model/sae.h) on rows x [rows, d_in] in host
  // or device memory as the backend's other ops; `reference` [rows, d_out]
  // (null: no error output); the math and its invariances are stated in
  // src/backend/cpu/sae_cpu.h. Unimplemented (naming the op) on a backend
  // without the kernel.
  // ---- Backward (the structs above; Unimplemented naming the op on a
  // backend without the kernel) ----
  // GemmBackwardOp (above); op.workspace holds GemmBackwardWorkspaceBytes(
  // op.w, op.m) bytes (w's n and k are read).
  virtual int64_t GemmBackwardWorkspaceBytes(const WeightOperand& w,
                                             int64_t m) const;
  virtual Status GemmBackwardInput(const GemmBackwardOp& op);
  virtual Status NormBackward(const NormBackwardOp& op);
  virtual int64_t AttentionBackwardWorkspaceBytes(const AttentionOp& op) const;
  virtual Status AttentionBackward(const AttentionBackwardOp& op);
  // dx[i] = dy[i] * fn'(x[i]), [n] (dx may alias dy).
  virtual Status ActivationBackward(ActivationFn fn, const float* x,
                                    const float* dy, float* dx, int64_t n);
  // The gated activation's VJP: out = fn(gate) * up; from dout [rows, n]
  // dense, dgate and dup [rows, n] (row strides dg_rs, du_rs) are written.
  // gpt-oss's clamped SwiGLU's VJP (ClampedSwiglu's layout): from dout
  // [rows, n] dense, dgate_up [rows, 2n] (row stride dgu_rs, interleaved as
  // gate_up) is written; a clamp passes the gradient where its input is
  // inside the range, bounds included (torch.clamp's rule).
  virtual Status ClampedSwigluBackward(const float* gate_up, int64_t gu_rs,
                                       const float* dout, float* dgate_up,
                                       int64_t dgu_rs, int64_t rows, int64_t n,
                                       float alpha, float limit);
  virtual Status GatedActivationBackward(ActivationFn fn, const float* gate,
                                         int64_t gate_rs, const float* up,
                                         int64_t up_rs, const float* dout,
                                         float* dgate, int64_t dg_rs,
                                         float* dup, int64_t du_rs,
                                         int64_t rows, int64_t n);

  virtual int64_t SaeWorkspaceBytes(const Sae& sae, int64_t rows) const;
  virtual Status RunSae(const Sae& sae, const float* x, const float* reference,
                        int64_t rows, void* workspace, const SaeOutputs& out);

  virtual Status AddRowsBroadcast(float* x, int64_t rows, int64_t cols,
                                  int64_t ld, const int32_t* idx, int64_t n,
                                  const float* v, float scale,
                                  bool norm_match) = 0;
  // Directional ablation: x[idx[i], :] -= d_i * u[:] with d_i = x[idx[i], :]
  // . u accumulated in double from the f32 values (rounded to f32 once), then
  // d_i * u[j] rounded to f32 and subtracted. u: [cols], a unit vector (the
  // caller's contract).
  virtual Status ProjectOutRows(float* x, int64_t rows, int64_t cols,
                                int64_t ld, const int32_t* idx, int64_t n,
                                const float* u) = 0;
  // Zero / mean / head ablation: x[idx[i], col_begin + j] = src[s, j] for
  // j < width = col_end - col_begin, s = i when src_rows == n, s = 0 when
  // src_rows == 1 (one row broadcast). 0 <= col_begin <= col_end <= cols.
  // src: [src_rows, width] dense.
  virtual Status SetRows(float* x, int64_t rows, int64_t cols, int64_t ld,
                         const int32_t* idx, int64_t n, int64_t col_begin,
                         int64_t col_end, const float* src,
                         int64_t src_rows) = 0;
  // Activation patching: x[dst_idx[i], :] = src[src_idx[i], :]. src:
  // [src_rows, cols] row stride ld_src, a buffer not overlapping x; src_idx
  // [n] in [0, src_rows), any order (a bad one is InvalidArgument too).
  virtual Status CopyRows(float* x, int64_t rows, int64_t cols, int64_t ld,
                          const int32_t* dst_idx, int64_t n, const float* src,
                          int64_t src_rows, int64_t ld_src,
                          const int32_t* src_idx) = 0;

  // ---- Mixture of experts ----
  // Top-k routing of `tokens` rows of router logits [tokens, experts] (row
  // stride ld, f32): ids [tokens, k] i32 and weights [tokens, k] f32 in slot
  // order (descending score; equal scores: lower expert id first).
  // kSoftmaxTopK: p = softmax over all experts (f32), the k largest p
  // (renormalised to sum 1 when op.renormalize); kTopKSoftmax: the k largest
  // logits, weights = softmax over those k; kSigmoidGroupTopK: see
  // RouterKind and RouteOp. Weights are then multiplied by op.scale. A kind
  // this backend does not implement, or group counts that do not divide the
  // experts, is an error naming them.
  virtual Status TopKRoute(const float* logits, int64_t tokens, int64_t experts,
                           int64_t ld, int64_t k, const RouteOp& op,
                           int32_t* ids, float* weights) = 0;
  // gpt-oss's clamped SwiGLU on interleaved gate_up [rows, 2n] (row stride
  // gu_rs; gate = even columns, up = odd): g = min(gate, limit),
  // u = clamp(up, -limit, limit), out [rows, n] dense =
  // (u + 1) * g * sigmoid(alpha * g).
  virtual void ClampedSwiglu(const float* gate_up, int64_t gu_rs, float* out,
                             int64_t rows, int64_t n, float alpha,
                             float limit) = 0;
  // Shared expert: y[r, :] += sigmoid(gate_logit[r]) * x[r, :]; x [rows,
  // cols] dense, y row stride ldy, gate_logit [rows].
  virtual void SigmoidGateAddRows(const float* x, const float* gate_logit,
                                  int64_t rows, int64_t cols, float* y,
                                  int64_t ldy) = 0;
  // x [n] = 0.
  virtual void SetZero(float* x, int64_t n) = 0;
  // Groups the tokens * k routed (token, slot) pairs of ids/weights [tokens,
  // k] by expert, stable in token order: offsets [experts + 1] (first routed
  // row of each expert; offsets[experts] = tokens * k), rows [tokens * k]
  // (the token of each routed row), row_weights [tokens * k]. All in this
  // backend's memory; `host_offsets` [experts + 1] (host memory) receives a
  // copy of the offsets (a device backend synchronises for it). An id outside
  // [0, experts) is an Internal error naming it.
  virtual Status GroupByExpert(const int32_t* ids, const float* weights,
                               int64_t tokens, int64_t k, int64_t experts,
                               int32_t* offsets, int32_t* rows,
                               float* row_weights, int32_t* host_offsets) = 0;

  // ---- Conversion ----
  virtual void ConvertFromF32(const float* src, void* dst, DType dtype,
                              int64_t n) = 0;
  virtual void ConvertToF32(const void* src, DType dtype, float* dst,
                            int64_t n) = 0;

  // ---- Head ----
  // lse[r] = logsumexp(logits[r, :]) for logits [rows, vocab] (one chunk of
  // the head; lse in host memory, double; rows <= kMaxHeadRows on a device
  // backend).
  virtual void LogSumExp(const float* logits, int64_t rows, int64_t vocab,
                         double* lse) = 0;
  // logprob[r] = logits[r, targets[r]] - logsumexp(logits[r, :]) in double
  // (targets and logprob in host memory; rows <= kMaxHeadRows).
  virtual void TargetLogProbs(const float* logits, int64_t rows, int64_t vocab,
                              const int32_t* targets, double* logprob) = 0;

  // ---- Capture: selection before anything leaves the device ----
  // dst row i = src row index[i] in `dtype` (F32 / BF16 / F16): src [*, cols]
  // f32 row stride ld; index [n] i32 and dst [n, cols] dense in memory this
  // backend's kernels can reach (its own, or pinned host memory from
  // Allocate(kPinnedHost)). Asynchronous on a device backend.
  virtual void GatherRowsConvert(const float* src, int64_t ld,
                                 const int32_t* index, int64_t n, int64_t cols,
                                 void* dst, DType dtype) = 0;
  // out[g, :] = sum (or max) over rows [begin[g], end[g]) of src [*, cols]
  // (row stride ld), in double, combined with out's values when
  // `accumulate`. begin/end [segments] i32 and out [segments, cols] as for
  // GatherRowsConvert.
  virtual void SegmentReduce(const float* src, int64_t ld, const int32_t* begin,
                             const int32_t* end, int64_t segments, int64_t cols,
                             bool max, bool accumulate, double* out) = 0;
};

// Rows of one head chunk a device backend scores at once (TargetLogProbs,
// LogSumExp).
inline constexpr int64_t kMaxHeadRows = 4096;

// A quantized operand as the decoders (src/core/quant_codes.h) take it.
QuantMatrix QuantMatrixOf(const WeightOperand& w);

// The weight operand of a bound weight (its storage format and [n, k]).
WeightOperand MakeWeightOperand(const TensorView& w, MatrixLayout layout);

// The GEMM operand of bound weight (role, layer), or of expert `expert` of an
// expert role: the expert's own tensor (Mixtral, Qwen-MoE) or slice `expert`
// of a stacked [E, ...] tensor (gpt-oss). Checked: the weight is bound.
// Quantized weights keep their stored format: values, block scales and the
// global scale of the expert (stacked [E, ...] tensors are sliced alike; an
// MXFP4 gate_up_proj_blocks [E, 2I, H/32, 16] gives n = 2I, k = H, kOutIn).
WeightOperand WeightOperandOf(const BoundWeights& w, WeightRole role,
                              int64_t layer, int64_t expert = kNoExpert);

// A bias vector [n] in `dtype`; data == nullptr when the model has none.
struct BiasOperand {
  const void* data = nullptr;
  DType dtype = DType::kF32;
};
// The bias (role, layer), or expert `expert`'s row of a stacked [E, n] bias.
BiasOperand BiasOf(const BoundWeights& w, WeightRole role, int64_t layer,
                   int64_t expert = kNoExpert);

}  // namespace loom

#endif  // LOOM_BACKEND_BACKEND_H_
