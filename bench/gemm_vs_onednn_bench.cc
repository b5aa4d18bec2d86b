// Loom's GEMM against oneDNN's matmul on the same shapes, in the same
// process, back to back: the baseline Loom's own kernels (batch-invariant,
// docs/design/cpu-backend.md) are measured against. oneDNN runs the way a
// caller gets its best speed: one primitive over the whole GEMM with its own
// threading, and the weights either as stored ([N, K] read as W^T, strided)
// or reordered once into the layout oneDNN picks (format `any`; needed for
// its AMX kernels). LOOM_CPU_ISA caps oneDNN at the same level as Loom.
// Counters: `loom_GFLOPs`, `onednn_GFLOPs` (the faster of the two oneDNN
// layouts), `vs_onednn` = oneDNN time / Loom time.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <vector>

#include "src/backend/cpu/isa.h"
#include "bench/bench_util.h"
#include "src/backend/cpu/kernels.h"
#include "src/base/float16.h"

namespace loom::cpu {
namespace {

using bench::Buf;

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

const dnnl::engine& Engine() {
  static const dnnl::engine* engine = [] {
    // oneDNN at the level Loom runs at.
    dnnl_cpu_isa_t cap = dnnl_cpu_isa_all;
    switch (ActiveIsa()) {
      case CpuIsa::kBaseline:
        cap = dnnl_cpu_isa_sse41;
        break;
      case CpuIsa::kAvx2:
        cap = dnnl_cpu_isa_avx2;
        break;
      case CpuIsa::kAvx512:
        cap = dnnl_cpu_isa_avx512_core;
        break;
      case CpuIsa::kAvx512Bf16:
        cap = dnnl_cpu_isa_avx512_core_bf16;
        break;
      case CpuIsa::kAmx:
        break;
    }
    (void)dnnl_set_max_cpu_isa(cap);
    return new dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return *engine;
}

// One oneDNN matmul y[m, n] = x[m, k] W^T with W stored [n, k] in `dt`
// (x in `dt` too), the weights as stored or reordered once (`blocked`).
struct OneDnnGemm {
  OneDnnGemm(int64_t m, int64_t n, int64_t k, dnnl::memory::data_type dt,
             void* x, void* w, float* y, bool blocked)
      : stream(Engine()) {
    using dims = dnnl::memory::dims;
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::desc src_md({m, k}, dt, tag::ab);
    const dnnl::memory::desc stored_md({k, n}, dt, dims{1, k});
    const dnnl::memory::desc w_md =
        blocked ? dnnl::memory::desc({k, n}, dt, tag::any) : stored_md;
    const dnnl::memory::desc dst_md({m, n}, dnnl::memory::data_type::f32,
                                    tag::ab);
    const dnnl::matmul::primitive_desc pd(
        dnnl::matmul::desc(src_md, w_md, dst_md), Engine());
    impl = pd.impl_info_str();
    prim = dnnl::matmul(pd);
    src = dnnl::memory(pd.src_desc(), Engine(), x);
    dst = dnnl::memory(pd.dst_desc(), Engine(), y);
    dnnl::memory stored(stored_md, Engine(), w);
    if (pd.weights_desc() == stored_md) {
      wei = stored;
    } else {
      wei = dnnl::memory(pd.weights_desc(), Engine());
      dnnl::reorder(stored, wei).execute(stream, stored, wei);
      stream.wait();
    }
  }
  double Run() {
    const auto t0 = std::chrono::steady_clock::now();
    prim.execute(stream, {{DNNL_ARG_SRC, src},
                          {DNNL_ARG_WEIGHTS, wei},
                          {DNNL_ARG_DST, dst}});
    stream.wait();
    return Seconds(std::chrono::steady_clock::now() - t0);
  }
  dnnl::stream stream;
  dnnl::matmul prim;
  dnnl::memory src, wei, dst;
  std::string impl;
};

// Args: M, N, K, dtype (0 = f32, 1 = bf16).
void BM_GemmVsOneDnn(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const bool bf16 = state.range(3) == 1;
  const DType dt = bf16 ? DType::kBF16 : DType::kF32;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(m * k), wf(n * k), y(m * n), y2(m * n);
  for (auto& v : x) v = u(rng);
  for (auto& v : wf) v = u(rng);
  std::vector<uint16_t> x16(m * k), w16(n * k);
  for (int64_t i = 0; i < m * k; ++i) x16[i] = F32ToBf16(x[i]);
  for (int64_t i = 0; i < n * k; ++i) w16[i] = F32ToBf16(wf[i]);
  Buf ws(GemmWorkspaceBytes(m, k, dt));
  GemmArgs a;
  a.x = x.data();
  a.w = bf16 ? static_cast<const void*>(w16.data()) : wf.data();
  a.w_dtype = dt;
  a.y = y.data();
  a.m = m, a.n = n, a.k = k;
  a.workspace = ws.p;
  GemmContext ctx;
  const auto ddt =
      bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
  void* xp = bf16 ? static_cast<void*>(x16.data()) : x.data();
  void* wp = bf16 ? static_cast<void*>(w16.data()) : wf.data();
  OneDnnGemm stored(m, n, k, ddt, xp, wp, y2.data(), false);
  OneDnnGemm blocked(m, n, k, ddt, xp, wp, y2.data(), true);
  ctx.Gemm(a);  // warm-up
  stored.Run();
  blocked.Run();
  double t_loom = 0, t_stored = 0, t_blocked = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    ctx.Gemm(a);
    const double t = Seconds(std::chrono::steady_clock::now() - t0);
    t_loom += t;
    t_stored += stored.Run();
    t_blocked += blocked.Run();
    state.SetIterationTime(t);
    benchmark::DoNotOptimize(y.data());
  }
  const double flops = 2.0 * m * n * k * state.iterations();
  const double t_onednn = std::min(t_stored, t_blocked);
  state.counters["loom_GFLOPs"] = flops / t_loom * 1e-9;
  state.counters["onednn_GFLOPs"] = flops / t_onednn * 1e-9;
  state.counters["vs_onednn"] = t_onednn / t_loom;
  state.SetLabel(std::string(GemmPathName(dt)) + " vs " +
                 (t_blocked < t_stored ? blocked.impl + " blocked"
                                       : stored.impl + " stored"));
}
BENCHMARK(BM_GemmVsOneDnn)
    ->ArgNames({"M", "N", "K", "bf16"})
    ->ArgsProduct({{1, 4, 16, 64, 128, 512}, {5632}, {2048}, {0, 1}})
    ->ArgsProduct({{512}, {2048}, {5632}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace loom::cpu
