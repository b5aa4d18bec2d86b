// KvCache: the keys and values of earlier positions, per layer, for `slots`
// sequences of up to `context` positions each (generation; the streamed long
// rows of `loom extract --streaming-chunk-size`).
//
// Layout (src/plan/kv_layout.h): layer l holds K [slots, P_l, kv_dim] and
// V [slots, P_l, kv_dim] in the backend's activation dtype (f32 on the CPU),
// one allocation per layer, with P_l = KvPositions(config, l, context):
// `context` for a global layer (position p at row p), min(context, window)
// for a sliding-window layer (a ring: position p at row p % P_l). The bytes
// are exactly the planner's `kv` term for a generation job of `context`
// tokens and `slots` sequences (KvLayerBytes; tested), plus one attention
// workspace (Costs().kv_attention_workspace) shared by all layers.
//
// Everything is allocated at Create; a forward only writes rows. The cache
// also records how many positions each slot holds (length), so that a
// forward cannot attend to positions never written.
//
// Not thread-safe; used by one executor at a time.
#ifndef LOOM_RUNTIME_KV_CACHE_H_
#define LOOM_RUNTIME_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "src/backend/backend.h"
#include "src/base/status.h"
#include "src/model/config.h"

namespace loom {

class KvCache {
 public:
  // `slots` sequences of up to `context` positions (both > 0) of layers
  // [0, layers) (-1 = every layer of the model) in the memory of `backend`
  // (not owned; must outlive the cache). Unimplemented when the backend has
  // no attention over a KV cache.
  static StatusOr<std::unique_ptr<KvCache>> Create(const ModelConfig& c,
                                                   int64_t slots,
                                                   int64_t context,
                                                   Backend& backend,
                                                   int64_t layers = -1);

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  int64_t slots() const { return slots_; }
  int64_t context() const { return context_; }
  DType dtype() const { return dtype_; }
  DeviceRef device() const { return device_; }
  // Rows per slot of `layer` (P_l above).
  int64_t positions(int64_t layer) const {
    return layers_[static_cast<size_t>(layer)].positions;
  }
  // K [slots, P_l, kv_dim] and V [slots, P_l, kv_dim] of `layer`.
  float* k(int64_t layer) const {
    return static_cast<float*>(layers_[static_cast<size_t>(layer)].k);
  }
  float* v(int64_t layer) const {
    return static_cast<float*>(layers_[static_cast<size_t>(layer)].v);
  }
  // The attention workspace (kv_attention_workspace(context, ...) bytes).
  void* workspace() const { return workspace_.data(); }
  int64_t workspace_bytes() const { return workspace_.bytes; }
  // Bytes of K and V over all layers (= the planner's kv term).
  int64_t storage_bytes() const;

  // Positions [0, length) of `slot` hold valid rows.
  int64_t length(int64_t slot) const {
    return lengths_[static_cast<size_t>(slot)];
  }
  void set_length(int64_t slot, int64_t n) {
    lengths_[static_cast<size_t>(slot)] = n;
  }
  // Frees a slot for a new sequence (its rows are simply overwritten).
  void Reset(int64_t slot) { set_length(slot, 0); }

 private:
  struct Layer {
    Buffer buffer;  // [2, slots, positions, kv_dim]
    void* k = nullptr;
    void* v = nullptr;
    int64_t positions = 0;
  };
  KvCache() = default;
  int64_t slots_ = 0, context_ = 0;
  DType dtype_ = DType::kF32;
  DeviceRef device_;
  std::vector<Layer> layers_;
  Buffer workspace_;
  std::vector<int64_t> lengths_;  // [slots]
};

}  // namespace loom

#endif  // LOOM_RUNTIME_KV_CACHE_H_
