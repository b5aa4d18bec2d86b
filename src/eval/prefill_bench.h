// `loom bench`: prefill throughput of a model on this machine, with the
// ceiling its weight GEMMs would allow, in the form users compare with
// llama.cpp's `llama-bench -p N` (docs/eval/bench.md).
#ifndef LOOM_EVAL_PREFILL_BENCH_H_
#define LOOM_EVAL_PREFILL_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/model/config.h"
#include "src/runtime/model.h"

namespace loom {

struct PrefillBenchOptions {
  std::vector<int64_t> tokens = {128, 512};  // prompt lengths, one run each
  int threads = 0;                           // 0 = all cores
  Precision precision = Precision::kAuto;
  int iterations = 3;  // timed forwards per length (after one warm-up)
};

struct PrefillPoint {
  int64_t tokens = 0;
  double seconds = 0;            // the fastest timed forward
  double tokens_per_second = 0;  // tokens / seconds
  // Weight-GEMM FLOPs of the forward (PrefillGemmFlops).
  double gemm_flops = 0;
  // The GEMM-only ceiling, measured on the forward's own path: the seconds
  // the fastest forward spent inside its weight GEMMs (every shape it runs,
  // dense and expert groups, timed as they ran), and the throughput if the
  // forward were nothing else (tokens / forward_gemm_seconds). The forward
  // cannot beat it: its GEMMs are part of it.
  double forward_gemm_seconds = 0;
  double gemm_only_tokens_per_second = 0;
  // A reference rate, not a bound: one dense [tokens, H] x [H, 4H] GEMM in
  // the compute dtype, and the throughput if all of the forward's GEMM
  // FLOPs ran at it (for an MoE model: prefill against a dense GEMM of
  // equal FLOPs). A small model's GEMMs can beat it.
  double dense_gemm_flops_per_second = 0;
  double dense_reference_tokens_per_second = 0;
  // As fractions of the path's peak (PrefillBenchResult): the forward's
  // weight-GEMM FLOP rate over the whole forward (gemm_flops / seconds),
  // inside its GEMMs (gemm_flops / forward_gemm_seconds), and the dense
  // reference's.
  double forward_of_peak = 0;
  double gemm_of_peak = 0;
  double dense_reference_of_peak = 0;
};

struct PrefillBenchResult {
  std::string cpu;        // /proc/cpuinfo's model name
  std::string isa;        // the ISA level Loom's kernels dispatch at
  int threads = 0;        // threads used
  std::string precision;  // the compute dtype
  double load_seconds = 0;
  // How the compute dtype's GEMMs run ("amx", "avx512bf16", "avx512",
  // "avx2", "baseline") and that path's peak: FLOP per cycle of one core
  // (cpu::GemmPeakFlopsPerCycle) x the clock measured on this core (turbo
  // included) x the threads.
  std::string gemm_path;
  int64_t peak_flops_per_cycle = 0;
  double clock_hz = 0;
  double peak_flops_per_second = 0;
  std::vector<PrefillPoint> prefill;
};

// FLOPs of the weight GEMMs of one forward of `tokens` tokens: 2 x tokens x
// the weight elements each token multiplies (q/k/v/o or MLA's projections;
// the dense MLP, or the router, experts_per_token experts and the shared
// expert). Attention scores, norms and the logits head are not counted.
double PrefillGemmFlops(const ModelConfig& c, int64_t tokens);

// Loads the model (timed as load_seconds), then per length: one warm-up and
// `iterations` timed forwards of synthetic token ids through every layer
// (hooked at the final norm: no logits), and the dense GEMM of the ceiling.
StatusOr<PrefillBenchResult> RunPrefillBench(const std::string& model_dir,
                                             const PrefillBenchOptions& o);

}  // namespace loom

#endif  // LOOM_EVAL_PREFILL_BENCH_H_
