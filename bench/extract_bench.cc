// A full `loom extract` job on the synthetic TinyLlama-1.1B-shaped model:
// 64 prompts of 96-160 tokens, last-token selection. Two cases, run in the
// same process: three mid layers (25/50/75 %: the forward stops after layer
// 16) vs the same hooks plus the last layer (the forward runs all 22 layers).
// Reported: rows/s and tokens/s; the ratio shows what stopping early saves.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>

#include "bench/bench_util.h"
#include "src/eval/extract.h"

namespace loom {
namespace {

std::string InputFile() {
  const std::string path =
      (std::filesystem::temp_directory_path() / "loom-extract-bench.jsonl")
          .string();
  std::ofstream out(path);
  for (int r = 0; r < 64; ++r) {
    out << "{\"id\": " << r << ", \"tokens\": [1";
    const int n = 96 + (r * 37) % 65;
    for (int i = 1; i < n; ++i)
      out << "," << (3 + (r * 131 + i * 7919) % 31990);
    out << "]}\n";
  }
  return path;
}

void BM_ExtractJob(benchmark::State& state) {
  const bool to_end = state.range(0) == 1;
  const std::string model = bench::SyntheticTinyLlamaDir();
  const std::string input = InputFile();
  ExtractSummary last;
  for (auto _ : state) {
    ExtractOptions o;
    o.model_dir = model;
    o.input_path = input;
    o.out_dir =
        (std::filesystem::temp_directory_path() / "loom-extract-bench-out")
            .string();
    std::filesystem::remove_all(o.out_dir);
    o.hooks = {"hook_resid_post"};
    o.layers = {"0.25", "0.5", "0.75"};
    if (to_end) o.layers.push_back("1.0");
    o.selectors = {"last"};
    o.precision = Precision::kBF16;
    o.batch_tokens = 512;
    auto s = RunExtract(o);
    if (!s.ok()) {
      state.SkipWithError(s.status().ToString().c_str());
      return;
    }
    last = *s;
    state.SetIterationTime(s->seconds);
  }
  state.counters["rows/s"] = static_cast<double>(last.rows_ok) / last.seconds;
  state.counters["tok/s"] = static_cast<double>(last.tokens) / last.seconds;
  state.SetLabel(to_end ? "layers 5,11,16 + 21 (forward to the end)"
                        : "layers 5,11,16 (stops after 16)");
}

BENCHMARK(BM_ExtractJob)
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kSecond);

}  // namespace
}  // namespace loom
