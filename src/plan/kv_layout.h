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
#ifndef LOOM_PLAN_KV_LAYOUT_H_
#define LOOM_PLAN_KV_LAYOUT_H_

#include <cstdint>

#include "src/core/dtype.h"
#include "src/model/config.h"

namespace loom {

// Positions per slot layer `layer` keeps for a context of `context` tokens:
// min(context, window) for a sliding-window layer, else context.
int64_t KvPositions(const ModelConfig& c, int64_t layer, int64_t context);

// Bytes of layer `layer`'s cache (K and V): 2 x kv_dim x KvPositions x slots
// x DTypeSize(dtype).
int64_t KvLayerBytes(const ModelConfig& c, int64_t layer, int64_t context,
                     int64_t slots, DType dtype);

}  // namespace loom

#endif  // LOOM_PLAN_KV_LAYOUT_H_
