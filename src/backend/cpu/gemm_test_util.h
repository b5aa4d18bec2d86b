// Shared by the CPU GEMM tests: an aligned workspace, and a group of GEMMs
// run one by one and as one GemmGroup.
#ifndef LOOM_BACKEND_CPU_GEMM_TEST_UTIL_H_
#define LOOM_BACKEND_CPU_GEMM_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "src/backend/cpu/kernels.h"

namespace loom::cpu {

// A 64-byte aligned buffer (workspaces must be aligned), filled with
// garbage: kernels must not read scratch before writing it.
struct AlignedBuf {
  explicit AlignedBuf(int64_t bytes) {
    const size_t n =
        static_cast<size_t>(std::max<int64_t>(bytes, 64) + 63) / 64 * 64;
    p = std::aligned_alloc(64, n);
    std::memset(p, 0xcd, n);
  }
  ~AlignedBuf() { std::free(p); }
  AlignedBuf(const AlignedBuf&) = delete;
  AlignedBuf& operator=(const AlignedBuf&) = delete;
  void* p;
};

// `items` (their y: a byte offset into an output of `out_floats` floats,
// all starting at `init`) run as one Gemm each and as one GemmGroup over x
// [rows, k], on one context with a workspace for `dtype`: {one by one,
// grouped}.
inline std::pair<std::vector<float>, std::vector<float>> OneByOneAndGrouped(
    const std::vector<GemmArgs>& items, const float* x, int64_t rows,
    int64_t k, DType dtype, int64_t out_floats, float init) {
  GemmContext ctx;
  AlignedBuf ws(GemmWorkspaceBytes(rows, k, dtype));
  std::vector<float> one(static_cast<size_t>(out_floats), init),
      grouped = one;
  for (GemmArgs a : items) {
    a.y = one.data() + reinterpret_cast<intptr_t>(a.y) / 4;
    a.workspace = ws.p;
    ctx.Gemm(a);
  }
  std::vector<GemmArgs> g = items;
  for (GemmArgs& a : g)
    a.y = grouped.data() + reinterpret_cast<intptr_t>(a.y) / 4;
  ctx.GemmGroup(g.data(), static_cast<int64_t>(g.size()), x, rows, ws.p);
  return {std::move(one), std::move(grouped)};
}

}  // namespace loom::cpu

#endif  // LOOM_BACKEND_CPU_GEMM_TEST_UTIL_H_
