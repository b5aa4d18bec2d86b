// GEMMs on Loom's own kernels (gemm_internal.h), batch- and thread-invariant.
//
// An output element is one chain of multiply-adds over k in order, whatever
// the row count, the tiles, the blocking or the threads (gemm_internal.h says
// what a step is per kernel family). The driver here only chooses which
// elements a task computes: tasks are (column block, row block) pairs of one
// GEMM, or of every GEMM of a group, handed out dynamically over the OpenMP
// threads. A task packs its column block of the weight for one K block at a
// time into its thread's slot of the workspace (f32 panels, or bf16 strips at
// the dot and amx levels; quantized weights are decoded there), then sweeps
// its rows over it with the family's tile.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "src/backend/cpu/gemm_internal.h"
#include "src/backend/cpu/isa.h"
#include "src/backend/cpu/kernels.h"
#include "src/backend/cpu/kernels_internal.h"
#include "src/base/check.h"
#include "src/base/units.h"

namespace loom::cpu {
namespace {

using gemm::BTile;
using gemm::WeightSource;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The fma family's per-ISA kernels.
struct FmaKernels {
  int64_t mr, lanes;
  decltype(&portable::FmaTile) tile;
  decltype(&portable::PackPanels) pack;
  decltype(&portable::FmaVectorsForRows) vectors;
};

const FmaKernels& Fma() {
  static const FmaKernels k = [] {
    if (ActiveIsa() >= CpuIsa::kAvx512)
      return FmaKernels{avx512::kFmaMr, avx512::kFmaLanes, avx512::FmaTile,
                        avx512::PackPanels, avx512::FmaVectorsForRows};
    if (ActiveIsa() >= CpuIsa::kAvx2)
      return FmaKernels{avx2::kFmaMr, avx2::kFmaLanes, avx2::FmaTile,
                        avx2::PackPanels, avx2::FmaVectorsForRows};
    return FmaKernels{portable::kFmaMr, portable::kFmaLanes,
                      portable::FmaTile, portable::PackPanels,
                      portable::FmaVectorsForRows};
  }();
  return k;
}

// Blocking, per family (single-thread and 2-thread sweeps on the Xeon of
// docs/design/cpu-backend.md; a packed block kc x nc stays in L2 while the
// task's rows sweep over it):
//   fma: K blocks of 512, 128 columns a task (f32 panels: 256 KB a slot);
//     256 -> 512 -> 1024 gave 281 -> 286 -> 301 GFLOP/s at 512 x 5632 x 2048.
//   dot: K blocks of 512, 128 columns.
//   amx: K blocks of 1024, 256 columns, at most 128 rows a task (C in the
//     slot as tiles: 128 KB); every C load and store drains the tile
//     pipeline, so fewer, longer K blocks win (256: 604, 1024: 657, all of
//     K: 676 GFLOP/s on one core), up to what a slot holds.
struct Blocking {
  int64_t kc, nc;
};
constexpr Blocking kFmaBlocking{512, 128};
constexpr Blocking kDotBlocking{512, 128};
constexpr Blocking kAmxBlocking{1024, 256};
constexpr int64_t kAmxRows = 128;
// Rows of one task at most (more rows: more tasks).
constexpr int64_t kMaxRowBlock = 512;

constexpr Blocking BlockingOf(GemmFamily f) {
  return f == GemmFamily::kFma   ? kFmaBlocking
         : f == GemmFamily::kDot ? kDotBlocking
                                 : kAmxBlocking;
}
int64_t KcOf(GemmFamily f, int64_t k) {
  return std::min(k, BlockingOf(f).kc);
}
int64_t NcOf(GemmFamily f) { return BlockingOf(f).nc; }
// Rows a task's row block is a multiple of.
int64_t RowUnit(GemmFamily f) {
  switch (f) {
    case GemmFamily::kAmx:
      return 32;
    case GemmFamily::kDot:
      return gemm::kDotMr;
    default:
      return Fma().mr;
  }
}

// Row stride (elements) of the bf16 x copy: k rounded up to a 32-k block,
// plus one block when the stride would be a multiple of 1 KB (rows at such
// strides share L1 sets: AMX loads 16 of them at once).
int64_t Bf16XStride(int64_t k) {
  int64_t s = AlignUp(k, gemm::kTileK);
  if ((s * 2) % 1024 == 0) s += gemm::kTileK;
  return s;
}

// Bytes of the x copy for `rows` rows.
int64_t XCopyBytes(GemmFamily f, DType compute, int64_t rows, int64_t k) {
  if (f == GemmFamily::kAmx)
    return AlignUp((rows + 32) * AlignUp(k, gemm::kTileK) * 2, 64);
  if (f != GemmFamily::kFma)
    return AlignUp((rows + 32) * Bf16XStride(k) * 2, 64);
  return compute == DType::kF32 ? 0 : AlignUp(rows * k * 4, 64);
}

// One thread's slot: the packed block, scratch for a quantized weight's
// decoded rows, and (amx) the task's C in tiles.
struct SlotLayout {
  int64_t pack_bytes, scratch_bytes, c_bytes;
  int64_t bytes() const { return pack_bytes + scratch_bytes + c_bytes; }
};
SlotLayout SlotOf(GemmFamily f, int64_t k) {
  const int64_t kc = KcOf(f, k);
  if (f == GemmFamily::kFma)
    return {AlignUp(kc * NcOf(f) * 4, 64),
            AlignUp(gemm::kPanelCols * kc * 4, 64), 0};
  return {AlignUp(NcOf(f) * AlignUp(kc, gemm::kTileK) * 2, 64),
          AlignUp(gemm::kStripCols * kc * 4, 64),
          f == GemmFamily::kAmx ? kAmxRows * NcOf(f) * 4 : 0};
}

// y[i, j] += bias[j] for rows [i0, i1), columns [j0, j1).
void AddBias(float* y, int64_t ldy, int64_t i0, int64_t i1, int64_t j0,
             int64_t j1, const void* bias, DType bias_dtype) {
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t j = j0; j < j1; ++j)
      y[i * ldy + j] += LoadScalarAsF32(bias, bias_dtype, j);
}

}  // namespace

