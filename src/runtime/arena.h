// Arena: one aligned allocation carved into named regions, sized before the
// first forward. Nothing in a forward pass allocates; smaller batches use
// narrower views of the same regions.
//
// Not thread-safe; owned by one executor.
#ifndef LOOM_RUNTIME_ARENA_H_
#define LOOM_RUNTIME_ARENA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/base/status.h"

namespace loom {

// A list of regions (name, bytes), laid out at 64-byte alignment.
class ArenaLayout {
 public:
  static constexpr int64_t kAlign = 64;
  // Adds a region and returns its index.
  int Add(std::string name, int64_t bytes);
  int64_t offset(int i) const { return regions_[i].offset; }
  int64_t bytes(int i) const { return regions_[i].bytes; }
  const std::string& name(int i) const { return regions_[i].name; }
  int size() const { return static_cast<int>(regions_.size()); }
  int64_t total_bytes() const { return total_; }

 private:
  struct Region {
    std::string name;
    int64_t offset;
    int64_t bytes;
  };
  std::vector<Region> regions_;
  int64_t total_ = 0;
};

class Arena {
 public:
  // One allocation of layout.total_bytes(); ResourceExhausted if it fails.
  static StatusOr<Arena> Allocate(const ArenaLayout& layout);
  void* region(int i) const { return base_.get() + layout_.offset(i); }
  template <typename T>
  T* as(int i) const {
    return static_cast<T*>(region(i));
  }
  const ArenaLayout& layout() const { return layout_; }
  int64_t bytes() const { return layout_.total_bytes(); }

 private:
  ArenaLayout layout_;
  std::shared_ptr<uint8_t> base_;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_ARENA_H_
