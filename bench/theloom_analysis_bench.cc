// TheLoom's analysis routes at Weaver's largest expected size: 1,000 vectors
// of width 4,096 (a 4096-wide model's hidden states). Reported separately:
// parsing the request body as Go writes it (shortest round-trip float64
// decimals, ~86 MB), /analyze/geometry's analysis, and /analyze/bilateral's
// (two such sets). The target is under 2 s per analysis on 2 cores.
#include <benchmark/benchmark.h>

#include <charconv>
#include <random>
#include <string>

#include "src/serve/theloom_analysis.h"

namespace loom {
namespace {

using serve::theloom::Matrix;

// Hidden-state-like rows: a shared offset, a rank-32 signal and noise.
Matrix HiddenLike(int64_t n, int64_t d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> offset(d), basis(32 * d);
  for (auto& v : offset) v = 2.0f * normal(rng);
  for (auto& v : basis) v = normal(rng);
  Matrix m;
  m.rows = n;
  m.cols = d;
  m.values.resize(n * d);
  std::vector<float> coef(32);
  for (int64_t i = 0; i < n; ++i) {
    for (auto& c : coef) c = normal(rng);
    for (int64_t j = 0; j < d; ++j) {
      float v = offset[j] + 0.5f * normal(rng);
      for (int k = 0; k < 32; ++k) v += 0.2f * coef[k] * basis[k * d + j];
      m.values[i * d + j] = v;
    }
  }
  return m;
}

// {"vectors": [[...], ...]} with each value as Go's encoding/json writes a
// float64 (shortest round-trip form).
std::string GoBody(const Matrix& m, const char* field) {
  std::string s = std::string("{\"") + field + "\":[";
  char buf[32];
  std::mt19937_64 rng(7);
  for (int64_t i = 0; i < m.rows; ++i) {
    s += i ? ",[" : "[";
    for (int64_t j = 0; j < m.cols; ++j) {
      // The value plus a float64-only perturbation: 17 significant digits.
      const double v = static_cast<double>(m.values[i * m.cols + j]) *
                       (1.0 + 1e-12 * static_cast<double>(rng() % 1000));
      const auto r = std::to_chars(buf, buf + sizeof(buf), v);
      if (j) s += ',';
      s.append(buf, r.ptr);
    }
    s += ']';
  }
  s += "]}";
  return s;
}

void BM_TheLoomParseGoBody(benchmark::State& state) {
  const Matrix m = HiddenLike(state.range(0), state.range(1), 1);
  const std::string body = GoBody(m, "vectors");
  for (auto _ : state) {
    auto b = serve::theloom::ParseAnalysisBody(body, {"vectors"}, 3,
                                               serve::theloom::kMaxVectors);
    if (!b.ok()) state.SkipWithError(b.status().ToString().c_str());
    benchmark::DoNotOptimize(b);
  }
  state.counters["body_MB"] = static_cast<double>(body.size()) / 1e6;
  state.SetBytesProcessed(state.iterations() *
                          static_cast<int64_t>(body.size()));
}
BENCHMARK(BM_TheLoomParseGoBody)
    ->Args({1000, 4096})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_TheLoomGeometry(benchmark::State& state) {
  const Matrix m = HiddenLike(state.range(0), state.range(1), 1);
  for (auto _ : state) {
    auto g = serve::theloom::AnalyzeGeometry(m, serve::theloom::kDefaultSeed);
    benchmark::DoNotOptimize(g);
  }
}
BENCHMARK(BM_TheLoomGeometry)
    ->Args({100, 4096})
    ->Args({1000, 4096})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_TheLoomBilateral(benchmark::State& state) {
  const Matrix s = HiddenLike(state.range(0), state.range(1), 1);
  const Matrix r = HiddenLike(state.range(0), state.range(1), 2);
  for (auto _ : state) {
    auto b =
        serve::theloom::AnalyzeBilateral(s, r, serve::theloom::kDefaultSeed);
    benchmark::DoNotOptimize(b);
  }
}
BENCHMARK(BM_TheLoomBilateral)
    ->Args({100, 4096})
    ->Args({1000, 4096})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace loom
