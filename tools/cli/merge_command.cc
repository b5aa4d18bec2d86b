// loom merge OUT SHARD_DIR... : joins the outputs of `loom extract --shard
// I/N` into one output, byte-identical to a single process's.
#include <cstdio>
#include <memory>

#include "src/eval/extract_merge.h"
#include "tools/cli/commands.h"

namespace loom::cli {

void AddMergeCommand(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<MergeOptions>();
  auto quiet = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "merge",
      "Join the outputs of `loom extract --shard I/N` (all N shards of one "
      "job) into OUT, identical to one process's output over the whole input");
  cmd->add_option("out", opts->out_dir, "Output directory (created)")
      ->required();
  cmd->add_option("shards", opts->shard_dirs,
                  "The shard output directories, in any order")
      ->required();
  cmd->add_flag("--remove-shards", opts->remove_shards,
                "Delete the shard directories once the merge is committed");
  cmd->add_flag("--quiet", *quiet, "No summary");
  cmd->callback([opts, quiet, exit_code] {
    StatusOr<MergeSummary> s = MergeExtractShards(*opts);
    if (!s.ok()) {
      *exit_code = ReportStatus("merge", s.status());
      return;
    }
    if (!*quiet) {
      nlohmann::json out = s->ToJson();
      out["out"] = opts->out_dir;
      std::printf("%s\n", out.dump(2).c_str());
    }
  });
}

}  // namespace loom::cli
