// The device and memory-plan flags of every command that plans (`loom plan`,
// the job commands extract, perplexity, compare, generate, patch, and
// serve), the --hooks / --layers pair of the commands that capture (extract,
// plan, generate, patch), --select and --precision. Each option is declared
// once in the parameter tables (src/eval/params.h: the placement and capture
// groups, which the Python keywords read too); a command adds the set it
// takes.
#ifndef LOOM_TOOLS_CLI_PLAN_FLAGS_H_
#define LOOM_TOOLS_CLI_PLAN_FLAGS_H_

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "src/eval/job_plan.h"
#include "src/eval/params.h"
#include "tools/cli/param_flags.h"

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
  std::vector<eval::ParamField> fields = eval::PlacementParamFields(f);
  switch (use) {
    case PlanFlagUse::kServe:
      AddParamFlags(cmd, fields, {"device", "max_memory", "reserve"});
      AddParamFlag(cmd, *eval::FindParam(fields, "show_plan"),
                   "Print each model's memory plan (stderr) as it loads");
      return;
    case PlanFlagUse::kJobCommand:
      AddParamFlags(cmd, fields);
      return;
    case PlanFlagUse::kPlanCommand:
      AddParamFlags(cmd, fields,
                    {"device", "max_memory", "reserve", "offload"});
      break;
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

// A capture option (eval::CaptureParam) bound to `target`.
template <typename T>
CLI::Option* AddCaptureFlag(CLI::App& cmd, std::string_view name, T* target,
                            const std::string& help = "") {
  return AddParamFlag(cmd, {&eval::CaptureParam(name), target, {}}, help);
}

// --hooks and --layers, read by ResolveHooks (src/model/hooks.h). Returns the
// --hooks option (extract makes it required; patch and generate add to its
// help what the hooks are for there).
inline CLI::Option* AddHookFlags(CLI::App& cmd, std::vector<std::string>* hooks,
                                 std::vector<std::string>* layers) {
  CLI::Option* h = AddCaptureFlag(cmd, "hooks", hooks);
  AddCaptureFlag(cmd, "layers", layers);
  return h;
}

// --select: row selectors (src/eval/row_selector.h); `help` says what they
// select in this command (extract's rows written, generate's rows returned,
// plan's rows kept: one selector, a std::string).
template <typename T>
CLI::Option* AddSelectFlag(CLI::App& cmd, T* selectors,
                           const std::string& help) {
  return AddCaptureFlag(cmd, "select", selectors, help)->capture_default_str();
}

// --precision: the compute dtype (ParsePrecision), the command's default
// shown; `of` says whose precision it is when a command has two (compare's
// model A), `more` adds what this command does with it.
inline CLI::Option* AddPrecisionFlag(CLI::App& cmd, std::string* precision,
                                     const std::string& of = "",
                                     const std::string& more = "") {
  // "Compute precision: auto, ..." -> "Compute precision of A: auto, ...".
  std::string help(eval::CaptureParam("precision").help);
  if (!of.empty()) help.insert(help.find(':'), " of " + of);
  return AddCaptureFlag(cmd, "precision", precision,
                        help + (more.empty() ? "" : "; " + more));
}

}  // namespace loom::cli

#endif  // LOOM_TOOLS_CLI_PLAN_FLAGS_H_