namespace {
std::optional<GemmFamily> g_bf16_family_for_testing;
}  // namespace

void SetBf16GemmFamilyForTesting(std::optional<GemmFamily> family) {
  LOOM_CHECK(!family || *family == GemmFamily::kFma ||
             (*family == GemmFamily::kDot &&
              ActiveIsa() >= CpuIsa::kAvx512Bf16) ||
             (*family == GemmFamily::kAmx && ActiveIsa() >= CpuIsa::kAmx))
      << "a bf16 GEMM family the " << IsaName(ActiveIsa())
      << " level does not run";
  g_bf16_family_for_testing = family;
}

// bf16: AMX where it is; AVX512_BF16's pair dot products where they run at
// twice the f32 FMA rate (AMD Zen 4 and 5: measured 392 vs 196 GFLOP/s on 2
// cores); on Intel's AVX512_BF16 cores without AMX they do not (measured on
// a Xeon capped at avx512bf16: the dot tiles 150 GFLOP/s, the fma family on
// widened weights 248-271), so bf16 runs the fma family there.
GemmFamily GemmFamilyOf(DType compute) {
  if (compute == DType::kBF16) {
    if (g_bf16_family_for_testing) return *g_bf16_family_for_testing;
    if (ActiveIsa() >= CpuIsa::kAmx) return GemmFamily::kAmx;
    if (ActiveIsa() >= CpuIsa::kAvx512Bf16 && DetectedCpuFeatures().amd)
      return GemmFamily::kDot;
  }
  return GemmFamily::kFma;
}

bool NativeGemmDType(DType dtype) {
  return dtype == DType::kF32 || GemmFamilyOf(dtype) != GemmFamily::kFma;
}

bool StripsLayoutFits(int64_t n, int64_t k, DType dtype) {
  return dtype == DType::kBF16 && GemmFamilyOf(dtype) != GemmFamily::kFma &&
         n > 0 && k > 0 && n % gemm::kStripCols == 0 && k % gemm::kTileK == 0;
}

