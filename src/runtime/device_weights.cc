#include "src/runtime/device_weights.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "src/base/units.h"

namespace loom {
namespace {

// Model-level weights that belong to the embedding side (the device running
// layer 0); every other model-level weight belongs to the head side.
bool EmbedSide(const TensorView& v, const BoundWeights& host) {
  for (WeightRole r : {WeightRole::kEmbed, WeightRole::kPosEmbed,
                       WeightRole::kEmbedNorm, WeightRole::kEmbedNormBias})
    if (const TensorView* e = host.Get(r, -1);
        e != nullptr && e->data == v.data)
      return true;
  return false;
}

// Pass 1 assigns each distinct source view an offset; pass 2 maps the views
// to base + offset. Streamed: layer tensors get offsets within their layer
// (`layers`), model-level ones within `base`.
struct Placement {
  std::map<const void*, std::pair<int64_t, int64_t>>
      offsets;                                         // src -> off, bytes
  std::vector<std::pair<const void*, int64_t>> order;  // src, bytes
  int64_t total = 0;

  int64_t Add(const TensorView& v) {
    auto [it, fresh] = offsets.try_emplace(v.data, total, v.bytes());
    if (fresh) {
      order.emplace_back(v.data, v.bytes());
      total += AlignUp(std::max<int64_t>(v.bytes(), 1), 64);
    }
    return it->second.first;
  }
};

struct Layout {
  const BoundWeights* host = nullptr;
  WeightSelection sel;
  bool streamed = false;
  Placement resident;             // everything, or the model-level weights
  std::vector<Placement> layers;  // streamed: [last - first + 1]
  uint8_t* base = nullptr;        // pass 2: resident weights
  uint8_t* slot[2] = {nullptr, nullptr};  // pass 2, streamed: the buffers

