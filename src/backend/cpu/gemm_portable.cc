// The GEMM's fma-family kernels, panel packing and quantized row decoding for
// baseline x86-64 (SSE2, 4 lanes; no FMA instruction: a product is rounded,
// then added); see gemm_kernels.inc.
#include <algorithm>

#define LOOM_GEMM_NS portable
#define LOOM_GEMM_LANES 4
#define LOOM_GEMM_MR 6
#define LOOM_GEMM_FMA(a, b, c) ((a) * (b) + (c))
#define LOOM_GEMM_SPLAT(s) (Vec{(s), (s), (s), (s)})
#include "src/backend/cpu/gemm_kernels.inc"  // NOLINT(build/include)
