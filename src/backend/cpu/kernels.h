// CPU kernels. They know nothing of models or HF names: plain row-major
// arrays, explicit sizes, caller-provided outputs and workspaces. Nothing here
// allocates on the heap during a call (a GemmContext's host bookkeeping grows
// on its first calls only).
//
// Activations are always f32. Weights may be f32, bf16 or f16 (used in place).
// Every kernel has a scalar reference in reference/reference_kernels.h that the
// tests compare against; the versions here are vectorised (AVX-512 when the CPU
// has it, a portable path otherwise) and multithreaded with OpenMP.
#ifndef LOOM_BACKEND_CPU_KERNELS_H_
#define LOOM_BACKEND_CPU_KERNELS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "src/core/dtype.h"
#include "src/core/quant_codes.h"

namespace loom::cpu {

// ---- GEMM ------------------------------------------------------------------

// Weight layout: kOutIn is torch Linear's [N, K] (y = x W^T); kInOut is GPT-2
// Conv1D's [K, N] (y = x W); kStrips and kPanels are [N, K] weights repacked
// by PackWeightStrips (bf16, read by the dot and amx families) and
// PackWeightPanels (f32, bf16 or f16, read by the fma family) into the
// layouts those GEMMs read without packing them per call.
enum class WeightLayout { kOutIn, kInOut, kStrips, kPanels };

// Compute precision of a GEMM: kF32 (exact f32 math), kBF16 / kF16 (the
// activation is rounded to the weight's 16-bit type, products accumulate in
// f32; the output is f32).
struct GemmArgs {
  const float* x = nullptr;  // [M, K] row-major, row stride K
  // Dense weight in w_dtype, see layout. Quantized weights: `quant` ([N, K]
  // codes, decoded to w_dtype, the compute dtype) and `w` unused.
  const void* w = nullptr;
  DType w_dtype = DType::kF32;
  WeightLayout layout = WeightLayout::kOutIn;
  const QuantMatrix* quant = nullptr;
  // [N] in w_dtype or f32 (bias_dtype), may be null
  const void* bias = nullptr;
  DType bias_dtype = DType::kF32;
  float* y = nullptr;  // [M, N] row-major, row stride ldy (0 = N)
  int64_t ldy = 0;
  int64_t m = 0, n = 0, k = 0;
  bool accumulate = false;  // y += x W^T (+ bias) instead of y = ...
  // At least GemmWorkspaceBytes(m, k, w_dtype) bytes, 64-byte aligned: the
  // rounded copy of x, then one packing slot per thread.
  void* workspace = nullptr;
  // The previous GEMM on this context used the same x contents, m, k,
  // w_dtype and workspace (e.g. the k and v projections after q), so the
  // rounded copy of x already in the workspace is reused.
  bool reuse_x_workspace = false;
};

// How a GEMM multiplies (src/backend/cpu/gemm_internal.h): the fma family
// (f32 products of f32 or widened 16-bit values, FMA chains at the active
// level), dot (AVX512_BF16 pair dot products) or amx (AMX tiles). bf16 GEMMs
// run amx at the amx level, dot at avx512bf16, fma below; f32 and f16 GEMMs
// always run fma.
enum class GemmFamily { kFma, kDot, kAmx };
GemmFamily GemmFamilyOf(DType compute);
// Tests only: bf16 GEMMs of this process run `family` (which the active
// level must support) instead of the policy's; nullopt restores it. Set it
// before sizing workspaces and repacking weights.
void SetBf16GemmFamilyForTesting(std::optional<GemmFamily> family);

// Whether a dense [n, k] (kOutIn) weight of `dtype` can be repacked into
// kStrips: bf16 on the dot or amx family, n a multiple of 16, k of 32.
bool StripsLayoutFits(int64_t n, int64_t k, DType dtype);
// Packs w [n, k] bf16 (kOutIn, StripsLayoutFits) into kStrips at `out`
// (n k bf16; `out` == `w`: in place): every 16 rows (output columns) become
// one strip over the same byte range, as pairs [k / 2][16][2] (pair p of
// column c: (w[c, 2p], w[c, 2p + 1])), so a slice of rows at a multiple of
// 16 is a slice of the strips. Parallel over strips; in place it allocates
// 16 k bf16 per thread.
void PackWeightStrips(const void* w, int64_t n, int64_t k, void* out);

// Whether a dense [n, k] (kOutIn) weight of `dtype` can be repacked into
// kPanels: f32, bf16 or f16 computed by the fma family, n a multiple of 16.
bool PanelsLayoutFits(int64_t n, int64_t k, DType dtype);
// Packs w [n, k] (kOutIn, PanelsLayoutFits) into kPanels at `out` (the same
// bytes; `out` == `w`: in place): every 16 rows (output columns) become one
// panel over the same byte range, [k][16] in the weight's dtype, so a slice
// of rows at a multiple of 16 is a slice of the panels. Parallel over
// panels; allocates one panel per thread.
void PackWeightPanels(const void* w, int64_t n, int64_t k, DType dtype,
                      void* out);

// Every output element y[i, j] is one chain of multiply-adds over k in order,
// whatever the number of rows, the tiles, the blocking or the thread count:
// a row's result does not depend on what else shares its GEMM (batch
// invariance), and the bytes do not depend on --threads.
//
// Bytes of GemmArgs::workspace for an [m, k] input and compute dtype
// `w_dtype` at the current thread count (NumThreads()): the rounded copy of x
// (none for f32 on the fma family), plus one slot per thread for a packed
// block of the weight and its scratch.
int64_t GemmWorkspaceBytes(int64_t m, int64_t k, DType w_dtype);

// Not thread-safe: one context per executing thread group. Holds host
// bookkeeping only (reused from call to call); every buffer a GEMM uses is
// the caller's workspace.
class GemmContext {
 public:
  GemmContext();
  ~GemmContext();
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;

