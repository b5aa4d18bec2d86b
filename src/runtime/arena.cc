#include "src/runtime/arena.h"

#include <cstdlib>
#include <cstring>

#include "src/base/units.h"

namespace loom {

StatusOr<Arena> Arena::Allocate(const ArenaPlan& plan) {
  Arena a;
  a.plan_ = plan;
  const int64_t bytes =
      AlignUp(std::max<int64_t>(plan.total_bytes, ArenaPlan::kAlign),
              ArenaPlan::kAlign);
  void* p = std::aligned_alloc(ArenaPlan::kAlign, static_cast<size_t>(bytes));
  if (p == nullptr)
    return ResourceExhaustedError("cannot allocate an arena of " +
                                  FormatBytes(bytes));
  std::memset(p, 0, static_cast<size_t>(bytes));
  a.base_ = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p),
                                     [](uint8_t* q) { std::free(q); });
  return a;
}

void* Arena::region(std::string_view name) const {
  const int i = plan_.Find(name);
  return i < 0 ? nullptr : base_.get() + plan_.regions[i].offset;
}

}  // namespace loom
