// `loom merge OUT SHARD_DIR...`: joins the outputs of `loom extract --shard
// I/N` (every shard of one job, each complete) into OUT, byte-identical to
// the output of one process over the whole input (docs/scale-out.md).
//
// Shards own whole commit windows (src/eval/shard.h), so merging puts windows
// back in input order: .npy rows are copied window by window (ragged offsets
// renumbered), safetensors shard files (already named by their window) are
// copied, rows.jsonl lines are interleaved the same way, and the manifest is
// the single run's: the settings with shard "0/1", the summed progress and
// the per-row records in input order. Written like a job: arrays, then
// rows.jsonl, then manifest.json (the commit record), under OUT/.lock.
//
// Refused, before anything is written, with the two shard directories and
// both values: shards of different jobs (any setting but `shard` differs:
// model, hooks, selectors, dtype, template, batch tokens, commit interval,
// format, ...; or the input or tokenizer), a shard missing or given twice,
// an incomplete shard, a shard being written (its .lock held), an OUT that
// already holds a job.
#ifndef LOOM_EVAL_EXTRACT_MERGE_H_
#define LOOM_EVAL_EXTRACT_MERGE_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/base/status.h"

namespace loom {

struct MergeOptions {
  std::string out_dir;
  std::vector<std::string> shard_dirs;  // in any order
  // After the merged manifest is saved, delete the shard directories (what
  // `extract --shard auto` does with OUT/shards).
  bool remove_shards = false;
  // The caller already holds OUT/.lock (LockOutDir).
  bool out_locked = false;
};

struct MergeSummary {
  int64_t shards = 0;  // N
  int64_t rows = 0, rows_ok = 0, rows_skipped = 0;
  int64_t windows = 0;
  int64_t bytes_copied = 0;  // array bytes
  std::vector<std::string> files;
  nlohmann::json ToJson() const;
};

StatusOr<MergeSummary> MergeExtractShards(const MergeOptions& options);

}  // namespace loom

#endif  // LOOM_EVAL_EXTRACT_MERGE_H_
