#include "src/backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "src/backend/cuda/gemm.h"
#include "src/backend/cuda/kernels.h"
#include "src/base/check.h"
#include "src/base/units.h"

namespace loom::cuda {
namespace {

static_assert(static_cast<int>(ActivationFn::kSilu) ==
              static_cast<int>(Act::kSilu));
static_assert(static_cast<int>(ActivationFn::kGeluTanh) ==
              static_cast<int>(Act::kGeluTanh));
static_assert(static_cast<int>(ActivationFn::kGeluExact) ==
              static_cast<int>(Act::kGeluExact));
static_assert(static_cast<int>(ActivationFn::kRelu) ==
              static_cast<int>(Act::kRelu));
static_assert(static_cast<int>(ActivationFn::kReluSquared) ==
              static_cast<int>(Act::kReluSquared));

Act ToAct(ActivationFn fn) { return static_cast<Act>(static_cast<int>(fn)); }

std::string CudaMessage(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

cudaMemcpyKind KindOf(DeviceRef dst, DeviceRef src) {
  const bool d = dst.kind == DeviceKind::kCuda,
             s = src.kind == DeviceKind::kCuda;
  if (d && s) return cudaMemcpyDeviceToDevice;
  if (d) return cudaMemcpyHostToDevice;
  if (s) return cudaMemcpyDeviceToHost;
  return cudaMemcpyHostToHost;
}

}  // namespace

std::vector<GpuInfo> ListGpus(std::string* reason) {
  std::vector<GpuInfo> gpus;
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (reason) *reason = CudaMessage(e);
    cudaGetLastError();  // clear
    return gpus;
  }
  if (n == 0 && reason) *reason = "no CUDA device is visible";
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    GpuInfo g;
    g.index = i;
    g.name = p.name;
    g.major = p.major;
    g.minor = p.minor;
    g.total_bytes = static_cast<int64_t>(p.totalGlobalMem);
    g.multiprocessors = p.multiProcessorCount;
    g.bf16 = p.major >= 8;
    size_t free = 0, total = 0;
    int prev = 0;
    cudaGetDevice(&prev);
    if (cudaSetDevice(i) == cudaSuccess &&
        cudaMemGetInfo(&free, &total) == cudaSuccess)
      g.free_bytes = static_cast<int64_t>(free);
    cudaSetDevice(prev);
    gpus.push_back(g);
  }
  return gpus;
}

CudaBackend::CudaBackend(int device)
    : device_(device), name_("cuda:" + std::to_string(device)) {}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    gemm_.reset();
    scratch_device_ = Buffer();
    scratch_host_ = Buffer();
    if (issued_ != nullptr) cudaEventDestroy(issued_);
    cudaStreamDestroy(stream_);
  }
}

StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device) {
  std::unique_ptr<CudaBackend> b(new CudaBackend(device));
  RETURN_IF_ERROR(b->Init());
  return b;
}

StatusOr<std::unique_ptr<Backend>> CudaBackend::NewInstance() const {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> b, Create(device_));
  return std::unique_ptr<Backend>(std::move(b));
}

Status CudaBackend::Init() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess)
    return FailedPreconditionError("cuda: no usable driver or device (" +
                                   CudaMessage(e) + ")");
  if (device_ < 0 || device_ >= n)
    return NotFoundError("cuda: no device " + std::to_string(device_) +
                         " (this machine has " + std::to_string(n) + ")");
  if ((e = cudaSetDevice(device_)) != cudaSuccess)
    return FailedPreconditionError(name_ + ": " + CudaMessage(e));
  cudaDeviceProp p{};
  if ((e = cudaGetDeviceProperties(&p, device_)) != cudaSuccess)
    return FailedPreconditionError(name_ + ": " + CudaMessage(e));
  capability_ = p.major * 10 + p.minor;
  if (capability_ < 80)
    return FailedPreconditionError(
        name_ + " (" + p.name + ") has compute capability " +
        std::to_string(p.major) + "." + std::to_string(p.minor) +
        "; this build targets 8.0 and later (sm_80, sm_90)");
  if ((e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)) !=
      cudaSuccess)
    return FailedPreconditionError(name_ + ": " + CudaMessage(e));
  if ((e = cudaEventCreateWithFlags(&issued_, cudaEventDisableTiming)) !=
      cudaSuccess)
    return FailedPreconditionError(name_ + ": event: " + CudaMessage(e));
  ASSIGN_OR_RETURN(gemm_, GemmRunner::Create());
  ASSIGN_OR_RETURN(scratch_device_, Allocate(kScratch, MemoryKind::kDevice));
  ASSIGN_OR_RETURN(scratch_host_, Allocate(kScratch, MemoryKind::kPinnedHost));
  return Status();
}

