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
#include "src/eval/plan_query.h"
#include "src/model/hooks.h"
#include "src/model/registry.h"
#include "src/plan/planner.h"
#include "src/plan/report.h"
#include "tools/cli/commands.h"
#include "tools/cli/flag_ranges.h"
#include "tools/cli/plan_flags.h"

namespace loom::cli {
namespace {

struct PlanArgs {
  std::string model_dir;  // MODEL_DIR (positional)
  std::string model;      // --model
  PlanFlags plan;         // --device ... --solve (PlanFlagUse::kPlanCommand)
  std::string mode = "analysis";
  int64_t batch_tokens = 0;  // 0 = min(kDefaultPlanBatchTokens, max positions)
  int64_t ctx = 0;           // 0 = min(batch tokens, max positions)
  int64_t seqs_per_batch = 0;
  std::vector<std::string> hooks;
  std::vector<std::string> layers;  // none: every layer (bare sites)
  std::string select = "all";
  std::string dtype = "f32";
  std::string capture_to = "host";
  int64_t capture_buffers = 1;
  bool logits = false;
  int64_t logits_chunk = 256;
  bool backward = false;
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

// The query `loom plan` runs (src/eval/plan_query.h): its flags as given.
PlanQuery ToQuery(const PlanArgs& a, const std::string& model_dir) {
  const PlanFlags& f = a.plan;
  PlanQuery q;
  q.model_dir = model_dir;
  q.devices = f;  // the JobPlanOptions base
  q.assume_dtype = f.assume_dtype;
  q.strategy = f.strategy;
  q.layers_per_device = f.layers_per_device;
  q.solve = f.solve;
  q.mode = a.mode;
  q.batch_tokens = a.batch_tokens;
  q.ctx = a.ctx;
  q.seqs_per_batch = a.seqs_per_batch;
  q.hooks = a.hooks;
  q.layers = a.layers;
  q.select = a.select;
  q.dtype = a.dtype;
  q.capture_to = a.capture_to;
  q.capture_buffers = a.capture_buffers;
  q.logits = a.logits;
  q.logits_chunk = a.logits_chunk;
  q.backward = a.backward;
  q.kv_dtype = a.kv_dtype;
  q.kv_context = a.kv_context;
  return q;
}

Status RunPlan(const PlanArgs& a, const std::string& model_dir,
               int* exit_code) {
  ASSIGN_OR_RETURN(PlanQueryResult r, RunPlanQuery(ToQuery(a, model_dir)));
  const MemoryPlan& plan = r.plan;
  if (a.json) {
    std::printf("%s\n", r.ToJson().dump(2).c_str());
  } else {
    std::printf("%s%s", r.solved_line.c_str(), FormatPlanTable(plan).c_str());
    // How the host multiplies in each 16-bit precision.
    const HostDescription host = DescribeHost();
    std::printf("cpu isa %s:", host.active_isa.c_str());
    for (const auto& p : host.precisions)
      if (p.precision != "f32")
        std::printf(" %s GEMMs %s;", p.precision.c_str(),
                    p.native ? "native" : "widened to f32 per panel");
    std::printf(" weights stay stored\n");
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
  AddModelFlag(*cmd, &a->model,
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
  AddSelectFlag(*cmd, &a->select, "Rows kept per sequence: all, last or mean");
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
  cmd->add_flag("--backward", a->backward,
                "Plan a gradient job (loom attribute, extract --grad-of): the "
                "backward's own bytes for one sequence of --batch-tokens");
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
