// loom bench MODEL_DIR [--tokens 128,512] [--threads N] [--precision P]
// [--iterations N] [--json]: prefill throughput and its GEMM-only ceiling
// (src/eval/prefill_bench.h; docs/eval/bench.md).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/eval/prefill_bench.h"
#include "tools/cli/commands.h"
#include "tools/cli/flag_ranges.h"
#include "tools/cli/plan_flags.h"

namespace loom::cli {
namespace {

void PrintTable(const std::string& dir, const PrefillBenchResult& r) {
  std::printf("loom bench %s\n", dir.c_str());
  std::printf("cpu: %s (kernels: %s), %d threads, compute %s, load %.2f s\n",
              r.cpu.c_str(), r.isa.c_str(), r.threads, r.precision.c_str(),
              r.load_seconds);
  std::printf(
      "gemm path: %s, peak %.0f GFLOP/s (%lld FLOP/cycle x %.2f GHz measured "
      "x %d threads)\n",
      r.gemm_path.c_str(), r.peak_flops_per_second * 1e-9,
      static_cast<long long>(r.peak_flops_per_cycle), r.clock_hz * 1e-9,
      r.threads);
  // "of gemm": the share of the forward its own GEMMs take (<= 1); "of
  // dense ref": the forward against one dense reference GEMM's rate (a
  // reference, which a small model's GEMMs can beat).
  std::printf("%8s %10s %10s %10s %16s %8s %16s %12s %13s %12s\n", "tokens",
              "ms", "gemm ms", "tok/s", "gemm-only tok/s", "of gemm",
              "dense-ref tok/s", "of dense ref", "gemm of peak", "fwd of peak");
  for (const PrefillPoint& p : r.prefill)
    std::printf(
        "%8lld %10.1f %10.1f %10.1f %16.1f %8.2f %16.1f %12.2f %13.2f "
        "%12.2f\n",
        static_cast<long long>(p.tokens), p.seconds * 1e3,
        p.forward_gemm_seconds * 1e3, p.tokens_per_second,
        p.gemm_only_tokens_per_second,
        p.tokens_per_second / p.gemm_only_tokens_per_second,
        p.dense_reference_tokens_per_second,
        p.tokens_per_second / p.dense_reference_tokens_per_second,
        p.gemm_of_peak, p.forward_of_peak);
}

nlohmann::json ToJson(const PrefillBenchResult& r) {
  nlohmann::json prefill = nlohmann::json::array();
  for (const PrefillPoint& p : r.prefill)
    prefill.push_back(
        {{"tokens", p.tokens},
         {"seconds", p.seconds},
         {"tokens_per_second", p.tokens_per_second},
         {"gemm_flops", p.gemm_flops},
         {"forward_gemm_seconds", p.forward_gemm_seconds},
         {"gemm_only_tokens_per_second", p.gemm_only_tokens_per_second},
         {"dense_gemm_flops_per_second", p.dense_gemm_flops_per_second},
         {"dense_reference_tokens_per_second",
          p.dense_reference_tokens_per_second},
         {"gemm_of_peak", p.gemm_of_peak},
         {"dense_reference_of_peak", p.dense_reference_of_peak},
         {"forward_of_peak", p.forward_of_peak}});
  return {{"prefill", prefill},
          {"cpu", r.cpu},
          {"isa", r.isa},
          {"gemm_path", r.gemm_path},
          {"peak_flops_per_cycle", r.peak_flops_per_cycle},
          {"clock_hz", r.clock_hz},
          {"peak_flops_per_second", r.peak_flops_per_second},
          {"threads", r.threads},
          {"precision", r.precision},
          {"load_seconds", r.load_seconds}};
}

}  // namespace

void AddBenchCommand(CLI::App& app, int* exit_code) {
  struct Options {
    std::string model_dir;
    std::string precision = "auto";
    bool json = false;
    PrefillBenchOptions bench;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Prefill throughput (tokens/s) of a model on this machine and the "
      "ceiling of its weight GEMMs, to compare with llama-bench -p N");
  cmd->add_option("MODEL_DIR", opts->model_dir,
                  "Directory with config.json and the safetensors")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--tokens", opts->bench.tokens,
                  "Prompt lengths, one timed run each (comma-separated)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  AddThreadsFlag(*cmd, &opts->bench.threads);
  AddPrecisionFlag(*cmd, &opts->precision);
  cmd->add_option("--iterations", opts->bench.iterations,
                  "Timed forwards per length after one warm-up (the fastest "
                  "is reported)")
      ->capture_default_str()
      ->check(IntRange(1, 1000));
  cmd->add_flag("--json", opts->json, "Print one JSON object");
  cmd->callback([opts, exit_code] {
    auto precision = ParsePrecision(opts->precision);
    if (!precision.ok()) {
      *exit_code = ReportStatus("bench", precision.status());
      return;
    }
    opts->bench.precision = *precision;
    auto r = RunPrefillBench(opts->model_dir, opts->bench);
    if (!r.ok()) {
      *exit_code = ReportStatus("bench", r.status());
      return;
    }
    if (opts->json)
      std::printf("%s\n", ToJson(*r).dump(2).c_str());
    else
      PrintTable(opts->model_dir, *r);
  });
}

}  // namespace loom::cli
