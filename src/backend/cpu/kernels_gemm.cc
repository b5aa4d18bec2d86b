// GEMMs through oneDNN matmul primitives, cached per shape.
//
// f32 weights: f32 x f32 -> f32. bf16 weights: x is rounded to bf16 into the
// caller's workspace, then bf16 x bf16 -> f32 (weights used in place, oneDNN
// reads the [N, K] torch layout as B = W^T with strides {1, K}). f16 weights:
// when the CPU has no native f16 matmul (oneDNN would pick its reference
// implementation), x is rounded to f16 and kept as f32, the weights are
// widened to f32 one column panel at a time into the workspace, and an f32
// matmul runs per panel. f16 x f16 products are exact in f32, so this is the
// same math as an f16 matmul with f32 accumulation.
#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>

#include "src/backend/cpu/kernels.h"
#include "src/backend/cpu/kernels_internal.h"
#include "src/backend/cpu/quant_decode.h"
#include "src/base/check.h"
#include "src/base/units.h"

namespace loom::cpu {
namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

// Columns of an f16 weight widened to f32 per panel (fallback path).
constexpr int64_t kF16Panel = 256;


dt ToDnnl(DType d) {
  switch (d) {
    case DType::kF32:
      return dt::f32;
    case DType::kBF16:
      return dt::bf16;
    case DType::kF16:
      return dt::f16;
    default:
      LOOM_CHECK(false) << "unsupported GEMM dtype " << static_cast<int>(d);
  }
  return dt::undef;
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

struct Entry {
  dnnl::matmul prim;
  dnnl::memory src, wei, bias, dst, scratch;
  int64_t scratch_bytes = 0;  // user-managed scratchpad (0: none or oneDNN's)
  bool has_bias = false;
  bool is_ref = false;  // oneDNN chose its (slow) reference implementation
};

// Cache bound: past this many entries the cache is cleared (shapes in a model
// are few; this only guards against unbounded growth with many distinct M).
constexpr size_t kMaxEntries = 4096;

}  // namespace

struct GemmContext::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::unordered_map<Key, Entry, KeyHash> cache;
  void* scratch = nullptr;  // borrowed, see SetScratchpad
  int64_t scratch_capacity = 0;

  // Plain 2D matmul: src [m, k] (row stride k), weights [k, n] with strides
  // (w_rs, w_cs), dst [m, n] row stride ldy, optional bias [1, n].
  Entry& Get2d(int64_t m, int64_t n, int64_t k, dt src_dt, dt w_dt,
               int64_t w_rs, int64_t w_cs, bool bias, dt bias_dt,
               bool accumulate, int64_t ldy) {
    const Key key = {1,
                     m,
                     n,
                     k,
                     static_cast<int64_t>(src_dt),
                     static_cast<int64_t>(w_dt),
                     w_rs,
                     w_cs,
                     bias,
                     static_cast<int64_t>(bias_dt),
                     accumulate,
                     ldy,
                     0,
                     0,
                     0,
                     0};
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    if (cache.size() >= kMaxEntries) cache.clear();
    dnnl::memory::desc src_md({m, k}, src_dt, dims{k, 1});
    dnnl::memory::desc w_md({k, n}, w_dt, dims{w_rs, w_cs});
    dnnl::memory::desc dst_md({m, n}, dt::f32, dims{ldy, 1});
    dnnl::memory::desc b_md;
    if (bias) b_md = dnnl::memory::desc({1, n}, bias_dt, dims{n, 1});
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    dnnl::matmul::desc desc =
        bias ? dnnl::matmul::desc(src_md, w_md, b_md, dst_md)
             : dnnl::matmul::desc(src_md, w_md, dst_md);
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::matmul::primitive_desc pd(desc, attr, engine);
    int64_t scratch_bytes = static_cast<int64_t>(pd.scratchpad_desc().get_size());
    if (scratch_bytes > scratch_capacity) {
      // More than the planned scratchpad (or none was given): oneDNN manages
      // this primitive's scratch itself.
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::library);
      pd = dnnl::matmul::primitive_desc(desc, attr, engine);
      scratch_bytes = 0;
    }
    Entry e;
    e.prim = dnnl::matmul(pd);
    e.scratch_bytes = scratch_bytes;
    if (scratch_bytes > 0) e.scratch = dnnl::memory(pd.scratchpad_desc(), engine, DNNL_MEMORY_NONE);
    e.is_ref = std::string(pd.impl_info_str()).find("ref") != std::string::npos;
    e.src = dnnl::memory(src_md, engine, DNNL_MEMORY_NONE);
    e.wei = dnnl::memory(w_md, engine, DNNL_MEMORY_NONE);
    e.dst = dnnl::memory(dst_md, engine, DNNL_MEMORY_NONE);
    e.has_bias = bias;
    if (bias) e.bias = dnnl::memory(b_md, engine, DNNL_MEMORY_NONE);
    return cache.emplace(key, std::move(e)).first->second;
  }

  void Run(Entry& e, const void* src, const void* wei, const void* bias,
           float* dst) {
    e.src.set_data_handle(const_cast<void*>(src));
    e.wei.set_data_handle(const_cast<void*>(wei));
    e.dst.set_data_handle(dst);
    // The C API with a fixed argument array: the C++ execute() builds
    // containers on every call, and a forward must not allocate.
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, e.src.get()},
                               {DNNL_ARG_WEIGHTS, e.wei.get()},
                               {DNNL_ARG_DST, e.dst.get()},
                               {DNNL_ARG_BIAS, nullptr}};
    if (e.has_bias) {
      e.bias.set_data_handle(const_cast<void*>(bias));
      args[3].memory = e.bias.get();
    }
    dnnl_exec_arg_t* next = args + (e.has_bias ? 4 : 3);
    if (e.scratch_bytes > 0) {
      e.scratch.set_data_handle(scratch);
      *next++ = {DNNL_ARG_SCRATCHPAD, e.scratch.get()};
    }
    const dnnl_status_t st = dnnl_primitive_execute(
        e.prim.get(), stream.get(), static_cast<int>(next - args), args);
    LOOM_CHECK(st == dnnl_success)
        << "oneDNN matmul failed: status " << static_cast<int>(st);
    stream.wait();
  }

  // Whether oneDNN has a real (non-reference) f16 matmul on this CPU.
  int native_f16 = -1;
  bool NativeF16() {
    if (native_f16 < 0) {
      try {
        Entry& e = Get2d(64, 64, 64, dt::f16, dt::f16, 1, 64, false, dt::f32,
                         false, 64);
        native_f16 = e.is_ref ? 0 : 1;
      } catch (const dnnl::error&) {
        native_f16 = 0;
      }
    }
    return native_f16 == 1;
  }

  void Gemm(const GemmArgs& a);
  void GemmF16Panels(const GemmArgs& a, int64_t ldy);
  void GemmSmall(const GemmArgs& a, int64_t ldy);
  void Matmul(const GemmContext::StridedMatmul& a);
};