BackendCapabilities CudaBackend::Capabilities() const {
  BackendCapabilities c;
  c.compute_dtypes = {DType::kF32, DType::kBF16, DType::kF16};
  c.weight_formats = StandardWeightFormats();
  c.attention_sinks = true;
  c.async_copy = true;
  c.max_route_experts = 1024;
  return c;
}

KernelCosts CudaBackend::Costs() const { return CudaKernelCosts(); }

int CudaBackend::SetNumThreads(int /*n*/) { return 1; }

void CudaBackend::Fail(const char* op, const std::string& message) {
  if (error_.ok()) error_ = InternalError(name_ + ": " + op + ": " + message);
}

void CudaBackend::Check(const char* op) {
  const cudaError_t e = cudaPeekAtLastError();
  if (e != cudaSuccess) {
    cudaGetLastError();
    Fail(op, CudaMessage(e));
  }
}

// ---- Memory ----------------------------------------------------------------

StatusOr<Buffer> CudaBackend::Allocate(int64_t bytes, MemoryKind kind) {
  if (bytes < 0)
    return InvalidArgumentError(name_ + ": cannot allocate " +
                                std::to_string(bytes) + " bytes");
  const int64_t n = AlignUp(std::max<int64_t>(bytes, 64), 256);
  cudaSetDevice(device_);
  void* p = nullptr;
  cudaError_t e = cudaSuccess;
  Buffer b;
  b.bytes = n;
  b.kind = kind;
  switch (kind) {
    case MemoryKind::kDevice: {
      e = cudaMalloc(&p, static_cast<size_t>(n));
      if (e == cudaSuccess) e = cudaMemset(p, 0, static_cast<size_t>(n));
      const int dev = device_;
      b.memory = std::shared_ptr<void>(p, [dev](void* q) {
        cudaSetDevice(dev);
        cudaFree(q);
      });
      b.device = device();
      break;
    }
    case MemoryKind::kPinnedHost:
      e = cudaHostAlloc(&p, static_cast<size_t>(n),
                        cudaHostAllocMapped | cudaHostAllocPortable);
      if (e == cudaSuccess) std::memset(p, 0, static_cast<size_t>(n));
      b.memory = std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
      break;
    case MemoryKind::kHost:
      p = std::aligned_alloc(64, static_cast<size_t>(n));
      if (p == nullptr)
        return ResourceExhaustedError(name_ + ": cannot allocate " +
                                      FormatBytes(n) + " of host memory");
      std::memset(p, 0, static_cast<size_t>(n));
      b.memory = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
      break;
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (p != nullptr) b.memory.reset();
    return ResourceExhaustedError(
        name_ + ": cannot allocate " + FormatBytes(n) +
        (kind == MemoryKind::kDevice ? " of device memory (" : " pinned (") +
        CudaMessage(e) + ")");
  }
  return b;
}

