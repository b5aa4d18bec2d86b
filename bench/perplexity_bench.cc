// `loom perplexity` throughput against a plain forward on a synthetic model
// with TinyLlama-1.1B shapes (bf16, vocab 32000), written once by `loom synth`
// code to $LOOM_BENCH_DIR (default: the system temp dir).
//
//   BM_PlainForwardLogits: executor forward of one ctx-token window with the
//     full lm_head (logits of every row, in chunks, discarded).
//   BM_Perplexity: EvaluatePerplexity over 4 windows of ctx tokens
//     (hf-stride, stride = ctx/2): forward + lm_head of the scored rows +
//     fused log-softmax; tokens/s counts tokens run through the model.
// Reported, not asserted.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <memory>

#include "src/backend/registry.h"
#include "src/eval/perplexity.h"
#include "src/model/synth.h"
#include "bench/bench_util.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"

namespace loom {
namespace {

// Threads are a process-wide setting of the CPU backend.
void SetThreads(int n) {
  auto backend = CreateBackend("cpu");
  if (backend.ok()) (*backend)->SetNumThreads(n);
}

const Model& PplModel() {
  static std::unique_ptr<Model> model = [] {
    const std::string dir = bench::SyntheticTinyLlamaDir();
    auto m = Model::Load(dir, Precision::kBF16);
    if (!m.ok()) {
      std::fprintf(stderr, "%s\n", m.status().ToString().c_str());
      std::exit(1);
    }
    return std::move(m).value();
  }();
  return *model;
}

std::vector<int32_t> Stream(int64_t n, int64_t vocab) {
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i)
    ids[i] = static_cast<int32_t>((i * 7919 + 3) % vocab);
  return ids;
}

void BM_PlainForwardLogits(benchmark::State& state) {
  SetThreads(static_cast<int>(state.range(0)));
  const int64_t ctx = state.range(1);
  const Model& model = PplModel();
  HookSet hooks;
  hooks.Add({HookSite::kLogits, -1});
  auto ex = Executor::Create(
      model, hooks,
      {.max_tokens = ctx, .max_seq_len = ctx, .logits_chunk_rows = 256});
  if (!ex.ok()) return state.SkipWithError(ex.status().ToString().c_str());
  const std::vector<int32_t> ids = Stream(ctx, model.config().vocab_size);
  const std::vector<int64_t> starts = {0, ctx};
  (void)(*ex)->Forward(Batch{ids, starts}, nullptr);  // warm-up
  for (auto _ : state) {
    Status s = (*ex)->Forward(Batch{ids, starts}, nullptr);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
  }
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(ctx) * state.iterations(),
                         benchmark::Counter::kIsRate);
  state.SetLabel("bf16 forward + lm_head, " + std::to_string(state.range(0)) +
                 "T ctx " + std::to_string(ctx));
}

void BM_Perplexity(benchmark::State& state) {
  SetThreads(static_cast<int>(state.range(0)));
  const int64_t ctx = state.range(1);
  const Model& model = PplModel();
  const std::vector<int32_t> ids =
      Stream(ctx * 5 / 2, model.config().vocab_size);
  auto plan = eval::PlanWindows(
      static_cast<int64_t>(ids.size()),
      {.protocol = eval::Protocol::kHfStride, .ctx = ctx, .stride = ctx / 2});
  if (!plan.ok()) return state.SkipWithError(plan.status().ToString().c_str());
  int64_t evaluated = 0, scored = 0;
  for (auto _ : state) {
    auto r = eval::EvaluatePerplexity(model, ids, *plan, {});
    if (!r.ok()) return state.SkipWithError(r.status().ToString().c_str());
    state.SetIterationTime(r->seconds);
    evaluated += r->tokens_evaluated;
    scored += r->tokens_scored;
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(evaluated),
                                               benchmark::Counter::kIsRate);
  state.counters["scored_tok/s"] = benchmark::Counter(
      static_cast<double>(scored), benchmark::Counter::kIsRate);
  state.SetLabel("bf16 hf-stride, " + std::to_string(plan->windows.size()) +
                 " windows, " + std::to_string(state.range(0)) + "T ctx " +
                 std::to_string(ctx));
}

BENCHMARK(BM_PlainForwardLogits)
    ->ArgNames({"threads", "ctx"})
    ->ArgsProduct({{2}, {512}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(1.0);
BENCHMARK(BM_Perplexity)
    ->ArgNames({"threads", "ctx"})
    ->ArgsProduct({{2}, {512}})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(2);

}  // namespace
}  // namespace loom
