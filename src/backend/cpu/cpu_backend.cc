#include "src/backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "src/backend/cpu/backward_cpu.h"
#include "src/backend/cpu/kernels_internal.h"
#include "src/backend/cpu/kernels_moe.h"
#include "src/backend/cpu/kernels_rows.h"
#include "src/backend/cpu/sae_cpu.h"
#include "src/base/check.h"
#include "src/base/units.h"

namespace loom::cpu {
namespace {

Activation ToCpu(ActivationFn fn) {
  switch (fn) {
    case ActivationFn::kSilu:
      return Activation::kSilu;
    case ActivationFn::kGeluTanh:
      return Activation::kGeluTanh;
    case ActivationFn::kGeluExact:
      return Activation::kGeluExact;
    case ActivationFn::kRelu:
      return Activation::kRelu;
    case ActivationFn::kReluSquared:
      return Activation::kReluSquared;
  }
  return Activation::kSilu;
}

WeightLayout ToCpu(MatrixLayout layout) {
  switch (layout) {
    case MatrixLayout::kInOut:
      return WeightLayout::kInOut;
    case MatrixLayout::kStrips:
      return WeightLayout::kStrips;
    case MatrixLayout::kPanels:
      return WeightLayout::kPanels;
    case MatrixLayout::kOutIn:
      break;
  }
  return WeightLayout::kOutIn;
}

}  // namespace

KernelCosts CpuKernelCosts() {
  KernelCosts k;
  // One workspace for every GEMM: the rounded x and a packing slot per
  // thread (quantized weights are decoded into the slots).
  k.gemm_workspace = &GemmWorkspaceBytes;
  k.attention_workspace = &AttentionWorkspaceBytes;
  k.kv_attention_workspace = &KvAttentionWorkspaceBytes;
  k.num_threads = NumThreads();
  k.activation_dtype = DType::kF32;
  return k;
}

CpuBackend::CpuBackend() : gemm_(std::make_unique<GemmContext>()) {}
CpuBackend::~CpuBackend() = default;

BackendCapabilities CpuBackend::Capabilities() const {
  BackendCapabilities c;
  c.compute_dtypes = {DType::kF32, DType::kBF16, DType::kF16};
  c.weight_formats = StandardWeightFormats();
  if (StripsLayoutFits(16, 32, DType::kBF16))
    c.weight_formats.push_back(
        WeightStorage{FormatKind::kDense, DType::kBF16, MatrixLayout::kStrips});
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16})
    if (PanelsLayoutFits(16, 32, d))
      c.weight_formats.push_back(
          WeightStorage{FormatKind::kDense, d, MatrixLayout::kPanels});
  c.attention_sinks = true;
  c.async_copy = false;
  c.max_route_experts = kMaxRouteColumns;
  return c;
}

KernelCosts CpuBackend::Costs() const { return CpuKernelCosts(); }

int CpuBackend::SetNumThreads(int n) { return cpu::SetNumThreads(n); }
int CpuBackend::NumThreads() const { return cpu::NumThreads(); }

StatusOr<Buffer> CpuBackend::Allocate(int64_t bytes, MemoryKind kind) {
  if (bytes < 0)
    return InvalidArgumentError("cpu: cannot allocate " +
                                std::to_string(bytes) + " bytes");
  const int64_t n = AlignUp(std::max<int64_t>(bytes, 64), 64);
  void* p = std::aligned_alloc(64, static_cast<size_t>(n));
  if (p == nullptr)
    return ResourceExhaustedError("cpu: cannot allocate " + FormatBytes(n));
  // Touch every page now, so the first forward does not fault them in.
  std::memset(p, 0, static_cast<size_t>(n));
  Buffer b;
  b.memory = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  b.bytes = n;
  b.kind = kind;
  return b;
}

Status CpuBackend::Copy(void* dst, DeviceRef dst_device, const void* src,
                        DeviceRef src_device, int64_t bytes) {
  if (dst_device.kind != DeviceKind::kCpu ||
      src_device.kind != DeviceKind::kCpu)
    return UnimplementedError(
        "cpu backend: copies to or from a non-host device");
  if (bytes > 0 && dst != src)
    std::memmove(dst, src, static_cast<size_t>(bytes));
  return Status();
}

