#include "src/backend/cuda/costs.h"

#include <algorithm>

namespace loom::cuda {

int64_t GemmInputCopyBytes(int64_t m, int64_t k, DType w_dtype) {
  if (m <= 0 || k <= 0) return 0;
  return w_dtype == DType::kBF16 || w_dtype == DType::kF16 ? m * k * 2 : 0;
}

int64_t GemmLibraryWorkspaceBytes(int64_t m, int64_t n, int64_t k,
                                  DType /*w_dtype*/, bool /*k_major*/) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  return kCublasLtWorkspace;
}

int64_t DecodeWorkspaceBytes(int64_t n, int64_t k, FormatKind kind,
                             DType compute) {
  if (kind == FormatKind::kDense || n <= 0 || k <= 0) return 0;
  return std::min(n, kDecodePanelRows) * k * DTypeSize(compute);
}

int64_t AttentionScratchBytes(int64_t /*max_seq_len*/, int64_t /*q_heads*/,
                              int64_t /*head_dim*/, int /*num_threads*/) {
  return 0;
}

KernelCosts CudaKernelCosts() {
  KernelCosts k;
  k.gemm_workspace = &GemmInputCopyBytes;
  k.gemm_scratchpad = &GemmLibraryWorkspaceBytes;
  k.weight_decode_workspace = &DecodeWorkspaceBytes;
  k.attention_workspace = &AttentionScratchBytes;
  k.num_threads = 1;
  k.device_runtime_bytes = kDeviceRuntimeBytes;
  k.activation_dtype = DType::kF32;
  return k;
}

}  // namespace loom::cuda
