// CudaBackend: the Backend interface (src/backend/backend.h) on one NVIDIA
// GPU. Activations are f32 in device memory, as on the CPU backend, so every
// op has the CPU's semantics; GEMMs run on cuBLASLt in the weights' dtype
// (bf16 / f16 inputs, f32 accumulation; f32 weights in true f32), quantized
// weights are decoded panel by panel into the planned decode workspace
// (gemm.h), and attention is our own fused kernel (attention.cu).
//
// Streams: each instance owns one non-blocking stream; ops are enqueued and
// return at once. Errors of enqueued work are sticky: the next Synchronize()
// (or Copy, which synchronises) returns them, naming the first op that
// failed. Memory: kDevice = cudaMalloc, kPinnedHost = cudaHostAlloc (mapped,
// portable: kernels may write it directly), kHost = ordinary host memory.
//
// Besides the planned arenas each instance holds a fixed scratch (kScratch
// bytes of device and of pinned host memory, made at construction) for the
// small host <-> device exchanges of ops with host outputs (LogSumExp,
// TargetLogProbs, GroupByExpert's offsets); it is one of the per-device
// constants the plan lists (docs/design/cuda-backend.md).
#ifndef LOOM_BACKEND_CUDA_CUDA_BACKEND_H_
#define LOOM_BACKEND_CUDA_CUDA_BACKEND_H_

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "src/backend/backend.h"
#include "src/backend/cuda/costs.h"

namespace loom::cuda {

class GemmRunner;

// What `loom devices` prints for one GPU.
struct GpuInfo {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int64_t total_bytes = 0, free_bytes = 0;
  int multiprocessors = 0;
  bool bf16 = false;  // capability >= 8.0
};

// The GPUs visible to this process (empty, with `reason` set, when there is
// no driver or no device).
std::vector<GpuInfo> ListGpus(std::string* reason);

class CudaBackend final : public Backend {
 public:
  // Bytes of the fixed per-instance scratch (device and pinned host each).
  static constexpr int64_t kScratch = int64_t{1} << 20;

  // An instance on GPU `device`; errors name the device and CUDA's message.
  static StatusOr<std::unique_ptr<CudaBackend>> Create(int device);
  ~CudaBackend() override;

  std::string_view name() const override { return name_; }
  DeviceRef device() const override { return {DeviceKind::kCuda, device_}; }
  StatusOr<std::unique_ptr<Backend>> NewInstance() const override;
  BackendCapabilities Capabilities() const override;
  KernelCosts Costs() const override;
  int SetNumThreads(int n) override;
  int NumThreads() const override { return 1; }

  StatusOr<Buffer> Allocate(int64_t bytes, MemoryKind kind) override;
  Status Copy(void* dst, DeviceRef dst_device, const void* src,
              DeviceRef src_device, int64_t bytes) override;
  Status CopyAsync(void* dst, DeviceRef dst_device, const void* src,
                   DeviceRef src_device, int64_t bytes) override;
  Status Synchronize() override;
  // Records `other`'s event on its stream and makes this stream wait for it
  // (other: a CUDA instance on any device; a host backend is synchronous and
  // needs no wait).
  Status WaitFor(Backend& other) override;

  void SetGemmScratchpad(void* scratch, int64_t bytes) override;
  void SetWeightDecodeWorkspace(void* workspace, int64_t bytes) override;
  void Gemm(const GemmOp& op) override;