Status CudaBackend::CopyAsync(void* dst, DeviceRef dst_device, const void* src,
                              DeviceRef src_device, int64_t bytes) {
  if (bytes == 0) return Status();
  cudaSetDevice(device_);
  cudaError_t e;
  if (dst_device.kind == DeviceKind::kCuda &&
      src_device.kind == DeviceKind::kCuda &&
      dst_device.index != src_device.index)
    e = cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index,
                            static_cast<size_t>(bytes), stream_);
  else
    e = cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                        KindOf(dst_device, src_device), stream_);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return InternalError(name_ + ": copy of " + FormatBytes(bytes) + ": " +
                         CudaMessage(e));
  }
  return Status();
}

Status CudaBackend::Copy(void* dst, DeviceRef dst_device, const void* src,
                         DeviceRef src_device, int64_t bytes) {
  RETURN_IF_ERROR(CopyAsync(dst, dst_device, src, src_device, bytes));
  return Synchronize();
}

Status CudaBackend::Synchronize() {
  cudaSetDevice(device_);
  const cudaError_t e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess) {
    cudaGetLastError();
    Fail("synchronize", CudaMessage(e));
  }
  Check("synchronize");
  Status s = error_;
  return s;
}

Status CudaBackend::WaitFor(Backend& other) {
  if (&other == this) return Status();
  auto* o = dynamic_cast<CudaBackend*>(&other);
  if (o == nullptr) {
    // A host backend has finished everything it was given when it returned.
    if (other.device().kind == DeviceKind::kCpu) return Status();
    return InvalidArgumentError(name_ + ": cannot wait for backend '" +
                                std::string(other.name()) + "'");
  }
  cudaSetDevice(o->device_);
  cudaError_t e = cudaEventRecord(o->issued_, o->stream_);
  if (e == cudaSuccess) {
    cudaSetDevice(device_);
    e = cudaStreamWaitEvent(stream_, o->issued_, 0);
  } else {
    cudaSetDevice(device_);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    return InternalError(name_ + ": wait for " + o->name_ + ": " +
                         CudaMessage(e));
  }
  return Status();
}

// ---- GEMM ------------------------------------------------------------------

void CudaBackend::SetGemmScratchpad(void* scratch, int64_t bytes) {
  gemm_->SetWorkspace(scratch, bytes);
}

void CudaBackend::SetWeightDecodeWorkspace(void* workspace, int64_t bytes) {
  gemm_->SetDecodeWorkspace(workspace, bytes);
}

void CudaBackend::Gemm(const GemmOp& op) {
  const Status s = gemm_->Run(op, stream_);
  if (!s.ok()) Fail("gemm", s.message());
  Check("gemm");
}

// ---- Norms, RoPE ------------------------------------------------------------

void CudaBackend::RmsNorm(const float* x, const void* w, DType w_dtype,
                          float offset, float eps, float* y, int64_t rows,
                          int64_t dim) {
  cuda::RmsNorm(x, w, w_dtype, offset, eps, y, rows, dim, stream_);
  Check("rms norm");
}

void CudaBackend::RmsNormBf16(const float* x, const void* w, float eps,
                              float* y, int64_t rows, int64_t dim) {
  cuda::RmsNormBf16(x, w, eps, y, rows, dim, stream_);
  Check("rms norm (bf16)");
}

void CudaBackend::RmsNormRows(float* x, int64_t tokens, int64_t ld,
                              int64_t groups, int64_t dim, const void* w,
                              DType w_dtype, float offset, float eps) {
  cuda::RmsNormRows(x, tokens, ld, groups, dim, w, w_dtype, offset, eps,
                    stream_);
  Check("rms norm rows");
}

void CudaBackend::LayerNormRows(float* x, int64_t tokens, int64_t ld,
                                int64_t groups, int64_t dim, const void* w,
                                const void* b, DType w_dtype, float eps) {
  cuda::LayerNormRows(x, tokens, ld, groups, dim, w, b, w_dtype, eps, stream_);
  Check("layer norm rows");
}

