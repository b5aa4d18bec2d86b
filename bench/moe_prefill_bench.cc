// MoE prefill on synthetic models with real expert shapes (`loom synth`
// presets, 1 layer, vocabulary 1024, bf16 compute, 2 threads):
//   qwen3-30b-a3b  hidden 2048, 128 experts top-8, expert intermediate 768,
//                  bf16 experts (separate gate / up / down GEMMs per expert);
//   gpt-oss-20b    hidden 2880, 32 experts top-4, intermediate 2880, MXFP4
//                  experts (fused interleaved gate_up GEMM + down, biases).
// The model is written once to $LOOM_BENCH_DIR (default: the system temp dir)
// as loom-synth-<preset>-1layer; an existing directory of that name is reused.
//
// Measured per forward, from hook timestamps (the executor is unchanged):
// the MoE layer = ln2.hook_normalized -> hook_mlp_out (router GEMM, top-k,
// grouping + gather, the expert GEMMs, activation, weighted scatter-add).
// Counters (times are means over the iterations):
//   moe_tok/s      tokens / MoE-layer time;
//   vs_dense       dense-GEMM time / MoE-layer time, i.e. MoE throughput as a
//                  fraction of the baseline's (goal >= 0.8);
//   router_frac    share of the MoE time in the router GEMM + top-k;
//   gemm_frac      share in the expert GEMMs alone (the executor's calls
//                  replayed with the same routing, same weights: one
//                  Backend::GemmGroup for gate/up, one for down);
//   group_speedup  the expert GEMMs one Gemm call after another (the
//                  schedule before GemmGroup; experts_1by1_ms) over the
//                  grouped schedule (experts_group_ms), same process;
//   experts_hit    experts with at least one routed row.
// Baseline (same process, same backend settings): the expert GEMMs' FLOPs as
// ONE GEMM. With T tokens and k experts per token there are R = T k routed
// rows; each goes through gate and up ([H] -> [Ie] each) and down ([Ie] ->
// [H]): 2 R H (2 Ie) + 2 R Ie H = 2 R H (3 Ie) FLOPs, i.e. exactly a
// [R, H] x [H, 3 Ie] GEMM. Its weight [3 Ie, H] is in the experts' stored
// format (bf16, or MXFP4 codes + E8M0 scales decoded by the same quantized
// GEMM path), random. It reads one expert-sized weight once, where the MoE
// layer reads every expert hit: the ratio prices both the per-expert launch
// overhead on small row counts and the extra weight traffic.
//
// Only ratios within one run are meaningful: absolute numbers depend on the
// machine and on what else runs on it.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "src/backend/registry.h"
#include "src/model/synth.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"