namespace {

GemmArgs ArgsOf(const GemmOp& op) {
  GemmArgs a;
  a.x = op.x;
  a.w = op.w.data;
  a.w_dtype = op.w.gemm_dtype();
  a.layout = ToCpu(op.w.format.layout);
  a.n = op.w.n;
  a.k = op.w.k;
  a.m = op.m;
  a.bias = op.bias;
  a.bias_dtype = op.bias_dtype;
  a.y = op.y;
  a.ldy = op.ldy;
  a.accumulate = op.accumulate;
  a.workspace = op.workspace;
  a.reuse_x_workspace = op.reuse_x_workspace;
  return a;
}

}  // namespace

void CpuBackend::Gemm(const GemmOp& op) {
  GemmArgs a = ArgsOf(op);
  QuantMatrix q;
  if (op.w.quantized()) {
    LOOM_CHECK(op.w.format.layout == MatrixLayout::kOutIn)
        << "quantized weights are [n, k]";
    q = QuantMatrixOf(op.w);
    a.quant = &q;
  }
  gemm_->Gemm(a);
}

MatrixLayout CpuBackend::RepackedLayout(int64_t n, int64_t k,
                                        DType dtype) const {
  if (StripsLayoutFits(n, k, dtype)) return MatrixLayout::kStrips;
  if (PanelsLayoutFits(n, k, dtype)) return MatrixLayout::kPanels;
  return MatrixLayout::kOutIn;
}

void CpuBackend::RepackWeight(const void* data, int64_t n, int64_t k,
                              DType dtype, void* out) const {
  switch (RepackedLayout(n, k, dtype)) {
    case MatrixLayout::kStrips:
      PackWeightStrips(data, n, k, out);
      return;
    case MatrixLayout::kPanels:
      PackWeightPanels(data, n, k, dtype, out);
      return;
    default:
      LOOM_CHECK(false) << "repack of a [" << n << ", " << k << "] "
                        << DTypeName(dtype) << " weight";
  }
}

// Every item, dense or quantized, as tasks of one parallel region (the same
// bytes as one Gemm per item).
void CpuBackend::GemmGroup(const GemmGroupOp& op) {
  group_args_.clear();
  group_quant_.clear();
  group_quant_.reserve(static_cast<size_t>(op.count));  // pointers stay valid
  for (int64_t i = 0; i < op.count; ++i) {
    const GemmOp& g = op.items[i];
    if (g.m == 0) continue;
    group_args_.push_back(ArgsOf(g));
    GemmArgs& a = group_args_.back();
    a.workspace = op.workspace;
    a.reuse_x_workspace = false;
    if (g.w.quantized()) {
      LOOM_CHECK(g.w.format.layout == MatrixLayout::kOutIn)
          << "quantized weights are [n, k]";
      group_quant_.push_back(QuantMatrixOf(g.w));
      a.quant = &group_quant_.back();
    }
  }
  gemm_->GemmGroup(group_args_.data(), static_cast<int64_t>(group_args_.size()),
                   op.x, op.rows, op.workspace);
}

void CpuBackend::RmsNorm(const float* x, const void* w, DType w_dtype,
                         float offset, float eps, float* y, int64_t rows,
                         int64_t dim) {
  cpu::RmsNorm(x, w, w_dtype, offset, eps, y, rows, dim);
}

void CpuBackend::RmsNormBf16(const float* x, const void* w, float eps, float* y,
                             int64_t rows, int64_t dim) {
  cpu::RmsNormBf16(x, w, eps, y, rows, dim);
}

void CpuBackend::RmsNormRows(float* x, int64_t tokens, int64_t ld,
                             int64_t groups, int64_t dim, const void* w,
                             DType w_dtype, float offset, float eps) {
  cpu::RmsNormRows(x, tokens, ld, groups, dim, w, w_dtype, offset, eps);
}

void CpuBackend::LayerNormRows(float* x, int64_t tokens, int64_t ld,
                               int64_t groups, int64_t dim, const void* w,
                               const void* b, DType w_dtype, float eps) {
  cpu::LayerNormRows(x, tokens, ld, groups, dim, w, b, w_dtype, eps);
}

void CpuBackend::LayerNorm(const float* x, const void* w, const void* b,
                           DType w_dtype, float offset, float eps, float* y,
                           int64_t rows, int64_t dim) {
  cpu::LayerNorm(x, w, b, w_dtype, offset, eps, y, rows, dim);
}

void CpuBackend::RopeTables(const int32_t* positions, int64_t tokens,
                            const float* inv_freq, int64_t half,
                            float attention_scaling, float* cos, float* sin) {
  cpu::RopeTables(positions, tokens, inv_freq, half, attention_scaling, cos,
                  sin);
}