void CudaBackend::LayerNorm(const float* x, const void* w, const void* b,
                            DType w_dtype, float offset, float eps, float* y,
                            int64_t rows, int64_t dim) {
  cuda::LayerNorm(x, w, b, w_dtype, offset, eps, y, rows, dim, stream_);
  Check("layer norm");
}

void CudaBackend::RopeTables(const int32_t* positions, int64_t tokens,
                             const float* inv_freq, int64_t half,
                             float attention_scaling, float* cos, float* sin) {
  cuda::RopeTables(positions, tokens, inv_freq, half, attention_scaling, cos,
                   sin, stream_);
  Check("rope tables");
}

void CudaBackend::ApplyRope(float* x, int64_t tokens, int64_t heads,
                            int64_t head_dim, int64_t row_stride,
                            const float* cos, const float* sin, int64_t half) {
  cuda::ApplyRope(x, tokens, heads, head_dim, row_stride, cos, sin, half,
                  stream_);
  Check("rope");
}

// ---- Attention --------------------------------------------------------------

Status CudaBackend::Attention(const AttentionOp& op) {
  if (op.alibi_slopes != nullptr)
    return UnimplementedError(
        "cuda backend: ALiBi attention (BLOOM) is not implemented on cuda "
        "yet");
  if (op.k_cache != nullptr)
    return UnimplementedError(
        "cuda backend: attention over a KV cache (generation) is not "
        "implemented on cuda yet");
  if (op.seq_start_device == nullptr)
    return InvalidArgumentError(name_ +
                                ": attention needs the sequence offsets in "
                                "device memory (seq_start_device)");
  if (op.v_head_dim > 0 && op.v_head_dim != op.head_dim)
    return UnimplementedError(
        name_ + ": attention with v heads of " + std::to_string(op.v_head_dim) +
        " and q/k heads of " + std::to_string(op.head_dim) +
        " (multi-head latent attention) is not implemented on cuda yet");
  if (!AttentionSupportsHeadDim(op.head_dim))
    return UnimplementedError(name_ + ": attention with head_dim " +
                              std::to_string(op.head_dim) +
                              " (the kernels take head dims 1 to 256)");
  AttentionArgs a;
  a.q = op.q;
  a.q_rs = op.q_rs;
  a.k = op.k;
  a.k_rs = op.k_rs;
  a.v = op.v;
  a.v_rs = op.v_rs;
  a.z = op.z;
  a.seq_start = op.seq_start_device;
  a.num_seqs = op.num_seqs;
  a.total_tokens = op.seq_start[op.num_seqs] - op.seq_start[0];
  a.max_seq_len = op.max_seq_len;
  if (a.max_seq_len <= 0)
    for (int64_t s = 0; s < op.num_seqs; ++s)
      a.max_seq_len =
          std::max(a.max_seq_len, op.seq_start[s + 1] - op.seq_start[s]);
  a.q_heads = op.q_heads;
  a.kv_heads = op.kv_heads;
  a.head_dim = op.head_dim;
  a.scale = op.scale;
  a.softcap = op.softcap;
  a.window = op.window;
  a.sinks = op.sinks;
  a.sinks_dtype = op.sinks_dtype;
  a.compute = op.compute;
  if (op.probs != nullptr) {
    if (op.num_seqs != 1 || op.probs_seq != 0)
      return InvalidArgumentError(
          name_ +
          ": attention probabilities are written for one sequence "
          "at a time");
    a.probs = op.probs;
    a.compute = DType::kF32;
  }
  a.workspace = op.workspace;
  cuda::Attention(a, stream_);
  Check("attention");
  return Status();
}

// ---- Elementwise ------------------------------------------------------------

void CudaBackend::Activation(ActivationFn fn, float* x, int64_t n) {
  cuda::Activation(ToAct(fn), x, n, stream_);
  Check("activation");
}

void CudaBackend::GatedActivation(ActivationFn fn, const float* gate,
                                  int64_t gate_rs, const float* up,
                                  int64_t up_rs, float* out, int64_t rows,
                                  int64_t n) {
  cuda::GatedActivation(ToAct(fn), gate, gate_rs, up, up_rs, out, rows, n,
                        stream_);
  Check("gated activation");
}

