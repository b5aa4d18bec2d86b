// CPU kernel benchmarks on TinyLlama-1.1B shapes (hidden 2048, intermediate
// 5632, 32 query heads x 64, 4 KV heads, vocab 32000). Reports GFLOP/s and
// times; asserts nothing about them.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "src/backend/cpu/kernels.h"
#include "src/base/float16.h"

namespace loom::cpu {
namespace {

struct Aligned {
  explicit Aligned(int64_t bytes) : p(std::aligned_alloc(64, (std::max<int64_t>(bytes, 64) + 63) / 64 * 64)) {}
  ~Aligned() { std::free(p); }
  void* p;
};

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

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
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * n * k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

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
  b->ArgNames({"M", "N", "K", "bf16"});
}
BENCHMARK(BM_Gemm)->Apply(GemmShapes)->Unit(benchmark::kMillisecond)->MinTime(0.2)->UseRealTime();

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
  for (int64_t i = 0; i < t; ++i) pairs += window > 0 ? std::min(i + 1, window) : i + 1;
  state.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * pairs * d * qh * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
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
  std::vector<float> x = Random(rows * dim, 4), w = Random(dim, 5), y(rows * dim);
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
    GatedActivation(Activation::kSilu, gu.data(), 2 * n, gu.data() + n, 2 * n, out.data(), rows, n);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * rows * n);
}
BENCHMARK(BM_GatedSilu)->Arg(512)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_Rope(benchmark::State& state) {
  const int64_t tokens = state.range(0), heads = 32, d = 64, half = 32;
  std::vector<float> x = Random(tokens * heads * d, 7), cos = Random(tokens * half, 8), sin = Random(tokens * half, 9);
  for (auto _ : state) {
    ApplyRope(x.data(), tokens, heads, d, heads * d, cos.data(), sin.data(), half);
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
BENCHMARK(BM_ConvertBf16)->Arg(512 * 5632)->Unit(benchmark::kMicrosecond)->UseRealTime();

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

}  // namespace
}  // namespace loom::cpu
