// CpuBackend: the Backend interface (src/backend/backend.h) on the host, with
// the kernels of kernels.h (oneDNN GEMM, vectorised OpenMP kernels). Memory
// is ordinary host memory for every MemoryKind; every op is synchronous.
// One instance per consumer: it owns a GemmContext (cached primitives and
// the borrowed scratchpad).
#ifndef LOOM_BACKEND_CPU_CPU_BACKEND_H_
#define LOOM_BACKEND_CPU_CPU_BACKEND_H_

#include <memory>
#include <vector>

#include "src/backend/backend.h"
#include "src/backend/cpu/kernels.h"

namespace loom::cpu {

class CpuBackend final : public Backend {
 public:
  CpuBackend();
  ~CpuBackend() override;

  std::string_view name() const override { return "cpu"; }
  DeviceRef device() const override { return {}; }
  StatusOr<std::unique_ptr<Backend>> NewInstance() const override {
    return std::unique_ptr<Backend>(new CpuBackend());
  }
  BackendCapabilities Capabilities() const override;
  KernelCosts Costs() const override;
  int SetNumThreads(int n) override;
  int NumThreads() const override;

  StatusOr<Buffer> Allocate(int64_t bytes, MemoryKind kind) override;
  Status Copy(void* dst, DeviceRef dst_device, const void* src,
              DeviceRef src_device, int64_t bytes) override;

  // The CPU GEMM needs no library scratch and decodes quantized weights into
  // its own workspace (GemmOp::workspace): nothing to lend.
  void SetGemmScratchpad(void* /*scratch*/, int64_t /*bytes*/) override {}
  void Gemm(const GemmOp& op) override;
  // bf16 weights at the avx512bf16 and amx levels: kStrips (PackWeightStrips).
  MatrixLayout RepackedLayout(int64_t n, int64_t k, DType dtype) const override;
  void RepackWeight(const void* data, int64_t n, int64_t k, DType dtype,
                    void* out) const override;
  void GemmGroup(const GemmGroupOp& op) override;

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
  Status ApplyRopePairs(float* x, int64_t tokens, int64_t heads,
                        int64_t head_dim, int64_t row_stride, const float* cos,
                        const float* sin, int64_t half) override;
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
  int64_t GemmBackwardWorkspaceBytes(const WeightOperand& w,
                                     int64_t m) const override;
  Status GemmBackwardInput(const GemmBackwardOp& op) override;
  Status NormBackward(const NormBackwardOp& op) override;
  int64_t AttentionBackwardWorkspaceBytes(const AttentionOp& op) const override;
  Status AttentionBackward(const AttentionBackwardOp& op) override;
  Status ActivationBackward(ActivationFn fn, const float* x, const float* dy,
                            float* dx, int64_t n) override;
  Status ClampedSwigluBackward(const float* gate_up, int64_t gu_rs,
                               const float* dout, float* dgate_up,
                               int64_t dgu_rs, int64_t rows, int64_t n,
                               float alpha, float limit) override;
  Status GatedActivationBackward(ActivationFn fn, const float* gate,
                                 int64_t gate_rs, const float* up,
                                 int64_t up_rs, const float* dout, float* dgate,
                                 int64_t dg_rs, float* dup, int64_t du_rs,
                                 int64_t rows, int64_t n) override;
  int64_t SaeWorkspaceBytes(const Sae& sae, int64_t rows) const override;
  Status RunSae(const Sae& sae, const float* x, const float* reference,
                int64_t rows, void* workspace, const SaeOutputs& out) override;
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

 private:
  std::unique_ptr<GemmContext> gemm_;
  std::vector<GemmArgs> group_args_;      // GemmGroup's items, reused
  std::vector<QuantMatrix> group_quant_;  // their quantized weights
};

// The CPU backend's planner costs (what CpuBackend::Costs returns), for code
// that plans without creating a backend.
KernelCosts CpuKernelCosts();

}  // namespace loom::cpu

#endif  // LOOM_BACKEND_CPU_CPU_BACKEND_H_