void CudaBackend::Add(const float* x, float* y, int64_t n) {
  cuda::Add(x, y, n, stream_);
  Check("add");
}

void CudaBackend::Scale(float* x, int64_t n, float s) {
  cuda::Scale(x, n, s, stream_);
  Check("scale");
}

void CudaBackend::Softcap(float* x, int64_t n, float cap) {
  cuda::Softcap(x, n, cap, stream_);
  Check("softcap");
}

void CudaBackend::Clamp(float* x, int64_t rows, int64_t cols, int64_t ld,
                        float lo, float hi) {
  cuda::Clamp(x, rows, cols, ld, lo, hi, stream_);
  Check("clamp");
}

void CudaBackend::RoundToBf16(float* x, int64_t rows, int64_t cols,
                              int64_t ld) {
  cuda::RoundToBf16(x, rows, cols, ld, stream_);
  Check("round to bf16");
}

void CudaBackend::Gather(const void* table, DType table_dtype,
                         const int32_t* ids, int64_t tokens, int64_t dim,
                         float* out) {
  // ids arrive in host memory (the batch): staged through the scratch.
  const int64_t bytes = tokens * int64_t{sizeof(int32_t)};
  if (bytes > kScratch) {
    Fail("gather", "batch of " + std::to_string(tokens) +
                       " token ids exceeds the staging scratch");
    return;
  }
  cudaPointerAttributes attr{};
  const bool on_device = cudaPointerGetAttributes(&attr, ids) == cudaSuccess &&
                         attr.type == cudaMemoryTypeDevice;
  cudaGetLastError();
  const int32_t* dev_ids = ids;
  if (!on_device) {
    // The previous user of the scratch must be done before it is rewritten.
    cudaStreamSynchronize(stream_);
    std::memcpy(scratch_host_.data(), ids, static_cast<size_t>(bytes));
    cudaMemcpyAsync(scratch_device_.data(), scratch_host_.data(),
                    static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                    stream_);
    dev_ids = static_cast<const int32_t*>(scratch_device_.data());
  }
  cuda::Gather(table, table_dtype, dev_ids, tokens, dim, out, stream_);
  Check("gather");
}

void CudaBackend::StridedCopy(const float* x, int64_t ldx, int64_t gsx,
                              int64_t isx, float* y, int64_t ldy, int64_t gsy,
                              int64_t isy, int64_t rows, int64_t groups,
                              int64_t n) {
  cuda::StridedCopy(x, ldx, gsx, isx, y, ldy, gsy, isy, rows, groups, n,
                    stream_);
  Check("strided copy");
}

void CudaBackend::DeinterleaveBlocks(const float* x, int64_t ldx, int64_t rows,
                                     int64_t groups, int64_t parts,
                                     int64_t width, float* y, int64_t ldy) {
  cuda::DeinterleaveBlocks(x, ldx, rows, groups, parts, width, y, ldy, stream_);
  Check("deinterleave blocks");
}

void CudaBackend::GatherRows(const float* x, int64_t ldx, const int32_t* rows,
                             int64_t n, int64_t cols, float* out) {
  cuda::GatherRows(x, ldx, rows, n, cols, out, stream_);
  Check("gather rows");
}

void CudaBackend::ScatterAddRows(const float* x, const int32_t* rows,
                                 const float* weights, int64_t n, int64_t cols,
                                 float* y, int64_t ldy) {
  cuda::ScatterAddRows(x, rows, weights, n, cols, y, ldy, stream_);
  Check("scatter-add rows");
}

