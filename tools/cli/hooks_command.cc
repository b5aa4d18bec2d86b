// loom hooks MODEL_DIR [--json]: every hook this model has (ModelHooks),
// with the shape of what one prompt of T tokens captures there.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "src/model/hooks.h"
#include "src/model/registry.h"
#include "tools/cli/commands.h"

namespace loom::cli {
namespace {

// "[T, 64]", "[heads=8, T, T]": what one prompt of T tokens gives at `hook`.
std::string ShapeOf(const HookPoint& hook, const ModelConfig& c) {
  if (hook.site == HookSite::kPattern)
    return "[" + std::to_string(c.num_heads) + ", T, T]";
  StatusOr<int64_t> w = HookWidth(hook, c);
  return w.ok() ? "[T, " + std::to_string(*w) + "]" : "[?]";
}

}  // namespace

void AddHooksCommand(CLI::App& app, int* exit_code) {
  struct Options {
    std::string model_dir;
    bool json = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "hooks",
      "Every hook name this model has (what --hooks accepts; '*' is all of "
      "them), in execution order, with the shape one prompt of T tokens "
      "captures there");
  cmd->add_option("MODEL_DIR", opts->model_dir, "Hugging Face model directory")
      ->required();
  cmd->add_flag("--json", opts->json,
                "Print JSON: [{\"name\", \"layer\", \"shape\"}, ...]");
  cmd->callback([opts, exit_code] {
    StatusOr<ModelConfig> c = LoadModelConfig(opts->model_dir);
    if (!c.ok()) {
      *exit_code = ReportStatus("hooks", c.status());
      return;
    }
    nlohmann::json list = nlohmann::json::array();
    for (const HookPoint& h : ModelHooks(*c)) {
      if (opts->json)
        list.push_back({{"name", HookName(h)},
                        {"layer", h.layer},
                        {"shape", ShapeOf(h, *c)}});
      else
        std::printf("%-44s %s\n", HookName(h).c_str(), ShapeOf(h, *c).c_str());
    }
    if (opts->json) std::printf("%s\n", list.dump(2).c_str());
  });
}

}  // namespace loom::cli
