// Arena: one aligned allocation holding the regions of a planned arena
// (src/plan/activations.h), at the offsets the planner chose by liveness.
// Sized before the first forward; nothing in a forward pass allocates, and
// smaller batches use narrower views of the same regions.
//
// Not thread-safe; owned by one executor.
#ifndef LOOM_RUNTIME_ARENA_H_
#define LOOM_RUNTIME_ARENA_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "src/base/status.h"
#include "src/plan/activations.h"

namespace loom {

class Arena {
 public:
  // One allocation of plan.total_bytes (at least 64 bytes); every page is
  // touched now so the first forward does not fault them in.
  static StatusOr<Arena> Allocate(const ArenaPlan& plan);
  // The region named `name`, or null when the plan has none.
  void* region(std::string_view name) const;
  template <typename T>
  T* as(std::string_view name) const {
    return static_cast<T*>(region(name));
  }
  const ArenaPlan& plan() const { return plan_; }
  int64_t bytes() const { return plan_.total_bytes; }

 private:
  ArenaPlan plan_;
  std::shared_ptr<uint8_t> base_;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_ARENA_H_