void CpuBackend::ApplyRope(float* x, int64_t tokens, int64_t heads,
                           int64_t head_dim, int64_t row_stride,
                           const float* cos, const float* sin, int64_t half) {
  cpu::ApplyRope(x, tokens, heads, head_dim, row_stride, cos, sin, half);
}

Status CpuBackend::ApplyRopePairs(float* x, int64_t tokens, int64_t heads,
                                  int64_t head_dim, int64_t row_stride,
                                  const float* cos, const float* sin,
                                  int64_t half) {
  cpu::ApplyRopePairs(x, tokens, heads, head_dim, row_stride, cos, sin, half);
  return Status();
}

namespace {
AttentionArgs AttentionArgsOf(const AttentionOp& op) {
  AttentionArgs a;
  a.q = op.q;
  a.q_rs = op.q_rs;
  a.k = op.k;
  a.k_rs = op.k_rs;
  a.v = op.v;
  a.v_rs = op.v_rs;
  a.z = op.z;
  a.seq_start = op.seq_start;
  a.num_seqs = op.num_seqs;
  a.q_heads = op.q_heads;
  a.kv_heads = op.kv_heads;
  a.head_dim = op.head_dim;
  a.v_head_dim = op.v_head_dim;
  a.scale = op.scale;
  a.softcap = op.softcap;
  a.window = op.window;
  a.sinks = op.sinks;
  a.sinks_dtype = op.sinks_dtype;
  a.alibi_slopes = op.alibi_slopes;
  a.probs = op.probs;
  a.probs_seq = op.probs_seq;
  return a;
}
}  // namespace

Status CpuBackend::Attention(const AttentionOp& op) {
  if (op.sinks != nullptr && op.sinks_dtype != DType::kF32 &&
      op.sinks_dtype != DType::kBF16 && op.sinks_dtype != DType::kF16)
    return InvalidArgumentError(
        std::string("cpu backend: attention sinks of dtype ") +
        std::string(DTypeName(op.sinks_dtype)) + ", expected F32, BF16 or F16");
  AttentionArgs a = AttentionArgsOf(op);
  a.workspace = op.workspace;
  if (op.k_cache != nullptr) {
    if (op.v_cache == nullptr || op.kv_slot == nullptr ||
        op.q_pos0 == nullptr || op.kv_capacity <= 0)
      return InvalidArgumentError(
          "cpu backend: kv attention needs v_cache, kv_slot, q_pos0 and a "
          "positive kv_capacity");
    if (op.probs != nullptr)
      return UnimplementedError(
          "cpu backend: attention probabilities with a KV cache");
    for (int64_t s = 0; s < op.num_seqs; ++s) {
      const int64_t end = op.q_pos0[s] + op.seq_start[s + 1] - op.seq_start[s];
      const bool ring = op.window > 0 && op.window <= op.kv_capacity;
      if (op.q_pos0[s] < 0 ||
          (end > op.kv_capacity && (!ring || op.kv_page_size > 0)))
        return OutOfRangeError("cpu backend: kv attention of sequence " +
                               std::to_string(s) + " reaches position " +
                               std::to_string(end) + " of a cache of " +
                               std::to_string(op.kv_capacity) + " positions");
    }
    if (op.kv_page_size > 0) {
      if (op.kv_page_table == nullptr || op.kv_pages_per_seq <= 0 ||
          op.kv_num_pages <= 0 ||
          op.kv_capacity > op.kv_pages_per_seq * op.kv_page_size)
        return InvalidArgumentError(
            "cpu backend: paged kv attention needs a page table of "
            "kv_pages_per_seq >= kv_capacity / kv_page_size pages per "
            "sequence and kv_num_pages > 0");
      for (int64_t s = 0; s < op.num_seqs; ++s) {
        const int64_t end =
            op.q_pos0[s] + op.seq_start[s + 1] - op.seq_start[s];
        const int64_t pages = (end + op.kv_page_size - 1) / op.kv_page_size;
        for (int64_t i = 0; i < pages; ++i) {
          const int32_t page = op.kv_page_table[s * op.kv_pages_per_seq + i];
          if (page < 0 || page >= op.kv_num_pages)
            return OutOfRangeError(
                "cpu backend: kv attention of sequence " + std::to_string(s) +
                " reaches position " + std::to_string(end) + " but entry " +
                std::to_string(i) + " of its page table is " +
                std::to_string(page) + ", not a page of [0, " +
                std::to_string(op.kv_num_pages) + ")");
        }
      }
      a.kv_page_table = op.kv_page_table;
      a.kv_pages_per_seq = op.kv_pages_per_seq;
      a.kv_page_size = op.kv_page_size;
    }
    a.k_cache = op.k_cache;
    a.v_cache = op.v_cache;
    a.kv_capacity = op.kv_capacity;
    a.kv_slot = op.kv_slot;
    a.q_pos0 = op.q_pos0;
  }
  cpu::Attention(*gemm_, a);
  return Status();
}

