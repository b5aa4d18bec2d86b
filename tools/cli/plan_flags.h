// The device and memory-plan flags of every command that plans (`loom plan`,
// the job commands extract, perplexity, compare, generate, patch, and
// serve), the --hooks / --layers pair of the commands that capture (extract,
// plan, generate, patch), --select and --precision. Each flag is declared
// here once; a command adds the set it takes.
#ifndef LOOM_TOOLS_CLI_PLAN_FLAGS_H_
#define LOOM_TOOLS_CLI_PLAN_FLAGS_H_

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "src/eval/job_plan.h"

namespace loom::cli {

// The flags' values. The shared ones live in the JobPlanOptions base, which
// the job commands hand to PlanJobOrRefuse as they are.
struct PlanFlags : JobPlanOptions {
  // `loom plan` only.
  std::string assume_dtype;           // --assume-dtype
  std::string strategy = "balanced";  // --strategy
  std::string layers_per_device;      // --layers-per-device
  std::string solve;                  // --solve
};

// Which command adds the flags.
enum class PlanFlagUse {
  kPlanCommand,  // --device --max-memory --reserve --offload --assume-dtype
                 // --strategy --layers-per-device --solve
  kJobCommand,   // --device --max-memory --reserve --offload --show-plan
                 // --verify-plan
  kServe,        // --device --max-memory --reserve --show-plan (every model
                 // the server loads is placed by them)
};

inline void AddPlanFlags(CLI::App& cmd, PlanFlags* f, PlanFlagUse use) {
  cmd.add_option("--device", f->devices,
                 "Devices to plan on, repeatable: cpu[=SIZE] (default: this "
                 "machine's RAM), cuda:N=SIZE (GPU N with SIZE usable: the "
                 "plan places layers there and the job runs them on it), "
                 "disk (weights streamed from the checkpoint)");
  cmd.add_option("--max-memory", f->max_memory,
                 "Caps per device, accelerate's syntax: 0=38GiB,1=90GiB,"
                 "cpu=50GiB; a key names a device --device gave, or, with no "
                 "GPU given there, declares cuda:0..N-1 with that capacity");
  cmd.add_option("--reserve", f->reserve,
                 "Bytes kept free: SIZE for every device, or "
                 "cuda:0=2GiB,cpu=4GiB");
  if (use == PlanFlagUse::kServe) {
    cmd.add_flag("--show-plan", f->show_plan,
                 "Print each model's memory plan (stderr) as it loads");
    return;
  }
  cmd.add_flag("--offload", f->offload,
               "Layers placed on the host run on the last GPU, their weights "
               "streamed from pinned host memory, two layers' buffers on that "
               "GPU");
  if (use == PlanFlagUse::kJobCommand) {
    cmd.add_flag("--show-plan", f->show_plan,
                 "Print the memory plan (stderr) before running");
    cmd.add_flag("--verify-plan", f->verify_plan,
                 "After the run, compare resident memory with the plan");
    return;
  }
  cmd.add_option("--assume-dtype", f->assume_dtype,
                 "Dtype of tensors whose headers are absent (index or config "
                 "only); default torch_dtype");
  cmd.add_option("--strategy", f->strategy, "balanced, sequential or manual");
  cmd.add_option("--layers-per-device", f->layers_per_device,
                 "Layer counts per device in order (manual): 20,28");
  cmd.add_option("--solve", f->solve,
                 "max-batch-tokens, max-context or min-devices");
}

// The flag of the hooks, for messages that name it (`loom generate --hooks`
// errors from the serving engine).
inline constexpr char kHooksFlag[] = "--hooks";

// --hooks and --layers, read by ResolveHooks (src/model/hooks.h). Returns the
// --hooks option (extract makes it required; patch and generate add to its
// help what the hooks are for there).
inline CLI::Option* AddHookFlags(CLI::App& cmd, std::vector<std::string>* hooks,
                                 std::vector<std::string>* layers) {
  CLI::Option* h =
      cmd.add_option(kHooksFlag, *hooks,
                     "Hook names, comma-separated or repeated: "
                     "blocks.12.hook_resid_post, blocks.{0.5}.hook_resid_post, "
                     "blocks.-1.…, blocks.*.…, ln_final.hook_normalized, "
                     "logits, or a bare site (hook_resid_post) with --layers")
          ->delimiter(',');
  cmd.add_option("--layers", *layers,
                 "Layers for bare hook sites: indices, negative indices, "
                 "fractions or * (0,12,-1 or 0.25,0.5,1.0)")
      ->delimiter(',');
  return h;
}

// --select: row selectors (src/eval/row_selector.h); `help` says what they
// select in this command (extract's rows written, generate's rows returned,
// plan's rows kept: one selector, a std::string).
template <typename T>
CLI::Option* AddSelectFlag(CLI::App& cmd, T* selectors,
                           const std::string& help) {
  return cmd.add_option("--select", *selectors, help)->capture_default_str();
}

// --precision: the compute dtype (ParsePrecision), the command's default
// shown; `of` says whose precision it is when a command has two (compare's
// model A), `more` adds what this command does with it.
inline CLI::Option* AddPrecisionFlag(CLI::App& cmd, std::string* precision,
                                     const std::string& of = "",
                                     const std::string& more = "") {
  return cmd
      .add_option("--precision", *precision,
                  "Compute precision" + (of.empty() ? "" : " of " + of) +
                      ": auto, f32, bf16 or f16" +
                      (more.empty() ? "" : "; " + more))
      ->capture_default_str();
}

}  // namespace loom::cli

#endif  // LOOM_TOOLS_CLI_PLAN_FLAGS_H_
