// Each `loom` subcommand lives in its own file and registers itself on the
// CLI11 app through one Add*Command function listed here. A subcommand's
// callback stores the process exit code in *exit_code (0 success, 1 error
// with a message on stderr, 2 usage error).
#ifndef LOOM_TOOLS_CLI_COMMANDS_H_
#define LOOM_TOOLS_CLI_COMMANDS_H_

#include <CLI/CLI.hpp>

#include "src/base/status.h"

namespace loom::cli {

void AddInspectCommand(CLI::App& app, int* exit_code);
void AddHooksCommand(CLI::App& app, int* exit_code);
void AddTokenizeCommand(CLI::App& app, int* exit_code);
void AddSynthCommand(CLI::App& app, int* exit_code);
void AddExtractCommand(CLI::App& app, int* exit_code);
void AddPlanCommand(CLI::App& app, int* exit_code);
void AddPerplexityCommand(CLI::App& app, int* exit_code);
void AddCompareCommand(CLI::App& app, int* exit_code);
void AddDevicesCommand(CLI::App& app, int* exit_code);
void AddGenerateCommand(CLI::App& app, int* exit_code);
void AddServeCommand(CLI::App& app, int* exit_code);
void AddMergeCommand(CLI::App& app, int* exit_code);
void AddPatchCommand(CLI::App& app, int* exit_code);
void AddAttributeCommand(CLI::App& app, int* exit_code);
void AddLensCommand(CLI::App& app, int* exit_code);
void AddBenchCommand(CLI::App& app, int* exit_code);

// Prints "loom <command>: <status message>" to stderr and returns 1 when
// `status` is an error, else 0.
int ReportStatus(std::string_view command, const Status& status);

}  // namespace loom::cli

#endif  // LOOM_TOOLS_CLI_COMMANDS_H_
