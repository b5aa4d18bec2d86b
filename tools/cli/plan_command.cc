// loom plan MODEL_DIR [--device D]... [--max-memory M] [--reserve R]
//   [--mode analysis|generation] [--batch-tokens N] [--ctx N] [--hooks H]...
//   [--layers L] [--select all|last|mean] [--dtype f32|bf16|f16]
//   [--capture-to host|device] [--assume-dtype bf16]
//   [--strategy balanced|sequential|manual] [--layers-per-device 20,28]
//   [--solve max-batch-tokens|max-context|min-devices] [--json]
//
// Prints every byte a run would hold, per device and arena, without loading
// a weight: MODEL_DIR may hold only config.json (+ the index). Exits 1 with
// the breakdown and what would fit when the plan does not fit.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "src/backend/registry.h"
#include "src/eval/job_plan.h"
#include "src/model/registry.h"
#include "src/plan/planner.h"
#include "src/plan/report.h"
#include "tools/cli/commands.h"

namespace loom::cli {
namespace {

struct PlanArgs {
  std::string model_dir;
  std::vector<std::string> devices;
  std::string max_memory;
  std::string reserve;
  std::string mode = "analysis";
  int64_t batch_tokens = 2048;
  int64_t ctx = 0;  // 0 = batch tokens
  int64_t seqs_per_batch = 0;
  std::vector<std::string> hooks;
  std::string layers = "*";
  std::string select = "all";
  std::string dtype = "f32";
  std::string capture_to = "host";
  int64_t capture_buffers = 1;
  bool logits = false;
  int64_t logits_chunk = 256;
  std::string kv_dtype;
  std::string assume_dtype;
  std::string strategy = "balanced";
  std::string layers_per_device;
  std::string solve;
  bool json = false;
};

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin <= s.size()) {
    size_t end = s.find(',', begin);
    if (end == std::string::npos) end = s.size();
    if (end > begin) out.push_back(s.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
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

// --hooks takes full names ("blocks.3.hook_resid_post", "blocks.*.attn.hook_q",
// "ln_final.hook_normalized") or bare per-layer sites ("hook_resid_post"),
// which apply to every layer of --layers ("0,12,-1", "0.5", "*").
StatusOr<HookSet> ParseHooks(const PlanArgs& a, int64_t num_layers) {
  HookSet set;
  for (const std::string& group : a.hooks) {
    for (const std::string& item : SplitList(group)) {
      std::vector<std::string> patterns;
      const bool model_level =
          item == "hook_embed" || item == "hook_pos_embed" ||
          item == "ln_final.hook_normalized" || item == "logits";
      if (item.rfind("blocks.", 0) == 0 || model_level) {
        patterns.push_back(item);
      } else {
        for (const std::string& l : SplitList(a.layers))
          patterns.push_back(
              "blocks." +
              (l.find('.') != std::string::npos ? "{" + l + "}" : l) + "." +
              item);
      }
      for (const std::string& p : patterns) {
        ASSIGN_OR_RETURN(std::vector<HookPoint> hs,
                         ParseHookPattern(p, num_layers));
        for (const HookPoint& h : hs) set.Add(h);
      }
    }
  }
  return set;
}

Status RunPlan(const PlanArgs& a, int* exit_code) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(a.model_dir));
  const ArchDef* arch = FindArch(config.model_type);
  const ArchWeights decl = arch->declare_weights(config);
  WeightTableOptions wopt;
  if (!a.assume_dtype.empty()) {
    ASSIGN_OR_RETURN(wopt.assume_dtype,
                     ParseDTypeArg("--assume-dtype", a.assume_dtype));
  }
  ASSIGN_OR_RETURN(WeightTable table,
                   BuildWeightTable(a.model_dir, config, decl, wopt));

  PlanInput in;
  in.config = &config;
  in.weights = &table;
  JobSpec& job = in.job;
  ASSIGN_OR_RETURN(job.mode, ParseJobMode(a.mode));
  job.batch_tokens = a.batch_tokens;
  job.context = a.ctx > 0 ? a.ctx : a.batch_tokens;
  job.seqs_per_batch = a.seqs_per_batch;
  ASSIGN_OR_RETURN(job.hooks, ParseHooks(a, config.num_layers));
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

  const int64_t host = HostMemoryBytes();
  ASSIGN_OR_RETURN(in.devices,
                   DevicesFromFlags(a.devices, a.max_memory, a.reserve, host));
  ASSIGN_OR_RETURN(in.strategy, ParseStrategy(a.strategy));
  if (!a.layers_per_device.empty()) {
    ASSIGN_OR_RETURN(in.layers_per_device,
                     ParseLayersPerDevice(a.layers_per_device));
    if (a.strategy == "balanced") in.strategy = Strategy::kManual;
  }
  if (in.strategy == Strategy::kManual && in.layers_per_device.empty())
    return InvalidArgumentError("--strategy manual needs --layers-per-device");
  // Kernel costs from the backend, as every job command takes them (a CUDA
  // backend will give its own).
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend("cpu"));
  in.costs = backend->Costs();

