// What interventions cost, against the same work without them, in one
// process (synthetic TinyLlama-1.1B shapes, bf16 weights, `loom synth`).
//
// BM_SteerPrefill: a prefill with one steering vector at one hook (layer 10's
//   hook_resid_post, every position) against the same prefill without:
//   the two forwards alternate in every iteration, so drift of a noisy
//   machine hits both; reports steer_cost_pct = 100 (t_steer / t_plain - 1).
// BM_PatchGrid: `loom patch`'s job (RunPatch) over L layers' hook_resid_pre
//   x P positions of a T-token prompt pair, against L * P + 2 plain forwards
//   of T tokens timed in the same process: grid_vs_forwards =
//   t_grid / t_forwards (the bound is <= 1: the patched cells run
//   batched).
// Nothing is asserted; the binary's context line names the CPU model.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <memory>

#include "bench/bench_util.h"
#include "src/backend/registry.h"
#include "src/eval/patch.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"

namespace loom {
namespace {

using Clock = std::chrono::steady_clock;

const Model& BenchModel() {
  static std::unique_ptr<Model> model = [] {
    auto m = Model::Load(bench::SyntheticTinyLlamaDir(), Precision::kBF16);
    if (!m.ok()) {
      std::fprintf(stderr, "%s\n", m.status().ToString().c_str());
      std::exit(1);
    }
    return std::move(m).value();
  }();
  return *model;
}

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void BM_SteerPrefill(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  auto backend = CreateBackend("cpu");
  if (!backend.ok()) {
    state.SkipWithError(backend.status().ToString().c_str());
    return;
  }
  const Model& model = BenchModel();
  const ModelConfig& c = model.config();
  HookSet hooks;
  hooks.Add({HookSite::kResidPost, c.num_layers - 1});
  auto ex = Executor::Create(
      model, hooks,
      {.max_tokens = tokens, .max_seq_len = tokens, .backend = backend->get()});
  if (!ex.ok()) {
    state.SkipWithError(ex.status().ToString().c_str());
    return;
  }
  std::vector<int32_t> ids(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i)
    ids[i] = static_cast<int32_t>((i * 7919) % c.vocab_size);
  const std::vector<int64_t> starts = {0, tokens};
  Intervention steer;
  steer.hook = {HookSite::kResidPost, std::min<int64_t>(10, c.num_layers - 1)};
  steer.mode = InterventionMode::kAdd;
  steer.scale = 4.0f;
  steer.vector.assign(static_cast<size_t>(c.hidden_size), 0.01f);
  const SequenceEdit edit{0, tokens, &steer};
  const Batch batch{ids, starts};
  for (int i = 0; i < 2; ++i)  // warm-up: primitives, page faults
    (void)(*ex)->Forward(batch, nullptr, nullptr, {&edit, 1});
  double plain = 0, steered = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    Status s = (*ex)->Forward(batch, nullptr);
    plain += Seconds(t0);
    t0 = Clock::now();
    if (s.ok()) s = (*ex)->Forward(batch, nullptr, nullptr, {&edit, 1});
    steered += Seconds(t0);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
  }
  state.counters["plain_tok/s"] = tokens * state.iterations() / plain;
  state.counters["steer_tok/s"] = tokens * state.iterations() / steered;
  state.counters["steer_cost_pct"] = 100.0 * (steered / plain - 1.0);
  state.SetLabel("bf16 " + std::to_string(tokens) + " tokens");
}

void BM_PatchGrid(benchmark::State& state) {
  const int64_t T = state.range(0);
  const Model& model = BenchModel();
  const ModelConfig& c = model.config();
  std::vector<int32_t> clean(static_cast<size_t>(T)), corrupted;
  for (int64_t i = 0; i < T; ++i)
    clean[i] = static_cast<int32_t>((i * 7919 + 3) % c.vocab_size);
  corrupted = clean;
  corrupted[static_cast<size_t>(T / 2)] = 5;
  eval::PatchOptions o;  // every layer's hook_resid_pre x every position
  o.batch_tokens = 512;
  double grid = 0;
  int64_t cells = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    auto r = eval::RunPatch(model, clean, corrupted, o);
    grid += Seconds(t0);
    if (!r.ok()) {
      state.SkipWithError(r.status().ToString().c_str());
      return;
    }
    cells = static_cast<int64_t>(r->logit_diff.size());
  }
  // The bound: cells + 2 forwards of T tokens, each to the last logits.
  HookSet hooks;
  hooks.Add({HookSite::kFinalNorm, -1});
  auto ex = Executor::Create(model, hooks, {.max_tokens = T});
  if (!ex.ok()) {
    state.SkipWithError(ex.status().ToString().c_str());
    return;
  }
  const std::vector<int64_t> starts = {0, T};
  (void)(*ex)->Forward(Batch{clean, starts}, nullptr);
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < cells + 2; ++i)
    (void)(*ex)->Forward(Batch{clean, starts}, nullptr);
  const double forwards = Seconds(t0);
  state.counters["cells"] = static_cast<double>(cells);
  state.counters["grid_s"] = grid / state.iterations();
  state.counters["forwards_s"] = forwards;
  state.counters["grid_vs_forwards"] = grid / state.iterations() / forwards;
  state.SetLabel("bf16 " + std::to_string(c.num_layers) + " layers x " +
                 std::to_string(T) + " positions");
}

BENCHMARK(BM_SteerPrefill)
    ->ArgName("tokens")
    ->Arg(128)
    ->Arg(512)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(8);
BENCHMARK(BM_PatchGrid)
    ->ArgName("tokens")
    ->Arg(8)
    ->Unit(benchmark::kSecond)
    ->UseRealTime()
    ->Iterations(1);

}  // namespace
}  // namespace loom
