// KvCache: the keys and values of earlier positions, per layer, for `slots`
// sequences of up to `context` positions each (generation; the streamed long
// rows of `loom extract --streaming-chunk-size`).
//
// Layout (src/plan/kv_layout.h): layer l holds K [slots, P_l, kv_dim] and
// V [slots, P_l, kv_v_dim] (kv_v_dim: MLA's narrower v heads, else kv_dim) in
// the backend's activation dtype (f32 on the CPU), one allocation per layer,
// with P_l = KvPositions(config, l, context): `context` for a global layer
// (position p at row p), min(context, window) for a sliding-window layer (a
// ring: position p at row p % P_l). The bytes are exactly the planner's `kv`
// term for a generation job of `context` tokens and `slots` sequences
// (KvLayerBytes; tested), plus one attention workspace
// (Costs().kv_attention_workspace) shared by the layers of each device. A
// placement's cache holds each layer on the device that computes it.
//
// Paged (KvPaging::page_size > 0, docs/design/generation.md "Paged KV"):
// every global layer holds K [num_pages, page_size, kv_dim] and V [num_pages,
// page_size, kv_v_dim], one pool shared by the slots; each slot has a page
// table (int32 page ids, at most ceil(context / page_size) entries, the same
// for every global layer), and its position p lives at row
// table[p / page_size] * page_size + p % page_size. Sliding-window layers
// keep their per-slot ring. A slot's positions must be covered by pages
// (Reserve) before a forward writes them; Reset returns its pages.
//
// Everything is allocated at Create; a forward only writes rows. The cache
// also records how many positions each slot holds (length), so that a
// forward cannot attend to positions never written.
//
// Not thread-safe; used by one executor at a time.
#ifndef LOOM_RUNTIME_KV_CACHE_H_
#define LOOM_RUNTIME_KV_CACHE_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "src/backend/backend.h"
#include "src/base/status.h"
#include "src/model/config.h"
#include "src/plan/kv_layout.h"

namespace loom {

class KvCache {
 public:
  // `slots` sequences of up to `context` positions (both > 0) of layers
  // [0, layers) (-1 = every layer of the model) in the memory of `backend`
  // (not owned; must outlive the cache). Unimplemented when the backend has
  // no attention over a KV cache.
  // `paging`: page_size 0 = contiguous (above); else page_size > 0 and
  // num_pages > 0.
  static StatusOr<std::unique_ptr<KvCache>> Create(
      const ModelConfig& c, int64_t slots, int64_t context, Backend& backend,
      KvPaging paging = {}, int64_t layers = -1);
  // The same over a placement: layer l in the memory of layer_backends[l]
  // (not owned; the backend that computes layer l), one attention workspace
  // per distinct backend. layer_backends.size() is the number of layers.
  static StatusOr<std::unique_ptr<KvCache>> Create(
      const ModelConfig& c, int64_t slots, int64_t context,
      std::span<Backend* const> layer_backends, KvPaging paging = {});

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  int64_t slots() const { return slots_; }
  int64_t context() const { return context_; }
  DType dtype() const { return dtype_; }
  // The device holding `layer`'s keys and values.
  DeviceRef device(int64_t layer) const {
    return layers_[static_cast<size_t>(layer)].device;
  }
  // Rows per slot of `layer` (P_l above; a paged layer: context, the
  // positions a slot can address through its page table).
  int64_t positions(int64_t layer) const {
    return layers_[static_cast<size_t>(layer)].positions;
  }
  // Whether `layer` is paged (a global layer of a paged cache).
  bool layer_paged(int64_t layer) const {
    return layers_[static_cast<size_t>(layer)].paged;
  }
  // K [slots, P_l, kv_dim] and V [slots, P_l, kv_v_dim] of `layer` (paged:
  // [num_pages, page_size, kv_dim / kv_v_dim]).
  float* k(int64_t layer) const {
    return static_cast<float*>(layers_[static_cast<size_t>(layer)].k);
  }
  float* v(int64_t layer) const {
    return static_cast<float*>(layers_[static_cast<size_t>(layer)].v);
  }
  // The attention workspace of `layer`'s device (kv_attention_workspace(
  // context, ...) bytes), and the bytes of all workspaces.
  void* workspace(int64_t layer) const {
    return workspaces_[layers_[static_cast<size_t>(layer)].workspace].data();
  }
  int64_t workspace_bytes() const;
  // Bytes of K and V over all layers (= the planner's kv term).
  int64_t storage_bytes() const;