Status CudaBackend::TopKRoute(const float* logits, int64_t tokens,
                              int64_t experts, int64_t ld, int64_t k,
                              const RouteOp& op, int32_t* ids, float* weights) {
  RETURN_IF_ERROR(CheckRouteOp(op, experts, k));
  if (op.kind == RouterKind::kSigmoidGroupTopK)
    return UnimplementedError(
        "cuda TopKRoute: the sigmoid group-limited router "
        "(RouterKind::kSigmoidGroupTopK, DeepSeek-V3) has no CUDA kernel "
        "yet; run this model on the CPU backend");
  cuda::TopKRoute(logits, tokens, experts, ld, k,
                  op.kind == RouterKind::kSoftmaxTopK ? Route::kSoftmaxTopK
                                                      : Route::kTopKSoftmax,
                  op.renormalize, ids, weights, stream_);
  Check("top-k route");
  if (op.scale != 1.0f) Scale(weights, tokens * k, op.scale);
  return Status();
}

void CudaBackend::ClampedSwiglu(const float* gate_up, int64_t gu_rs, float* out,
                                int64_t rows, int64_t n, float alpha,
                                float limit) {
  cuda::ClampedSwiglu(gate_up, gu_rs, out, rows, n, alpha, limit, stream_);
  Check("clamped swiglu");
}

void CudaBackend::SigmoidGateAddRows(const float* x, const float* gate_logit,
                                     int64_t rows, int64_t cols, float* y,
                                     int64_t ldy) {
  cuda::SigmoidGateAddRows(x, gate_logit, rows, cols, y, ldy, stream_);
  Check("sigmoid gate add");
}

void CudaBackend::SetZero(float* x, int64_t n) {
  cuda::SetZero(x, n, stream_);
  Check("set zero");
}

// The row edits of interventions have CPU kernels only so far.
Status CudaBackend::AddRowsBroadcast(float*, int64_t, int64_t, int64_t,
                                     const int32_t*, int64_t, const float*,
                                     float, bool) {
  return UnimplementedError(name_ +
                            ": AddRowsBroadcast (steering row edit) is not "
                            "implemented on cuda yet; use --device cpu");
}

Status CudaBackend::ProjectOutRows(float*, int64_t, int64_t, int64_t,
                                   const int32_t*, int64_t, const float*) {
  return UnimplementedError(name_ +
                            ": ProjectOutRows (directional ablation row edit) "
                            "is not implemented on cuda yet; use --device cpu");
}

Status CudaBackend::SetRows(float*, int64_t, int64_t, int64_t, const int32_t*,
                            int64_t, int64_t, int64_t, const float*, int64_t) {
  return UnimplementedError(name_ +
                            ": SetRows (zero/replace/head ablation row edit) "
                            "is not implemented on cuda yet; use --device cpu");
}

Status CudaBackend::CopyRows(float*, int64_t, int64_t, int64_t, const int32_t*,
                             int64_t, const float*, int64_t, int64_t,
                             const int32_t*) {
  return UnimplementedError(name_ +
                            ": CopyRows (activation patching row edit) is not "
                            "implemented on cuda yet; use --device cpu");
}

Status CudaBackend::GroupByExpert(const int32_t* ids, const float* weights,
                                  int64_t tokens, int64_t k, int64_t experts,
                                  int32_t* offsets, int32_t* rows,
                                  float* row_weights, int32_t* host_offsets) {
  // The scratch holds the bad-id flag, then the offsets' way back.
  const int64_t bytes = (experts + 2) * int64_t{sizeof(int32_t)};
  if (bytes > kScratch)
    return InvalidArgumentError(name_ + ": " + std::to_string(experts) +
                                " experts exceed the routing scratch");
  int32_t* bad = static_cast<int32_t*>(scratch_device_.data());
  cudaMemsetAsync(bad, 0, sizeof(int32_t), stream_);
  cuda::GroupByExpert(ids, weights, tokens, k, experts, offsets, rows,
                      row_weights, bad, stream_);
  Check("group by expert");
  int32_t* host = static_cast<int32_t*>(scratch_host_.data());
  cudaMemcpyAsync(host, bad, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_);
  cudaMemcpyAsync(host + 1, offsets, (experts + 1) * sizeof(int32_t),
                  cudaMemcpyDeviceToHost, stream_);
  RETURN_IF_ERROR(Synchronize());
  if (host[0] != 0) {
    const int64_t i = host[0] - 1;
    return InternalError("router chose an expert outside [0, " +
                         std::to_string(experts) + ") (token " +
                         std::to_string(i / k) + ", slot " +
                         std::to_string(i % k) + ")");
  }
  std::memcpy(host_offsets, host + 1, (experts + 1) * sizeof(int32_t));
  return Status();
}

