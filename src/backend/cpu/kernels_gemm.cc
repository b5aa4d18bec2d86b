// GEMMs through oneDNN matmul primitives, over a fixed grid of output tiles.
//
// Every GEMM is cut into tiles [rows, cols] that depend on (m, n) only
// (GemmTilesOf). Each tile is computed by one thread with a single-threaded
// oneDNN primitive (created with one OpenMP thread, cached per tile shape), so
// every output element is the same sum in the same order whatever the thread
// count: results are byte-identical for --threads 1, 2, N. Tiles are handed
// out dynamically (a descheduled thread's tiles are taken by the others).
//
// f32 weights: f32 x f32 -> f32. 16-bit weights: x is rounded to the weight's
// type (RNE) into the caller's workspace; then, when oneDNN multiplies that
// type natively at the active ISA (bf16: AVX-512, f16: AVX512-FP16), a 16-bit
// x 16-bit -> f32 primitive reads the weights in place (the [N, K] torch
// layout as B = W^T with strides {1, K}); otherwise each tile widens its
// weight panel to f32 in the calling thread's slot of the workspace and runs
// an f32 primitive on the rounded x (kept as f32). Products of two 16-bit
// values are exact in f32, so both are the same math with f32 accumulation;
// the weights stay stored as they are in the checkpoint either way.
#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/backend/cpu/codes_gemm.h"
#include "src/backend/cpu/isa.h"
#include "src/backend/cpu/kernels.h"
#include "src/backend/cpu/kernels_internal.h"
#include "src/backend/cpu/quant_decode.h"
#include "src/base/check.h"
#include "src/base/units.h"

namespace loom::cpu {
namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

dt ToDnnl(DType d) {
  switch (d) {
    case DType::kBF16:
      return dt::bf16;
    case DType::kF16:
      return dt::f16;
    default:
      return dt::f32;
  }
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Runs `fn` with OpenMP's thread count set to one on this thread, so that a
// oneDNN primitive created inside plans its work for one thread.
template <typename Fn>
auto WithOneThread(Fn fn) {
  struct Restore {
    int n;
    ~Restore() { omp_set_num_threads(n); }
  } restore{omp_get_max_threads()};
  omp_set_num_threads(1);
  return fn();
}

// Key of a cached primitive: every field that changes the primitive.
using Key = std::array<int64_t, 16>;
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : k) {
      h ^= static_cast<uint64_t>(v);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

// The memory objects one thread executes a primitive with (their data
// handles are swapped per call).
struct ThreadMems {
  dnnl::memory src, wei, dst, scratch;
};

struct Entry {
  dnnl::matmul prim;
  std::vector<ThreadMems> mems;  // one per thread slot
  int64_t scratch_bytes = 0;     // one thread's scratchpad slice (0: none)
  bool own_scratch = false;      // in the context's buffer, not the lent one
};

// Cache bound: past this many entries the cache is cleared (shapes in a model
// are few; this only guards against unbounded growth with many distinct M).
constexpr size_t kMaxEntries = 4096;

// A tile primitive's shape and operand types.
struct TileShape {
  int64_t m, n, k;
  dt src_dt, w_dt;
  int64_t w_rs, w_cs;  // weight [k, n] element strides
  bool accumulate;     // a sum post-op (y += x W^T)
  int64_t ldy;
  Key key() const {
    return {1,
            m,
            n,
            k,
            static_cast<int64_t>(src_dt),
            static_cast<int64_t>(w_dt),
            w_rs,
            w_cs,
            accumulate,
            ldy,
            0,
            0,
            0,
            0,
            0,
            0};
  }
};

const dnnl::engine& Engine() {
  static const dnnl::engine* const engine = [] {
    InitOneDnnIsa();
    return new dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return *engine;
}

// The primitive descriptor of tile `t`, planned for one thread (what the
// tiles run with) or, `one_thread` false, for OpenMP's current count.
dnnl::matmul::primitive_desc TilePd(const TileShape& t,
                                    dnnl::scratchpad_mode mode,
                                    bool one_thread = true) {
  dnnl::memory::desc src_md({t.m, t.k}, t.src_dt, dims{t.k, 1});
  dnnl::memory::desc w_md({t.k, t.n}, t.w_dt, dims{t.w_rs, t.w_cs});
  dnnl::memory::desc dst_md({t.m, t.n}, dt::f32, dims{t.ldy, 1});
  dnnl::primitive_attr attr;
  if (t.accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  attr.set_scratchpad_mode(mode);
  auto make = [&] {
    return dnnl::matmul::primitive_desc(
        dnnl::matmul::desc(src_md, w_md, dst_md), attr, Engine());
  };
  return one_thread ? WithOneThread(make) : make();
}

// The scratch one thread slot gets for a tile primitive: what oneDNN books
// for one thread, or for the whole thread count if that is more (a primitive
// may size buffers by the threads it sees when it runs).
int64_t SlotScratchBytes(const TileShape& t,
                         const dnnl::matmul::primitive_desc& one_thread) {
  int64_t bytes = static_cast<int64_t>(one_thread.scratchpad_desc().get_size());
  if (bytes > 0 && omp_get_max_threads() > 1) {
    const dnnl::matmul::primitive_desc all =
        TilePd(t, dnnl::scratchpad_mode::user, /*one_thread=*/false);
    bytes =
        std::max(bytes, static_cast<int64_t>(all.scratchpad_desc().get_size()));
  }
  return AlignUp(bytes, 64);
}

// Whether oneDNN has a real (non-reference) matmul for 16-bit `d` at the
// active ISA.
bool ProbeNative(DType d) {
  try {
    const dt t = ToDnnl(d);
    dnnl::matmul::primitive_desc pd =
        TilePd(TileShape{64, 64, 64, t, t, 1, 64, false, 64},
               dnnl::scratchpad_mode::library);
    return std::string(pd.impl_info_str()).find("ref") == std::string::npos;
  } catch (const dnnl::error&) {
    return false;
  }
}

// Bytes of the rounded copy of x at the start of a 16-bit GEMM's workspace.
int64_t XCopyBytes(int64_t m, int64_t k) { return AlignUp(m * k * 4, 64); }
// Bytes of one thread's widened weight panel.
int64_t PanelSlotBytes(int64_t k) {
  return AlignUp(kGemmTileMaxCols * k * 4, 64);
}

}  // namespace

bool NativeGemmDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return true;
    case DType::kBF16: {
      static const bool native =
          ActiveIsa() >= CpuIsa::kAvx512 && ProbeNative(DType::kBF16);
      return native;
    }
    case DType::kF16: {
      static const bool native = ActiveIsa() >= CpuIsa::kAvx512 &&
                                 DetectedCpuFeatures().avx512_fp16 &&
                                 ProbeNative(DType::kF16);
      return native;
    }
    default:
      return false;
  }
}

GemmTiling GemmTilesOf(int64_t m, int64_t n) {
  GemmTiling t;
  // About eight column tiles where n allows, 64 to 256 columns wide (a
  // multiple of 16); rows in blocks of at most 512.
  t.cols = n <= kGemmTileMinCols
               ? n
               : std::clamp(AlignUp(CeilDiv(n, 8), 16), kGemmTileMinCols,
                            kGemmTileMaxCols);
  t.rows = std::min(m, kGemmTileMaxRows);
  t.row_tiles = t.rows > 0 ? CeilDiv(m, t.rows) : 0;
  t.col_tiles = t.cols > 0 ? CeilDiv(n, t.cols) : 0;
  return t;
}

struct GemmContext::Impl {
  std::unordered_map<Key, Entry, KeyHash> cache;
  std::vector<dnnl::stream> streams;  // one per thread slot
  void* scratch = nullptr;            // borrowed, see SetScratchpad
  int64_t scratch_capacity = 0;
  int cache_threads = 0;  // the thread count the cache's entries were made for
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> own_scratch_buf;
  int64_t own_scratch_bytes = 0;

