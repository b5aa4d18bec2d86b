#include "src/runtime/device_weights.h"

#include <map>
#include <utility>
#include <vector>

#include "src/base/units.h"

namespace loom {
namespace {

// Model-level weights that belong to the embedding side (the device running
// layer 0); every other model-level weight belongs to the head side.
bool EmbedSide(const TensorView& v, const BoundWeights& host) {
  for (WeightRole r : {WeightRole::kEmbed, WeightRole::kPosEmbed})
    if (const TensorView* e = host.Get(r, -1); e != nullptr && e->data == v.data)
      return true;
  return false;
}

// Pass 1 assigns each distinct source view an offset; pass 2 maps the views
// to base + offset.
struct Layout {
  const BoundWeights* host = nullptr;
  WeightSelection sel;
  std::map<const void*, std::pair<int64_t, int64_t>> offsets;  // src -> off, bytes
  std::vector<std::pair<const void*, int64_t>> order;           // src, bytes
  int64_t total = 0;
  uint8_t* base = nullptr;  // pass 2

  bool Wanted(int64_t layer, const TensorView& v) const {
    if (layer >= 0) return layer >= sel.first_layer && layer <= sel.last_layer;
    return EmbedSide(v, *host) ? sel.embed : sel.head;
  }
};

void* Assign(void* context, int64_t layer, const TensorView& v) {
  Layout& l = *static_cast<Layout*>(context);
  if (!l.Wanted(layer, v)) return nullptr;
  auto [it, fresh] = l.offsets.try_emplace(v.data, l.total, v.bytes());
  if (fresh) {
    l.order.emplace_back(v.data, v.bytes());
    l.total += AlignUp(std::max<int64_t>(v.bytes(), 1), 64);
  }
  return v.data;  // any non-null pointer: pass 1 only sizes
}

void* Map(void* context, int64_t layer, const TensorView& v) {
  Layout& l = *static_cast<Layout*>(context);
  if (!l.Wanted(layer, v)) return nullptr;
  return l.base + l.offsets.at(v.data).first;
}

Layout Plan(const BoundWeights& host, const WeightSelection& selection) {
  Layout l;
  l.host = &host;
  l.sel = selection;
  (void)host.Placed(&Assign, &l);
  return l;
}

}  // namespace

int64_t DeviceWeights::Bytes(const BoundWeights& host,
                             const WeightSelection& selection) {
  return Plan(host, selection).total;
}

StatusOr<DeviceWeights> DeviceWeights::Upload(const BoundWeights& host,
                                              const WeightSelection& selection,
                                              Backend& backend) {
  Layout l = Plan(host, selection);
  DeviceWeights d;
  ASSIGN_OR_RETURN(d.buffer_, backend.Allocate(std::max<int64_t>(l.total, 64),
                                               MemoryKind::kDevice));
  l.base = static_cast<uint8_t*>(d.buffer_.data());
  for (const auto& [src, bytes] : l.order)
    RETURN_IF_ERROR(backend.Copy(l.base + l.offsets.at(src).first,
                                 backend.device(), src, DeviceRef{}, bytes));
  d.weights_ = host.Placed(&Map, &l);
  return d;
}

}  // namespace loom