void CpuBackend::Activation(ActivationFn fn, float* x, int64_t n) {
  cpu::ApplyActivation(ToCpu(fn), x, n);
}

void CpuBackend::GatedActivation(ActivationFn fn, const float* gate,
                                 int64_t gate_rs, const float* up,
                                 int64_t up_rs, float* out, int64_t rows,
                                 int64_t n) {
  cpu::GatedActivation(ToCpu(fn), gate, gate_rs, up, up_rs, out, rows, n);
}

void CpuBackend::Add(const float* x, float* y, int64_t n) { cpu::Add(x, y, n); }
void CpuBackend::Scale(float* x, int64_t n, float s) { cpu::Scale(x, n, s); }
void CpuBackend::Softcap(float* x, int64_t n, float cap) {
  cpu::Softcap(x, n, cap);
}
void CpuBackend::Clamp(float* x, int64_t rows, int64_t cols, int64_t ld,
                       float lo, float hi) {
  cpu::Clamp(x, rows, cols, ld, lo, hi);
}
void CpuBackend::RoundToBf16(float* x, int64_t rows, int64_t cols, int64_t ld) {
  cpu::RoundToBf16(x, rows, cols, ld);
}

void CpuBackend::Gather(const void* table, DType table_dtype,
                        const int32_t* ids, int64_t tokens, int64_t dim,
                        float* out) {
  cpu::Gather(table, table_dtype, ids, tokens, dim, out);
}

void CpuBackend::StridedCopy(const float* x, int64_t ldx, int64_t gsx,
                             int64_t isx, float* y, int64_t ldy, int64_t gsy,
                             int64_t isy, int64_t rows, int64_t groups,
                             int64_t n) {
  cpu::StridedCopy(x, ldx, gsx, isx, y, ldy, gsy, isy, rows, groups, n);
}

void CpuBackend::DeinterleaveBlocks(const float* x, int64_t ldx, int64_t rows,
                                    int64_t groups, int64_t parts,
                                    int64_t width, float* y, int64_t ldy) {
  cpu::DeinterleaveBlocks(x, ldx, rows, groups, parts, width, y, ldy);
}

void CpuBackend::GatherRows(const float* x, int64_t ldx, const int32_t* rows,
                            int64_t n, int64_t cols, float* out) {
  cpu::GatherRows(x, ldx, rows, n, cols, out);
}

void CpuBackend::ScatterAddRows(const float* x, const int32_t* rows,
                                const float* weights, int64_t n, int64_t cols,
                                float* y, int64_t ldy) {
  cpu::ScatterAddRows(x, rows, weights, n, cols, y, ldy);
}

Status CpuBackend::TopKRoute(const float* logits, int64_t tokens,
                             int64_t experts, int64_t ld, int64_t k,
                             const RouteOp& op, int32_t* ids, float* weights) {
  RETURN_IF_ERROR(CheckRouteOp(op, experts, k));
  if (experts > cpu::kMaxRouteColumns)
    return InvalidArgumentError(
        "cpu TopKRoute: experts = " + std::to_string(experts) +
        ", expected <= " + std::to_string(cpu::kMaxRouteColumns));
  if (op.kind == RouterKind::kSigmoidGroupTopK) {
    std::vector<float> bias;  // [experts] f32
    if (op.correction_bias != nullptr) {
      bias.resize(static_cast<size_t>(experts));
      cpu::ConvertToF32(op.correction_bias, op.correction_bias_dtype,
                        bias.data(), experts);
    }
    cpu::SigmoidGroupTopKRoute(
        logits, tokens, experts, ld, k, bias.empty() ? nullptr : bias.data(),
        op.groups, op.keep_groups, op.renormalize, op.scale, ids, weights);
    return Status();
  }
  cpu::TopKRoute(logits, tokens, experts, ld, k,
                 op.kind == RouterKind::kSoftmaxTopK
                     ? cpu::TopKMode::kSoftmaxThenTopK
                     : cpu::TopKMode::kTopKThenSoftmax,
                 op.renormalize, ids, weights);
  if (op.scale != 1.0f) cpu::Scale(weights, tokens * k, op.scale);
  return Status();
}