  // Makes sure there are `threads` thread slots (streams, and memory objects
  // in every entry made from now on); the cache is rebuilt when the count
  // changed (scratch slices depend on it).
  void PrepareThreads(int threads) {
    if (threads != cache_threads) {
      cache.clear();
      cache_threads = threads;
    }
    while (static_cast<int>(streams.size()) < threads)
      streams.emplace_back(Engine());
  }

  Entry& Get(const TileShape& t) {
    const Key key = t.key();
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    // Always a user scratchpad, one slice per thread slot: oneDNN's own
    // (library) scratchpad belongs to the primitive, and one primitive runs
    // on several threads at once here.
    dnnl::matmul::primitive_desc pd = TilePd(t, dnnl::scratchpad_mode::user);
    const int64_t scratch_bytes = SlotScratchBytes(t, pd);
    bool own_scratch = false;
    if (scratch_bytes * cache_threads > scratch_capacity) {
      // More than the lent scratchpad holds (or none was lent: tests,
      // benchmarks): the context's own, grown here, before any forward.
      own_scratch = true;
      if (scratch_bytes * cache_threads > own_scratch_bytes) {
        own_scratch_bytes = scratch_bytes * cache_threads;
        own_scratch_buf.reset(static_cast<char*>(
            std::aligned_alloc(64, static_cast<size_t>(own_scratch_bytes))));
        LOOM_CHECK(own_scratch_buf != nullptr)
            << "cannot allocate " << own_scratch_bytes
            << " bytes of GEMM scratchpad";
      }
    }
    Entry e;
    e.prim = WithOneThread([&] { return dnnl::matmul(pd); });
    e.scratch_bytes = scratch_bytes;
    e.own_scratch = own_scratch;
    const dnnl::engine& eng = Engine();
    e.mems.resize(static_cast<size_t>(cache_threads));
    for (ThreadMems& m : e.mems) {
      m.src = dnnl::memory(pd.src_desc(), eng, DNNL_MEMORY_NONE);
      m.wei = dnnl::memory(pd.weights_desc(), eng, DNNL_MEMORY_NONE);
      m.dst = dnnl::memory(pd.dst_desc(), eng, DNNL_MEMORY_NONE);
      if (scratch_bytes > 0)
        m.scratch = dnnl::memory(pd.scratchpad_desc(), eng, DNNL_MEMORY_NONE);
    }
    return cache.emplace(key, std::move(e)).first->second;
  }

