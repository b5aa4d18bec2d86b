// Quantized GEMM (weights kept as MXFP4 / NVFP4 codes, decoded block by
// block into the compute dtype as they are packed) against the bf16 GEMM of
// the same shape,
// both measured in the same run: counters `vs_bf16` (quantized throughput /
// bf16 throughput) and `bytes_vs_bf16` (stored weight bytes / bf16 bytes).
// Goal: vs_bf16 >= 0.8 at bytes_vs_bf16 <= 0.3. Compute dtype bf16.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "bench/bench_util.h"
#include "src/backend/cpu/kernels.h"
#include "src/backend/cpu/quant_decode.h"
#include "src/base/float16.h"
#include "src/core/format.h"

namespace loom::cpu {
namespace {

using bench::Buf;

GemmContext& Ctx() {
  static GemmContext* ctx = new GemmContext();
  return *ctx;
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// A random [n, k] weight stored in `kind` (no NaN codes), x [m, k] in
// [-1, 1), y [m, n], and the workspace the executor lends a bf16-compute
// GEMM.
struct QuantFixture {
  QuantFixture(int64_t m, int64_t n, int64_t k, FormatKind kind, uint32_t seed)
      : x(m * k),
        y(m * n),
        ws(GemmWorkspaceBytes(m, k, DType::kBF16)) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (auto& v : x) v = dist(rng);
    const bool fp8 = kind == FormatKind::kFp8Block;
    const int64_t block = kind == FormatKind::kMxfp4 ? 32 : fp8 ? 128 : 16;
    codes.resize(fp8 ? n * k : n * k / 2);
    for (auto& c : codes) {
      c = static_cast<uint8_t>(rng() & 0xFF);
      if (fp8 && (c & 0x7F) == 0x7F) c = 0;  // E4M3 NaN
    }
    q.kind = kind;
    q.values = codes.data();
    q.n = n;
    q.k = k;
    q.block_in = block;
    if (fp8) {
      q.block_out = 128;
      std::vector<float> f(((n + 127) / 128) * ((k + 127) / 128), 0.01f);
      scales.resize(f.size() * 4);
      std::memcpy(scales.data(), f.data(), scales.size());
      q.scale_dtype = DType::kF32;
    } else {
      scales.resize(n * k / block);
      for (auto& v : scales)
        v = static_cast<uint8_t>(
            kind == FormatKind::kMxfp4 ? 118 + rng() % 8 : 0x30 + rng() % 32);
      q.scale_dtype =
          kind == FormatKind::kMxfp4 ? DType::kF8E8M0 : DType::kF8E4M3;
      q.global_scale = 0.01f;
    }
    q.scales = scales.data();
    a.x = x.data();
    a.w_dtype = DType::kBF16;
    a.y = y.data();
    a.m = m, a.n = n, a.k = k;
    a.workspace = ws.p;
  }
  std::vector<float> x, y;
  std::vector<uint8_t> codes, scales;
  QuantMatrix q;
  Buf ws;
  GemmArgs a;  // x, y, m, n, k, bf16 compute, the workspace
};

// Args: M, N, K, format (0 = mxfp4, 1 = nvfp4-modelopt).
void BM_QuantGemmVsBf16(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const FormatKind kind =
      state.range(3) == 0 ? FormatKind::kMxfp4 : FormatKind::kNvfp4ModelOpt;
  QuantFixture fx(m, n, k, kind, 7);
  const QuantMatrix& q = fx.q;
  const std::vector<uint8_t>& codes = fx.codes;
  const std::vector<uint8_t>& scales = fx.scales;
  std::vector<float>& y = fx.y;
  // The bf16 weight of the same shape: the decoded values, rounded.
  std::vector<uint16_t> w16(n * k);
  DecodeRows(q, 0, n, DType::kBF16, w16.data());
  GemmArgs a = fx.a;
  a.quant = &q;
  GemmArgs d = fx.a;
  d.w = w16.data();
  Ctx().Gemm(d);  // warm-up
  Ctx().Gemm(a);
  double t_bf16 = 0, t_quant = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    Ctx().Gemm(d);
    const auto t1 = std::chrono::steady_clock::now();
    Ctx().Gemm(a);
    const auto t2 = std::chrono::steady_clock::now();
    t_bf16 += Seconds(t1 - t0);
    t_quant += Seconds(t2 - t1);
    state.SetIterationTime(Seconds(t2 - t1));
    benchmark::DoNotOptimize(y.data());
  }
  const double flops = 2.0 * m * n * k * state.iterations();
  state.counters["quant_GFLOPs"] = flops / t_quant * 1e-9;
  state.counters["bf16_GFLOPs"] = flops / t_bf16 * 1e-9;
  state.counters["vs_bf16"] = t_bf16 / t_quant;
  const double quant_bytes = static_cast<double>(
      codes.size() + scales.size() + (kind == FormatKind::kMxfp4 ? 0 : 4));
  state.counters["bytes_vs_bf16"] = quant_bytes / (2.0 * n * k);
}
BENCHMARK(BM_QuantGemmVsBf16)
    ->ArgNames({"M", "N", "K", "nvfp4"})
    ->ArgsProduct({{128, 512}, {5760}, {2880}, {0, 1}})
    ->ArgsProduct({{128, 512}, {4096}, {4096}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Decoding a whole [N, K] weight into the compute dtype, alone.
// Args: N, K, format (0 = mxfp4, 1 = nvfp4-modelopt), out (0 = f32, 1 = bf16).
void BM_QuantDecode(benchmark::State& state) {
  const int64_t n = state.range(0), k = state.range(1);
  const FormatKind kind =
      state.range(2) == 0 ? FormatKind::kMxfp4 : FormatKind::kNvfp4ModelOpt;
  const DType out = state.range(3) == 0 ? DType::kF32 : DType::kBF16;
  const int64_t block = kind == FormatKind::kMxfp4 ? 32 : 16;
  std::mt19937 rng(7);
  std::vector<uint8_t> codes(n * k / 2), scales(n * k / block);
  for (auto& c : codes) c = static_cast<uint8_t>(rng() & 0xFF);
  for (auto& s : scales) s = static_cast<uint8_t>(120 + rng() % 4);
  QuantMatrix q;
  q.kind = kind;
  q.values = codes.data();
  q.scales = scales.data();
  q.n = n;
  q.k = k;
  q.block_in = block;
  q.global_scale = 0.01f;
  Buf dst(n * k * DTypeSize(out));
  for (auto _ : state) {
    DecodeRows(q, 0, n, out, dst.p);
    benchmark::DoNotOptimize(dst.p);
  }
  state.counters["Gelem/s"] =
      benchmark::Counter(static_cast<double>(n * k) * state.iterations() * 1e-9,
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_QuantDecode)
    ->ArgNames({"N", "K", "nvfp4", "bf16"})
    ->ArgsProduct({{4096}, {4096}, {0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace loom::cpu
