#include "src/eval/prefill_bench.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <memory>
#include <random>

#include "src/backend/registry.h"
#include "src/eval/session.h"
#include "src/model/layer_config.h"
#include "src/runtime/executor.h"

namespace loom {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Weight elements one token multiplies in layer `lc` of `c`.
double LayerWeightsPerToken(const ModelConfig& c, const LayerConfig& lc) {
  const double H = static_cast<double>(c.hidden_size);
  double w = 0;
  if (lc.is_mla()) {
    const MlaConfig& m = lc.mla;
    const double heads = static_cast<double>(lc.q_heads);
    w += m.q_lora_rank > 0
             ? m.q_lora_rank * H + heads * m.qk_head_dim() * m.q_lora_rank
             : heads * m.qk_head_dim() * H;
    w += (m.kv_lora_rank + m.qk_rope_head_dim) * H;
    w += heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank;
  } else {
    w += static_cast<double>(lc.q_width() + lc.k_width() + lc.v_width()) * H;
  }
  w += static_cast<double>(lc.z_width()) * H;  // o_proj
  if (lc.moe()) {
    const double Ie = static_cast<double>(lc.expert_intermediate_size);
    w += static_cast<double>(lc.num_experts) * H;  // router
    w += static_cast<double>(lc.experts_per_token) * 3 * Ie * H;
    if (lc.shared_expert())
      w += 3.0 * lc.shared_expert_intermediate_size * H +
           (lc.shared_expert_gate ? H : 0);
  } else {
    const double I = static_cast<double>(c.intermediate_size);
    w += (lc.mlp == MlpKind::kPlain ? 2 : 3) * I * H;
  }
  return w;
}

// Seconds of the fastest of `iterations` runs of fn (after one warm-up).
template <typename Fn>
StatusOr<double> Fastest(int iterations, Fn fn) {
  RETURN_IF_ERROR(fn());
  double best = 1e300;
  for (int i = 0; i < iterations; ++i) {
    const Clock::time_point t0 = Clock::now();
    RETURN_IF_ERROR(fn());
    best = std::min(best, Since(t0));
  }
  return best;
}

// FLOP/s of one dense [T, H] x [H, 4H] GEMM in `dtype` (random weights).
StatusOr<double> DenseGemmRate(Backend& be, int64_t T, int64_t H, DType dtype,
                               int iterations) {
  const int64_t N = 4 * H;
  const KernelCosts costs = be.Costs();
  // The backend's own buffers (outside any forward).
  ASSIGN_OR_RETURN(Buffer w,
                   be.Allocate(N * H * DTypeSize(dtype), MemoryKind::kDevice));
  ASSIGN_OR_RETURN(Buffer x, be.Allocate(T * H * 4, MemoryKind::kDevice));
  ASSIGN_OR_RETURN(Buffer y, be.Allocate(T * N * 4, MemoryKind::kDevice));
  ASSIGN_OR_RETURN(
      Buffer ws,
      be.Allocate(costs.gemm_workspace ? costs.gemm_workspace(T, H, dtype) : 0,
                  MemoryKind::kDevice));
  const int64_t pad_bytes =
      costs.gemm_scratchpad ? costs.gemm_scratchpad(T, N, H, dtype, false) : 0;
  ASSIGN_OR_RETURN(Buffer pad, be.Allocate(pad_bytes, MemoryKind::kDevice));
  std::mt19937 rng(7);
  if (dtype == DType::kF32) {
    auto* v = static_cast<float*>(w.data());
    for (int64_t i = 0; i < N * H; ++i) v[i] = (rng() % 2001) * 1e-5f - 0.01f;
  } else {
    // Small values as bf16 / f16 bit patterns.
    auto* v = static_cast<uint16_t*>(w.data());
    for (int64_t i = 0; i < N * H; ++i)
      v[i] = static_cast<uint16_t>(0x3c00 + rng() % 0x100);
  }
  std::fill_n(static_cast<float*>(x.data()), T * H, 0.01f);
  be.SetGemmScratchpad(pad.data(), pad_bytes);
  // In the layout the forward's weights have (the backend's repack).
  const MatrixLayout layout = be.RepackedLayout(N, H, dtype);
  if (layout != MatrixLayout::kOutIn)
    be.RepackWeight(w.data(), N, H, dtype, w.data());
  GemmOp op;
  op.x = static_cast<const float*>(x.data());
  op.m = T;
  op.w.data = w.data();
  op.w.n = N;
  op.w.k = H;
  op.w.format = WeightStorage{FormatKind::kDense, dtype, layout};
  op.w.decode_dtype = dtype;
  op.y = static_cast<float*>(y.data());
  op.workspace = ws.data();
  ASSIGN_OR_RETURN(double s, Fastest(iterations, [&] {
                     be.Gemm(op);
                     return Status();
                   }));
  be.SetGemmScratchpad(nullptr, 0);
  return 2.0 * static_cast<double>(T) * H * N / s;
}

// Hooks nothing but needs every layer run: the final norm's output is
// delivered and dropped.
class DropSink : public HookSink {
 public:
  Status OnActivation(const HookPoint&, const Batch&, int64_t, int64_t,
                      const ActivationView&) override {
    return Status();
  }
};

}  // namespace