  // Executes `e` on thread slot `slot` (no allocation: the C API with a
  // fixed argument array).
  void Run(Entry& e, int slot, const void* src, const void* wei, float* dst) {
    ThreadMems& m = e.mems[static_cast<size_t>(slot)];
    m.src.set_data_handle(const_cast<void*>(src));
    m.wei.set_data_handle(const_cast<void*>(wei));
    m.dst.set_data_handle(dst);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, m.src.get()},
                               {DNNL_ARG_WEIGHTS, m.wei.get()},
                               {DNNL_ARG_DST, m.dst.get()}};
    dnnl_exec_arg_t* next = args + 3;
    if (e.scratch_bytes > 0) {
      char* base =
          e.own_scratch ? own_scratch_buf.get() : static_cast<char*>(scratch);
      m.scratch.set_data_handle(base + slot * e.scratch_bytes);
      *next++ = {DNNL_ARG_SCRATCHPAD, m.scratch.get()};
    }
    const dnnl_status_t st = dnnl_primitive_execute(
        e.prim.get(), streams[static_cast<size_t>(slot)].get(),
        static_cast<int>(next - args), args);
    LOOM_CHECK(st == dnnl_success)
        << "oneDNN matmul failed: status " << static_cast<int>(st);
  }

  // One GEMM's tile grid with the primitives of its (up to four) tile
  // shapes, ready for RunTile on any thread slot.
  struct Tiled {
    const GemmArgs* a;
    int64_t ldy;
    const void* src;  // x as the primitives read it (rounded copy or x)
    bool widen;
    char* panels;  // thread slots' widened panels (widen only)
    GemmTiling g;
    Entry* entries[2][2];
    int64_t x_esize;
    int64_t tiles() const { return g.row_tiles * g.col_tiles; }
  };
  // GemmGroup's plans and (plan, tile) tasks, reused from call to call.
  std::vector<Tiled> group_plans;
  std::vector<std::pair<int64_t, int64_t>> group_tasks;
  void Gemm(const GemmArgs& a);
  // Rounds x (m x k) into the workspace as the GEMM reads it; returns what
  // the primitives read.
  const void* PrepareX(const GemmArgs& a, bool widen, int64_t rows);
  Tiled PrepareTiles(const GemmArgs& a, int64_t ldy, const void* src,
                     bool widen, char* panels);
  void RunTile(const Tiled& p, int64_t t, int slot);
  void GemmTiles(const GemmArgs& a, int64_t ldy, const void* src, bool widen);
  void GemmGroup(const GemmArgs* items, int64_t count, const float* x,
                 int64_t rows, void* workspace);
  void GemmSmall(const GemmArgs& a, int64_t ldy);
  void Matmul(const GemmContext::StridedMatmul& a);
};

int64_t GemmScratchpadBytes(int64_t m, int64_t n, int64_t k, DType w_dtype,
                            WeightLayout layout) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  const bool native = NativeGemmDType(w_dtype);
  const bool out_in = layout == WeightLayout::kOutIn;
  const dt t_dt = native ? ToDnnl(w_dtype) : dt::f32;
  const GemmTiling g = GemmTilesOf(m, n);
  int64_t most = 0;
  try {
    for (int64_t tm : {g.rows, m - (g.row_tiles - 1) * g.rows})
      for (int64_t tn : {g.cols, n - (g.col_tiles - 1) * g.cols}) {
        // In place: the weight's own strides; widened: the panel's.
        const int64_t w_rs = out_in ? 1 : (native ? n : tn);
        const int64_t w_cs = out_in ? k : 1;
        for (bool accumulate : {false, true}) {
          const TileShape t{tm, tn, k, t_dt, t_dt, w_rs, w_cs, accumulate, n};
          most = std::max(most, SlotScratchBytes(
                                    t, TilePd(t, dnnl::scratchpad_mode::user)));
        }
      }
  } catch (const dnnl::error&) {
    return 0;  // no primitive: the GEMM reports it when it runs
  }
  return most * NumThreads();
}

