// CPU kernel benchmarks on TinyLlama-1.1B shapes (hidden 2048, intermediate
// 5632, 32 query heads x 64, 4 KV heads, vocab 32000). Reports GFLOP/s and
// times; asserts nothing about them.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "src/backend/cpu/isa.h"
#include "bench/bench_util.h"
#include "src/backend/cpu/kernels.h"
#include "src/base/float16.h"

namespace loom::cpu {
namespace {

using Aligned = bench::Buf;

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Every figure is printed with the CPU it was measured on (benchmark context:
// the model name from /proc/cpuinfo and the ISA level Loom dispatches at).
const bool kCpuContext = [] {
  benchmark::AddCustomContext("cpu_model", CpuModelName());
  benchmark::AddCustomContext(
      "loom_cpu_isa", std::string(IsaName(ActiveIsa())) + " (detected " +
                          std::string(IsaName(DetectedIsa())) + ")");
  return true;
}();

GemmContext& Ctx() {
  static GemmContext* ctx = new GemmContext();
  return *ctx;
}

// Args: M, N, K, dtype (0 = f32, 1 = bf16).
void BM_Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const DType dt = state.range(3) == 0 ? DType::kF32 : DType::kBF16;
  std::vector<float> x = Random(m * k, 1), wf = Random(n * k, 2), y(m * n);
  std::vector<uint16_t> w16;
  if (dt == DType::kBF16) {
    w16.resize(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) w16[i] = F32ToBf16(wf[i]);
  }
  Aligned ws(GemmWorkspaceBytes(m, k, dt));
  GemmArgs a;
  a.x = x.data();
  a.w = dt == DType::kF32 ? static_cast<const void*>(wf.data()) : w16.data();
  a.w_dtype = dt;
  a.y = y.data();
  a.m = m, a.n = n, a.k = k;
  a.workspace = ws.p;
  Ctx().Gemm(a);  // warm-up: primitive creation
  for (auto _ : state) {
    Ctx().Gemm(a);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * m * n * k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// Stored-bf16 GEMM against the f32 GEMM of the same shape, in the same run:
// each iteration times one of each, back to back. `bf16_vs_f32` = f32 time /
// bf16 time (1.0: the 16-bit weights cost nothing). On a CPU without native
// bf16 the bf16 weights are widened per tile panel
// (docs/design/cpu-backend.md). Args: M, N, K.
void BM_GemmBf16VsF32(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  std::vector<float> x = Random(m * k, 1), wf = Random(n * k, 2), y(m * n);
  std::vector<uint16_t> w16(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) w16[i] = F32ToBf16(wf[i]);
  Aligned ws(GemmWorkspaceBytes(m, k, DType::kBF16));
  GemmArgs a;
  a.x = x.data();
  a.y = y.data();
  a.m = m, a.n = n, a.k = k;
  a.workspace = ws.p;
  GemmArgs b = a;
  a.w = wf.data();
  a.w_dtype = DType::kF32;
  b.w = w16.data();
  b.w_dtype = DType::kBF16;
  Ctx().Gemm(a);  // warm-up: primitive creation
  Ctx().Gemm(b);
  double t32 = 0, t16 = 0;
  using Clock = std::chrono::steady_clock;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    Ctx().Gemm(a);
    const auto t1 = Clock::now();
    Ctx().Gemm(b);
    const auto t2 = Clock::now();
    t32 += std::chrono::duration<double>(t1 - t0).count();
    t16 += std::chrono::duration<double>(t2 - t1).count();
    benchmark::DoNotOptimize(y.data());
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["f32_GFLOP/s"] = 2.0 * m * n * k * 1e-9 * iters / t32;
  state.counters["bf16_GFLOP/s"] = 2.0 * m * n * k * 1e-9 * iters / t16;
  state.counters["bf16_vs_f32"] = t32 / t16;
}
BENCHMARK(BM_GemmBf16VsF32)
    ->Args({512, 2048, 2048})
    ->Args({512, 5632, 2048})
    ->Args({512, 2048, 5632})
    ->Args({128, 2048, 2048})
    ->Args({128, 5632, 2048})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void GemmShapes(benchmark::internal::Benchmark* b) {
  for (int64_t dt : {0, 1})
    for (int64_t m : {128, 512}) {
      b->Args({m, 2048, 2048, dt});   // q_proj, o_proj
      b->Args({m, 256, 2048, dt});    // k_proj, v_proj
      b->Args({m, 5632, 2048, dt});   // gate_proj, up_proj
      b->Args({m, 2048, 5632, dt});   // down_proj
      b->Args({m, 32000, 2048, dt});  // lm_head
    }
  for (int64_t m : {1, 4, 8, 16}) {  // decode-sized
    b->Args({m, 5632, 2048, 1});
    b->Args({m, 5632, 2048, 0});
  }
  // Expert-sized (Qwen3-30B-A3B: gate/up [768, 2048], down [2048, 768]): the
  // few rows each expert receives in a prefill batch.
  for (int64_t m : {4, 8, 16, 32, 64}) {
    b->Args({m, 768, 2048, 1});
    b->Args({m, 2048, 768, 1});
  }
  b->ArgNames({"M", "N", "K", "bf16"});
}
BENCHMARK(BM_Gemm)
    ->Apply(GemmShapes)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.2)
    ->UseRealTime();

// One causal sequence of T tokens, 32 q heads, 4 kv heads, head_dim 64, from a
// fused QKV buffer. Args: T, window.
void BM_Attention(benchmark::State& state) {
  const int64_t t = state.range(0), window = state.range(1);
  const int64_t qh = 32, kvh = 4, d = 64, rs = (qh + 2 * kvh) * d;
  std::vector<float> qkv = Random(t * rs, 3), z(t * qh * d);
  const int64_t starts[2] = {0, t};
  Aligned ws(AttentionWorkspaceBytes(t, qh, d, NumThreads()));
  AttentionArgs a;
  a.q = qkv.data(), a.q_rs = rs;
  a.k = qkv.data() + qh * d, a.k_rs = rs;
  a.v = qkv.data() + (qh + kvh) * d, a.v_rs = rs;
  a.z = z.data();
  a.seq_start = starts;
  a.num_seqs = 1;
  a.q_heads = qh, a.kv_heads = kvh, a.head_dim = d;
  a.scale = 0.125f;
  a.window = window;
  a.workspace = ws.p;
  for (auto _ : state) {
    Attention(Ctx(), a);
    benchmark::DoNotOptimize(z.data());
  }
  // Visible (query, key) pairs times 2 matmuls x 2 flops x head_dim x heads.
  double pairs = 0;
  for (int64_t i = 0; i < t; ++i)
    pairs += window > 0 ? std::min(i + 1, window) : i + 1;
  state.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * pairs * d * qh * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Attention)
    ->ArgsProduct({{128, 512, 2048}, {0}})
    ->Args({2048, 512})
    ->ArgNames({"T", "window"})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.2)
    ->UseRealTime();

void BM_RmsNorm(benchmark::State& state) {
  const int64_t rows = state.range(0), dim = 2048;
  std::vector<float> x = Random(rows * dim, 4), w = Random(dim, 5),
                     y(rows * dim);
  for (auto _ : state) {
    RmsNorm(x.data(), w.data(), DType::kF32, 0.0f, 1e-5f, y.data(), rows, dim);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * rows * dim * 8);
}
BENCHMARK(BM_RmsNorm)->Arg(512)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_GatedSilu(benchmark::State& state) {
  const int64_t rows = state.range(0), n = 5632;
  std::vector<float> gu = Random(rows * 2 * n, 6), out(rows * n);
  for (auto _ : state) {
    GatedActivation(Activation::kSilu, gu.data(), 2 * n, gu.data() + n, 2 * n,
                    out.data(), rows, n);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * rows * n);
}
BENCHMARK(BM_GatedSilu)->Arg(512)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_Rope(benchmark::State& state) {
  const int64_t tokens = state.range(0), heads = 32, d = 64, half = 32;
  std::vector<float> x = Random(tokens * heads * d, 7),
                     cos = Random(tokens * half, 8),
                     sin = Random(tokens * half, 9);
  for (auto _ : state) {
    ApplyRope(x.data(), tokens, heads, d, heads * d, cos.data(), sin.data(),
              half);
    benchmark::DoNotOptimize(x.data());
  }
  state.SetItemsProcessed(state.iterations() * tokens * heads * d);
}
BENCHMARK(BM_Rope)->Arg(512)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_ConvertBf16(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> x = Random(n, 10);
  std::vector<uint16_t> y(n);
  for (auto _ : state) {
    ConvertFromF32(x.data(), y.data(), DType::kBF16, n);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_ConvertBf16)
    ->Arg(512 * 5632)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_LogSumExp(benchmark::State& state) {
  const int64_t rows = state.range(0), vocab = 32000;
  std::vector<float> x = Random(rows * vocab, 11);
  std::vector<double> lse(rows);
  for (auto _ : state) {
    LogSumExp(x.data(), rows, vocab, lse.data());
    benchmark::DoNotOptimize(lse.data());
  }
  state.SetItemsProcessed(state.iterations() * rows * vocab);
}
BENCHMARK(BM_LogSumExp)->Arg(512)->Unit(benchmark::kMicrosecond)->UseRealTime();

// One TinyLlama-1.1B decoder layer in bf16 on T tokens (one sequence), the
// kernels in the order a forward pass calls them, plus an estimate for the
// whole model: 22 such layers and the lm_head (timed once beforehand).
void BM_TinyLlamaLayer(benchmark::State& state) {
  const int64_t t = state.range(0);
  const int64_t h = 2048, inter = 5632, qh = 32, kvh = 4, d = 64, vocab = 32000,
                layers = 22;
  const int64_t q_n = qh * d, kv_n = kvh * d, ld = q_n + 2 * kv_n;
  auto bf16 = [](int64_t n, uint32_t seed) {
    std::vector<float> f = Random(n, seed);
    std::vector<uint16_t> out(n);
    for (int64_t i = 0; i < n; ++i) out[i] = F32ToBf16(f[i] * 0.02f);
    return out;
  };
  const auto wq = bf16(q_n * h, 20), wk = bf16(kv_n * h, 21),
             wv = bf16(kv_n * h, 22), wo = bf16(h * q_n, 23);
  const auto wg = bf16(inter * h, 24), wu = bf16(inter * h, 25),
             wd = bf16(h * inter, 26);
  const auto norm1 = bf16(h, 27), norm2 = bf16(h, 28), lm = bf16(vocab * h, 29);
  std::vector<float> x = Random(t * h, 30), hbuf(t * h), qkv(t * ld),
                     z(t * q_n), o(t * h);
  std::vector<float> gu(t * 2 * inter), act(t * inter), logits(t * vocab);
  std::vector<int32_t> pos(t);
  for (int64_t i = 0; i < t; ++i) pos[i] = static_cast<int32_t>(i);
  std::vector<float> inv_freq(d / 2), cos(t * d / 2), sin(t * d / 2);
  for (int64_t i = 0; i < d / 2; ++i)
    inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / d));
  Aligned gws(GemmWorkspaceBytes(t, inter, DType::kBF16));
  Aligned aws(AttentionWorkspaceBytes(t, qh, d, NumThreads()));
  const int64_t starts[2] = {0, t};
  auto gemm = [&](const float* in, const std::vector<uint16_t>& w, int64_t n,
                  int64_t k, float* out, int64_t ldy, bool acc, bool reuse) {
    GemmArgs a;
    a.x = in, a.w = w.data(), a.w_dtype = DType::kBF16, a.m = t, a.n = n,
    a.k = k;
    a.y = out, a.ldy = ldy, a.accumulate = acc, a.workspace = gws.p,
    a.reuse_x_workspace = reuse;
    Ctx().Gemm(a);
  };
  auto layer = [&] {
    RmsNorm(x.data(), norm1.data(), DType::kBF16, 0.0f, 1e-5f, hbuf.data(), t,
            h);
    gemm(hbuf.data(), wq, q_n, h, qkv.data(), ld, false, false);
    gemm(hbuf.data(), wk, kv_n, h, qkv.data() + q_n, ld, false, true);
    gemm(hbuf.data(), wv, kv_n, h, qkv.data() + q_n + kv_n, ld, false, true);
    RopeTables(pos.data(), t, inv_freq.data(), d / 2, 1.0f, cos.data(),
               sin.data());
    ApplyRope(qkv.data(), t, qh, d, ld, cos.data(), sin.data(), d / 2);
    ApplyRope(qkv.data() + q_n, t, kvh, d, ld, cos.data(), sin.data(), d / 2);
    AttentionArgs a;
    a.q = qkv.data(), a.q_rs = ld, a.k = qkv.data() + q_n, a.k_rs = ld,
    a.v = qkv.data() + q_n + kv_n, a.v_rs = ld;
    a.z = z.data(), a.seq_start = starts, a.num_seqs = 1, a.q_heads = qh,
    a.kv_heads = kvh, a.head_dim = d;
    a.scale = 0.125f, a.workspace = aws.p;
    Attention(Ctx(), a);
    gemm(z.data(), wo, h, q_n, x.data(), h, true,
         false);  // residual via accumulate
    RmsNorm(x.data(), norm2.data(), DType::kBF16, 0.0f, 1e-5f, hbuf.data(), t,
            h);
    gemm(hbuf.data(), wg, inter, h, gu.data(), 2 * inter, false, false);
    gemm(hbuf.data(), wu, inter, h, gu.data() + inter, 2 * inter, false, true);
    GatedActivation(Activation::kSilu, gu.data(), 2 * inter, gu.data() + inter,
                    2 * inter, act.data(), t, inter);
    gemm(act.data(), wd, h, inter, x.data(), h, true, false);
  };
  auto seconds = [](auto fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
        .count();
  };
  layer();  // warm-up: primitives
  gemm(x.data(), lm, vocab, h, logits.data(), vocab, false, false);
  double lm_s = 1e9;
  for (int i = 0; i < 2; ++i)
    lm_s = std::min(lm_s, seconds([&] {
                      gemm(x.data(), lm, vocab, h, logits.data(), vocab, false,
                           false);
                    }));
  double layer_s = 1e9;
  for (auto _ : state) {
    layer_s = std::min(layer_s, seconds(layer));
    // Keep activations bounded across iterations.
    RmsNorm(x.data(), nullptr, DType::kF32, 0.0f, 1e-5f, x.data(), t, h);
  }
  state.counters["best_layer_ms"] = layer_s * 1e3;
  state.counters["lm_head_ms"] = lm_s * 1e3;
  state.counters["model_tok/s"] =
      static_cast<double>(t) / (layers * layer_s + lm_s);
}
BENCHMARK(BM_TinyLlamaLayer)
    ->Arg(128)
    ->Arg(512)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.5)
    ->UseRealTime();

}  // namespace
}  // namespace loom::cpu