// ---- Conversion, head -------------------------------------------------------

void CudaBackend::ConvertFromF32(const float* src, void* dst, DType dtype,
                                 int64_t n) {
  cuda::ConvertFromF32(src, dst, dtype, n, stream_);
  Check("convert from f32");
}

void CudaBackend::ConvertToF32(const void* src, DType dtype, float* dst,
                               int64_t n) {
  cuda::ConvertToF32(src, dtype, dst, n, stream_);
  Check("convert to f32");
}

void CudaBackend::LogSumExp(const float* logits, int64_t rows, int64_t vocab,
                            double* lse) {
  if (rows * int64_t{sizeof(double)} > kScratch) {
    Fail("logsumexp", std::to_string(rows) + " rows exceed the head scratch");
    return;
  }
  double* dev = static_cast<double*>(scratch_device_.data());
  cuda::LogSumExp(logits, rows, vocab, dev, stream_);
  Check("logsumexp");
  cudaMemcpyAsync(lse, dev, rows * sizeof(double), cudaMemcpyDeviceToHost,
                  stream_);
  const Status s = Synchronize();
  (void)s;  // sticky: reported by the caller's next Synchronize
}

void CudaBackend::TargetLogProbs(const float* logits, int64_t rows,
                                 int64_t vocab, const int32_t* targets,
                                 double* logprob) {
  if (rows * int64_t{sizeof(double) + sizeof(float)} > kScratch) {
    Fail("target log-probabilities",
         std::to_string(rows) + " rows exceed the head scratch");
    return;
  }
  double* lse = static_cast<double*>(scratch_device_.data());
  cuda::LogSumExp(logits, rows, vocab, lse, stream_);
  Check("logsumexp");
  // The target logits: one element per row, gathered on the host side of a
  // strided copy (rows of the chunk are `vocab` floats apart).
  float* picked = reinterpret_cast<float*>(
      static_cast<uint8_t*>(scratch_host_.data()) + rows * sizeof(double));
  for (int64_t r = 0; r < rows; ++r)
    cudaMemcpyAsync(picked + r, logits + r * vocab + targets[r], sizeof(float),
                    cudaMemcpyDeviceToHost, stream_);
  cudaMemcpyAsync(logprob, lse, rows * sizeof(double), cudaMemcpyDeviceToHost,
                  stream_);
  if (!Synchronize().ok()) return;
  for (int64_t r = 0; r < rows; ++r)
    logprob[r] = static_cast<double>(picked[r]) - logprob[r];
}

// ---- Capture ----------------------------------------------------------------

void CudaBackend::GatherRowsConvert(const float* src, int64_t ld,
                                    const int32_t* index, int64_t n,
                                    int64_t cols, void* dst, DType dtype) {
  cuda::GatherRowsConvert(src, ld, index, n, cols, dst, dtype, stream_);
  Check("gather rows (capture)");
}

void CudaBackend::SegmentReduce(const float* src, int64_t ld,
                                const int32_t* begin, const int32_t* end,
                                int64_t segments, int64_t cols, bool max,
                                bool accumulate, double* out) {
  cuda::SegmentReduce(src, ld, begin, end, segments, cols,
                      max ? Reduce::kMax : Reduce::kSum, accumulate, out,
                      stream_);
  Check("segment reduce (capture)");
}

}  // namespace loom::cuda
