// loom inspect MODEL_DIR [--json]
#include <cstdio>
#include <memory>

#include "src/model/inspect.h"
#include "tools/cli/commands.h"

namespace loom::cli {

void AddInspectCommand(CLI::App& app, int* exit_code) {
  struct Options {
    std::string model_dir;
    bool json = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd =
      app.add_subcommand("inspect",
                         "Architecture, dimensions, parameters, bytes per "
                         "dtype and per weight group (role family x format) "
                         "of a model directory; "
                         "checks the checkpoint against the architecture");
  cmd->add_option("MODEL_DIR", opts->model_dir, "Hugging Face model directory")
      ->required();
  cmd->add_flag("--json", opts->json, "Print JSON");
  cmd->callback([opts, exit_code] {
    StatusOr<InspectReport> rep = InspectModel(opts->model_dir);
    if (!rep.ok()) {
      *exit_code = ReportStatus("inspect", rep.status());
      return;
    }
    if (opts->json) {
      std::printf("%s\n", rep->ToJson().dump(2).c_str());
    } else {
      std::printf("%s", rep->ToText().c_str());
    }
    if (!rep->problems.empty()) {
      for (const auto& p : rep->problems)
        std::fprintf(stderr, "loom inspect: %s\n", p.c_str());
      *exit_code = 1;
    }
  });
}

}  // namespace loom::cli
