#include "src/backend/cpu/codes_gemm.h"

#include <omp.h>

#include <algorithm>

#include "src/backend/cpu/isa.h"
#include "src/backend/cpu/kernels.h"
#include "src/backend/cpu/kernels_internal.h"
#include "src/backend/cpu/quant_decode.h"
#include "src/base/check.h"
#include "src/base/units.h"

namespace loom::cpu {
namespace {

struct CodesKernels {
  decltype(&portable::DecodeCodesRange) decode;
  decltype(&portable::DotTile) dot;
};

const CodesKernels& Active() {
  static const CodesKernels k = [] {
    switch (ActiveIsa()) {
      case CpuIsa::kAvx512:
      case CpuIsa::kAvx512Bf16:
        return CodesKernels{avx512::DecodeCodesRange, avx512::DotTile};
      case CpuIsa::kAvx2:
        return CodesKernels{avx2::DecodeCodesRange, avx2::DotTile};
      case CpuIsa::kBaseline:
        break;
    }
    return CodesKernels{portable::DecodeCodesRange, portable::DotTile};
  }();
  return k;
}

// Columns [j0, j0 + nb) of one item, every row, by the calling thread;
// `tile` is its [kCodesTileCols, kCodesTileK] f32 slot.
void RunTask(const CodesGemmItem& it, int64_t j0, DType compute, float* tile) {
  const CodesKernels& kern = Active();
  const QuantMatrix& w = it.w;
  const int64_t nb = std::min(kCodesTileCols, w.n - j0);
  const int64_t ldy = it.ldy == 0 ? w.n : it.ldy;
  float* y = it.y + j0;
  if (!it.accumulate)
    for (int64_t i = 0; i < it.m; ++i) std::fill_n(y + i * ldy, nb, 0.0f);
  const bool round = !DecodeIsExactIn(w.kind, compute);
  for (int64_t c0 = 0; c0 < w.k; c0 += kCodesTileK) {
    const int64_t kc = std::min(kCodesTileK, w.k - c0);
    for (int64_t j = 0; j < nb; ++j) {
      float* row = tile + j * kc;  // [kc]
      kern.decode(w, j0 + j, c0, c0 + kc, row);
      if (round) RoundToDTypeAsF32(row, row, compute, kc);
    }
    kern.dot(it.x + c0, w.k, it.m, tile, nb, kc, y, ldy);
  }
  if (it.bias != nullptr) {
    for (int64_t i = 0; i < it.m; ++i)
      for (int64_t j = 0; j < nb; ++j)
        y[i * ldy + j] += LoadScalarAsF32(it.bias, it.bias_dtype, j0 + j);
  }
}

}  // namespace

int64_t CodesGemmMaxRows(FormatKind kind) {
  if (kind == FormatKind::kDense) return 0;
  // BM_CodesGemmVsPanels, one GEMM, 2 threads, Zen 3 (AVX2), bf16 compute:
  // the codes path is 1.2-1.5x the panels at 1-16 rows, 1.0-1.24 at 32, and
  // 0.89-1.01 at 64 rows, 0.81-0.95 at 128. But experts run as one group
  // (GemmQuantizedGroup) with no barrier per expert, one expert's decode
  // overlapping another's multiply: BM_MoePrefill, gpt-oss-20b preset at 512
  // tokens (about 64 rows per expert) gives a MoE layer 0.68 of the dense
  // GEMM of equal FLOPs with experts up to 96 rows on the codes, 0.51 with
  // those over 32 in panels. One bound for both, so that a group and one
  // call per item stay the same bytes. The same on AVX-512 until measured.
  return 96;
}

int64_t CodesGemmTileBytes(int64_t k) {
  return AlignUp(kCodesTileCols * std::min(k, kCodesTileK) * 4, 64);
}

void CodesGemm(const CodesGemmItem* items, int64_t count, DType compute,
               void* tiles, int64_t tiles_bytes) {
  if (count <= 0) return;
  const int64_t k = items[0].w.k;
  const int64_t slot = CodesGemmTileBytes(k);
  LOOM_CHECK(tiles != nullptr && tiles_bytes >= slot &&
             reinterpret_cast<uintptr_t>(tiles) % 64 == 0)
      << "codes GEMM: decode tiles of " << tiles_bytes << " bytes, need at "
      << "least one of " << slot << " (64-byte aligned)";
  // As many threads as the lent tiles hold (planned: NumThreads(); fewer if
  // the thread count grew after planning). Outputs do not depend on it.
  const int threads =
      static_cast<int>(std::min<int64_t>(NumThreads(), tiles_bytes / slot));
  int64_t tasks = 0;
  for (int64_t i = 0; i < count; ++i) {
    const CodesGemmItem& it = items[i];
    LOOM_CHECK(it.w.k == k && it.w.kind != FormatKind::kDense && it.m >= 0)
        << "codes GEMM item " << i << ": k=" << it.w.k << " vs " << k;
    tasks += (it.w.n + kCodesTileCols - 1) / kCodesTileCols;
  }
  // Task t -> (item, first column): items in order, then their column blocks.
  auto run = [&](int64_t t, int thread) {
    int64_t i = 0;
    for (;; ++i) {
      const int64_t blocks =
          (items[i].w.n + kCodesTileCols - 1) / kCodesTileCols;
      if (t < blocks) break;
      t -= blocks;
    }
    if (items[i].m == 0) return;
    RunTask(
        items[i], t * kCodesTileCols, compute,
        reinterpret_cast<float*>(static_cast<char*>(tiles) + thread * slot));
  };
  if (threads == 1 || tasks == 1) {
    for (int64_t t = 0; t < tasks; ++t) run(t, 0);
    return;
  }
#pragma omp parallel for schedule(dynamic, 4) num_threads(threads)
  for (int64_t t = 0; t < tasks; ++t) run(t, omp_get_thread_num());
}

}  // namespace loom::cpu