  // Positions [0, length) of `slot` hold valid rows.
  int64_t length(int64_t slot) const {
    return lengths_[static_cast<size_t>(slot)];
  }
  void set_length(int64_t slot, int64_t n) {
    lengths_[static_cast<size_t>(slot)] = n;
  }
  // Frees a slot for a new sequence (its rows are simply overwritten) and
  // returns its pages to the pool.
  void Reset(int64_t slot);

  // ---- Pages (a paged cache; host side, not thread-safe) ----
  bool paged() const { return paging_.page_size > 0; }
  // Positions per page; 0 when not paged.
  int64_t page_size() const { return paging_.page_size; }
  int64_t num_pages() const { return paging_.num_pages; }
  // Entries of a page table: ceil(context / page_size) (0 when not paged).
  int64_t pages_per_seq() const { return pages_per_seq_; }
  // Pages not reserved by any slot (0 when not paged).
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }
  // Pages covering `positions` positions: ceil(positions / page_size) (0
  // when not paged).
  int64_t PagesFor(int64_t positions) const;
  // Makes the page table of `slot` cover positions [0, positions), taking
  // pages from the pool as needed (all or nothing). OutOfRange when
  // `positions` exceeds the context or `slot` is not a slot;
  // ResourceExhausted naming the pages needed and free when the pool is
  // short. A cache without paging covers every position: only the checks.
  Status Reserve(int64_t slot, int64_t positions);
  // Pages held by `slot`, and the positions they cover (without paging:
  // 0 and context).
  int64_t reserved_pages(int64_t slot) const {
    return paged() ? reserved_[static_cast<size_t>(slot)] : 0;
  }
  int64_t reserved_positions(int64_t slot) const {
    return paged() ? std::min(context_, reserved_pages(slot) * page_size())
                   : context_;
  }
  // The page table of `slot`: [pages_per_seq] page ids, the first
  // reserved_pages(slot) valid (the rest -1). Null when not paged.
  const int32_t* page_table(int64_t slot) const {
    return paged() ? page_tables_.data() + slot * pages_per_seq_ : nullptr;
  }
  // Bytes of one page over every paged layer (K and V), and the ring bytes
  // of one slot over the unpaged layers.
  int64_t page_bytes() const { return page_bytes_; }
  int64_t slot_ring_bytes() const { return slot_ring_bytes_; }

 private:
  struct Layer {
    Buffer buffer;  // K [slots, positions, kv_dim] | V [.., kv_v_dim]
    void* k = nullptr;
    void* v = nullptr;
    int64_t positions = 0;
    bool paged = false;
    DeviceRef device;
    size_t workspace = 0;  // index into workspaces_
  };
  KvCache() = default;
  int64_t slots_ = 0, context_ = 0;
  KvPaging paging_;
  int64_t pages_per_seq_ = 0;
  int64_t page_bytes_ = 0, slot_ring_bytes_ = 0;
  std::vector<int32_t> page_tables_;  // [slots, pages_per_seq], -1 = none
  std::vector<int64_t> reserved_;     // [slots] pages held
  std::vector<int32_t> free_;         // free page ids, taken from the back
  DType dtype_ = DType::kF32;
  std::vector<Layer> layers_;
  std::vector<Buffer> workspaces_;  // one per distinct backend
  std::vector<int64_t> lengths_;    // [slots]
};

}  // namespace loom

#endif  // LOOM_RUNTIME_KV_CACHE_H_