void CpuBackend::ClampedSwiglu(const float* gate_up, int64_t gu_rs, float* out,
                               int64_t rows, int64_t n, float alpha,
                               float limit) {
  cpu::ClampedSwiglu(gate_up, gu_rs, out, rows, n, alpha, limit);
}

void CpuBackend::SigmoidGateAddRows(const float* x, const float* gate_logit,
                                    int64_t rows, int64_t cols, float* y,
                                    int64_t ldy) {
  cpu::SigmoidGateAddRows(x, gate_logit, rows, cols, y, ldy);
}

void CpuBackend::SetZero(float* x, int64_t n) { cpu::SetZero(x, n); }

namespace {

// The arguments every row edit shares, checked before any kernel runs.
Status CheckRowEdit(std::string_view op, int64_t rows, int64_t cols, int64_t ld,
                    int64_t n) {
  if (rows < 0 || cols < 0 || ld < cols || n < 0)
    return InvalidArgumentError(
        std::string(op) + ": bad shape (rows " + std::to_string(rows) +
        ", cols " + std::to_string(cols) + ", ld " + std::to_string(ld) +
        ", n " + std::to_string(n) + ")");
  return Status();
}

// The error of a kernel's bad-index answer `bad` (-1 = none; i < n: idx[i]
// is not strictly increasing inside [0, rows); n + i: src_idx[i] is outside
// [0, src_rows)).
Status RowIndexError(std::string_view op, int64_t bad, const int32_t* idx,
                     int64_t n, int64_t rows, const int32_t* src_idx = nullptr,
                     int64_t src_rows = 0) {
  if (bad < 0) return Status();
  if (bad >= n)
    return InvalidArgumentError(
        std::string(op) + ": source row index src_idx[" +
        std::to_string(bad - n) + "] = " + std::to_string(src_idx[bad - n]) +
        " is outside [0, " + std::to_string(src_rows) + ")");
  std::string why = " is outside [0, " + std::to_string(rows) + ")";
  if (idx[bad] >= 0 && idx[bad] < rows)
    why = " is not above the previous index " + std::to_string(idx[bad - 1]) +
          " (indices must be strictly increasing)";
  return InvalidArgumentError(std::string(op) + ": row index idx[" +
                              std::to_string(bad) +
                              "] = " + std::to_string(idx[bad]) + why);
}

}  // namespace

int64_t CpuBackend::SaeWorkspaceBytes(const Sae& sae, int64_t rows) const {
  return cpu::SaeWorkspaceBytes(sae, rows);
}

Status CpuBackend::RunSae(const Sae& sae, const float* x,
                          const float* reference, int64_t rows, void* workspace,
                          const SaeOutputs& out) {
  if (rows < 0 || out.topk < 0 || out.topk > sae.d_sae)
    return InvalidArgumentError("RunSae: rows " + std::to_string(rows) +
                                ", topk " + std::to_string(out.topk) +
                                " (d_sae " + std::to_string(sae.d_sae) + ")");
  cpu::RunSae(sae, x, reference, rows, workspace, out);
  return Status();
}

Status CpuBackend::AddRowsBroadcast(float* x, int64_t rows, int64_t cols,
                                    int64_t ld, const int32_t* idx, int64_t n,
                                    const float* v, float scale,
                                    bool norm_match) {
  RETURN_IF_ERROR(CheckRowEdit("AddRowsBroadcast", rows, cols, ld, n));
  return RowIndexError(
      "AddRowsBroadcast",
      cpu::AddRowsBroadcast(x, rows, cols, ld, idx, n, v, scale, norm_match),
      idx, n, rows);
}

Status CpuBackend::ProjectOutRows(float* x, int64_t rows, int64_t cols,
                                  int64_t ld, const int32_t* idx, int64_t n,
                                  const float* u) {
  RETURN_IF_ERROR(CheckRowEdit("ProjectOutRows", rows, cols, ld, n));
  return RowIndexError("ProjectOutRows",
                       cpu::ProjectOutRows(x, rows, cols, ld, idx, n, u), idx,
                       n, rows);
}