  nlohmann::json solved;
  std::string solved_line;
  if (a.solve == "max-batch-tokens") {
    ASSIGN_OR_RETURN(int64_t t, SolveMaxBatchTokens(in));
    job.batch_tokens = t;
    if (a.ctx <= 0) job.context = t;
    solved = {{"what", a.solve}, {"value", t}};
    solved_line = "max batch tokens: " + std::to_string(t) + "\n";
  } else if (a.solve == "max-context") {
    ASSIGN_OR_RETURN(int64_t ctx, SolveMaxContext(in));
    job.context = ctx;
    job.batch_tokens = std::max(job.batch_tokens, ctx);
    solved = {{"what", a.solve}, {"value", ctx}};
    solved_line = "max context: " + std::to_string(ctx) + "\n";
  } else if (a.solve == "min-devices") {
    ASSIGN_OR_RETURN(in.devices, SolveMinDevices(in));
    int n = 0;
    for (const DeviceSpec& d : in.devices)
      n += d.compute && d.kind != DeviceKind::kDisk;
    solved = {{"what", a.solve}, {"value", n}};
    solved_line = "min devices: " + std::to_string(n) + "\n";
  } else if (!a.solve.empty()) {
    return InvalidArgumentError(
        "--solve '" + a.solve +
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
                         "before loading anything "
                         "(MODEL_DIR may hold only config.json and the index)");
  cmd->add_option("MODEL_DIR", a->model_dir, "Hugging Face model directory")
      ->required();
  cmd->add_option("--device", a->devices,
                  "cpu[=SIZE] (default: detected RAM), cuda:N=SIZE (declared), "
                  "disk (weights streamed "
                  "from the checkpoint); repeatable");
  cmd->add_option("--max-memory", a->max_memory,
                  "Budgets in accelerate's syntax: 0=38GiB,1=90GiB,cpu=50GiB");
  cmd->add_option(
      "--reserve", a->reserve,
      "Bytes set aside: SIZE for every device, or cuda:0=2GiB,cpu=4GiB");
  cmd->add_option("--mode", a->mode,
                  "analysis (no KV cache) or generation (KV cache for --ctx)");
  cmd->add_option("--batch-tokens", a->batch_tokens,
                  "Tokens per forward (packed sequences)");
  cmd->add_option("--ctx", a->ctx,
                  "Longest sequence (default: --batch-tokens)");
  cmd->add_option("--seqs-per-batch", a->seqs_per_batch,
                  "Sequences per batch (default: batch tokens / ctx)");
  cmd->add_option(
      "--hooks", a->hooks,
      "Hooks as for loom extract: blocks.{L}.hook_resid_post, or a bare site "
      "applied to --layers; "
      "comma-separated or repeated (none: the whole forward with logits)");
  cmd->add_option("--layers", a->layers,
                  "Layers for bare hook sites: 0,12,-1 or 0.5 or * (default)");
  cmd->add_option("--select", a->select,
                  "Rows kept per sequence: all, last or mean");
  cmd->add_option("--dtype", a->dtype, "Capture dtype: f32, bf16 or f16");
  cmd->add_option("--capture-to", a->capture_to,
                  "Where captures are staged: host or device");
  cmd->add_option("--capture-buffers", a->capture_buffers,
                  "Staging buffers per hook (2 = double-buffered)");
  cmd->add_flag("--logits", a->logits,
                "Compute logits (perplexity) even with hooks");
  cmd->add_option("--logits-chunk", a->logits_chunk,
                  "Rows of logits computed at a time");
  cmd->add_option("--kv-dtype", a->kv_dtype,
                  "KV cache dtype (default: the model's torch_dtype)");
  cmd->add_option("--assume-dtype", a->assume_dtype,
                  "Dtype of tensors whose headers are absent (index or config "
                  "only); default torch_dtype");
  cmd->add_option("--strategy", a->strategy, "balanced, sequential or manual");
  cmd->add_option("--layers-per-device", a->layers_per_device,
                  "Layer counts per device in order (manual): 20,28");
  cmd->add_option("--solve", a->solve,
                  "max-batch-tokens, max-context or min-devices");
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a, exit_code] {
    const Status s = RunPlan(*a, exit_code);
    if (!s.ok()) *exit_code = ReportStatus("plan", s);
  });
}

}  // namespace loom::cli
