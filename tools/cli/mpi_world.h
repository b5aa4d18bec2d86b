// MPI for `loom extract --shard auto` under mpirun / mpiexec: after every
// rank has finished its shard, the ranks agree (one all-reduce, the barrier)
// on whether all succeeded, rank 0 merges, and every rank exits with the
// merge's status. Built with MPI when CMake finds it (LOOM_MPI); without it,
// Available() is false and the ranks coordinate through OUT/.lock instead
// (the last rank to finish merges, docs/scale-out.md).
#ifndef LOOM_TOOLS_CLI_MPI_WORLD_H_
#define LOOM_TOOLS_CLI_MPI_WORLD_H_

#include "src/base/status.h"

namespace loom::cli {

class MpiWorld {
 public:
  // Whether this loom was built with MPI.
  static bool Available();
  // MPI_Init (Internal naming MPI's error when it fails); nothing without
  // MPI. Finalized by the destructor.
  static StatusOr<MpiWorld> Init();
  MpiWorld(MpiWorld&& o) noexcept
      : active_(o.active_), rank_(o.rank_), size_(o.size_) {
    o.active_ = false;
  }
  MpiWorld& operator=(MpiWorld&&) = delete;
  ~MpiWorld();

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The barrier: true when every rank passed true.
  StatusOr<bool> AllSucceeded(bool mine) const;
  // Rank 0's `status` on every rank (others pass anything).
  Status Share(const Status& status) const;

 private:
  MpiWorld() = default;
  bool active_ = false;
  int rank_ = 0, size_ = 1;
};

}  // namespace loom::cli

#endif  // LOOM_TOOLS_CLI_MPI_WORLD_H_
