// loom: extract hidden states from Hugging Face checkpoints and evaluate them.
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "src/backend/registry.h"
#include "tools/cli/commands.h"

namespace loom::cli {

int ReportStatus(std::string_view command, const Status& status) {
  if (status.ok()) return 0;
  // A message the library already prefixed with the command's name
  // ("generate: prompt 0 is empty", shared with serve and Python) is not
  // prefixed twice.
  std::string_view message = status.message();
  if (message.size() > command.size() + 2 && message.starts_with(command) &&
      message.substr(command.size(), 2) == ": ")
    message.remove_prefix(command.size() + 2);
  std::fprintf(stderr, "loom %.*s: %.*s\n", static_cast<int>(command.size()),
               command.data(), static_cast<int>(message.size()),
               message.data());
  // A device the command was asked to run on is not here: a usage error, as
  // CLI11's (docs/design/error-model.md).
  return status.code() == StatusCode::kUnavailable ? 2 : 1;
}

}  // namespace loom::cli

namespace {

// The OpenMP runtime's idle threads sleep (OMP_WAIT_POLICY=passive) instead
// of spinning: with libgomp's default spin, every parallel region waited on
// a thread descheduled while another process held a core. Measured with
// bench/threads_neighbour.sh (AMD EPYC, lscpu family 25 model 1, Zen 3, 2
// cores; docs/design/cpu-backend.md): beside a busy-loop process, perplexity
// on the bundled model took 2.34x its time alone when spinning, 1.37x when
// passive; alone, passive costs 2-5 % on a 4-layer TinyLlama (within noise).
// libgomp reads its wait settings once, as it loads,
// so the process starts itself again with the policy set; OMP_WAIT_POLICY
// or GOMP_SPINCOUNT given by the user are kept (OMP_WAIT_POLICY=active
// restores the spinning).
void SleepingOpenMpThreads(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr ||
      std::getenv("GOMP_SPINCOUNT") != nullptr)
    return;
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  execv("/proc/self/exe", argv);
  // Not re-executed (no /proc): this process runs with libgomp's defaults.
  unsetenv("OMP_WAIT_POLICY");
}

}  // namespace

int main(int argc, char** argv) {
  SleepingOpenMpThreads(argv);
  // Large buffers that libraries free (oneDNN's per-call repack buffers) go
  // back to the OS at once, so resident memory stays what the plan says.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  if (const loom::Status isa = loom::CheckCpuIsaCap(); !isa.ok()) {
    std::fprintf(stderr, "loom: %s\n", isa.message().c_str());
    return 2;
  }
  CLI::App app{
      "loom: exact activations, perplexity and KL from Hugging Face "
      "checkpoints"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "loom 0.1.0");
  // Usage errors carry the prefix of every other error: `loom <command>: `
  // (`loom: ` before a command is known, naming the word that is none).
  app.failure_message([argc, argv](const CLI::App* a, const CLI::Error& e) {
    const std::vector<CLI::App*> parsed = a->get_subcommands();
    if (parsed.empty() && argc > 1 && argv[1][0] != '-') {
      std::string names;
      bool known = false;
      for (const CLI::App* c :
           a->get_subcommands([](const CLI::App*) { return true; })) {
        names += (names.empty() ? "" : ", ") + c->get_name();
        known = known || c->get_name() == argv[1];
      }
      if (!known)
        return "loom: unknown command '" + std::string(argv[1]) +
               "'; commands: " + names + "\n";
    }
    const std::string prefix =
        parsed.empty() ? "loom" : "loom " + parsed.front()->get_name();
    return prefix + ": " + e.what() +
           "\nRun with --help for more information.\n";
  });
  int exit_code = 0;
  loom::cli::AddInspectCommand(app, &exit_code);
  loom::cli::AddHooksCommand(app, &exit_code);
  loom::cli::AddTokenizeCommand(app, &exit_code);
  loom::cli::AddSynthCommand(app, &exit_code);
  loom::cli::AddExtractCommand(app, &exit_code);
  loom::cli::AddPlanCommand(app, &exit_code);
  loom::cli::AddPerplexityCommand(app, &exit_code);
  loom::cli::AddGenerateCommand(app, &exit_code);
  loom::cli::AddServeCommand(app, &exit_code);
  loom::cli::AddMergeCommand(app, &exit_code);
  loom::cli::AddPatchCommand(app, &exit_code);
  loom::cli::AddAttributeCommand(app, &exit_code);
  loom::cli::AddLensCommand(app, &exit_code);
  loom::cli::AddBenchCommand(app, &exit_code);
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