int64_t GemmWorkspaceBytes(int64_t m, int64_t k, DType w_dtype) {
  switch (w_dtype) {
    case DType::kBF16:
    case DType::kF16:
      return XCopyBytes(m, k) +
             (NativeGemmDType(w_dtype) ? 0 : NumThreads() * PanelSlotBytes(k));
    default:
      return 0;
  }
}

// Adds bias [n] (any supported dtype) to each of the m rows of y (row stride
// ldy).
static void AddBiasRows(float* y, int64_t ldy, int64_t m, int64_t n,
                        const void* bias, DType bias_dtype) {
#pragma omp parallel for schedule(static) if (m * n > 65536)
  for (int64_t i = 0; i < m; ++i) {
    float* row = y + i * ldy;
    if (bias_dtype == DType::kF32) {
      Add(static_cast<const float*>(bias), row, n);
    } else {
      for (int64_t j = 0; j < n; ++j)
        row[j] += LoadScalarAsF32(bias, bias_dtype, j);
    }
  }
}

void GemmContext::Impl::Gemm(const GemmArgs& a) {
  LOOM_CHECK(a.m >= 0 && a.n > 0 && a.k > 0)
      << "m=" << a.m << " n=" << a.n << " k=" << a.k;
  if (a.m == 0) return;  // no rows (e.g. an empty batch)
  LOOM_CHECK(a.x != nullptr && a.w != nullptr && a.y != nullptr)
      << "null GEMM operand";
  LOOM_CHECK(IsComputeDType(a.w_dtype))
      << "w_dtype=" << static_cast<int>(a.w_dtype);
  const DType x_dtype = a.x_dtype.value_or(a.w_dtype);
  LOOM_CHECK(IsComputeDType(x_dtype));
  const int64_t ldy = a.ldy == 0 ? a.n : a.ldy;
  LOOM_CHECK_GE(ldy, a.n);
  if (a.bias != nullptr) LOOM_CHECK(IsComputeDType(a.bias_dtype));

  // Measured against oneDNN (single thread, 5632 x 2048): the streaming kernel
  // is 1.3-1.7x faster for [N, K] weights up to m = 4, and for [K, N] weights
  // only at m = 1.
  if (HasAvx512() &&
      (a.layout == WeightLayout::kOutIn ? a.m <= kSmallGemmMaxM : a.m == 1)) {
    GemmSmall(a, ldy);
    return;
  }
  const bool widen = !NativeGemmDType(a.w_dtype);
  const void* src =
      a.reuse_x_workspace && x_dtype != DType::kF32 ? a.workspace : nullptr;
  if (src == nullptr) src = PrepareX(a, widen, a.m);
  GemmTiles(a, ldy, src, widen);
}

const void* GemmContext::Impl::PrepareX(const GemmArgs& a, bool widen,
                                        int64_t rows) {
  const DType x_dtype = a.x_dtype.value_or(a.w_dtype);
  if (x_dtype == DType::kF32) return a.x;
  LOOM_CHECK(a.workspace != nullptr) << "16-bit GEMM needs a workspace";
  LOOM_CHECK(reinterpret_cast<uintptr_t>(a.workspace) % 64 == 0)
      << "workspace not 64-byte aligned";
  // The native path reads x in the weight's type, the widened (and the
  // f32-weight) path reads the rounded values as f32.
  if (x_dtype == a.w_dtype && !widen)
    ConvertFromF32(a.x, a.workspace, a.w_dtype, rows * a.k);
  else
    RoundToDTypeAsF32(a.x, static_cast<float*>(a.workspace), x_dtype,
                      rows * a.k);
  return a.workspace;
}

GemmContext::Impl::Tiled GemmContext::Impl::PrepareTiles(
    const GemmArgs& a, int64_t ldy, const void* src, bool widen, char* panels) {
  Tiled p{&a, ldy, src, widen, panels, GemmTilesOf(a.m, a.n), {}, 4};
  const bool out_in = a.layout == WeightLayout::kOutIn;
  // What oneDNN multiplies: the stored type in place, or f32 panels.
  const dt t_dt = widen ? dt::f32 : ToDnnl(a.w_dtype);
  const dt src_dt =
      (a.x_dtype.value_or(a.w_dtype) == DType::kF32 || widen) ? dt::f32 : t_dt;
  p.x_esize = src_dt == dt::f32 ? 4 : 2;
  if (widen) LOOM_CHECK(panels != nullptr) << "16-bit GEMM needs a workspace";
  // The (up to four) tile shapes: full, last row tile, last column tile.
  const GemmTiling& g = p.g;
  for (int lr = 0; lr < 2; ++lr)
    for (int lc = 0; lc < 2; ++lc) {
      const int64_t tm = lr ? a.m - (g.row_tiles - 1) * g.rows : g.rows;
      const int64_t tn = lc ? a.n - (g.col_tiles - 1) * g.cols : g.cols;
      const int64_t w_rs = out_in ? 1 : (widen ? tn : a.n);
      const int64_t w_cs = out_in ? a.k : 1;
      p.entries[lr][lc] = &Get(
          TileShape{tm, tn, a.k, src_dt, t_dt, w_rs, w_cs, a.accumulate, ldy});
    }
  return p;
}