double PrefillGemmFlops(const ModelConfig& c, int64_t tokens) {
  double w = 0;
  for (const LayerConfig& lc : MakeLayerConfigs(c))
    w += LayerWeightsPerToken(c, lc);
  return 2.0 * w * static_cast<double>(tokens);
}

StatusOr<PrefillBenchResult> RunPrefillBench(const std::string& model_dir,
                                             const PrefillBenchOptions& o) {
  if (o.iterations < 1)
    return InvalidArgumentError("bench: --iterations " +
                                std::to_string(o.iterations) +
                                ": expected at least 1");
  PrefillBenchResult r;
  const HostDescription host = DescribeHost();
  r.cpu = host.cpu_model;
  r.isa = host.active_isa;
  // Planned (and refused when it does not fit) like any job: the largest
  // prefill's forward to the final norm.
  SessionParams sp;
  sp.command = "bench";
  sp.model_dir = model_dir;
  sp.precision = o.precision;
  sp.threads = o.threads;
  const Clock::time_point t0 = Clock::now();
  ASSIGN_OR_RETURN(
      std::unique_ptr<Session> session,
      Session::Open(sp, [&](const Session& s) -> StatusOr<JobSpec> {
        const ModelConfig& c = s.config();
        JobSpec job;
        job.batch_tokens = 0;
        for (int64_t T : o.tokens) {
          if (T < 1 || T > c.max_position_embeddings)
            return InvalidArgumentError(
                "bench: --tokens " + std::to_string(T) + " outside [1, " +
                std::to_string(c.max_position_embeddings) +
                "] (the model's max_position_embeddings)");
          job.batch_tokens = std::max(job.batch_tokens, T);
        }
        if (job.batch_tokens == 0)
          return InvalidArgumentError("bench: no --tokens given");
        job.context = job.batch_tokens;
        job.hooks.Add({HookSite::kFinalNorm, -1});
        return job;
      }));
  r.load_seconds = Since(t0);
  const Model* model = &session->model();
  const ModelConfig& c = model->config();
  for (const char ch : DTypeName(model->compute_dtype()))  // "bf16"
    r.precision += static_cast<char>(std::tolower(ch));
  for (const HostDescription::PrecisionPath& p : host.precisions)
    if (p.precision == r.precision) {
      r.gemm_path = p.gemm_path;
      r.peak_flops_per_cycle = p.peak_flops_per_cycle;
    }
  Backend* backend = session->host();
  r.threads = backend->SetNumThreads(o.threads);
  r.clock_hz = MeasureHostClockHz();
  r.peak_flops_per_second =
      static_cast<double>(r.peak_flops_per_cycle) * r.clock_hz * r.threads;
  HookSet hooks;
  hooks.Add({HookSite::kFinalNorm, -1});
  for (int64_t T : o.tokens) {
    PrefillPoint p;
    p.tokens = T;
    ASSIGN_OR_RETURN(std::unique_ptr<Executor> ex,
                     Executor::Create(*model, hooks,
                                      {.max_tokens = T,
                                       .max_seq_len = T,
                                       .backend = backend,
                                       .time_gemms = true}));
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i)
      ids[static_cast<size_t>(i)] =
          static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
    const std::vector<int64_t> starts = {0, T};
    DropSink sink;
    // The fastest forward, and the time its own GEMMs took in it.
    p.seconds = 1e300;
    for (int i = -1; i < o.iterations; ++i) {  // -1: the warm-up
      ex->ResetGemmSeconds();
      const Clock::time_point f0 = Clock::now();
      RETURN_IF_ERROR(ex->Forward(Batch{ids, starts}, &sink));
      const double s = Since(f0);
      if (i >= 0 && s < p.seconds) {
        p.seconds = s;
        p.forward_gemm_seconds = ex->gemm_seconds();
      }
    }
    ex.reset();  // its arenas, before the reference's buffers
    const double t = static_cast<double>(T);
    p.tokens_per_second = t / p.seconds;
    p.gemm_flops = PrefillGemmFlops(c, T);
    p.gemm_only_tokens_per_second = t / p.forward_gemm_seconds;
    ASSIGN_OR_RETURN(p.dense_gemm_flops_per_second,
                     DenseGemmRate(*backend, T, c.hidden_size,
                                   model->compute_dtype(), o.iterations));
    p.dense_reference_tokens_per_second =
        p.dense_gemm_flops_per_second / (p.gemm_flops / t);
    if (r.peak_flops_per_second > 0) {
      const double peak = r.peak_flops_per_second;
      p.forward_of_peak = p.gemm_flops / p.seconds / peak;
      p.gemm_of_peak = p.gemm_flops / p.forward_gemm_seconds / peak;
      p.dense_reference_of_peak = p.dense_gemm_flops_per_second / peak;
    }
    r.prefill.push_back(p);
  }
  return r;
}

}  // namespace loom
