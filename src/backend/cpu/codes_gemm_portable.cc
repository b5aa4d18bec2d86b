// CodesGemm's kernels for baseline x86-64 (SSE2, 4 lanes); see
// codes_gemm_kernels.inc.
#include <algorithm>

#define LOOM_CODES_NS portable
#define LOOM_CODES_LANES 4
#include "src/backend/cpu/codes_gemm_kernels.inc"  // NOLINT(build/include)
