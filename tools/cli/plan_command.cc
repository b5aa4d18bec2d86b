// loom plan (--model DIR | MODEL_DIR) [--device D]... [--max-memory M]
//   [--reserve R] [--mode analysis|generation] [--batch-tokens N] [--ctx N]
//   [--hooks H]... [--layers L] [--select all|last|mean] [--kv-context N]
//   [--dtype f32|bf16|f16] [--capture-to host|device] [--assume-dtype bf16]
//   [--strategy balanced|sequential|manual] [--layers-per-device 20,28]
//   [--solve max-batch-tokens|max-context|min-devices] [--json]
//
// Prints every byte a run would hold, per device and arena, without loading
// a weight: the model directory may hold only config.json (+ the index).
// Exits 1 with the breakdown and what would fit when the plan does not fit,
// 2 on a usage error.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "src/backend/registry.h"
#include "src/eval/job_plan.h"
#include "src/model/hooks.h"
#include "src/model/registry.h"
#include "src/plan/planner.h"
#include "src/plan/report.h"
#include "tools/cli/commands.h"
#include "tools/cli/flag_ranges.h"
#include "tools/cli/plan_flags.h"

namespace loom::cli {
namespace {

// --batch-tokens when not given, unless the model holds fewer positions.
constexpr int64_t kDefaultBatchTokens = 2048;

struct PlanArgs {
  std::string model_dir;  // MODEL_DIR (positional)
  std::string model;      // --model
  PlanFlags plan;         // --device ... --solve (PlanFlagUse::kPlanCommand)
  std::string mode = "analysis";
  int64_t batch_tokens = 0;  // 0 = min(kDefaultBatchTokens, max positions)
  int64_t ctx = 0;           // 0 = min(batch tokens, max positions)
  int64_t seqs_per_batch = 0;
  std::vector<std::string> hooks;
  std::vector<std::string> layers = {"*"};
  std::string select = "all";
  std::string dtype = "f32";
  std::string capture_to = "host";
  int64_t capture_buffers = 1;
  bool logits = false;
  int64_t logits_chunk = 256;
  std::string kv_dtype;
  int64_t kv_context = 0;
  bool json = false;
};

// The model directory from --model or MODEL_DIR: one of them, or both naming
// the same directory. InvalidArgument otherwise (a usage error).
StatusOr<std::string> ModelDir(const PlanArgs& a) {
  if (a.model.empty() && a.model_dir.empty())
    return InvalidArgumentError("no model directory: give --model DIR");
  if (a.model.empty()) return a.model_dir;
  if (a.model_dir.empty() || a.model_dir == a.model) return a.model;
  std::error_code ec;
  if (std::filesystem::equivalent(a.model_dir, a.model, ec) && !ec)
    return a.model;
  return InvalidArgumentError("MODEL_DIR '" + a.model_dir + "' and --model '" +
                              a.model +
                              "' name different directories; give one");
}

StatusOr<DType> ParseDTypeArg(const std::string& flag, const std::string& s) {
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

Status RunPlan(const PlanArgs& a, const std::string& model_dir,
               int* exit_code) {
  const PlanFlags& f = a.plan;
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  const ArchDef* arch = FindArch(config.model_type);
  const ArchWeights decl = arch->declare_weights(config);
  WeightTableOptions wopt;
  if (!f.assume_dtype.empty()) {
    ASSIGN_OR_RETURN(wopt.assume_dtype,
                     ParseDTypeArg("--assume-dtype", f.assume_dtype));
  }
  ASSIGN_OR_RETURN(WeightTable table,
                   BuildWeightTable(model_dir, config, decl, wopt));

  PlanInput in;
  in.config = &config;
  in.weights = &table;
  JobSpec& job = in.job;
  ASSIGN_OR_RETURN(job.mode, ParseJobMode(a.mode));
  // Defaults follow the model: a flag left out never asks for more
  // positions than it has (the table's job line says what was used).
  const int64_t max_positions = config.max_position_embeddings;
  job.batch_tokens = a.batch_tokens > 0
                         ? a.batch_tokens
                         : std::min(kDefaultBatchTokens, max_positions);
  job.context = a.ctx > 0 ? a.ctx : std::min(job.batch_tokens, max_positions);
  job.seqs_per_batch = a.seqs_per_batch;
  ASSIGN_OR_RETURN(job.hooks, ResolveHooks(a.hooks, a.layers, config));
  ASSIGN_OR_RETURN(job.selector, ParseSelector(a.select));
  ASSIGN_OR_RETURN(job.capture_dtype, ParseDTypeArg("--dtype", a.dtype));
  ASSIGN_OR_RETURN(job.capture_to, ParseCaptureTarget(a.capture_to));
  job.capture_buffers = a.capture_buffers;
  // Without hooks, plan the whole forward with its logits (perplexity).
  job.logits = a.logits || job.hooks.empty();
  job.logits_chunk_rows = a.logits_chunk;
  if (!a.kv_dtype.empty()) {
    ASSIGN_OR_RETURN(job.kv_dtype, ParseDTypeArg("--kv-dtype", a.kv_dtype));
  }
  job.kv_context = a.kv_context;

  const int64_t host = HostMemoryBytes();
  ASSIGN_OR_RETURN(in.devices,
                   DevicesFromFlags(f.devices, f.max_memory, f.reserve, host));
  ASSIGN_OR_RETURN(in.strategy, ParseStrategy(f.strategy));
  in.offload = f.offload;
  if (!f.layers_per_device.empty()) {
    ASSIGN_OR_RETURN(in.layers_per_device,
                     ParseLayersPerDevice(f.layers_per_device));
    if (f.strategy == "balanced") in.strategy = Strategy::kManual;
  }
  if (in.strategy == Strategy::kManual && in.layers_per_device.empty())
    return InvalidArgumentError("--strategy manual needs --layers-per-device");
  // Kernel costs of the backend the layers run on, as every job command takes
  // them: the CUDA backend's when a GPU computes (in every build).
  bool gpu = false;
  for (const DeviceSpec& d : in.devices)
    gpu = gpu || (d.kind == DeviceKind::kCuda && d.compute);
  in.costs = BackendCosts(gpu ? DeviceKind::kCuda : DeviceKind::kCpu);

  nlohmann::json solved;
  std::string solved_line;
  if (f.solve == "max-batch-tokens") {
    StatusOr<int64_t> most = SolveMaxBatchTokens(in);
    if (!most.ok()) return ExplainNoBatchFits(in, most.status());
    const int64_t t = *most;
    job.batch_tokens = t;
    if (a.ctx <= 0) job.context = std::min(t, max_positions);
    solved = {{"what", f.solve}, {"value", t}};
    solved_line = "max batch tokens: " + std::to_string(t) + "\n";
  } else if (f.solve == "max-context") {
    ASSIGN_OR_RETURN(int64_t ctx, SolveMaxContext(in));
    job.context = ctx;
    job.batch_tokens = std::max(job.batch_tokens, ctx);
    solved = {{"what", f.solve}, {"value", ctx}};
    solved_line = "max context: " + std::to_string(ctx) + "\n";
  } else if (f.solve == "min-devices") {
    ASSIGN_OR_RETURN(in.devices, SolveMinDevices(in));
    int n = 0;
    for (const DeviceSpec& d : in.devices)
      n += d.compute && d.kind != DeviceKind::kDisk;
    solved = {{"what", f.solve}, {"value", n}};
    solved_line = "min devices: " + std::to_string(n) + "\n";
  } else if (!f.solve.empty()) {
    return InvalidArgumentError(
        "--solve '" + f.solve +
        "': expected max-batch-tokens, max-context or min-devices");
  }

  ASSIGN_OR_RETURN(MemoryPlan plan, MakePlan(in));
  if (a.json) {
    nlohmann::json j = PlanToJson(plan);
    if (!solved.is_null()) j["solve"] = solved;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s%s", solved_line.c_str(), FormatPlanTable(plan).c_str());
  }
  if (!plan.fits) {
    std::fprintf(
        stderr, "loom plan: the plan does not fit%s\n",
        plan.problems.empty() ? "" : (": " + plan.problems.front()).c_str());
    *exit_code = 1;
  }
  return Status();
}

}  // namespace

void AddPlanCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* cmd =
      app.add_subcommand("plan",
                         "Every byte a run will hold, per device and arena, "
                         "before loading anything (the model directory may "
                         "hold only config.json and the index)");
  cmd->add_option("--model", a->model,
                  "Hugging Face model directory (or give it as MODEL_DIR)");
  cmd->add_option("MODEL_DIR", a->model_dir,
                  "Hugging Face model directory (as --model)");
  AddPlanFlags(*cmd, &a->plan, PlanFlagUse::kPlanCommand);
  cmd->add_option("--mode", a->mode,
                  "analysis (no KV cache) or generation (KV cache for --ctx)");
  cmd->add_option("--batch-tokens", a->batch_tokens,
                  "Tokens per forward (packed sequences; default min(2048, "
                  "max_position_embeddings))")
      ->check(IntRange(1));
  cmd->add_option("--ctx", a->ctx,
                  "Longest sequence; generation: KV cache positions (default: "
                  "--batch-tokens, at most max_position_embeddings)")
      ->check(IntRange(1));
  cmd->add_option("--seqs-per-batch", a->seqs_per_batch,
                  "Sequences per batch (default: batch tokens / ctx)")
      ->check(IntRange(1));
  // No hooks: the whole forward with its logits (perplexity).
  AddHookFlags(*cmd, &a->hooks, &a->layers);
  cmd->get_option("--layers")->default_str("*");
  cmd->add_option("--select", a->select,
                  "Rows kept per sequence: all, last or mean");
  cmd->add_option("--dtype", a->dtype, "Capture dtype: f32, bf16 or f16");
  cmd->add_option("--capture-to", a->capture_to,
                  "Where captures are staged: host or device");
  cmd->add_option("--capture-buffers", a->capture_buffers,
                  "Staging buffers per hook (2 = double-buffered)")
      ->capture_default_str()
      ->check(IntRange(1));
  cmd->add_flag("--logits", a->logits,
                "Compute logits (perplexity) even with hooks (without hooks "
                "they always are)");
  cmd->add_option("--logits-chunk", a->logits_chunk,
                  "Rows of logits computed at a time")
      ->capture_default_str()
      ->check(IntRange(1));
  cmd->add_option("--kv-dtype", a->kv_dtype,
                  "KV cache dtype (default: the model's torch_dtype; analysis "
                  "with --kv-context: the activation dtype)");
  cmd->add_option("--kv-context", a->kv_context,
                  "analysis: a KV cache of one sequence of N positions for "
                  "rows streamed in chunks (as `loom extract "
                  "--streaming-chunk-size` with --max-row-tokens N; default "
                  "0: none)")
      ->check(IntRange(0));
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a, exit_code] {
    StatusOr<std::string> model_dir = ModelDir(*a);
    if (!model_dir.ok()) {
      ReportStatus("plan", model_dir.status());
      *exit_code = 2;  // a usage error
      return;
    }
    const Status s = RunPlan(*a, *model_dir, exit_code);
    if (!s.ok()) *exit_code = ReportStatus("plan", s);
  });
}

}  // namespace loom::cli