  // y = x W^T (+ bias) (+ y if accumulate). Checks its arguments with
  // LOOM_CHECK.
  void Gemm(const GemmArgs& args);

  // Several GEMMs (`items`, dense or quantized weights of one compute dtype
  // and k) whose inputs are row ranges of one x [rows, k] (experts' gate, up
  // or down): x is rounded once into `workspace` (GemmWorkspaceBytes(rows,
  // k, w_dtype) bytes; the items' own workspace and reuse_x_workspace are not
  // read), and the tasks of all items run in one parallel region. Outputs
  // are bit-identical to calling Gemm per item, at any thread count.
  void GemmGroup(const GemmArgs* items, int64_t count, const float* x,
                 int64_t rows, void* workspace);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- Norms ----------------------------------------------------------------

// y[r, :] = x[r, :] * rsqrt(mean(x[r,:]^2) + eps) * (w + offset)
// offset = 0 for Llama-style, 1 for Gemma's (1 + w). w (dtype w_dtype) may be
// null (no gain). x and y may alias.
//   x, y: [rows, dim] dense; w: [dim]
void RmsNorm(const float* x, const void* w, DType w_dtype, float offset,
             float eps, float* y, int64_t rows, int64_t dim);

// y = (x - mean) * rsqrt(var + eps) * (w + offset) + b, biased variance like
// torch (offset 1: Nemotron's LayerNorm1P). w and b may be null (OLMo's
// parameter-free LayerNorm). x and y may alias.
//   x, y: [rows, dim] dense; w, b: [dim] in w_dtype
void LayerNorm(const float* x, const void* w, const void* b, DType w_dtype,
               float offset, float eps, float* y, int64_t rows, int64_t dim);

// Hugging Face's bf16 Llama RMSNorm (two roundings):
//   y = bf16(w * bf16(x * rsqrt(mean(x^2) + eps)))   (w: bf16 gain)
//   x, y: [rows, dim] dense (may alias); w: [dim] bf16
void RmsNormBf16(const float* x, const void* w, float eps, float* y,
                 int64_t rows, int64_t dim);

// RMSNorm in place over `groups` consecutive groups of `dim` values of each
// of `tokens` rows (q/k norms: per head, groups = heads; or over the whole
// projection, groups = 1), gain (w + offset), w [dim] in w_dtype.
//   x: [tokens, groups * dim] with row stride ld
void RmsNormRows(float* x, int64_t tokens, int64_t ld, int64_t groups,
                 int64_t dim, const void* w, DType w_dtype, float offset,
                 float eps);
// The same with LayerNorm (gain w and bias b [dim], either may be null):
// StableLM's and Persimmon's q/k norms.
//   x: [tokens, groups * dim] with row stride ld
void LayerNormRows(float* x, int64_t tokens, int64_t ld, int64_t groups,
                   int64_t dim, const void* w, const void* b, DType w_dtype,
                   float eps);

// ---- Rotary embeddings ----------------------------------------------------

// Fills cos/sin tables [tokens, half] (half = rotary_dim / 2) for
// positions [tokens] and inv_freq [half]:
//   angle = float(pos[t]) * inv_freq[i]   (f32 product, as HF computes it)
//   cos[t,i] = cosf(angle) * attention_scaling, sin likewise.
void RopeTables(const int32_t* positions, int64_t tokens, const float* inv_freq,
                int64_t half, float attention_scaling, float* cos, float* sin);

// In place on x [tokens, heads, head_dim] (row stride `row_stride` elements
// between tokens), HF rotate_half convention on the first rotary_dim = 2*half
// elements of each head:
//   x1 = x[..., :half], x2 = x[..., half:2*half]
//   x[..., :half] = x1*cos - x2*sin;  x[..., half:2*half] = x2*cos + x1*sin
void ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
               int64_t row_stride, const float* cos, const float* sin,
               int64_t half);
// The same with HF's rotate_every_two convention (GPT-J, CodeGen): the
// adjacent pairs of the first 2*half elements of each head rotate in place,
//   x0 = x[2i], x1 = x[2i+1]
//   x[2i] = x0*cos_i - x1*sin_i;  x[2i+1] = x1*cos_i + x0*sin_i
// (each product rounded to f32, then the sum: as HF's f32 ops).
void ApplyRopePairs(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                    int64_t row_stride, const float* cos, const float* sin,
                    int64_t half);

// ---- Attention --------------------------------------------------------------

// Causal self-attention over packed variable-length sequences (no padding).
// Sequence s occupies tokens [seq_start[s], seq_start[s+1]).
//   q: [T, q_heads, head_dim] with row stride q_rs elements per token
//   k: [T, kv_heads, head_dim], v: [T, kv_heads, dv] (row strides k_rs, v_rs)
//   z (out): [T, q_heads, dv] dense (row stride q_heads * dv)
// where dv = v_head_dim (0: head_dim; MLA's v heads are narrower than q/k).
// Query head h uses kv head h / (q_heads / kv_heads) (GQA).
// scores = (q . k) * scale; if softcap > 0: scores = softcap * tanh(scores /
// softcap); key j is visible to query i (positions within the sequence) iff j
// <= i and (window <= 0 or i - j < window). Softmax in f32. With sinks
// (gpt-oss), query head h's row also holds one extra logit sinks[h]: the max
// and the softmax run over the visible keys plus the sink, then the sink
// column is dropped, so a row's key probabilities sum to 1 - p(sink). If
// probs is non-null and the sequence index equals probs_seq, the
// probabilities of that sequence are written to probs [q_heads, L, L] (zeros
// where masked; without the sink column).
struct AttentionArgs {
  const float* q;
  int64_t q_rs;
  const float* k;
  int64_t k_rs;
  const float* v;
  int64_t v_rs;
  float* z;
  const int64_t* seq_start;  // [num_seqs + 1]
  int64_t num_seqs;
  int64_t q_heads, kv_heads, head_dim;
  int64_t v_head_dim = 0;  // 0 = head_dim
  float scale;
  float softcap = 0.0f;
  int64_t window = 0;
  // [q_heads] sink logits in sinks_dtype (F32/BF16/F16), or null = none.
  const void* sinks = nullptr;
  DType sinks_dtype = DType::kF32;
  // [q_heads] ALiBi slopes (score += slope_h * key position), or null.
  const float* alibi_slopes = nullptr;
  float* probs = nullptr;
  int64_t probs_seq = -1;
  // Scratch of at least AttentionWorkspaceBytes(...) bytes, 64-byte aligned.
  void* workspace = nullptr;
  // Size of `workspace` in bytes; 0 means it was sized by
  // AttentionWorkspaceBytes(longest sequence of this call, ..., NumThreads()).
  // When given, the kernel uses no more threads than the workspace has room
  // for.
  int64_t workspace_bytes = 0;
  // KV cache (AttentionOp::k_cache): k/v hold the new rows of sequence s at
  // positions q_pos0[s] + i of slot kv_slot[s]; k_cache [slots,
  // kv_capacity, kv_heads * head_dim] and v_cache [slots, kv_capacity,
  // kv_heads * dv], position p at row p % kv_capacity.
  // The new rows are stored into the cache and queries attend to positions
  // [0, p] (window respected) with the same masking, softcap and sinks as
  // above. probs must be null; the workspace is KvAttentionWorkspaceBytes.
  float* k_cache = nullptr;
  float* v_cache = nullptr;
  int64_t kv_capacity = 0;
  const int64_t* kv_slot = nullptr;  // [num_seqs]
  const int64_t* q_pos0 = nullptr;   // [num_seqs]
  // Paged cache (kv_page_size > 0, AttentionOp::kv_page_table): k_cache /
  // v_cache [num_pages, kv_page_size, kv_heads * head_dim (v: dv)]; position p
  // of
  // sequence s at row kv_page_table[s * kv_pages_per_seq + p / kv_page_size]
  // * kv_page_size + p % kv_page_size. The new rows are stored into their
  // pages, then the visible keys are gathered in position order into the
  // workspace panel and the same tiles run over it.
  const int32_t* kv_page_table = nullptr;  // [num_seqs, kv_pages_per_seq]
  int64_t kv_pages_per_seq = 0;
  int64_t kv_page_size = 0;
};
// Workspace for sequences of up to max_seq_len tokens on num_threads threads:
// O(64 x max_seq_len) floats per thread (query tiles of 64 rows; see
// docs/design/cpu-backend.md). width = max(head_dim, v_head_dim).
int64_t AttentionWorkspaceBytes(int64_t max_seq_len, int64_t q_heads,
                                int64_t width, int num_threads);
// Tiled over (sequence, head, 64 query rows); fully masked key blocks are never
// visited. Deterministic and independent of the thread count. `ctx` is not
// used by the current implementation (a dedicated AVX-512 tile kernel).
void Attention(GemmContext& ctx, const AttentionArgs& args);
// Workspace of attention over a KV cache of up to `context` positions per
// sequence: the tile scratch of AttentionWorkspaceBytes(context, ...) plus
// one staging panel of K and V rows [context, kv_heads * (head_dim +
// v_head_dim)] (a sliding-window ring is unrolled there in position order).
int64_t KvAttentionWorkspaceBytes(int64_t context, int64_t q_heads,
                                  int64_t kv_heads, int64_t head_dim,
                                  int64_t v_head_dim, int num_threads);

// ---- Elementwise
// -------------------------------------------------------------

enum class Activation { kSilu, kGeluTanh, kGeluExact, kRelu, kReluSquared };

// out[r, i] = act(gate[r, i]) * up[r, i]; gate/up rows have strides
// gate_rs/up_rs (so a fused [gate | up] buffer works), out is dense [rows, n].
//   gate, up: [rows, n] (row strides gate_rs, up_rs); out: [rows, n]
void GatedActivation(Activation act, const float* gate, int64_t gate_rs,
                     const float* up, int64_t up_rs, float* out, int64_t rows,
                     int64_t n);
// In place: x = act(x). x: [n]
void ApplyActivation(Activation act, float* x, int64_t n);
// In place: x = cap * tanh(x / cap). x: [n]
void Softcap(float* x, int64_t n, float cap);
// y += x. x, y: [n]
void Add(const float* x, float* y, int64_t n);
// x *= s. x: [n]
void Scale(float* x, int64_t n, float s);
// x[r, j] = min(max(x[r, j], lo), hi). x: [rows, cols] with row stride ld
void Clamp(float* x, int64_t rows, int64_t cols, int64_t ld, float lo,
           float hi);
// x[r, j] = bf16(x[r, j]) (round to nearest even, stored as f32).
//   x: [rows, cols] with row stride ld
void RoundToBf16(float* x, int64_t rows, int64_t cols, int64_t ld);
// Regroups blocks of `width` columns part-major:
// y[r, (p * groups + g) * width + i] = x[r, (g * parts + p) * width + i].
//   x: [rows, groups * parts * width] row stride ldx; y: [rows, parts * groups
//   * width] row stride ldy; x and y do not overlap. Exact (a copy).
void DeinterleaveBlocks(const float* x, int64_t ldx, int64_t rows,
                        int64_t groups, int64_t parts, int64_t width, float* y,
                        int64_t ldy);
// y[r * ldy + g * gsy + i * isy] = x[r * ldx + g * gsx + i * isx] for
// r < rows, g < groups, i < n (strides may be 0 on x: broadcast). Exact;
// destinations distinct, x and y do not overlap.
void StridedCopy(const float* x, int64_t ldx, int64_t gsx, int64_t isx,
                 float* y, int64_t ldy, int64_t gsy, int64_t isy, int64_t rows,
                 int64_t groups, int64_t n);
// out[i, :] = x[rows[i], :]. x: [*, cols] row stride ldx; rows: [n];
// out: [n, cols] dense
void GatherRows(const float* x, int64_t ldx, const int32_t* rows, int64_t n,
                int64_t cols, float* out);
// y[rows[i], :] += w[i] * x[i, :] (w null = 1), rows distinct.
//   x: [n, cols] dense; rows, w: [n]; y: [*, cols] row stride ldy
void ScatterAddRows(const float* x, const int32_t* rows, const float* w,
                    int64_t n, int64_t cols, float* y, int64_t ldy);
// Embedding gather: out[t, :] = table[ids[t], :] (table [vocab, dim] in
// table_dtype) converted to f32. ids are validated by the caller.
//   ids: [tokens]; out: [tokens, dim]
void Gather(const void* table, DType table_dtype, const int32_t* ids,
            int64_t tokens, int64_t dim, float* out);
// Converts n f32 values to dtype (F32/BF16/F16) at dst (round to nearest even).
//   src: [n] f32; dst: [n] in dtype
void ConvertFromF32(const float* src, void* dst, DType dtype, int64_t n);
// Converts n values of dtype (F32/BF16/F16) to f32. src: [n]; dst: [n]
void ConvertToF32(const void* src, DType dtype, float* dst, int64_t n);

// ---- Log-softmax -----------------------------------------------------------

// For each row r of logits [rows, vocab]: lse[r] = logsumexp(logits[r, :]),
// computed in f32 with a max shift, summation in double for stability.
//   lse: [rows]
void LogSumExp(const float* logits, int64_t rows, int64_t vocab, double* lse);

// ---- Capture ---------------------------------------------------------------

// dst row i = src row index[i] converted to dtype (F32/BF16/F16).
//   src: [*, cols] row stride ld; index: [n]; dst: [n, cols] dense in dtype
void GatherRowsConvert(const float* src, int64_t ld, const int32_t* index,
                       int64_t n, int64_t cols, void* dst, DType dtype);
// out[g, :] = sum (max) over rows [begin[g], end[g]) of src, in double,
// combined with out when `accumulate` (rows in order: the sums are exactly
// the sequential double sums).
//   src: [*, cols] row stride ld; begin, end: [segments]; out: [segments, cols]
void SegmentReduce(const float* src, int64_t ld, const int32_t* begin,
                   const int32_t* end, int64_t segments, int64_t cols, bool max,
                   bool accumulate, double* out);

// ---- Threads ---------------------------------------------------------------

// Sets the OpenMP/oneDNN thread count (0 = all cores). Returns the count used.
int SetNumThreads(int n);
int NumThreads();

}  // namespace loom::cpu

#endif  // LOOM_BACKEND_CPU_KERNELS_H_