void PackWeightStrips(const void* w, int64_t n, int64_t k, void* out) {
  LOOM_CHECK(StripsLayoutFits(n, k, DType::kBF16))
      << "strips of a [" << n << ", " << k << "] weight at the "
      << GemmPathName(DType::kBF16) << " level";
  const auto* src = static_cast<const uint16_t*>(w);
  auto* dst = static_cast<uint16_t*>(out);
  const int64_t strip = gemm::kStripCols * k;  // elements
  const int64_t strips = n / gemm::kStripCols;
  const bool in_place = src == dst;
#pragma omp parallel
  {
    // Load-time, not a forward: in place, the rows are first copied aside.
    std::vector<uint16_t> rows(in_place ? static_cast<size_t>(strip) : 0);
#pragma omp for schedule(static)
    for (int64_t s = 0; s < strips; ++s) {
      const uint16_t* from = src + s * strip;
      if (in_place) {
        std::copy(from, from + strip, rows.begin());
        from = rows.data();
      }
      const WeightSource ws{from,  DType::kBF16, true,    gemm::kStripCols, k,
                            false, false,        nullptr, DType::kBF16};
      gemm::PackStrips(ws, 0, gemm::kStripCols, 0, k, dst + s * strip,
                       nullptr);
    }
  }
}

bool PanelsLayoutFits(int64_t n, int64_t k, DType dtype) {
  return IsComputeDType(dtype) && GemmFamilyOf(dtype) == GemmFamily::kFma &&
         n > 0 && k > 0 && n % gemm::kPanelCols == 0;
}

namespace {

// PackWeightPanels for elements of type T: per panel, its 16 rows copied
// aside, then written as [k][16] in blocks of 64 k (a 16 x 64 block fits L1).
template <typename T>
void PackPanelsOf(const T* src, int64_t n, int64_t k, T* dst) {
  constexpr int64_t kP = gemm::kPanelCols, kBlock = 64;
  const int64_t panel = kP * k;  // elements
#pragma omp parallel
  {
    // Load-time, not a forward: this thread's copy of the panel's rows.
    std::vector<T> rows(static_cast<size_t>(panel));
#pragma omp for schedule(static)
    for (int64_t p = 0; p < n / kP; ++p) {
      std::copy(src + p * panel, src + (p + 1) * panel, rows.begin());
      T* o = dst + p * panel;  // [k][16]
      for (int64_t k0 = 0; k0 < k; k0 += kBlock) {
        const int64_t k1 = std::min(k, k0 + kBlock);
        for (int64_t c = 0; c < kP; ++c) {
          const T* r = rows.data() + c * k;
          for (int64_t kk = k0; kk < k1; ++kk) o[kk * kP + c] = r[kk];
        }
      }
    }
  }
}

}  // namespace

void PackWeightPanels(const void* w, int64_t n, int64_t k, DType dtype,
                      void* out) {
  LOOM_CHECK(PanelsLayoutFits(n, k, dtype))
      << "panels of a [" << n << ", " << k << "] " << DTypeName(dtype)
      << " weight at the " << GemmPathName(dtype) << " level";
  if (dtype == DType::kF32)
    PackPanelsOf(static_cast<const float*>(w), n, k, static_cast<float*>(out));
  else
    PackPanelsOf(static_cast<const uint16_t*>(w), n, k,
                 static_cast<uint16_t*>(out));
}

int64_t GemmWorkspaceBytes(int64_t m, int64_t k, DType w_dtype) {
  if (m <= 0 || k <= 0) return 0;
  const GemmFamily f = GemmFamilyOf(w_dtype);
  return XCopyBytes(f, w_dtype, m, k) + NumThreads() * SlotOf(f, k).bytes();
}

struct GemmContext::Impl {
  // One GEMM ready for its tasks.
  struct Prepared {
    const GemmArgs* a = nullptr;
    WeightSource src;
    const float* xf = nullptr;     // fma: x rows as the tiles read them
    const uint16_t* xb = nullptr;  // dot / amx: the bf16 copy
    int64_t ldx = 0, ldy = 0;
    int64_t row_block = 0, row_blocks = 0, col_blocks = 0;
    int64_t tasks() const { return row_blocks * col_blocks; }
  };
  GemmFamily family = GemmFamily::kFma;
  DType compute = DType::kF32;
  char* slots = nullptr;
  SlotLayout slot;
  // Reused from call to call (host bookkeeping; grows on the first calls).
  std::vector<Prepared> prepared;
  std::vector<std::pair<int32_t, int32_t>> tasks;  // (GEMM, task)

