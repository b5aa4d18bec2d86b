// PLACEHOLDER: to be written (see gemm.h).
#include "src/backend/cuda/gemm.h"

namespace loom::cuda {

struct GemmRunner::State {};

int64_t GemmInputCopyBytes(int64_t m, int64_t k, DType w_dtype) { return 0; }
int64_t GemmLibraryWorkspaceBytes(int64_t m, int64_t n, int64_t k,
                                  DType w_dtype, bool k_major) {
  return 0;
}
int64_t DecodeWorkspaceBytes(int64_t n, int64_t k, FormatKind kind,
                             DType compute) {
  return 0;
}
StatusOr<std::unique_ptr<GemmRunner>> GemmRunner::Create() {
  return std::unique_ptr<GemmRunner>(new GemmRunner());
}
GemmRunner::~GemmRunner() = default;
void GemmRunner::SetWorkspace(void*, int64_t) {}
void GemmRunner::SetDecodeWorkspace(void*, int64_t) {}
Status GemmRunner::Run(const GemmOp&, cudaStream_t) {
  return UnimplementedError("cuda gemm: not written yet");
}

}  // namespace loom::cuda