// Tile t: column tile t / row_tiles, row tile t % row_tiles. A widened panel
// is widened again for every row tile (M > 512): one pass over [cols, K] per
// [512, cols, K] of products.
void GemmContext::Impl::RunTile(const Tiled& p, int64_t t, int slot) {
  const GemmArgs& a = *p.a;
  const GemmTiling& g = p.g;
  const int64_t ct = t / g.row_tiles, rt = t % g.row_tiles;
  const int64_t i0 = rt * g.rows, j0 = ct * g.cols;
  const int64_t tn = std::min(g.cols, a.n - j0);
  Entry& e =
      *p.entries[rt == g.row_tiles - 1 ? 1 : 0][ct == g.col_tiles - 1 ? 1 : 0];
  const bool out_in = a.layout == WeightLayout::kOutIn;
  const void* w = nullptr;
  if (p.widen) {
    float* panel =
        reinterpret_cast<float*>(p.panels + slot * PanelSlotBytes(a.k));
    const auto* w16 = static_cast<const uint16_t*>(a.w);
    if (out_in) {
      // Rows j0..j0+tn of W [N, K] are contiguous: widen them as they are.
      ConvertToF32Serial(w16 + j0 * a.k, a.w_dtype, panel, tn * a.k);
    } else {
      // Columns j0..j0+tn of W [K, N]: a dense [K, tn] panel.
      for (int64_t q = 0; q < a.k; ++q)
        ConvertToF32Serial(w16 + q * a.n + j0, a.w_dtype, panel + q * tn, tn);
    }
    w = panel;
  } else {
    w = static_cast<const char*>(a.w) +
        (out_in ? j0 * a.k : j0) * DTypeSize(a.w_dtype);
  }
  Run(e, slot, static_cast<const char*>(p.src) + i0 * a.k * p.x_esize, w,
      a.y + i0 * p.ldy + j0);
}

// The tiles of one GEMM (GemmTilesOf), each on one thread.
void GemmContext::Impl::GemmTiles(const GemmArgs& a, int64_t ldy,
                                  const void* src, bool widen) {
  const int threads = NumThreads();
  PrepareThreads(threads);
  if (cache.size() + 4 >= kMaxEntries) cache.clear();
  if (widen)
    LOOM_CHECK(a.workspace != nullptr) << "16-bit GEMM needs a workspace";
  // Thread slot i's widened panel: after the rounded x, PanelSlotBytes each.
  char* panels =
      widen ? static_cast<char*>(a.workspace) + XCopyBytes(a.m, a.k) : nullptr;
  const Tiled p = PrepareTiles(a, ldy, src, widen, panels);
  const int64_t tiles = p.tiles();
  if (tiles == 1 || threads == 1) {
    // Outside a parallel region oneDNN would thread the primitive itself.
    WithOneThread([&] {
      for (int64_t t = 0; t < tiles; ++t) RunTile(p, t, 0);
      return 0;
    });
  } else {
    // Inside the region each primitive runs on its calling thread.
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t t = 0; t < tiles; ++t) RunTile(p, t, omp_get_thread_num());
  }
  // The bias is added here, never given to oneDNN: its bias post-processing
  // books scratch by the thread count it sees when it runs, more than a
  // one-thread primitive declares (measured: tiles on two threads overwrote
  // each other's slices).
  if (a.bias != nullptr) AddBiasRows(a.y, ldy, a.m, a.n, a.bias, a.bias_dtype);
}