namespace loom {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

using bench::Buf;

const char* kPresets[] = {"qwen3-30b-a3b", "gpt-oss-20b"};

StatusOr<std::string> SyntheticDir(const std::string& preset) {
  const char* env = std::getenv("LOOM_BENCH_DIR");
  const std::string base =
      env ? env : std::filesystem::temp_directory_path().string();
  const std::string dir = base + "/loom-synth-" + preset + "-1layer";
  if (!std::filesystem::exists(dir + "/model.safetensors")) {
    SynthOptions o;
    o.preset = preset;
    o.num_layers = 1;
    o.vocab_size = 1024;
    o.dtype = DType::kBF16;
    RETURN_IF_ERROR(WriteSyntheticModel(dir, o).status());
  }
  return dir;
}

// Timestamps of the hooks that bracket the MoE layer, and the routing.
class TimingSink : public HookSink {
 public:
  Status OnActivation(const HookPoint& hook, const Batch&, int64_t, int64_t,
                      const ActivationView& view) override {
    const Clock::time_point now = Clock::now();
    switch (hook.site) {
      case HookSite::kLn2:
        ln2 = now;
        break;
      case HookSite::kExpertWeights:
        routed = now;
        break;
      case HookSite::kMlpOut:
        mlp_out = now;
        break;
      case HookSite::kExpertIds: {
        const auto* p = static_cast<const int32_t*>(view.data);  // [T, k]
        ids.assign(p, p + view.rows * view.cols);
        break;
      }
      default:
        break;
    }
    return Status();
  }
  Clock::time_point ln2, routed, mlp_out;
  std::vector<int32_t> ids;
};

// Args: preset index, tokens.
void BM_MoePrefill(benchmark::State& state) {
  const std::string preset = kPresets[state.range(0)];
  const int64_t T = state.range(1);
  const int threads = 2;
  auto dir = SyntheticDir(preset);
  if (!dir.ok()) {
    state.SkipWithError(("synth: " + dir.status().ToString()).c_str());
    return;
  }
  auto model = Model::Load(*dir, Precision::kBF16);
  if (!model.ok()) {
    state.SkipWithError(model.status().ToString().c_str());
    return;
  }
  const ModelConfig& c = (*model)->config();
  const Program program = BuildProgram(c);
  const LayerConfig& lc = program.layers.front();
  const int64_t H = c.hidden_size, K = lc.experts_per_token, E = lc.num_experts,
                Ie = lc.expert_intermediate_size, R = T * K;
  auto ex_backend = CreateBackend("cpu");
  auto be_or = CreateBackend("cpu");
  if (!ex_backend.ok() || !be_or.ok()) {
    state.SkipWithError("no cpu backend");
    return;
  }
  (*ex_backend)->SetNumThreads(threads);
  Backend& be = **be_or;  // baseline and replayed expert GEMMs
  be.SetNumThreads(threads);

  HookSet hooks;
  for (HookSite s : {HookSite::kLn2, HookSite::kExpertIds,
                     HookSite::kExpertWeights, HookSite::kMlpOut})
    hooks.Add({s, 0});
  auto ex = Executor::Create(
      **model, hooks,
      {.max_tokens = T, .max_seq_len = T, .backend = ex_backend->get()});
  if (!ex.ok()) {
    state.SkipWithError(ex.status().ToString().c_str());
    return;
  }
  std::vector<int32_t> ids(T);
  for (int64_t i = 0; i < T; ++i)
    ids[i] = static_cast<int32_t>((i * 7919) % c.vocab_size);
  std::vector<int64_t> starts = {0, T};
  TimingSink sink;
  Status st = (*ex)->Forward(Batch{ids, starts}, &sink);  // warm-up
  if (!st.ok()) {
    state.SkipWithError(st.ToString().c_str());
    return;
  }
  double moe_s = 0, router_s = 0;
  for (auto _ : state) {
    st = (*ex)->Forward(Batch{ids, starts}, &sink);
    if (!st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      return;
    }
    moe_s += Seconds(sink.mlp_out - sink.ln2);
    router_s += Seconds(sink.routed - sink.ln2);
  }
  const double iters = static_cast<double>(state.iterations());
  moe_s /= iters;
  router_s /= iters;

  // Rows per expert of the last forward's routing.
  std::vector<int64_t> rows(E, 0);
  for (int32_t e : sink.ids) ++rows[e];
  int64_t hit = 0;
  for (int64_t n : rows) hit += n > 0;

  // The expert GEMMs alone, replayed as the executor issues them.
  const BoundWeights& w = (*model)->weights();
  const bool fused = lc.expert_act == ExpertActKind::kClampedSwigluInterleaved;
  const WeightOperand w0 = WeightOperandOf(
      w, fused ? WeightRole::kExpertGateUp : WeightRole::kExpertGate, 0, 0);
  const KernelCosts costs = be.Costs();
  const DType wd = (*model)->compute_dtype();
  const int64_t kmax = std::max(H, Ie), nmax = std::max(3 * Ie, H);
  Buf x(R * kmax * 4), y(R * nmax * 4);
  std::fill_n(static_cast<float*>(x.p), R * kmax, 0.01f);
  Buf gemm_ws(costs.gemm_workspace ? costs.gemm_workspace(R, kmax, wd) : 0);
  int64_t scratch_bytes = 0;
  if (costs.gemm_scratchpad)
    scratch_bytes = std::max(costs.gemm_scratchpad(R, 3 * Ie, H, wd, false),
                             costs.gemm_scratchpad(R, H, Ie, wd, false));
  Buf scratch(scratch_bytes);
  if (scratch_bytes > 0) be.SetGemmScratchpad(scratch.p, scratch_bytes);
  int64_t decode_bytes = 0;
  if (w0.quantized() && costs.weight_decode_workspace)
    for (auto [n, k] : {std::pair{3 * Ie, H}, {2 * Ie, H}, {H, Ie}})
      decode_bytes = std::max(
          decode_bytes,
          costs.weight_decode_workspace(n, k, w0.format.kind, w0.decode_dtype));
  Buf decode(decode_bytes);
  if (decode_bytes > 0) be.SetWeightDecodeWorkspace(decode.p, decode_bytes);
  auto make_op = [&](const WeightOperand& op_w, WeightRole bias, int64_t e,
                     int64_t m) {
    GemmOp op;
    op.w = op_w;
    if (bias != WeightRole::kOther) {
      const BiasOperand b = BiasOf(w, bias, 0, e);
      op.bias = b.data;
      op.bias_dtype = b.dtype;
    }
    op.x = static_cast<const float*>(x.p);
    op.m = m;
    op.y = static_cast<float*>(y.p);
    op.workspace = gemm_ws.p;
    return op;
  };
  auto gemm = [&](const WeightOperand& op_w, WeightRole bias, int64_t e,
                  int64_t m, bool same_x) {
    GemmOp op = make_op(op_w, bias, e, m);
    op.reuse_x_workspace = same_x;
    be.Gemm(op);
  };
  auto run_experts = [&] {
    for (int64_t e = 0; e < E; ++e) {
      if (rows[e] == 0) continue;
      if (fused) {
        gemm(WeightOperandOf(w, WeightRole::kExpertGateUp, 0, e),
             WeightRole::kExpertGateUpBias, e, rows[e], false);
      } else {
        gemm(WeightOperandOf(w, WeightRole::kExpertGate, 0, e),
             WeightRole::kOther, e, rows[e], false);
        gemm(WeightOperandOf(w, WeightRole::kExpertUp, 0, e),
             WeightRole::kOther, e, rows[e], true);
      }
    }
    for (int64_t e = 0; e < E; ++e) {
      if (rows[e] == 0) continue;
      gemm(WeightOperandOf(w, WeightRole::kExpertDown, 0, e),
           lc.expert_bias ? WeightRole::kExpertDownBias : WeightRole::kOther, e,
           rows[e], false);
    }
  };

  // The same GEMMs as the executor issues them now: one Backend::GemmGroup
  // for every expert's gate and up, one for the downs (each expert's rows a
  // range of one [R, k] input).
  std::vector<GemmOp> items;
  auto run_group = [&] {
    GemmGroupOp g;
    g.x = static_cast<const float*>(x.p);
    g.rows = R;
    g.items = items.data();
    g.count = static_cast<int64_t>(items.size());
    g.workspace = gemm_ws.p;
    be.GemmGroup(g);
  };
  auto run_experts_grouped = [&] {
    items.clear();
    int64_t row = 0;
    for (int64_t e = 0; e < E; ++e) {
      if (rows[e] == 0) continue;
      auto add = [&](WeightRole wr, WeightRole br, int64_t col) {
        GemmOp op = make_op(WeightOperandOf(w, wr, 0, e), br, e, rows[e]);
        op.x = static_cast<const float*>(x.p) + row * H;
        op.y = static_cast<float*>(y.p) + row * nmax + col;
        op.ldy = nmax;
        items.push_back(op);
      };
      if (fused) {
        add(WeightRole::kExpertGateUp, WeightRole::kExpertGateUpBias, 0);
      } else {
        add(WeightRole::kExpertGate, WeightRole::kOther, 0);
        add(WeightRole::kExpertUp, WeightRole::kOther, Ie);
      }
      row += rows[e];
    }
    run_group();
    items.clear();
    row = 0;
    for (int64_t e = 0; e < E; ++e) {
      if (rows[e] == 0) continue;
      GemmOp op = make_op(
          WeightOperandOf(w, WeightRole::kExpertDown, 0, e),
          lc.expert_bias ? WeightRole::kExpertDownBias : WeightRole::kOther, e,
          rows[e]);
      op.x = static_cast<const float*>(x.p) + row * Ie;
      op.y = static_cast<float*>(y.p) + row * nmax;
      op.ldy = nmax;
      items.push_back(op);
      row += rows[e];
    }
    run_group();
  };

  // The dense baseline: [R, H] x [H, 3 Ie] in the experts' weight format.
  std::mt19937 rng(7);
  WeightOperand dense = w0;
  dense.n = 3 * Ie;
  dense.k = H;
  std::unique_ptr<Buf> dense_w, dense_sc;
  if (w0.quantized()) {
    // MXFP4: 4-bit codes [n, k / 2] bytes, E8M0 scales [n, k / 32].
    if (w0.format.kind != FormatKind::kMxfp4) {
      state.SkipWithError("baseline written for MXFP4 quantized experts only");
      return;
    }
    dense_w = std::make_unique<Buf>(dense.n * H / 2);
    dense_sc = std::make_unique<Buf>(dense.n * H / 32);
    auto* v = static_cast<uint8_t*>(dense_w->p);
    for (int64_t i = 0; i < dense.n * H / 2; ++i) v[i] = rng() & 0xFF;
    auto* s = static_cast<uint8_t*>(dense_sc->p);
    for (int64_t i = 0; i < dense.n * H / 32; ++i) s[i] = 118 + rng() % 8;
    dense.data = dense_w->p;
    dense.scales = dense_sc->p;
  } else {
    // Dense 16-bit values (bf16 / f16 bit patterns of small numbers).
    dense_w = std::make_unique<Buf>(dense.n * H * 2);
    auto* v = static_cast<uint16_t*>(dense_w->p);
    for (int64_t i = 0; i < dense.n * H; ++i)
      v[i] = static_cast<uint16_t>(0x3c00 + rng() % 0x100);
    dense.data = dense_w->p;
  }
  auto run_dense = [&] { gemm(dense, WeightRole::kOther, 0, R, false); };

  // Best of 3 after a warm-up, for both.
  auto best_of = [](auto&& fn) {
    fn();
    double best = 1e30;
    for (int i = 0; i < 3; ++i) {
      const auto t0 = Clock::now();
      fn();
      best = std::min(best, Seconds(Clock::now() - t0));
    }
    return best;
  };
  const double experts_s = best_of(run_experts);
  const double grouped_s = best_of(run_experts_grouped);
  const double dense_s = best_of(run_dense);

  state.counters["moe_tok/s"] = static_cast<double>(T) / moe_s;
  state.counters["moe_ms"] = moe_s * 1e3;
  state.counters["dense_ms"] = dense_s * 1e3;
  state.counters["vs_dense"] = dense_s / moe_s;
  state.counters["router_frac"] = router_s / moe_s;
  state.counters["gemm_frac"] = grouped_s / moe_s;
  // The expert GEMMs one by one (the schedule before GemmGroup) over the
  // grouped schedule, same process, same routing.
  state.counters["experts_1by1_ms"] = experts_s * 1e3;
  state.counters["experts_group_ms"] = grouped_s * 1e3;
  state.counters["group_speedup"] = experts_s / grouped_s;
  state.counters["experts_hit"] = static_cast<double>(hit);
  state.SetLabel(preset + " " + std::string(DTypeName(wd)) + " " +
                 (w0.quantized() ? "mxfp4" : "dense") + " experts, " +
                 std::to_string(threads) + "T, " + std::to_string(T) +
                 " tokens");
}

BENCHMARK(BM_MoePrefill)
    ->ArgNames({"preset", "tokens"})
    ->ArgsProduct({{0, 1}, {128, 512}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);

}  // namespace
}  // namespace loom
