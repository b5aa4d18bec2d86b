#include "src/runtime/arena.h"

#include <cstdlib>
#include <cstring>

#include "src/base/units.h"

namespace loom {

int ArenaLayout::Add(std::string name, int64_t bytes) {
  LOOM_CHECK_GE(bytes, 0);
  regions_.push_back({std::move(name), total_, bytes});
  total_ += AlignUp(bytes, kAlign);
  return static_cast<int>(regions_.size()) - 1;
}

StatusOr<Arena> Arena::Allocate(const ArenaLayout& layout) {
  Arena a;
  a.layout_ = layout;
  const int64_t bytes = std::max<int64_t>(layout.total_bytes(), ArenaLayout::kAlign);
  void* p = std::aligned_alloc(ArenaLayout::kAlign, static_cast<size_t>(bytes));
  if (p == nullptr) return ResourceExhaustedError("cannot allocate the activation arena of " + FormatBytes(bytes));
  // Touch every page now so the first forward does not fault them in.
  std::memset(p, 0, static_cast<size_t>(bytes));
  a.base_ = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
  return a;
}

}  // namespace loom