  void Run(const GemmArgs* items, int64_t count, const float* x, int64_t rows,
           void* workspace, bool reuse_x);
  const void* PrepareX(const float* x, int64_t rows, int64_t k,
                       void* workspace, bool reuse);
  void Plan(Prepared& p, int threads, int64_t gemms);
  void RunTask(const Prepared& p, int64_t t, int slot_index);
  void RunFmaBlock(const Prepared& p, int64_t i0, int64_t i1, int64_t j0,
                   int64_t cols, int64_t k0, int64_t kc, char* slot_base);
  void RunBf16Block(const Prepared& p, int64_t i0, int64_t i1, int64_t j0,
                    int64_t cols, int64_t k0, int64_t kc, char* slot_base);
  const uint16_t* StripsOf(const Prepared& p, int64_t j0, int64_t cols,
                           int64_t k0, int64_t kc, char* slot_base,
                           int64_t* stride);
  void RunAmxTask(const Prepared& p, int64_t i0, int64_t i1, int64_t j0,
                  int64_t cols, char* slot_base);
};

// Rounds x [rows, k] into the workspace as the family reads it (or nothing:
// f32 x is read in place); returns what the tiles read.
const void* GemmContext::Impl::PrepareX(const float* x, int64_t rows, int64_t k,
                                        void* workspace, bool reuse) {
  if (family == GemmFamily::kFma && compute == DType::kF32) return x;
  LOOM_CHECK(workspace != nullptr) << "GEMM needs a workspace";
  LOOM_CHECK(reinterpret_cast<uintptr_t>(workspace) % 64 == 0)
      << "workspace not 64-byte aligned";
  if (reuse) return workspace;
  if (family == GemmFamily::kFma) {
    RoundToDTypeAsF32(x, static_cast<float*>(workspace), compute, rows * k);
    return workspace;
  }
  auto* out = static_cast<uint16_t*>(workspace);
  const int64_t padded = rows + 32;
  if (family == GemmFamily::kAmx) {
    const int64_t blocks = CeilDiv(padded, 16);
#pragma omp parallel for schedule(static) if (rows * k >= (1 << 16))
    for (int64_t b = 0; b < blocks; ++b)
      gemm::RoundXToBf16Blocks(x, rows, k, out, padded, b * 16,
                               std::min(padded, b * 16 + 16));
    return workspace;
  }
  const int64_t ldx = Bf16XStride(k);
  // Rows in blocks of 16 over the threads (each output row is one thread's).
  const int64_t blocks = CeilDiv(padded, 16);
#pragma omp parallel for schedule(static) if (rows * k >= (1 << 16))
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t r0 = b * 16, r1 = std::min(padded, r0 + 16);
    const int64_t real = std::clamp<int64_t>(rows - r0, 0, r1 - r0);
    gemm::RoundXToBf16(x + r0 * k, real, k, out + r0 * ldx, ldx, r1 - r0);
  }
  return workspace;
}

// The task grid of one GEMM: column blocks of NcOf(family), rows split into
// blocks (multiples of the family's row unit, at most kMaxRowBlock) when the
// column blocks of all `gemms` alone give the threads too few tasks.
void GemmContext::Impl::Plan(Prepared& p, int threads, int64_t gemms) {
  const GemmArgs& a = *p.a;
  const int64_t unit = RowUnit(family);
  p.col_blocks = CeilDiv(a.n, NcOf(family));
  int64_t row_blocks = CeilDiv(
      a.m, family == GemmFamily::kAmx ? kAmxRows : kMaxRowBlock);
  const int64_t want = 4 * threads;
  if (threads > 1 && p.col_blocks * gemms * row_blocks < want)
    row_blocks = std::max(row_blocks, CeilDiv(want, p.col_blocks * gemms));
  row_blocks = std::min(row_blocks, CeilDiv(a.m, unit));
  p.row_block = AlignUp(CeilDiv(a.m, row_blocks), unit);
  p.row_blocks = CeilDiv(a.m, p.row_block);
}