// Several GEMMs whose inputs are row ranges of one x [rows, k] (experts):
// x is rounded once, then every tile of every GEMM is a task of one parallel
// region, the largest (rows x columns) first. Each tile is the primitive
// GemmTiles would run for it, so every output is bit-identical to the GEMMs
// run one by one, at any thread count.
void GemmContext::Impl::GemmGroup(const GemmArgs* items, int64_t count,
                                  const float* x, int64_t rows,
                                  void* workspace) {
  const GemmArgs& f = items[0];
  for (int64_t i = 0; i < count; ++i) {
    const GemmArgs& a = items[i];
    LOOM_CHECK(a.k == f.k && a.w_dtype == f.w_dtype &&
               a.x_dtype.value_or(a.w_dtype) == f.x_dtype.value_or(f.w_dtype))
        << "GEMM group item " << i << ": k=" << a.k << " vs " << f.k;
    LOOM_CHECK(a.m > 0 && a.n > 0 && a.x >= x &&
               a.x + a.m * a.k <= x + rows * f.k && (a.x - x) % f.k == 0)
        << "GEMM group item " << i << ": rows outside the group's x";
  }
  const bool widen = !NativeGemmDType(f.w_dtype);
  if (widen || f.x_dtype.value_or(f.w_dtype) != DType::kF32)
    LOOM_CHECK(workspace != nullptr) << "16-bit GEMM needs a workspace";
  GemmArgs whole = f;
  whole.x = x;
  whole.workspace = workspace;
  const char* src = static_cast<const char*>(PrepareX(whole, widen, rows));
  const int threads = NumThreads();
  PrepareThreads(threads);
  if (cache.size() + 4 * static_cast<size_t>(count) >= kMaxEntries)
    cache.clear();
  char* panels =
      widen ? static_cast<char*>(workspace) + XCopyBytes(rows, f.k) : nullptr;
  // Host bookkeeping kept by the context: its capacity grows on the first
  // groups, later calls allocate nothing.
  std::vector<Tiled>& plans = group_plans;
  std::vector<std::pair<int64_t, int64_t>>& tasks =
      group_tasks;  // (plan, tile)
  plans.clear();
  tasks.clear();
  for (int64_t i = 0; i < count; ++i) {
    const GemmArgs& a = items[i];
    const int64_t ldy = a.ldy == 0 ? a.n : a.ldy;
    plans.push_back(PrepareTiles(a, ldy, nullptr, widen, panels));
    Tiled& p = plans.back();
    p.src = src + (a.x - x) * p.x_esize;
    for (int64_t t = 0; t < p.tiles(); ++t) tasks.emplace_back(i, t);
  }
  // Largest tiles first (rows x columns of the tile), then in item order.
  auto cost = [&](const std::pair<int64_t, int64_t>& task) {
    const Tiled& p = plans[static_cast<size_t>(task.first)];
    const int64_t rt = task.second % p.g.row_tiles;
    const int64_t ct = task.second / p.g.row_tiles;
    return std::min(p.g.rows, p.a->m - rt * p.g.rows) *
           std::min(p.g.cols, p.a->n - ct * p.g.cols);
  };
  std::sort(tasks.begin(), tasks.end(), [&](const auto& l, const auto& r) {
    const int64_t cl = cost(l), cr = cost(r);
    return cl != cr ? cl > cr : l < r;
  });
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  if (threads == 1 || n_tasks == 1) {
    WithOneThread([&] {
      for (const auto& [i, t] : tasks) RunTile(plans[i], t, 0);
      return 0;
    });
  } else {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t j = 0; j < n_tasks; ++j)
      RunTile(plans[static_cast<size_t>(tasks[j].first)], tasks[j].second,
              omp_get_thread_num());
  }
  for (const Tiled& p : plans)
    if (p.a->bias != nullptr)
      AddBiasRows(p.a->y, p.ldy, p.a->m, p.a->n, p.a->bias, p.a->bias_dtype);
}

void GemmContext::Impl::GemmSmall(const GemmArgs& a, int64_t ldy) {
  const float* x = a.x;
  const DType x_dtype = a.x_dtype.value_or(a.w_dtype);
  if (x_dtype != DType::kF32) {
    LOOM_CHECK(a.workspace != nullptr) << "16-bit GEMM needs a workspace";
    float* xr =
        static_cast<float*>(a.workspace);  // [m, k] rounded to the weight type
    if (!a.reuse_x_workspace) RoundToDTypeAsF32(a.x, xr, x_dtype, a.m * a.k);
    x = xr;
  }
  SmallGemm g{x,
              a.m,
              a.k,
              a.n,
              a.w,
              a.w_dtype,
              a.layout == WeightLayout::kOutIn,
              a.bias,
              a.bias_dtype,
              a.y,
              ldy,
              a.accumulate};
  const int64_t cols =
      g.out_in ? kSmallGemmColumnBlockOutIn : kSmallGemmColumnBlockInOut;
  const int64_t blocks = (a.n + cols - 1) / cols;
  // Each output column is computed by one thread in a fixed order: the result
  // does not depend on the thread count.
  // Dynamic: on a shared machine a descheduled thread's blocks are taken over
  // by the others (static halves would wait for it).
#pragma omp parallel for schedule(dynamic, 2) if (a.n * a.k >= (1 << 16))
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t n0 = b * cols;
    avx512::SmallGemmColumns(g, n0, std::min(a.n, n0 + cols));
  }
}

