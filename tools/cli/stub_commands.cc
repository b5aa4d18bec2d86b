// Subcommands not yet built into this binary. Each is replaced by its own
// file as it lands; remove its line here then.
#include "tools/cli/commands.h"

namespace loom::cli {

void AddRunCommand(CLI::App&, int*) {}

}  // namespace loom::cli