  void RmsNorm(const float* x, const void* w, DType w_dtype, float offset,
               float eps, float* y, int64_t rows, int64_t dim) override;
  void RmsNormBf16(const float* x, const void* w, float eps, float* y,
                   int64_t rows, int64_t dim) override;
  void RmsNormRows(float* x, int64_t tokens, int64_t ld, int64_t groups,
                   int64_t dim, const void* w, DType w_dtype, float offset,
                   float eps) override;
  void LayerNormRows(float* x, int64_t tokens, int64_t ld, int64_t groups,
                     int64_t dim, const void* w, const void* b, DType w_dtype,
                     float eps) override;
  void LayerNorm(const float* x, const void* w, const void* b, DType w_dtype,
                 float offset, float eps, float* y, int64_t rows,
                 int64_t dim) override;
  void RopeTables(const int32_t* positions, int64_t tokens,
                  const float* inv_freq, int64_t half, float attention_scaling,
                  float* cos, float* sin) override;
  void ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                 int64_t row_stride, const float* cos, const float* sin,
                 int64_t half) override;
  Status Attention(const AttentionOp& op) override;
  void Activation(ActivationFn fn, float* x, int64_t n) override;
  void GatedActivation(ActivationFn fn, const float* gate, int64_t gate_rs,
                       const float* up, int64_t up_rs, float* out, int64_t rows,
                       int64_t n) override;
  void Add(const float* x, float* y, int64_t n) override;
  void Scale(float* x, int64_t n, float s) override;
  void Softcap(float* x, int64_t n, float cap) override;
  void Clamp(float* x, int64_t rows, int64_t cols, int64_t ld, float lo,
             float hi) override;
  void RoundToBf16(float* x, int64_t rows, int64_t cols, int64_t ld) override;
  void Gather(const void* table, DType table_dtype, const int32_t* ids,
              int64_t tokens, int64_t dim, float* out) override;
  void StridedCopy(const float* x, int64_t ldx, int64_t gsx, int64_t isx,
                   float* y, int64_t ldy, int64_t gsy, int64_t isy,
                   int64_t rows, int64_t groups, int64_t n) override;
  void DeinterleaveBlocks(const float* x, int64_t ldx, int64_t rows,
                          int64_t groups, int64_t parts, int64_t width,
                          float* y, int64_t ldy) override;
  void GatherRows(const float* x, int64_t ldx, const int32_t* rows, int64_t n,
                  int64_t cols, float* out) override;
  void ScatterAddRows(const float* x, const int32_t* rows, const float* weights,
                      int64_t n, int64_t cols, float* y, int64_t ldy) override;
  Status TopKRoute(const float* logits, int64_t tokens, int64_t experts,
                   int64_t ld, int64_t k, const RouteOp& op, int32_t* ids,
                   float* weights) override;
  void ClampedSwiglu(const float* gate_up, int64_t gu_rs, float* out,
                     int64_t rows, int64_t n, float alpha,
                     float limit) override;
  void SigmoidGateAddRows(const float* x, const float* gate_logit, int64_t rows,
                          int64_t cols, float* y, int64_t ldy) override;
  void SetZero(float* x, int64_t n) override;
  Status AddRowsBroadcast(float* x, int64_t rows, int64_t cols, int64_t ld,
                          const int32_t* idx, int64_t n, const float* v,
                          float scale, bool norm_match) override;
  Status ProjectOutRows(float* x, int64_t rows, int64_t cols, int64_t ld,
                        const int32_t* idx, int64_t n, const float* u) override;
  Status SetRows(float* x, int64_t rows, int64_t cols, int64_t ld,
                 const int32_t* idx, int64_t n, int64_t col_begin,
                 int64_t col_end, const float* src, int64_t src_rows) override;
  Status CopyRows(float* x, int64_t rows, int64_t cols, int64_t ld,
                  const int32_t* dst_idx, int64_t n, const float* src,
                  int64_t src_rows, int64_t ld_src,
                  const int32_t* src_idx) override;
  Status GroupByExpert(const int32_t* ids, const float* weights, int64_t tokens,
                       int64_t k, int64_t experts, int32_t* offsets,
                       int32_t* rows, float* row_weights,
                       int32_t* host_offsets) override;
  void ConvertFromF32(const float* src, void* dst, DType dtype,
                      int64_t n) override;
  void ConvertToF32(const void* src, DType dtype, float* dst,
                    int64_t n) override;
  void LogSumExp(const float* logits, int64_t rows, int64_t vocab,
                 double* lse) override;
  void TargetLogProbs(const float* logits, int64_t rows, int64_t vocab,
                      const int32_t* targets, double* logprob) override;
  void GatherRowsConvert(const float* src, int64_t ld, const int32_t* index,
                         int64_t n, int64_t cols, void* dst,
                         DType dtype) override;
  void SegmentReduce(const float* src, int64_t ld, const int32_t* begin,
                     const int32_t* end, int64_t segments, int64_t cols,
                     bool max, bool accumulate, double* out) override;

  cudaStream_t stream() const { return stream_; }
  // The compute capability of this device (major * 10 + minor).
  int capability() const { return capability_; }

 private:
  explicit CudaBackend(int device);
  Status Init();
  // Records the first failure of an enqueued op (sticky until Synchronize).
  void Check(const char* op);
  void Fail(const char* op, const std::string& message);

  int device_ = 0;
  int capability_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  // Recorded on stream_ when another instance waits for this one (WaitFor);
  // made once at Init, so a forward allocates nothing.
  cudaEvent_t issued_ = nullptr;
  std::unique_ptr<GemmRunner> gemm_;
  Buffer scratch_device_, scratch_host_;
  Status error_;
};

}  // namespace loom::cuda

#endif  // LOOM_BACKEND_CUDA_CUDA_BACKEND_H_