int64_t GemmScratchpadBytes(int64_t m, int64_t n, int64_t k, DType w_dtype,
                            WeightLayout layout) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  try {
    static const dnnl::engine* const engine =
        new dnnl::engine(dnnl::engine::kind::cpu, 0);
    const bool out_in = layout == WeightLayout::kOutIn;
    const dt w_dt = ToDnnl(w_dtype);
    dnnl::memory::desc src_md({m, k}, w_dt, dims{k, 1});
    dnnl::memory::desc w_md({k, n}, w_dt, dims{out_in ? 1 : n, out_in ? k : 1});
    dnnl::memory::desc dst_md({m, n}, dt::f32, dims{n, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, w_md, dst_md),
                                    attr, *engine);
    return AlignUp(static_cast<int64_t>(pd.scratchpad_desc().get_size()), 64);
  } catch (const dnnl::error& e) {
    LOOM_CHECK(false) << "oneDNN: " << e.what();
  }
  return 0;
}

int64_t GemmWorkspaceBytes(int64_t m, int64_t k, DType w_dtype) {
  switch (w_dtype) {
    case DType::kBF16:
    case DType::kF16:
      // bf16/f16 copy of x; the f16 fallback needs an f32 copy of x plus one
      // widened weight panel. Take the larger so either path fits.
      return AlignUp(m * k * 4, 64) + AlignUp(kF16Panel * k * 4, 64);
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
  const int64_t ldy = a.ldy == 0 ? a.n : a.ldy;
  LOOM_CHECK_GE(ldy, a.n);
  const bool out_in = a.layout == WeightLayout::kOutIn;
  const int64_t w_rs = out_in ? 1 : a.n;
  const int64_t w_cs = out_in ? a.k : 1;
  if (a.bias != nullptr) LOOM_CHECK(IsComputeDType(a.bias_dtype));

  // Measured against oneDNN (single thread, 5632 x 2048): the streaming kernel
  // is 1.3-1.7x faster for [N, K] weights up to m = 4, and for [K, N] weights
  // only at m = 1.
  if (HasAvx512() &&
      (a.layout == WeightLayout::kOutIn ? a.m <= kSmallGemmMaxM : a.m == 1)) {
    GemmSmall(a, ldy);
    return;
  }
  if (a.w_dtype == DType::kF16 && !NativeF16()) {
    GemmF16Panels(a, ldy);
    return;
  }
  const void* src = a.x;
  if (a.w_dtype != DType::kF32) {
    LOOM_CHECK(a.workspace != nullptr) << "16-bit GEMM needs a workspace";
    LOOM_CHECK(reinterpret_cast<uintptr_t>(a.workspace) % 64 == 0)
        << "workspace not 64-byte aligned";
    if (!a.reuse_x_workspace)
      ConvertFromF32(a.x, a.workspace, a.w_dtype, a.m * a.k);
    src = a.workspace;
  }
  // oneDNN takes an f32 bias, or one of the weight's type.
  const bool dnnl_bias = a.bias != nullptr && (a.bias_dtype == DType::kF32 ||
                                               a.bias_dtype == a.w_dtype);
  Entry& e = Get2d(a.m, a.n, a.k, ToDnnl(a.w_dtype), ToDnnl(a.w_dtype), w_rs,
                   w_cs, dnnl_bias, dnnl_bias ? ToDnnl(a.bias_dtype) : dt::f32,
                   a.accumulate, ldy);
  Run(e, src, a.w, dnnl_bias ? a.bias : nullptr, a.y);
  if (a.bias != nullptr && !dnnl_bias)
    AddBiasRows(a.y, ldy, a.m, a.n, a.bias, a.bias_dtype);
}

void GemmContext::Impl::GemmF16Panels(const GemmArgs& a, int64_t ldy) {
  LOOM_CHECK(a.workspace != nullptr) << "16-bit GEMM needs a workspace";
  LOOM_CHECK(reinterpret_cast<uintptr_t>(a.workspace) % 64 == 0)
      << "workspace not 64-byte aligned";
  float* xr = static_cast<float*>(a.workspace);  // [m, k]
  float* panel = reinterpret_cast<float*>(
      static_cast<char*>(a.workspace) + AlignUp(a.m * a.k * 4, 64));  // [nc, k]
  // x rounded to f16 (as f32).
  if (!a.reuse_x_workspace) RoundToDTypeAsF32(a.x, xr, DType::kF16, a.m * a.k);
  const uint16_t* w = static_cast<const uint16_t*>(a.w);
  const bool out_in = a.layout == WeightLayout::kOutIn;
  const bool dnnl_bias = a.bias != nullptr && a.bias_dtype == DType::kF32;
  for (int64_t j0 = 0; j0 < a.n; j0 += kF16Panel) {
    const int64_t nc = std::min(kF16Panel, a.n - j0);
    if (out_in) {
      // Rows j0..j0+nc of W [N, K] are contiguous: widen them as they are.
      ConvertToF32(w + j0 * a.k, DType::kF16, panel, nc * a.k);
    } else {
      // Columns j0..j0+nc of W [K, N]: gather into a dense [K, nc] panel.
#pragma omp parallel for schedule(static)
      for (int64_t p = 0; p < a.k; ++p)
        ConvertToF32Serial(w + p * a.n + j0, DType::kF16, panel + p * nc, nc);
    }
    Entry& e = Get2d(a.m, nc, a.k, dt::f32, dt::f32, out_in ? 1 : nc,
                     out_in ? a.k : 1, dnnl_bias, dt::f32, a.accumulate, ldy);
    Run(e, xr, panel,
        dnnl_bias ? static_cast<const float*>(a.bias) + j0 : nullptr, a.y + j0);
  }
  if (a.bias != nullptr && !dnnl_bias)
    AddBiasRows(a.y, ldy, a.m, a.n, a.bias, a.bias_dtype);
}

void GemmContext::Impl::GemmSmall(const GemmArgs& a, int64_t ldy) {
  const float* x = a.x;
  if (a.w_dtype != DType::kF32) {
    LOOM_CHECK(a.workspace != nullptr) << "16-bit GEMM needs a workspace";
    float* xr =
        static_cast<float*>(a.workspace);  // [m, k] rounded to the weight type
    if (!a.reuse_x_workspace) RoundToDTypeAsF32(a.x, xr, a.w_dtype, a.m * a.k);
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
                                    engine);
    Entry e;
    e.prim = dnnl::matmul(pd);
    e.src = dnnl::memory(a_md, engine, DNNL_MEMORY_NONE);
    e.wei = dnnl::memory(b_md, engine, DNNL_MEMORY_NONE);
    e.dst = dnnl::memory(c_md, engine, DNNL_MEMORY_NONE);
    it = cache.emplace(key, std::move(e)).first;
  }
  Run(it->second, a.a, a.b, nullptr, a.c);
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
  try {
    impl_->Gemm(args);
  } catch (const dnnl::error& e) {
    LOOM_CHECK(false) << "oneDNN GEMM m=" << args.m << " n=" << args.n
                      << " k=" << args.k << ": " << e.what();
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
  const int64_t bias_size =
      args.bias != nullptr ? DTypeSize(args.bias_dtype) : 0;
  for (int64_t j0 = 0; j0 < w.n; j0 += kQuantPanelRows) {
    const int64_t nc = std::min(kQuantPanelRows, w.n - j0);
    DecodeRows(w, j0, nc, args.w_dtype, decode_workspace);  // [nc, k]
    GemmArgs p = args;
    p.w = decode_workspace;
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
