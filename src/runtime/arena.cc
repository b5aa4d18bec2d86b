#include "src/runtime/arena.h"

#include "src/base/units.h"

namespace loom {

StatusOr<Arena> Arena::Allocate(const ArenaPlan& plan, Backend& backend) {
  Arena a;
  a.plan_ = plan;
  const int64_t bytes =
      AlignUp(std::max<int64_t>(plan.total_bytes, ArenaPlan::kAlign),
              ArenaPlan::kAlign);
  ASSIGN_OR_RETURN(a.buffer_, backend.Allocate(bytes, MemoryKind::kDevice));
  a.buffer_.device = backend.device();
  uint8_t* base = static_cast<uint8_t*>(a.buffer_.data());
  for (const PlannedRegion& r : plan.regions)
    a.regions_[static_cast<size_t>(r.id)] = base + r.offset;
  return a;
}

}  // namespace loom
