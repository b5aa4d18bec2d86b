// GEMMs of the CUDA backend on cuBLASLt: y[m, n] = x[m, k] W^T (+ bias)
// (+ y), x f32 in device memory (converted to the weight's 16-bit dtype in
// the caller's workspace, as the CPU backend does), W in its stored format.
//   - bf16 / f16 weights: cuBLASLt with 16-bit inputs, f32 accumulation and
//     f32 output (CUBLAS_COMPUTE_32F), the bias added by the epilogue.
//   - f32 weights: cuBLASLt in true f32 (no TF32), for f32 models.
//   - quantized weights (FP8 per-tensor / block, MXFP4, NVFP4): decoded panel
//     by panel (kDecodePanelRows rows of W at a time) into the planned decode
//     workspace in the compute dtype, each panel multiplied as a 16-bit
//     weight. Never a whole dequantized model; at most one panel.
// One runner per backend instance (it holds the cuBLASLt handle and caches
// matmul descriptors and heuristics by shape).
#ifndef LOOM_BACKEND_CUDA_GEMM_H_
#define LOOM_BACKEND_CUDA_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "src/backend/backend.h"
#include "src/backend/cuda/costs.h"
#include "src/base/status.h"

namespace loom::cuda {

class GemmRunner {
 public:
  static StatusOr<std::unique_ptr<GemmRunner>> Create();
  ~GemmRunner();
  void SetWorkspace(void* workspace, int64_t bytes);
  void SetDecodeWorkspace(void* workspace, int64_t bytes);
  // Enqueues `op` on `stream` (op.workspace holds GemmInputCopyBytes).
  Status Run(const GemmOp& op, cudaStream_t stream);

 private:
  GemmRunner() = default;
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace loom::cuda

#endif  // LOOM_BACKEND_CUDA_GEMM_H_
