#include "src/eval/plan_query.h"

#include <algorithm>
#include <optional>

#include "src/backend/registry.h"
#include "src/model/hooks.h"
#include "src/model/registry.h"
#include "src/plan/report.h"
#include "src/runtime/backward.h"

namespace loom {
namespace {

// SolveMaxBatchTokens' refusal, with the table of the one-token plan.
Status ExplainNoBatchFits(const PlanInput& in, const Status& refusal) {
  if (refusal.code() != StatusCode::kResourceExhausted) return refusal;
  PlanInput one = in;
  one.suggest = false;
  one.job.batch_tokens = 1;
  if (one.job.seqs_per_batch > 1) one.job.seqs_per_batch = 1;
  StatusOr<MemoryPlan> plan = MakePlan(one);
  if (!plan.ok()) return refusal;
  return ResourceExhaustedError(refusal.message() + ":\n" +
                                FormatPlanTable(*plan));
}

}  // namespace

StatusOr<DType> ParsePlanDType(const std::string& flag, const std::string& s) {
  const std::string name = s == "f32"    ? "F32"
                           : s == "bf16" ? "BF16"
                           : s == "f16"  ? "F16"
                                         : s;
  std::optional<DType> d = ParseDType(name);
  if (!d)
    return InvalidArgumentError(flag + " '" + s +
                                "': expected f32, bf16 or f16");
  return *d;
}

nlohmann::json PlanQueryResult::ToJson() const {
  nlohmann::json j = PlanToJson(plan);
  if (!solved.is_null()) j["solve"] = solved;
  // How the host multiplies in each precision (16-bit weights stay stored on
  // every ISA; without native support they are widened per panel).
  const HostDescription host = DescribeHost();
  j["cpu"] = {{"isa", host.active_isa}};
  for (const auto& p : host.precisions)
    j["cpu"]["gemm"][p.precision] = {{"native", p.native}, {"how", p.how}};
  return j;
}

StatusOr<PlanQueryResult> RunPlanQuery(const PlanQuery& q) {
  const JobPlanOptions& f = q.devices;
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(q.model_dir));
  const ArchDef* arch = FindArch(config.model_type);
  const ArchWeights decl = arch->declare_weights(config);
  WeightTableOptions wopt;
  if (!q.assume_dtype.empty()) {
    ASSIGN_OR_RETURN(wopt.assume_dtype,
                     ParsePlanDType("--assume-dtype", q.assume_dtype));
  }
  ASSIGN_OR_RETURN(WeightTable table,
                   BuildWeightTable(q.model_dir, config, decl, wopt));

  PlanInput in;
  in.config = &config;
  in.weights = &table;
  JobSpec& job = in.job;
  ASSIGN_OR_RETURN(job.mode, ParseJobMode(q.mode));
  // Defaults follow the model: a flag left out never asks for more
  // positions than it has (the table's job line says what was used).
  const int64_t max_positions = config.max_position_embeddings;
  job.batch_tokens = q.batch_tokens > 0
                         ? q.batch_tokens
                         : std::min(kDefaultPlanBatchTokens, max_positions);
  job.context = q.ctx > 0 ? q.ctx : std::min(job.batch_tokens, max_positions);
  job.seqs_per_batch = q.seqs_per_batch;
  // Bare sites default to every layer here.
  const bool layers_given = !q.layers.empty();
  ASSIGN_OR_RETURN(
      job.hooks,
      ResolveHooks(q.hooks,
                   layers_given ? q.layers : std::vector<std::string>{"*"},
                   config, layers_given));
  ASSIGN_OR_RETURN(job.selector, ParseSelector(q.select));
  ASSIGN_OR_RETURN(job.capture_dtype, ParsePlanDType("--dtype", q.dtype));
  ASSIGN_OR_RETURN(job.capture_to, ParseCaptureTarget(q.capture_to));
  job.capture_buffers = q.capture_buffers;
  // Without hooks, plan the whole forward with its logits (perplexity).
  job.logits = q.logits || job.hooks.empty();
  job.logits_chunk_rows = q.logits_chunk;
  if (!q.kv_dtype.empty()) {
    ASSIGN_OR_RETURN(job.kv_dtype, ParsePlanDType("--kv-dtype", q.kv_dtype));
  }
  job.kv_context = q.kv_context;
  if (q.backward) {
    if (!q.solve.empty())
      return UnimplementedError(
          "--backward with --solve: the backward's bytes are planned for the "
          "given --batch-tokens only");
    // One sequence of batch_tokens tokens (its own positions).
    job.context = job.batch_tokens;
    job.seqs_per_batch = 1;
    job.tapped_hooks = BackwardTappedHooks(config, job.hooks);
    job.logits = true;
    job.logits_chunk_rows = std::min(job.logits_chunk_rows, job.batch_tokens);
    job.backward_bytes =
        PlannedBackwardBytes(config, job.batch_tokens, job.logits_chunk_rows);
  }

  const int64_t host = HostMemoryBytes();
  ASSIGN_OR_RETURN(in.devices,
                   DevicesFromFlags(f.devices, f.max_memory, f.reserve, host));
  ASSIGN_OR_RETURN(in.strategy, ParseStrategy(q.strategy));
  in.offload = f.offload;
  if (!q.layers_per_device.empty()) {
    ASSIGN_OR_RETURN(in.layers_per_device,
                     ParseLayersPerDevice(q.layers_per_device));
    if (q.strategy == "balanced") in.strategy = Strategy::kManual;
  }
  if (in.strategy == Strategy::kManual && in.layers_per_device.empty())
    return InvalidArgumentError("--strategy manual needs --layers-per-device");
  // Kernel costs of the backend the layers run on, as every job command takes
  // them: the CUDA backend's when a GPU computes (in every build).
  bool gpu = false;
  for (const DeviceSpec& d : in.devices)
    gpu = gpu || (d.kind == DeviceKind::kCuda && d.compute);
  in.costs = BackendCosts(gpu ? DeviceKind::kCuda : DeviceKind::kCpu);

  PlanQueryResult r;
  if (q.solve == "max-batch-tokens") {
    StatusOr<int64_t> most = SolveMaxBatchTokens(in);
    if (!most.ok()) return ExplainNoBatchFits(in, most.status());
    const int64_t t = *most;
    job.batch_tokens = t;
    if (q.ctx <= 0) job.context = std::min(t, max_positions);
    r.solved = {{"what", q.solve}, {"value", t}};
    r.solved_line = "max batch tokens: " + std::to_string(t) + "\n";
  } else if (q.solve == "max-context") {
    ASSIGN_OR_RETURN(int64_t ctx, SolveMaxContext(in));
    job.context = ctx;
    job.batch_tokens = std::max(job.batch_tokens, ctx);
    r.solved = {{"what", q.solve}, {"value", ctx}};
    r.solved_line = "max context: " + std::to_string(ctx) + "\n";
  } else if (q.solve == "min-devices") {
    ASSIGN_OR_RETURN(in.devices, SolveMinDevices(in));
    int n = 0;
    for (const DeviceSpec& d : in.devices)
      n += d.compute && d.kind != DeviceKind::kDisk;
    r.solved = {{"what", q.solve}, {"value", n}};
    r.solved_line = "min devices: " + std::to_string(n) + "\n";
  } else if (!q.solve.empty()) {
    return InvalidArgumentError(
        "--solve '" + q.solve +
        "': expected max-batch-tokens, max-context or min-devices");
  }
  ASSIGN_OR_RETURN(r.plan, MakePlan(in));
  return r;
}

}  // namespace loom
