// Prefill throughput of the full forward on a synthetic model with
// TinyLlama-1.1B shapes (hidden 2048, 22 layers, 32 heads / 4 KV heads,
// intermediate 5632, vocab 32000), bf16 weights written by `loom synth`.
//
// Reported per case: tokens/s and, as the in-run baseline, the fraction of the
// time a forward spends in its GEMMs alone (the same GEMM shapes timed in the
// same process). Nothing is asserted.
//
// The model is written once to $LOOM_BENCH_DIR (default: the system temp dir).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "bench/bench_util.h"
#include "src/backend/registry.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"

namespace loom {
namespace {

const Model& GetModel(Precision p) {
  static std::unique_ptr<Model> models[2];
  const int i = p == Precision::kF32 ? 0 : 1;
  if (!models[i]) {
    for (auto& m : models) m.reset();  // keep one resident at a time
    auto m = Model::Load(bench::SyntheticTinyLlamaDir(), p);
    if (!m.ok()) {
      std::fprintf(stderr, "%s\n", m.status().ToString().c_str());
      std::exit(1);
    }
    models[i] = std::move(m).value();
  }
  return *models[i];
}

// Runs one forward of `tokens` tokens through all layers (resid_post of the
// last layer: no final norm / lm_head, as an extraction job would).
void BM_Prefill(benchmark::State& state) {
  const Precision precision =
      state.range(0) == 32 ? Precision::kF32 : Precision::kBF16;
  const int threads = static_cast<int>(state.range(1));
  const int64_t tokens = state.range(2);
  auto backend = CreateBackend("cpu");
  if (!backend.ok()) {
    state.SkipWithError(backend.status().ToString().c_str());
    return;
  }
  Backend& be = **backend;
  be.SetNumThreads(threads);
  const Model& model = GetModel(precision);
  const ModelConfig& c = model.config();
  HookSet hooks;
  hooks.Add({HookSite::kResidPost, c.num_layers - 1});
  auto ex = Executor::Create(model, hooks,
                             {.max_tokens = tokens, .max_seq_len = tokens});
  if (!ex.ok()) {
    state.SkipWithError(ex.status().ToString().c_str());
    return;
  }
  std::vector<int32_t> ids(tokens);
  for (int64_t i = 0; i < tokens; ++i)
    ids[i] = static_cast<int32_t>((i * 7919) % c.vocab_size);
  std::vector<int64_t> starts = {0, tokens};
  (void)(*ex)->Forward(Batch{ids, starts},
                       nullptr);  // warm-up: primitive creation, page faults
  for (auto _ : state) {
    Status s = (*ex)->Forward(Batch{ids, starts}, nullptr);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
  }
  // Baseline in the same process: the forward's GEMMs alone.
  std::vector<float> x(tokens * c.intermediate_size, 0.01f),
      y(tokens * 2 * c.intermediate_size);
  const size_t ws_bytes = static_cast<size_t>(be.Costs().gemm_workspace(
      tokens, c.intermediate_size, model.compute_dtype()));
  std::unique_ptr<void, decltype(&std::free)> ws(
      std::aligned_alloc(64, (ws_bytes + 127) / 64 * 64), &std::free);
  auto run_gemms = [&] {
    for (int64_t l = 0; l < c.num_layers; ++l) {
      for (WeightRole r :
           {WeightRole::kQ, WeightRole::kK, WeightRole::kV, WeightRole::kO,
            WeightRole::kGate, WeightRole::kUp, WeightRole::kDown}) {
        const TensorView& w = model.weights().Require(r, l);
        GemmOp op;
        op.x = x.data();
        op.w = MakeWeightOperand(w, MatrixLayout::kOutIn);
        op.m = tokens;
        op.y = y.data();
        op.workspace = ws.get();
        be.Gemm(op);
      }
    }
  };
  run_gemms();
  const auto t0 = std::chrono::steady_clock::now();
  run_gemms();
  const double gemm_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(tokens) * state.iterations(),
                         benchmark::Counter::kIsRate);
  state.counters["gemm_only_tok/s"] = static_cast<double>(tokens) / gemm_s;
  state.SetLabel(std::string(precision == Precision::kF32 ? "f32" : "bf16") +
                 " " + std::to_string(threads) + "T " + std::to_string(tokens) +
                 " tokens");
}

BENCHMARK(BM_Prefill)
    ->ArgNames({"prec", "threads", "tokens"})
    ->ArgsProduct({{16, 32}, {1, 2}, {128, 512}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);

}  // namespace
}  // namespace loom
