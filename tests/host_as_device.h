// A test stand-in for a GPU: a Backend that computes with the CPU backend in
// host memory but reports itself as device cuda:`index`. The runtime then
// takes every path it takes for a real device — weights copied into the
// device's own allocation, batch metadata copied over, expert offsets copied
// back, hooks delivered as device views and selected "on the device" — and
// since the kernels are the CPU's, the results must equal the host run bit
// for bit. Copies are plain memcpy, whatever the DeviceRefs say.
#ifndef LOOM_TESTS_HOST_AS_DEVICE_H_
#define LOOM_TESTS_HOST_AS_DEVICE_H_

#include <cstring>
#include <memory>

#include "src/backend/backend.h"
#include "src/backend/registry.h"
#include "src/base/check.h"

namespace loom::testing {

class HostAsDevice final : public Backend {
 public:
  explicit HostAsDevice(int index = 0) : index_(index) {
    auto b = CreateBackend("cpu");
    LOOM_CHECK(b.ok());
    cpu_ = std::move(*b);
  }
  std::string_view name() const override { return "host-as-device"; }
  DeviceRef device() const override { return {DeviceKind::kCuda, index_}; }
  StatusOr<std::unique_ptr<Backend>> NewInstance() const override {
    return std::unique_ptr<Backend>(new HostAsDevice(index_));
  }
  BackendCapabilities Capabilities() const override {
    return cpu_->Capabilities();
  }
  KernelCosts Costs() const override { return cpu_->Costs(); }
  int SetNumThreads(int n) override { return cpu_->SetNumThreads(n); }
  int NumThreads() const override { return cpu_->NumThreads(); }
  StatusOr<Buffer> Allocate(int64_t bytes, MemoryKind kind) override {
    ASSIGN_OR_RETURN(Buffer b, cpu_->Allocate(bytes, kind));
    if (kind == MemoryKind::kDevice) b.device = device();
    return b;
  }
  Status Copy(void* dst, DeviceRef, const void* src, DeviceRef,
              int64_t bytes) override {
    ++copies_;
    std::memmove(dst, src, static_cast<size_t>(bytes));
    return Status();
  }
  void SetGemmScratchpad(void* s, int64_t b) override {
    cpu_->SetGemmScratchpad(s, b);
  }
  void SetWeightDecodeWorkspace(void* w, int64_t b) override {
    cpu_->SetWeightDecodeWorkspace(w, b);
  }
  void Gemm(const GemmOp& op) override { cpu_->Gemm(op); }
  void RmsNorm(const float* x, const void* w, DType wd, float off, float eps,
               float* y, int64_t rows, int64_t dim) override {
    cpu_->RmsNorm(x, w, wd, off, eps, y, rows, dim);
  }
  void RmsNormBf16(const float* x, const void* w, float eps, float* y,
                   int64_t rows, int64_t dim) override {
    cpu_->RmsNormBf16(x, w, eps, y, rows, dim);
  }
  void RmsNormRows(float* x, int64_t t, int64_t ld, int64_t g, int64_t dim,
                   const void* w, DType wd, float offset, float eps) override {
    cpu_->RmsNormRows(x, t, ld, g, dim, w, wd, offset, eps);
  }
  void LayerNormRows(float* x, int64_t t, int64_t ld, int64_t g, int64_t dim,
                     const void* w, const void* b, DType wd,
                     float eps) override {
    cpu_->LayerNormRows(x, t, ld, g, dim, w, b, wd, eps);
  }
  void LayerNorm(const float* x, const void* w, const void* b, DType wd,
                 float offset, float eps, float* y, int64_t rows,
                 int64_t dim) override {
    cpu_->LayerNorm(x, w, b, wd, offset, eps, y, rows, dim);
  }
  void RopeTables(const int32_t* p, int64_t t, const float* f, int64_t half,
                  float s, float* cos, float* sin) override {
    cpu_->RopeTables(p, t, f, half, s, cos, sin);
  }
  void ApplyRope(float* x, int64_t t, int64_t h, int64_t hd, int64_t rs,
                 const float* cos, const float* sin, int64_t half) override {
    cpu_->ApplyRope(x, t, h, hd, rs, cos, sin, half);
  }
  Status ApplyRopePairs(float* x, int64_t t, int64_t h, int64_t hd, int64_t rs,
                        const float* cos, const float* sin,
                        int64_t half) override {
    return cpu_->ApplyRopePairs(x, t, h, hd, rs, cos, sin, half);
  }
  Status Attention(const AttentionOp& op) override {
    // A device reads the offsets from its own memory: they must be there.
    LOOM_CHECK(op.seq_start_device != nullptr);
    LOOM_CHECK(std::memcmp(op.seq_start_device, op.seq_start,
                           sizeof(int64_t) * (op.num_seqs + 1)) == 0);
    return cpu_->Attention(op);
  }
  void Activation(ActivationFn fn, float* x, int64_t n) override {
    cpu_->Activation(fn, x, n);
  }
  void GatedActivation(ActivationFn fn, const float* g, int64_t grs,
                       const float* u, int64_t urs, float* out, int64_t rows,
                       int64_t n) override {
    cpu_->GatedActivation(fn, g, grs, u, urs, out, rows, n);
  }
  void Add(const float* x, float* y, int64_t n) override { cpu_->Add(x, y, n); }
  void Scale(float* x, int64_t n, float s) override { cpu_->Scale(x, n, s); }
  void Softcap(float* x, int64_t n, float c) override {
    cpu_->Softcap(x, n, c);
  }
  void Clamp(float* x, int64_t r, int64_t c, int64_t ld, float lo,
             float hi) override {
    cpu_->Clamp(x, r, c, ld, lo, hi);
  }
  void RoundToBf16(float* x, int64_t r, int64_t c, int64_t ld) override {
    cpu_->RoundToBf16(x, r, c, ld);
  }
  void Gather(const void* t, DType td, const int32_t* ids, int64_t n,
              int64_t dim, float* out) override {
    cpu_->Gather(t, td, ids, n, dim, out);
  }
  void StridedCopy(const float* x, int64_t ldx, int64_t gsx, int64_t isx,
                   float* y, int64_t ldy, int64_t gsy, int64_t isy,
                   int64_t rows, int64_t groups, int64_t n) override {
    cpu_->StridedCopy(x, ldx, gsx, isx, y, ldy, gsy, isy, rows, groups, n);
  }
  void DeinterleaveBlocks(const float* x, int64_t ldx, int64_t rows,
                          int64_t groups, int64_t parts, int64_t width,
                          float* y, int64_t ldy) override {
    cpu_->DeinterleaveBlocks(x, ldx, rows, groups, parts, width, y, ldy);
  }
  void GatherRows(const float* x, int64_t ldx, const int32_t* rows, int64_t n,
                  int64_t cols, float* out) override {
    cpu_->GatherRows(x, ldx, rows, n, cols, out);
  }
  void ScatterAddRows(const float* x, const int32_t* rows, const float* w,
                      int64_t n, int64_t cols, float* y, int64_t ldy) override {
    cpu_->ScatterAddRows(x, rows, w, n, cols, y, ldy);
  }
  Status TopKRoute(const float* l, int64_t t, int64_t e, int64_t ld, int64_t k,
                   const RouteOp& op, int32_t* ids, float* w) override {
    return cpu_->TopKRoute(l, t, e, ld, k, op, ids, w);
  }
  void ClampedSwiglu(const float* gu, int64_t rs, float* out, int64_t rows,
                     int64_t n, float alpha, float limit) override {
    cpu_->ClampedSwiglu(gu, rs, out, rows, n, alpha, limit);
  }
  void SigmoidGateAddRows(const float* x, const float* g, int64_t rows,
                          int64_t cols, float* y, int64_t ldy) override {
    cpu_->SigmoidGateAddRows(x, g, rows, cols, y, ldy);
  }
  void SetZero(float* x, int64_t n) override { cpu_->SetZero(x, n); }
  Status AddRowsBroadcast(float* x, int64_t r, int64_t c, int64_t ld,
                          const int32_t* idx, int64_t n, const float* v,
                          float s, bool norm_match) override {
    return cpu_->AddRowsBroadcast(x, r, c, ld, idx, n, v, s, norm_match);
  }
  Status ProjectOutRows(float* x, int64_t r, int64_t c, int64_t ld,
                        const int32_t* idx, int64_t n,
                        const float* u) override {
    return cpu_->ProjectOutRows(x, r, c, ld, idx, n, u);
  }
  Status SetRows(float* x, int64_t r, int64_t c, int64_t ld, const int32_t* idx,
                 int64_t n, int64_t cb, int64_t ce, const float* src,
                 int64_t sr) override {
    return cpu_->SetRows(x, r, c, ld, idx, n, cb, ce, src, sr);
  }
  Status CopyRows(float* x, int64_t r, int64_t c, int64_t ld, const int32_t* di,
                  int64_t n, const float* src, int64_t sr, int64_t lds,
                  const int32_t* si) override {
    return cpu_->CopyRows(x, r, c, ld, di, n, src, sr, lds, si);
  }
  Status GroupByExpert(const int32_t* ids, const float* w, int64_t t, int64_t k,
                       int64_t e, int32_t* off, int32_t* rows, float* rw,
                       int32_t* host_off) override {
    // A device backend's offsets come back into separate host memory.
    LOOM_CHECK(host_off != off);
    return cpu_->GroupByExpert(ids, w, t, k, e, off, rows, rw, host_off);
  }
  void ConvertFromF32(const float* s, void* d, DType dt, int64_t n) override {
    cpu_->ConvertFromF32(s, d, dt, n);
  }
  void ConvertToF32(const void* s, DType dt, float* d, int64_t n) override {
    cpu_->ConvertToF32(s, dt, d, n);
  }
  void LogSumExp(const float* l, int64_t r, int64_t v, double* lse) override {
    cpu_->LogSumExp(l, r, v, lse);
  }
  void TargetLogProbs(const float* l, int64_t r, int64_t v, const int32_t* t,
                      double* lp) override {
    cpu_->TargetLogProbs(l, r, v, t, lp);
  }
  void GatherRowsConvert(const float* src, int64_t ld, const int32_t* index,
                         int64_t n, int64_t cols, void* dst,
                         DType dtype) override {
    ++gathers_;
    cpu_->GatherRowsConvert(src, ld, index, n, cols, dst, dtype);
  }
  void SegmentReduce(const float* src, int64_t ld, const int32_t* b,
                     const int32_t* e, int64_t g, int64_t cols, bool max,
                     bool acc, double* out) override {
    ++reductions_;
    cpu_->SegmentReduce(src, ld, b, e, g, cols, max, acc, out);
  }

  int64_t copies() const { return copies_; }
  int64_t gathers() const { return gathers_; }
  int64_t reductions() const { return reductions_; }

 private:
  int index_;
  std::unique_ptr<Backend> cpu_;
  int64_t copies_ = 0, gathers_ = 0, reductions_ = 0;
};

}  // namespace loom::testing

#endif  // LOOM_TESTS_HOST_AS_DEVICE_H_