Status CpuBackend::SetRows(float* x, int64_t rows, int64_t cols, int64_t ld,
                           const int32_t* idx, int64_t n, int64_t col_begin,
                           int64_t col_end, const float* src,
                           int64_t src_rows) {
  RETURN_IF_ERROR(CheckRowEdit("SetRows", rows, cols, ld, n));
  if (col_begin < 0 || col_begin > col_end || col_end > cols)
    return InvalidArgumentError(
        "SetRows: column range [" + std::to_string(col_begin) + ", " +
        std::to_string(col_end) + ") is not inside [0, " +
        std::to_string(cols) + ")");
  if (src_rows != 1 && src_rows != n)
    return InvalidArgumentError(
        "SetRows: src has " + std::to_string(src_rows) +
        " rows; it needs 1 (broadcast) or n = " + std::to_string(n));
  return RowIndexError("SetRows",
                       cpu::SetRows(x, rows, cols, ld, idx, n, col_begin,
                                    col_end, src, src_rows),
                       idx, n, rows);
}

Status CpuBackend::CopyRows(float* x, int64_t rows, int64_t cols, int64_t ld,
                            const int32_t* dst_idx, int64_t n, const float* src,
                            int64_t src_rows, int64_t ld_src,
                            const int32_t* src_idx) {
  RETURN_IF_ERROR(CheckRowEdit("CopyRows", rows, cols, ld, n));
  if (src_rows < 0 || ld_src < cols)
    return InvalidArgumentError("CopyRows: bad source shape (src_rows " +
                                std::to_string(src_rows) + ", ld_src " +
                                std::to_string(ld_src) + ", cols " +
                                std::to_string(cols) + ")");
  return RowIndexError("CopyRows",
                       cpu::CopyRows(x, rows, cols, ld, dst_idx, n, src,
                                     src_rows, ld_src, src_idx),
                       dst_idx, n, rows, src_idx, src_rows);
}

Status CpuBackend::GroupByExpert(const int32_t* ids, const float* weights,
                                 int64_t tokens, int64_t k, int64_t experts,
                                 int32_t* offsets, int32_t* rows,
                                 float* row_weights, int32_t* host_offsets) {
  const int64_t bad = cpu::GroupByExpert(ids, weights, tokens, k, experts,
                                         offsets, rows, row_weights);
  if (bad >= 0)
    return InternalError("router chose expert " + std::to_string(ids[bad]) +
                         " of " + std::to_string(experts) + " (token " +
                         std::to_string(bad / k) + ", slot " +
                         std::to_string(bad % k) + ")");
  if (host_offsets != offsets)
    std::copy(offsets, offsets + experts + 1, host_offsets);
  return Status();
}

void CpuBackend::ConvertFromF32(const float* src, void* dst, DType dtype,
                                int64_t n) {
  cpu::ConvertFromF32(src, dst, dtype, n);
}

void CpuBackend::ConvertToF32(const void* src, DType dtype, float* dst,
                              int64_t n) {
  cpu::ConvertToF32(src, dtype, dst, n);
}

void CpuBackend::LogSumExp(const float* logits, int64_t rows, int64_t vocab,
                           double* lse) {
  cpu::LogSumExp(logits, rows, vocab, lse);
}

void CpuBackend::TargetLogProbs(const float* logits, int64_t rows,
                                int64_t vocab, const int32_t* targets,
                                double* logprob) {
  cpu::LogSumExp(logits, rows, vocab, logprob);
  for (int64_t r = 0; r < rows; ++r)
    logprob[r] =
        static_cast<double>(logits[r * vocab + targets[r]]) - logprob[r];
}

void CpuBackend::GatherRowsConvert(const float* src, int64_t ld,
                                   const int32_t* index, int64_t n,
                                   int64_t cols, void* dst, DType dtype) {
  cpu::GatherRowsConvert(src, ld, index, n, cols, dst, dtype);
}

void CpuBackend::SegmentReduce(const float* src, int64_t ld,
                               const int32_t* begin, const int32_t* end,
                               int64_t segments, int64_t cols, bool max,
                               bool accumulate, double* out) {
  cpu::SegmentReduce(src, ld, begin, end, segments, cols, max, accumulate, out);
}

// ---- Backward ----

