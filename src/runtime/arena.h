// Arena: one backend allocation holding the regions of a planned arena
// (src/plan/activations.h), at the offsets the planner chose by liveness.
// Sized before the first forward; nothing in a forward pass allocates, and
// smaller batches use narrower views of the same regions. Regions are found
// by their typed BufferId (a table lookup, no strings).
//
// Not thread-safe; owned by one executor (or logits head).
#ifndef LOOM_RUNTIME_ARENA_H_
#define LOOM_RUNTIME_ARENA_H_

#include <array>
#include <cstdint>

#include "src/backend/backend.h"
#include "src/base/status.h"
#include "src/plan/activations.h"
#include "src/plan/program.h"

namespace loom {

class Arena {
 public:
  // One device allocation of plan.total_bytes (at least 64 bytes) from
  // `backend`, resident from the start (so the first forward does not fault
  // pages in).
  static StatusOr<Arena> Allocate(const ArenaPlan& plan, Backend& backend);
  // The region of buffer `id`, or null when the plan has none.
  void* region(BufferId id) const {
    return regions_[static_cast<size_t>(id)];
  }
  template <typename T>
  T* as(BufferId id) const {
    return static_cast<T*>(region(id));
  }
  // Start of the allocation (region offsets are relative to it).
  const void* base() const { return buffer_.data(); }
  const ArenaPlan& plan() const { return plan_; }
  int64_t bytes() const { return plan_.total_bytes; }
  DeviceRef device() const { return buffer_.device; }

 private:
  ArenaPlan plan_;
  Buffer buffer_;
  std::array<void*, kNumBuffers> regions_{};
};

}  // namespace loom

#endif  // LOOM_RUNTIME_ARENA_H_
