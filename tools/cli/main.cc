// loom: extract hidden states from Hugging Face checkpoints and evaluate them.
#include <malloc.h>

#include <cstdio>

#include "tools/cli/commands.h"

namespace loom::cli {

int ReportStatus(std::string_view command, const Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "loom %.*s: %s\n", static_cast<int>(command.size()),
               command.data(), status.message().c_str());
  return 1;
}

}  // namespace loom::cli

int main(int argc, char** argv) {
  // Large buffers that libraries free (oneDNN's per-call repack buffers) go
  // back to the OS at once, so resident memory stays what the plan says.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  CLI::App app{
      "loom: exact activations, perplexity and KL from Hugging Face "
      "checkpoints"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "loom 0.1.0");
  int exit_code = 0;
  loom::cli::AddInspectCommand(app, &exit_code);
  loom::cli::AddTokenizeCommand(app, &exit_code);
  loom::cli::AddSynthCommand(app, &exit_code);
  loom::cli::AddExtractCommand(app, &exit_code);
  loom::cli::AddPlanCommand(app, &exit_code);
  loom::cli::AddPerplexityCommand(app, &exit_code);
  loom::cli::AddGenerateCommand(app, &exit_code);
  loom::cli::AddServeCommand(app, &exit_code);
  loom::cli::AddCompareCommand(app, &exit_code);
  loom::cli::AddDevicesCommand(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  return exit_code;
}