void GemmContext::Impl::RunFmaBlock(const Prepared& p, int64_t i0, int64_t i1,
                                    int64_t j0, int64_t cols, int64_t k0,
                                    int64_t kc, char* slot_base) {
  const FmaKernels& fk = Fma();
  const GemmArgs& a = *p.a;
  const WeightSource& src = p.src;
  // B: a kPanels weight read where it is (f32; 16-bit for few rows), or the
  // block packed into the slot as f32 panels.
  const bool direct = src.panels && (src.dtype == DType::kF32 ||
                                     i1 - i0 <= gemm::kFmaFewRows);
  const void* b = nullptr;
  int64_t pstride = 0;
  DType bt = DType::kF32;
  auto* scratch = reinterpret_cast<float*>(slot_base + slot.pack_bytes);
  auto* pack = reinterpret_cast<float*>(slot_base);
  if (direct) {
    pstride = gemm::kPanelCols * src.k;
    b = static_cast<const char*>(src.w) +
        ((j0 / gemm::kPanelCols) * pstride + k0 * gemm::kPanelCols) *
            DTypeSize(src.dtype);
    bt = src.dtype;
  } else {
    fk.pack(src, j0, cols, k0, kc, pack, scratch);
    b = pack;
    pstride = gemm::kPanelCols * kc;
  }
  const bool load_c = a.accumulate || k0 > 0;
  for (int64_t i = i0; i < i1;) {
    const int64_t rows = std::min(fk.mr, i1 - i);
    const int64_t width = fk.vectors(rows) * fk.lanes;
    for (int64_t jj = 0; jj < cols; jj += width) {
      const int64_t w = std::min(width, cols - jj);
      // Column jj: panel jj / 16, column jj % 16 of it.
      const void* bj = static_cast<const char*>(b) +
                       ((jj / gemm::kPanelCols) * pstride +
                        jj % gemm::kPanelCols) *
                           (direct ? DTypeSize(bt) : 4);
      int64_t ps = pstride;
      DType t = bt;
      if (direct && jj + width > AlignUp(cols, gemm::kPanelCols)) {
        // The tile would read panels past the weight's last one: its
        // columns go through the slot, zero-padded.
        fk.pack(src, j0 + jj, w, k0, kc, pack, scratch);
        bj = pack;
        ps = gemm::kPanelCols * kc;
        t = DType::kF32;
      }
      fk.tile(p.xf + i * p.ldx + k0, p.ldx, rows, bj, ps, t, kc,
              a.y + i * p.ldy + j0 + jj, p.ldy, w, load_c);
    }
    i += rows;
  }
}

void GemmContext::Impl::RunBf16Block(const Prepared& p, int64_t i0, int64_t i1,
                                     int64_t j0, int64_t cols, int64_t k0,
                                     int64_t kc, char* slot_base) {
  const GemmArgs& a = *p.a;
  const int64_t kcp = AlignUp(kc, gemm::kTileK);
  int64_t stride = 0;
  const uint16_t* pack = StripsOf(p, j0, cols, k0, kc, slot_base, &stride);
  const bool load_c = a.accumulate || k0 > 0;
  const uint16_t* x = p.xb + k0;
  for (int64_t i = i0; i < i1;) {
    const int64_t rows = std::min(gemm::kDotMr, i1 - i);
    const int64_t width = gemm::DotStripsForRows(rows) * gemm::kStripCols;
    for (int64_t jj = 0; jj < cols; jj += width)
      gemm::DotTile(x + i * p.ldx, p.ldx, rows,
                    BTile{pack + (jj / 16) * stride, stride}, kcp,
                    a.y + i * p.ldy + j0 + jj, p.ldy,
                    std::min(width, cols - jj), load_c);
    i += rows;
  }
}