  bool Wanted(int64_t layer, const TensorView& v) const {
    if (layer >= 0) return layer >= sel.first_layer && layer <= sel.last_layer;
    // A tied lm_head is the embedding's view: the head side wants it too.
    if (sel.head)
      if (const TensorView* h = host->Get(WeightRole::kLmHead, -1);
          h != nullptr && h->data == v.data)
        return true;
    return EmbedSide(v, *host) ? sel.embed : sel.head;
  }
};

void* Assign(void* context, int64_t layer, const TensorView& v) {
  Layout& l = *static_cast<Layout*>(context);
  if (!l.Wanted(layer, v)) return nullptr;
  if (l.streamed && layer >= 0)
    l.layers[static_cast<size_t>(layer - l.sel.first_layer)].Add(v);
  else
    l.resident.Add(v);
  return v.data;  // any non-null pointer: pass 1 only sizes
}

void* Map(void* context, int64_t layer, const TensorView& v) {
  Layout& l = *static_cast<Layout*>(context);
  if (!l.Wanted(layer, v)) return nullptr;
  if (l.streamed && layer >= 0) {
    const int64_t i = layer - l.sel.first_layer;
    return l.slot[i % 2] +
           l.layers[static_cast<size_t>(i)].offsets.at(v.data).first;
  }
  return l.base + l.resident.offsets.at(v.data).first;
}

Layout Plan(const BoundWeights& host, const WeightSelection& selection,
            bool streamed) {
  Layout l;
  l.host = &host;
  l.sel = selection;
  l.streamed = streamed;
  if (streamed)
    l.layers.resize(static_cast<size_t>(std::max<int64_t>(
        selection.last_layer - selection.first_layer + 1, 0)));
  (void)host.Placed(&Assign, &l);
  return l;
}

int64_t Staged(const Layout& l) {
  int64_t total = 0;
  for (const Placement& p : l.layers) total += p.total;
  return total;
}

int64_t Largest(const Layout& l) {
  int64_t most = 0;
  for (const Placement& p : l.layers) most = std::max(most, p.total);
  return most;
}

}  // namespace

int64_t DeviceWeights::Bytes(const BoundWeights& host,
                             const WeightSelection& selection) {
  return Plan(host, selection, false).resident.total;
}

int64_t DeviceWeights::StagedBytes(const BoundWeights& host,
                                   const WeightSelection& selection) {
  return Staged(Plan(host, selection, true));
}

int64_t DeviceWeights::StreamBufferBytes(const BoundWeights& host,
                                         const WeightSelection& selection) {
  return Largest(Plan(host, selection, true));
}

const void* DeviceWeights::StagedLayer(int64_t layer) const {
  return static_cast<const uint8_t*>(staged_.data()) +
         layer_offset_[static_cast<size_t>(layer - first_layer_)];
}

int64_t DeviceWeights::LayerBytes(int64_t layer) const {
  const size_t i = static_cast<size_t>(layer - first_layer_);
  return layer_offset_[i + 1] - layer_offset_[i];
}

StatusOr<DeviceWeights> DeviceWeights::Upload(const BoundWeights& host,
                                              const WeightSelection& selection,
                                              Backend& backend) {
  Layout l = Plan(host, selection, false);
  DeviceWeights d;
  ASSIGN_OR_RETURN(d.buffer_,
                   backend.Allocate(std::max<int64_t>(l.resident.total, 64),
                                    MemoryKind::kDevice));
  l.base = static_cast<uint8_t*>(d.buffer_.data());
  for (const auto& [src, bytes] : l.resident.order)
    RETURN_IF_ERROR(backend.Copy(l.base + l.resident.offsets.at(src).first,
                                 backend.device(), src, DeviceRef{}, bytes));
  d.first_layer_ = selection.first_layer;
  d.weights_ = host.Placed(&Map, &l);
  return d;
}

StatusOr<DeviceWeights> DeviceWeights::UploadStreamed(
    const BoundWeights& host, const WeightSelection& selection,
    Backend& backend) {
  if (selection.last_layer < selection.first_layer)
    return InvalidArgumentError("offload: a streamed segment needs layers");
  Layout l = Plan(host, selection, true);
  DeviceWeights d;
  d.first_layer_ = selection.first_layer;
  // Model-level weights: resident, as Upload copies them (none: no buffer).
  if (l.resident.total > 0) {
    ASSIGN_OR_RETURN(d.buffer_,
                     backend.Allocate(l.resident.total, MemoryKind::kDevice));
    l.base = static_cast<uint8_t*>(d.buffer_.data());
    for (const auto& [src, bytes] : l.resident.order)
      RETURN_IF_ERROR(backend.Copy(l.base + l.resident.offsets.at(src).first,
                                   backend.device(), src, DeviceRef{}, bytes));
  }
  // The layers, one after another in pinned host memory (host -> host
  // copies: plain memcpy).
  d.layer_offset_.assign(l.layers.size() + 1, 0);
  for (size_t i = 0; i < l.layers.size(); ++i)
    d.layer_offset_[i + 1] = d.layer_offset_[i] + l.layers[i].total;
  ASSIGN_OR_RETURN(d.staged_, backend.Allocate(std::max<int64_t>(Staged(l), 64),
                                               MemoryKind::kPinnedHost));
  auto* staged = static_cast<uint8_t*>(d.staged_.data());
  for (size_t i = 0; i < l.layers.size(); ++i)
    for (const auto& [src, bytes] : l.layers[i].order)
      std::memcpy(
          staged + d.layer_offset_[i] + l.layers[i].offsets.at(src).first, src,
          static_cast<size_t>(bytes));
  const int64_t largest = std::max<int64_t>(Largest(l), 64);
  for (int i = 0; i < 2; ++i) {
    ASSIGN_OR_RETURN(d.stream_[i],
                     backend.Allocate(largest, MemoryKind::kDevice));
    l.slot[i] = static_cast<uint8_t*>(d.stream_[i].data());
  }
  d.weights_ = host.Placed(&Map, &l);
  return d;
}

}  // namespace loom
