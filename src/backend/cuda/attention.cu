// PLACEHOLDER: bodies to be written (see kernels.h).
#include "src/backend/cuda/kernels.h"

namespace loom::cuda {

int64_t AttentionWorkspaceBytes(int64_t max_seq_len, int64_t q_heads, int64_t head_dim) { return 0; }

bool AttentionSupportsHeadDim(int64_t head_dim) { return false; }

void Attention(const AttentionArgs& a, cudaStream_t s) {}

}  // namespace loom::cuda