// Columns [j0, j0 + cols), k [k0, k0 + kc) of the weight as bf16 strips:
// where a kStrips weight holds them, or packed into the slot.
const uint16_t* GemmContext::Impl::StripsOf(const Prepared& p, int64_t j0,
                                            int64_t cols, int64_t k0,
                                            int64_t kc, char* slot_base,
                                            int64_t* stride) {
  if (p.src.strips) {
    *stride = gemm::kStripCols * p.src.k;
    return static_cast<const uint16_t*>(p.src.w) +
           (j0 / gemm::kStripCols) * *stride + k0 * gemm::kStripCols;
  }
  auto* pack = reinterpret_cast<uint16_t*>(slot_base);
  auto* scratch = reinterpret_cast<float*>(slot_base + slot.pack_bytes);
  gemm::PackStrips(p.src, j0, cols, k0, kc, pack, scratch);
  *stride = gemm::kStripCols * AlignUp(kc, gemm::kTileK);
  return pack;
}

// An amx task: its C [rows, cols] lives in the slot as 16 x 16 tiles (rows
// and columns padded to 32), loaded from y first when accumulating, and goes
// to y (with the bias) once every K block is done.
void GemmContext::Impl::RunAmxTask(const Prepared& p, int64_t i0, int64_t i1,
                                   int64_t j0, int64_t cols, char* slot_base) {
  const GemmArgs& a = *p.a;
  const int64_t rows = i1 - i0;
  const int64_t rt = AlignUp(rows, 32) / 16, ct = AlignUp(cols, 32) / 16;
  auto* cs = reinterpret_cast<float*>(slot_base + slot.pack_bytes +
                                      slot.scratch_bytes);  // [rt][ct][16][16]
  if (a.accumulate) gemm::AmxLoadC(a.y + i0 * p.ldy + j0, p.ldy, rows, cols, cs, ct, rt);
  const int64_t kc = KcOf(family, a.k);
  // x block-major (RoundXToBf16Blocks): a 16-row tile is 1 KB contiguous.
  const gemm::ATile al{64, p.ldx, 16 * gemm::kTileK};
  // Without a bias, the last K block stores whole 32 x 32 blocks straight
  // into y (saved: one pass over C, 4 % of a TinyLlama forward); the rest
  // (the edges: rows past a multiple of 32, columns past one) go through
  // the tiles in the slot.
  const bool direct = a.bias == nullptr;
  const int64_t rows_direct = direct ? rows / 32 * 32 : 0;
  const int64_t cols_direct = direct ? cols / 32 * 32 : 0;
  float* y = a.y + i0 * p.ldy + j0;
  for (int64_t k0 = 0; k0 < a.k; k0 += kc) {
    const int64_t kcc = std::min(kc, a.k - k0);
    const int64_t kcp = AlignUp(kcc, gemm::kTileK);
    int64_t stride = 0;
    const uint16_t* b = StripsOf(p, j0, cols, k0, kcc, slot_base, &stride);
    const bool load_c = a.accumulate || k0 > 0;
    const uint16_t* x =
        p.xb + (k0 / gemm::kTileK) * p.ldx + i0 * gemm::kTileK;
    const bool last = k0 + kc >= a.k;
    for (int64_t ib = 0; ib < rt; ib += 2)
      for (int64_t jc = 0; jc < ct; jc += 2) {
        const bool to_y =
            last && ib * 16 < rows_direct && jc * 16 < cols_direct;
        gemm::AmxTile(x + ib * 16 * gemm::kTileK, al,
                      std::min<int64_t>(32, rows - ib * 16),
                      BTile{b + jc * stride, stride}, kcp,
                      cs + (ib * ct + jc) * 256, ct * 256,
                      std::min<int64_t>(32, cols - jc * 16), load_c,
                      to_y ? y + ib * 16 * p.ldy + jc * 16 : nullptr, p.ldy);
      }
  }
  // The rest of C; the bias joins here when it is f32 (the executor's),
  // other dtypes after.
  const bool f32_bias = a.bias != nullptr && a.bias_dtype == DType::kF32;
  const float* bias =
      f32_bias ? static_cast<const float*>(a.bias) + j0 : nullptr;
  gemm::AmxStoreC(cs, ct, 0, rows_direct, cols_direct, cols, y, p.ldy, bias);
  gemm::AmxStoreC(cs, ct, rows_direct, rows, 0, cols, y, p.ldy, bias);
  if (a.bias != nullptr && !f32_bias)
    AddBias(a.y, p.ldy, i0, i1, j0, j0 + cols, a.bias, a.bias_dtype);
}

