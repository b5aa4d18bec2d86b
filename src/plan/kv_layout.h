// KV cache geometry: the one function the planner's `kv` term and the
// runtime's KvCache (src/runtime/kv_cache.h) both size the cache with, so
// that plan and allocation cannot disagree.
//
// Layout of one layer's cache: K [slots, positions, kv_dim] then V [slots,
// positions, kv_dim], in the KV dtype (row-major; kv_dim = kv_heads x
// head_dim, so one position's row holds every kv head). A global layer keeps
// `context` positions per slot (position p at row p); a sliding-window layer
// keeps min(context, window) (a ring buffer: position p at row
// p % positions).
//
// Paged (KvPaging::page_size > 0): every global layer instead holds K and V
// as [num_pages, page_size, kv_dim], one pool shared by all slots; a slot's
// page table (the same for every global layer) maps its position p to row
// table[p / page_size] * page_size + p % page_size. Sliding-window layers
// keep their per-slot ring (already bounded by the window).
#ifndef LOOM_PLAN_KV_LAYOUT_H_
#define LOOM_PLAN_KV_LAYOUT_H_

#include <cstdint>

#include "src/core/dtype.h"
#include "src/model/config.h"
#include "src/plan/activations.h"

namespace loom {

// Paging of the global layers' KV (page_size 0 = contiguous: `context`
// positions per slot).
struct KvPaging {
  int64_t page_size = 0;  // positions per page; 0 = not paged
  int64_t num_pages = 0;  // pages in the shared pool
};

// Whether layer `layer` keeps its KV in pages under `paging`: a paged cache's
// global (non-window) layers.
bool KvLayerPaged(const ModelConfig& c, int64_t layer, const KvPaging& paging);

// Positions per slot layer `layer` keeps for a context of `context` tokens:
// min(context, window) for a sliding-window layer, else context.
int64_t KvPositions(const ModelConfig& c, int64_t layer, int64_t context);

// Bytes of layer `layer`'s cache (K and V): 2 x kv_dim x KvPositions x slots
// x DTypeSize(dtype).
int64_t KvLayerBytes(const ModelConfig& c, int64_t layer, int64_t context,
                     int64_t slots, DType dtype);

// The same with paging: a paged layer (KvLayerPaged) holds 2 x num_pages x
// page_size x kv_dim x DTypeSize(dtype) bytes, any other layer
// KvLayerBytes(c, layer, context, slots, dtype). The one function KvCache
// and the planner's kv term both use.
int64_t KvLayerBytes(const ModelConfig& c, int64_t layer, int64_t context,
                     int64_t slots, DType dtype, const KvPaging& paging);

// The dtype a backend's KV cache holds: the activation dtype its forward
// writes K and V in (f32 on the CPU and CUDA backends today). The one rule
// KvCache allocates by and the planner's kv term sizes with (unless a plan
// is asked for another dtype: `loom plan --kv-dtype`).
DType KvCacheDType(const KernelCosts& costs);

}  // namespace loom

#endif  // LOOM_PLAN_KV_LAYOUT_H_