namespace {

WeightRows WeightRowsOf(const WeightOperand& w, QuantMatrix* q) {
  WeightRows r;
  r.data = w.data;
  r.dtype = w.format.dtype;
  r.n = w.n;
  r.k = w.k;
  r.in_out = w.format.layout == MatrixLayout::kInOut;
  r.panels = w.format.layout == MatrixLayout::kPanels;
  r.strips = w.format.layout == MatrixLayout::kStrips;
  if (w.quantized()) {
    *q = QuantMatrixOf(w);
    r.quant = q;
  }
  return r;
}

}  // namespace

int64_t CpuBackend::GemmBackwardWorkspaceBytes(const WeightOperand& w,
                                               int64_t m) const {
  return cpu::GemmBackwardWorkspaceBytes(m, w.n, w.k);
}

Status CpuBackend::GemmBackwardInput(const GemmBackwardOp& op) {
  if (op.w.quantized() && op.w.format.layout != MatrixLayout::kOutIn)
    return InvalidArgumentError(
        "cpu backend: GemmBackwardInput of a quantized "
        "weight stored other than [n, k]");
  if (op.workspace == nullptr)
    return InvalidArgumentError(
        "cpu backend: GemmBackwardInput needs its "
        "workspace");
  QuantMatrix q;
  const WeightRows w = WeightRowsOf(op.w, &q);
  cpu::GemmBackwardInput(*gemm_, w, op.dy, op.ldy > 0 ? op.ldy : op.w.n, op.m,
                         op.dx, op.ldx > 0 ? op.ldx : op.w.k, op.accumulate,
                         op.workspace);
  return Status();
}

Status CpuBackend::NormBackward(const NormBackwardOp& op) {
  if (op.dx == op.x)
    return InvalidArgumentError("cpu backend: NormBackward's dx aliases x");
  cpu::NormBackward(op.x, op.dy, op.dx, op.rows, op.dim, op.w, op.w_dtype,
                    op.offset, op.eps, op.layer_norm, op.freeze_scale,
                    op.accumulate);
  return Status();
}

int64_t CpuBackend::AttentionBackwardWorkspaceBytes(
    const AttentionOp& op) const {
  int64_t len = op.max_seq_len;
  if (len <= 0 && op.seq_start != nullptr)
    for (int64_t s = 0; s < op.num_seqs; ++s)
      len = std::max(len, op.seq_start[s + 1] - op.seq_start[s]);
  return cpu::AttentionBackwardWorkspaceBytes(len, NumThreads());
}

Status CpuBackend::AttentionBackward(const AttentionBackwardOp& op) {
  const AttentionOp& f = op.fwd;
  if (f.k_cache != nullptr || f.probs != nullptr)
    return InvalidArgumentError(
        "cpu backend: AttentionBackward runs on the "
        "whole sequences (no KV cache, no probs)");
  if (f.q_heads % f.kv_heads != 0)
    return InvalidArgumentError(
        "cpu backend: AttentionBackward: q heads " + std::to_string(f.q_heads) +
        " not a multiple of kv heads " + std::to_string(f.kv_heads));
  cpu::AttentionBackward(AttentionArgsOf(f), op.dz, op.dq, op.dk, op.dv,
                         op.freeze_pattern, op.workspace);
  return Status();
}

Status CpuBackend::ActivationBackward(ActivationFn fn, const float* x,
                                      const float* dy, float* dx, int64_t n) {
  cpu::ActivationBackward(ToCpu(fn), x, dy, dx, n);
  return Status();
}

Status CpuBackend::ClampedSwigluBackward(const float* gate_up, int64_t gu_rs,
                                         const float* dout, float* dgate_up,
                                         int64_t dgu_rs, int64_t rows,
                                         int64_t n, float alpha, float limit) {
  cpu::ClampedSwigluBackward(gate_up, gu_rs, dout, dgate_up, dgu_rs, rows, n,
                             alpha, limit);
  return Status();
}

Status CpuBackend::GatedActivationBackward(ActivationFn fn, const float* gate,
                                           int64_t gate_rs, const float* up,
                                           int64_t up_rs, const float* dout,
                                           float* dgate, int64_t dg_rs,
                                           float* dup, int64_t du_rs,
                                           int64_t rows, int64_t n) {
  cpu::GatedActivationBackward(ToCpu(fn), gate, gate_rs, up, up_rs, dout, dgate,
                               dg_rs, dup, du_rs, rows, n);
  return Status();
}

}  // namespace loom::cpu