// Task t of a GEMM: column block t / row_blocks, row block t % row_blocks,
// every K block in order.
void GemmContext::Impl::RunTask(const Prepared& p, int64_t t, int slot_index) {
  const GemmArgs& a = *p.a;
  const int64_t rb = t % p.row_blocks, cb = t / p.row_blocks;
  const int64_t i0 = rb * p.row_block, i1 = std::min(a.m, i0 + p.row_block);
  const int64_t nc = NcOf(family);
  const int64_t j0 = cb * nc, cols = std::min(nc, a.n - j0);
  char* base = slots + slot_index * slot.bytes();
  if (family == GemmFamily::kAmx) {
    RunAmxTask(p, i0, i1, j0, cols, base);  // with the bias
    return;
  } else {
    const int64_t kc = KcOf(family, a.k);
    for (int64_t k0 = 0; k0 < a.k; k0 += kc) {
      const int64_t kcc = std::min(kc, a.k - k0);
      if (family == GemmFamily::kFma)
        RunFmaBlock(p, i0, i1, j0, cols, k0, kcc, base);
      else
        RunBf16Block(p, i0, i1, j0, cols, k0, kcc, base);
    }
  }
  if (a.bias != nullptr)
    AddBias(a.y, p.ldy, i0, i1, j0, j0 + cols, a.bias, a.bias_dtype);
}

