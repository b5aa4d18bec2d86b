#include "src/eval/shard.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <vector>

namespace loom {
namespace {

// A non-negative decimal integer, all of `text`.
std::optional<int64_t> ParseCount(std::string_view text) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end || v < 0)
    return std::nullopt;
  return v;
}

class EnvReader {
 public:
  explicit EnvReader(const GetEnvFn& getenv) : getenv_(getenv) {}
  bool Has(const char* name) const {
    const char* v = Get(name);
    return v != nullptr && *v != '\0';
  }
  // The variable as a count; nullopt when unset; InvalidArgument when set
  // but not a number.
  StatusOr<std::optional<int64_t>> Int(const char* name) {
    const char* v = Get(name);
    if (v == nullptr || *v == '\0') return std::optional<int64_t>();
    const std::optional<int64_t> n = ParseCount(v);
    if (!n)
      return InvalidArgumentError(std::string("--shard auto: ") + name + "=" +
                                  v + " is not a non-negative integer");
    source_ += std::string(source_.empty() ? "" : " ") + name + "=" + v;
    return n;
  }
  const std::string& source() const { return source_; }

 private:
  const char* Get(const char* name) const {
    return getenv_ ? getenv_(name) : std::getenv(name);
  }
  const GetEnvFn& getenv_;
  std::string source_;
};

// rank / size / local rank / local size variables of one launcher.
struct Vars {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
  bool mpi;
};

constexpr Vars kLaunchers[] = {
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", true},
    {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
     true},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", false},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, false},
};

Status CheckRank(const LauncherEnv& env) {
  if (env.shard.count < 1)
    return InvalidArgumentError("--shard auto: world size " +
                                std::to_string(env.shard.count) + " (" +
                                env.source + ") must be >= 1");
  if (env.shard.index >= env.shard.count)
    return InvalidArgumentError(
        "--shard auto: rank " + std::to_string(env.shard.index) +
        " is not below the world size " + std::to_string(env.shard.count) +
        " (" + env.source + ")");
  return Status();
}

// Slurm array jobs: task (ID - MIN) / STEP of COUNT.
StatusOr<std::optional<ShardSpec>> SlurmArrayTask(EnvReader& env) {
  ASSIGN_OR_RETURN(std::optional<int64_t> id, env.Int("SLURM_ARRAY_TASK_ID"));
  ASSIGN_OR_RETURN(std::optional<int64_t> count,
                   env.Int("SLURM_ARRAY_TASK_COUNT"));
  if (!id || !count) return std::optional<ShardSpec>();
  ASSIGN_OR_RETURN(std::optional<int64_t> min, env.Int("SLURM_ARRAY_TASK_MIN"));
  ASSIGN_OR_RETURN(std::optional<int64_t> step,
                   env.Int("SLURM_ARRAY_TASK_STEP"));
  const int64_t lo = min.value_or(0), by = step.value_or(1);
  if (by < 1 || *id < lo || (*id - lo) % by != 0 || (*id - lo) / by >= *count)
    return InvalidArgumentError(
        "--shard auto: array task " + std::to_string(*id) + " is not one of " +
        std::to_string(*count) + " tasks " + std::to_string(lo) + ", " +
        std::to_string(lo + by) + ", ... (" + env.source() +
        "); submit the array as a contiguous range, e.g. --array=0-" +
        std::to_string(*count - 1));
  return std::optional<ShardSpec>(ShardSpec{(*id - lo) / by, *count});
}

}  // namespace

std::string ShardSpec::ToString() const {
  return std::to_string(index) + "/" + std::to_string(count);
}

StatusOr<ShardSpec> ParseShardSpec(std::string_view text) {
  const size_t slash = text.find('/');
  const auto bad = [&](const std::string& why) {
    return InvalidArgumentError("--shard '" + std::string(text) + "': " + why +
                                " (expected I/N with 0 <= I < N, or auto)");
  };
  if (slash == std::string_view::npos) return bad("no '/'");
  const std::optional<int64_t> i = ParseCount(text.substr(0, slash));
  const std::optional<int64_t> n = ParseCount(text.substr(slash + 1));
  if (!i || !n) return bad("not two non-negative integers");
  if (*n < 1) return bad("N must be >= 1");
  if (*i >= *n) return bad("I must be below N");
  return ShardSpec{*i, *n};
}

StatusOr<LauncherEnv> DetectLauncher(const GetEnvFn& getenv) {
  EnvReader env(getenv);
  for (const Vars& v : kLaunchers) {
    if (!env.Has(v.rank) || !env.Has(v.size)) continue;
    LauncherEnv out;
    out.launcher = v.launcher;
    out.mpi = v.mpi;
    ASSIGN_OR_RETURN(std::optional<int64_t> rank, env.Int(v.rank));
    ASSIGN_OR_RETURN(std::optional<int64_t> size, env.Int(v.size));
    out.shard = ShardSpec{*rank, *size};
    ASSIGN_OR_RETURN(std::optional<int64_t> local, env.Int(v.local_rank));
    out.local_rank = local.value_or(0);
    if (v.local_size != nullptr) {
      ASSIGN_OR_RETURN(std::optional<int64_t> n, env.Int(v.local_size));
      out.local_size = n.value_or(0);
    }
    if (std::string_view(v.launcher) == "slurm") {
      // An array of tasks of `size` ranks each.
      ASSIGN_OR_RETURN(std::optional<ShardSpec> task, SlurmArrayTask(env));
      if (task) {
        out.launcher = "slurm-array+slurm";
        out.shard = ShardSpec{task->index * *size + *rank, task->count * *size};
      }
    }
    out.source = env.source();
    RETURN_IF_ERROR(CheckRank(out));
    return out;
  }
  // An array job whose tasks were not started by srun.
  ASSIGN_OR_RETURN(std::optional<ShardSpec> task, SlurmArrayTask(env));
  if (task) {
    LauncherEnv out;
    out.launcher = "slurm-array";
    out.shard = *task;
    out.source = env.source();
    return out;
  }
  return NotFoundError(
      "--shard auto: no launcher found in the environment (looked for "
      "OMPI_COMM_WORLD_RANK/SIZE (OpenMPI's mpirun), PMI_RANK/PMI_SIZE "
      "(MPICH), RANK/WORLD_SIZE (torchrun), SLURM_PROCID/SLURM_NTASKS (srun) "
      "and SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT (sbatch --array)); give "
      "the shard as --shard I/N");
}

std::string ShardDirOf(const std::string& out_dir, const ShardSpec& shard) {
  char name[64];
  std::snprintf(name, sizeof name, "shard-%05lld-of-%05lld",
                static_cast<long long>(shard.index),
                static_cast<long long>(shard.count));
  return out_dir + "/shards/" + name;
}

}  // namespace loom
