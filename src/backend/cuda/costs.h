// The CUDA backend's planner costs: pure functions of shapes and constants,
// built in every configuration (no CUDA headers), so `loom plan` plans GPU
// placements on machines without the toolkit. gemm.cc sizes its panels and
// workspace from these same constants; the attention kernels need none.
#ifndef LOOM_BACKEND_CUDA_COSTS_H_
#define LOOM_BACKEND_CUDA_COSTS_H_

#include <cstdint>

#include "src/core/dtype.h"
#include "src/core/format.h"
#include "src/plan/activations.h"

namespace loom::cuda {

// Rows of a quantized W decoded at once (gemm.cc).
inline constexpr int64_t kDecodePanelRows = 4096;
// cuBLASLt's workspace (the planner's gemm_scratchpad for every shape; 32 MiB
// is what NVIDIA recommends for Hopper).
inline constexpr int64_t kCublasLtWorkspace = int64_t{32} << 20;
// What a GPU holds for our runtime outside the planned arenas: the CUDA
// context with lazily loaded modules (ours and cuBLASLt's), the cuBLASLt
// handle, the streams and the backend's fixed scratch. An ESTIMATE until
// measured on an H100: cuda_model_test.RuntimeOverheadWithinPlan prints the
// measured value and fails when it exceeds this.
inline constexpr int64_t kDeviceRuntimeBytes = int64_t{640} << 20;

// KernelCosts::gemm_workspace: the 16-bit copy of x (0 for f32 weights).
int64_t GemmInputCopyBytes(int64_t m, int64_t k, DType w_dtype);
// KernelCosts::gemm_scratchpad.
int64_t GemmLibraryWorkspaceBytes(int64_t m, int64_t n, int64_t k,
                                  DType w_dtype, bool k_major);
// KernelCosts::weight_decode_workspace: one panel of W in `compute` (0 for
// dense weights).
int64_t DecodeWorkspaceBytes(int64_t n, int64_t k, FormatKind kind,
                             DType compute);
// KernelCosts::attention_workspace: the attention kernels keep their row
// statistics in registers (0).
int64_t AttentionScratchBytes(int64_t max_seq_len, int64_t q_heads,
                              int64_t head_dim, int num_threads);

// The CUDA backend's planner costs (what CudaBackend::Costs returns).
KernelCosts CudaKernelCosts();

}  // namespace loom::cuda

#endif  // LOOM_BACKEND_CUDA_COSTS_H_