// The GEMMs `items` (all with the same k and compute dtype) whose inputs are
// row ranges of x [rows, k]: x is rounded once, then every task of every
// GEMM runs in one parallel region, the largest first.
void GemmContext::Impl::Run(const GemmArgs* items, int64_t count,
                            const float* x, int64_t rows, void* workspace,
                            bool reuse_x) {
  const GemmArgs& f = items[0];
  compute = f.w_dtype;
  family = GemmFamilyOf(compute);
  const int64_t k = f.k;
  for (int64_t i = 0; i < count; ++i) {
    const GemmArgs& a = items[i];
    LOOM_CHECK(a.k == k && a.w_dtype == compute)
        << "GEMM group item " << i << ": k=" << a.k << " vs " << k << ", "
        << DTypeName(a.w_dtype) << " vs " << DTypeName(compute);
    LOOM_CHECK(a.m >= 0 && a.n > 0 && a.x >= x && a.x + a.m * k <= x + rows * k &&
               (a.x - x) % k == 0)
        << "GEMM group item " << i << ": rows outside the group's x";
    LOOM_CHECK(a.y != nullptr && (a.m == 0 || a.w != nullptr || a.quant))
        << "null GEMM operand";
    LOOM_CHECK_GE(a.ldy == 0 ? a.n : a.ldy, a.n);
    if (a.bias != nullptr) LOOM_CHECK(IsComputeDType(a.bias_dtype));
  }
  const void* xp = PrepareX(x, rows, k, workspace, reuse_x);
  const int threads = NumThreads();
  slots = static_cast<char*>(workspace) + XCopyBytes(family, compute, rows, k);
  slot = SlotOf(family, k);
  prepared.clear();
  tasks.clear();
  for (int64_t i = 0; i < count; ++i) {
    const GemmArgs& a = items[i];
    Prepared p;
    p.a = &a;
    if (a.quant != nullptr) {
      LOOM_CHECK(a.quant->n == a.n && a.quant->k == k)
          << "quantized weight [" << a.quant->n << ", " << a.quant->k
          << "] for a GEMM n=" << a.n << " k=" << k;
      p.src = WeightSource{nullptr, compute, true,   a.n,   k,
                           false,   false,   a.quant, compute};
    } else {
      p.src = WeightSource{a.w,
                           a.w_dtype,
                           a.layout != WeightLayout::kInOut,
                           a.n,
                           k,
                           a.layout == WeightLayout::kStrips,
                           a.layout == WeightLayout::kPanels,
                           nullptr,
                           compute};
      LOOM_CHECK(!p.src.strips || (family != GemmFamily::kFma &&
                                   StripsLayoutFits(a.n, k, a.w_dtype)))
          << "a weight in kStrips [" << a.n << ", " << k << "] "
          << DTypeName(a.w_dtype) << " on the " << GemmPathName(compute)
          << " path, which does not read strips";
      LOOM_CHECK(!p.src.panels || (family == GemmFamily::kFma &&
                                   PanelsLayoutFits(a.n, k, a.w_dtype)))
          << "a weight in kPanels [" << a.n << ", " << k << "] "
          << DTypeName(a.w_dtype) << " on the " << GemmPathName(compute)
          << " path, which does not read panels";
    }
    const int64_t row0 = (a.x - x) / k;
    if (family == GemmFamily::kFma) {
      p.xf = static_cast<const float*>(xp) + row0 * k;
      p.ldx = k;
    } else if (family == GemmFamily::kAmx) {
      p.ldx = (rows + 32) * gemm::kTileK;  // elements from one 32-k block to the next
      p.xb = static_cast<const uint16_t*>(xp) + row0 * gemm::kTileK;
    } else {
      p.ldx = Bf16XStride(k);
      p.xb = static_cast<const uint16_t*>(xp) + row0 * p.ldx;
    }
    p.ldy = a.ldy == 0 ? a.n : a.ldy;
    prepared.push_back(p);
  }
  int64_t gemms = 0;
  for (const Prepared& p : prepared) gemms += p.a->m > 0 ? 1 : 0;
  for (size_t i = 0; i < prepared.size(); ++i) {
    Prepared& p = prepared[i];
    if (p.a->m == 0) continue;
    Plan(p, threads, gemms);
    for (int64_t t = 0; t < p.tasks(); ++t)
      tasks.emplace_back(static_cast<int32_t>(i), static_cast<int32_t>(t));
  }
  if (tasks.empty()) return;
  // Largest tasks (rows x columns) first, then in order.
  auto cost = [&](const std::pair<int32_t, int32_t>& task) {
    const Prepared& p = prepared[static_cast<size_t>(task.first)];
    const int64_t rb = task.second % p.row_blocks, cb = task.second / p.row_blocks;
    const int64_t nc = NcOf(family);
    return std::min(p.row_block, p.a->m - rb * p.row_block) *
           std::min(nc, p.a->n - cb * nc);
  };
  if (count > 1)
    std::stable_sort(tasks.begin(), tasks.end(),
                     [&](const auto& l, const auto& r) { return cost(l) > cost(r); });
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  const bool amx = family == GemmFamily::kAmx;
  if (threads == 1 || n_tasks == 1) {
    if (amx) gemm::AmxBegin();
    for (const auto& [g, t] : tasks) RunTask(prepared[static_cast<size_t>(g)], t, 0);
    if (amx) gemm::AmxEnd();
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    if (amx) gemm::AmxBegin();
    const int slot_index = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int64_t j = 0; j < n_tasks; ++j)
      RunTask(prepared[static_cast<size_t>(tasks[j].first)], tasks[j].second,
              slot_index);
    if (amx) gemm::AmxEnd();
  }
}

GemmContext::GemmContext() : impl_(std::make_unique<Impl>()) {}
GemmContext::~GemmContext() = default;

void GemmContext::Gemm(const GemmArgs& a) {
  LOOM_CHECK(a.m >= 0 && a.n > 0 && a.k > 0)
      << "m=" << a.m << " n=" << a.n << " k=" << a.k;
  if (a.m == 0) return;  // no rows (e.g. an empty batch)
  LOOM_CHECK(a.x != nullptr) << "null GEMM operand";
  LOOM_CHECK(IsComputeDType(a.w_dtype))
      << "w_dtype=" << static_cast<int>(a.w_dtype);
  impl_->Run(&a, 1, a.x, a.m, a.workspace, a.reuse_x_workspace);
}

void GemmContext::GemmGroup(const GemmArgs* items, int64_t count,
                            const float* x, int64_t rows, void* workspace) {
  if (count <= 0) return;
  LOOM_CHECK(x != nullptr && rows >= 0) << "null GEMM group input";
  impl_->Run(items, count, x, rows, workspace, /*reuse_x=*/false);
}

}  // namespace loom::cpu
