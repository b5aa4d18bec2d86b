// Data-parallel extraction: which input rows a shard of a job takes, and the
// rank / world size that launchers (OpenMPI, MPICH, Slurm, torchrun) put in
// the environment for `loom extract --shard auto`.
//
// The unit of distribution is the commit window: window w holds input rows
// [w * C, (w + 1) * C) (C = --commit-every) and belongs to shard w mod N. A
// shard therefore runs exactly the windows a single process would run, with
// the same rows in the same batches, so its arrays hold the single run's
// bytes and `loom merge` only has to put windows back in order
// (docs/scale-out.md).
#ifndef LOOM_EVAL_SHARD_H_
#define LOOM_EVAL_SHARD_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "src/base/status.h"

namespace loom {

struct ShardSpec {
  int64_t index = 0;  // 0-based
  int64_t count = 1;  // 1 = the whole input

  bool whole() const { return count == 1; }
  // Window `window` (0-based, of the whole input) is this shard's.
  bool Owns(int64_t window) const { return window % count == index; }
  // The input row of the shard's `local`-th row (0-based) with windows of
  // `window_rows` rows.
  int64_t InputRow(int64_t local, int64_t window_rows) const {
    const int64_t k = local / window_rows;  // the shard's k-th window
    return (index + k * count) * window_rows + local % window_rows;
  }
  // The global window index of the shard's `k`-th window.
  int64_t Window(int64_t k) const { return index + k * count; }
  std::string ToString() const;  // "I/N"
  bool operator==(const ShardSpec&) const = default;
};

// "I/N" with 0 <= I < N; InvalidArgument naming the flag otherwise.
StatusOr<ShardSpec> ParseShardSpec(std::string_view text);

// What a launcher says about this process.
struct LauncherEnv {
  std::string launcher;  // "openmpi", "mpich", "torchrun", "slurm",
                         // "slurm-array" (possibly "slurm-array+slurm")
  ShardSpec shard;       // rank / world size
  int64_t local_rank = 0;
  int64_t local_size = 0;  // ranks on this node; 0 = unknown
  // Variables read, for messages: "OMPI_COMM_WORLD_RANK=1 ...".
  std::string source;
  // Launched by an MPI launcher (mpirun / mpiexec / srun --mpi): MPI can be
  // initialised.
  bool mpi = false;
};

// Reads the launcher's variables through `getenv` (std::getenv by default),
// in this order: OpenMPI (OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK /
// _LOCAL_SIZE), MPICH / Hydra (PMI_RANK / PMI_SIZE, MPI_LOCALRANKID /
// MPI_LOCALNRANKS), torchrun (RANK / WORLD_SIZE / LOCAL_RANK /
// LOCAL_WORLD_SIZE), Slurm (SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, and
// for array jobs SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT /
// SLURM_ARRAY_TASK_MIN / SLURM_ARRAY_TASK_STEP: task t of an array of A tasks
// of n ranks each is shard t * n + rank of A * n). NotFound listing the
// variables when none is set; InvalidArgument naming the variable and its
// value when one is not a number or the rank is not below the size.
using GetEnvFn = std::function<const char*(const char*)>;
StatusOr<LauncherEnv> DetectLauncher(const GetEnvFn& getenv = nullptr);

// The directory of shard `shard` under an --out of `--shard auto`:
// "<out>/shards/shard-00001-of-00004".
std::string ShardDirOf(const std::string& out_dir, const ShardSpec& shard);

}  // namespace loom

#endif  // LOOM_EVAL_SHARD_H_