void GemmContext::Impl::Matmul(const GemmContext::StridedMatmul& a) {
  LOOM_CHECK(a.a != nullptr && a.b != nullptr && a.c != nullptr)
      << "null matmul operand";
  LOOM_CHECK(a.batch > 0 && a.m > 0 && a.n > 0 && a.k > 0)
      << "batch=" << a.batch << " m=" << a.m << " n=" << a.n << " k=" << a.k;
  // Batch strides only matter when batch > 1; give oneDNN a harmless value
  // otherwise.
  const bool batched = a.batch > 1;
  const Key key = {2,
                   a.batch,
                   a.m,
                   a.n,
                   a.k,
                   a.a_rs,
                   a.a_cs,
                   batched ? a.a_bs : 0,
                   a.b_rs,
                   a.b_cs,
                   batched ? a.b_bs : 0,
                   a.c_rs,
                   batched ? a.c_bs : 0,
                   std::bit_cast<int32_t>(a.alpha),
                   0,
                   0};
  if (cache_threads == 0) PrepareThreads(NumThreads());
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= kMaxEntries) cache.clear();
    const int64_t a_bs = batched ? a.a_bs : a.m * a.k;
    const int64_t b_bs = batched ? a.b_bs : a.k * a.n;
    const int64_t c_bs = batched ? a.c_bs : a.m * a.n;
    dnnl::memory::desc a_md({a.batch, a.m, a.k}, dt::f32,
                            dims{a_bs, a.a_rs, a.a_cs});
    dnnl::memory::desc b_md({a.batch, a.k, a.n}, dt::f32,
                            dims{b_bs, a.b_rs, a.b_cs});
    dnnl::memory::desc c_md({a.batch, a.m, a.n}, dt::f32,
                            dims{c_bs, a.c_rs, 1});
    dnnl::primitive_attr attr;
    if (a.alpha != 1.0f) attr.set_output_scales(0, {a.alpha});
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr,
                                    Engine());
    Entry e;
    e.prim = dnnl::matmul(pd);
    e.mems.resize(1);
    e.mems[0].src = dnnl::memory(a_md, Engine(), DNNL_MEMORY_NONE);
    e.mems[0].wei = dnnl::memory(b_md, Engine(), DNNL_MEMORY_NONE);
    e.mems[0].dst = dnnl::memory(c_md, Engine(), DNNL_MEMORY_NONE);
    it = cache.emplace(key, std::move(e)).first;
  }
  // Not tiled: the forward does not use it (attention has its own kernel).
  Run(it->second, 0, a.a, a.b, a.c);
}

GemmContext::GemmContext() {
  try {
    impl_ = std::make_unique<Impl>();
  } catch (const dnnl::error& e) {
    LOOM_CHECK(false) << "oneDNN: " << e.what();
  }
}

GemmContext::~GemmContext() = default;

void GemmContext::Gemm(const GemmArgs& args) {
  // After a GEMM on the codes the workspace holds its f32 copy of x, which
  // is not the copy a native 16-bit GEMM reads: no reuse then.
  GemmArgs a = args;
  if (last_codes_) a.reuse_x_workspace = false;
  last_codes_ = false;
  try {
    impl_->Gemm(a);
  } catch (const dnnl::error& e) {
    LOOM_CHECK(false) << "oneDNN GEMM m=" << args.m << " n=" << args.n
                      << " k=" << args.k << ": " << e.what();
  }
}

void GemmContext::GemmGroup(const GemmArgs* items, int64_t count,
                            const float* x, int64_t rows, void* workspace) {
  if (count <= 0) return;
  last_codes_ = false;  // the workspace now holds the group's copy
  try {
    impl_->GemmGroup(items, count, x, rows, workspace);
  } catch (const dnnl::error& e) {
    LOOM_CHECK(false) << "oneDNN GEMM group of " << count << ": " << e.what();
  }
}

void GemmContext::GemmQuantized(const GemmArgs& args, const QuantMatrix& w,
                                void* decode_workspace,
                                int64_t decode_workspace_bytes) {
  LOOM_CHECK(w.kind != FormatKind::kDense && w.n > 0 && w.k > 0)
      << "quantized GEMM of a dense or empty weight: n=" << w.n << " k=" << w.k;
  const int64_t need =
      QuantDecodeWorkspaceBytes(w.n, w.k, w.kind, args.w_dtype);
  LOOM_CHECK(decode_workspace != nullptr && decode_workspace_bytes >= need)
      << "quantized GEMM n=" << w.n << " k=" << w.k << " ("
      << FormatName(w.kind) << " -> " << DTypeName(args.w_dtype)
      << "): weight decode workspace of " << decode_workspace_bytes
      << " bytes, needs " << need << " (planned by the weight decode term)";
  LOOM_CHECK(reinterpret_cast<uintptr_t>(decode_workspace) % 64 == 0)
      << "decode workspace not 64-byte aligned";
  if (args.m == 0) return;
  const int64_t ldy = args.ldy == 0 ? w.n : args.ldy;
  if (UsesCodes(args.m, w.kind)) {
    GemmQuantizedGroup(&args, &w, 1, args.x, args.m, args.workspace,
                       decode_workspace, decode_workspace_bytes);
    return;
  }
  const int64_t bias_size =
      args.bias != nullptr ? DTypeSize(args.bias_dtype) : 0;
  // A 16-bit compute dtype the ISA cannot multiply natively: the panel is
  // decoded to f32 and rounded to the compute dtype there (the same values
  // as a 16-bit panel), and x is rounded to it.
  const bool native = NativeGemmDType(args.w_dtype);
  const DType panel_dtype = native ? args.w_dtype : DType::kF32;
  for (int64_t j0 = 0; j0 < w.n; j0 += kQuantPanelRows) {
    const int64_t nc = std::min(kQuantPanelRows, w.n - j0);
    DecodeRows(w, j0, nc, panel_dtype, decode_workspace);  // [nc, k]
    if (panel_dtype != args.w_dtype && !DecodeIsExactIn(w.kind, args.w_dtype))
      RoundToDTypeAsF32(static_cast<const float*>(decode_workspace),
                        static_cast<float*>(decode_workspace), args.w_dtype,
                        nc * w.k);
    GemmArgs p = args;
    p.w = decode_workspace;
    p.w_dtype = panel_dtype;
    p.x_dtype = args.x_dtype.value_or(args.w_dtype);
    p.layout = WeightLayout::kOutIn;
    p.n = nc;
    p.k = w.k;
    p.ldy = ldy;
    p.y = args.y + j0;
    p.bias = args.bias != nullptr
                 ? static_cast<const uint8_t*>(args.bias) + j0 * bias_size
                 : nullptr;
    // Every panel multiplies the same x: its 16-bit copy is made once.
    p.reuse_x_workspace = args.reuse_x_workspace || j0 > 0;
    Gemm(p);
  }
}

void GemmContext::GemmQuantizedGroup(const GemmArgs* items,
                                     const QuantMatrix* w, int64_t count,
                                     const float* x, int64_t rows,
                                     void* workspace, void* decode_workspace,
                                     int64_t decode_workspace_bytes) {
  if (count <= 0) return;
  const DType compute = items[0].w_dtype;
  const int64_t k = w[0].k;
  // x rounded to the compute dtype (an f32 copy) unless it is f32.
  const float* xr = x;
  if (compute != DType::kF32) {
    LOOM_CHECK(workspace != nullptr) << "16-bit GEMM needs a workspace";
    float* copy = static_cast<float*>(workspace);  // [rows, k]
    RoundToDTypeAsF32(x, copy, compute, rows * k);
    xr = copy;
  }
  // Host bookkeeping kept by the context: grows on the first groups only.
  std::vector<CodesGemmItem>& list = codes_items_;
  list.clear();
  for (int64_t i = 0; i < count; ++i) {
    const GemmArgs& a = items[i];
    LOOM_CHECK(a.w_dtype == compute && w[i].k == k && a.x >= x &&
               a.x + a.m * k <= x + rows * k && (a.x - x) % k == 0)
        << "quantized GEMM group item " << i << ": k=" << w[i].k << " vs " << k
        << ", compute " << DTypeName(a.w_dtype) << " vs " << DTypeName(compute)
        << ", or rows outside the group's x";
    CodesGemmItem c;
    c.x = xr + (a.x - x);
    c.m = a.m;
    c.w = w[i];
    c.y = a.y;
    c.ldy = a.ldy;
    c.accumulate = a.accumulate;
    c.bias = a.bias;
    c.bias_dtype = a.bias_dtype;
    list.push_back(c);
  }
  CodesGemm(list.data(), count, compute, decode_workspace,
            decode_workspace_bytes);
  last_codes_ = true;
}

bool GemmContext::UsesCodes(int64_t m, FormatKind kind) const {
  switch (quant_path_) {
    case QuantPath::kPanels:
      return false;
    case QuantPath::kCodes:
      return true;
    case QuantPath::kAuto:
      break;
  }
  return m <= CodesGemmMaxRows(kind);
}

void GemmContext::SetScratchpad(void* scratch, int64_t bytes) {
  LOOM_CHECK(bytes == 0 || reinterpret_cast<uintptr_t>(scratch) % 64 == 0)
      << "scratchpad not 64-byte aligned";
  // Primitives were built for the old capacity.
  if (bytes != impl_->scratch_capacity) impl_->cache.clear();
  impl_->scratch = scratch;
  impl_->scratch_capacity = bytes;
}

void GemmContext::Matmul(const StridedMatmul& args) {
  try {
    impl_->Matmul(args);
  } catch (const dnnl::error& e) {
    LOOM_CHECK(false) << "oneDNN matmul batch=" << args.batch << " m=" << args.m
                      << " n=" << args.n << " k=" << args.k << ": " << e.what();
  }
}

}  // namespace loom::cpu
