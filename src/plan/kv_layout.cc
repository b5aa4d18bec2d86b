#include "src/plan/kv_layout.h"

#include <algorithm>

namespace loom {

int64_t KvPositions(const ModelConfig& c, int64_t layer, int64_t context) {
  const int64_t w = c.sliding_window.empty()
                        ? 0
                        : c.sliding_window[static_cast<size_t>(layer)];
  return w > 0 ? std::min(w, context) : context;
}

int64_t KvLayerBytes(const ModelConfig& c, int64_t layer, int64_t context,
                     int64_t slots, DType dtype) {
  return (c.kv_dim() + c.kv_v_dim()) * KvPositions(c, layer, context) * slots *
         DTypeSize(dtype);
}

bool KvLayerPaged(const ModelConfig& c, int64_t layer, const KvPaging& paging) {
  if (paging.page_size <= 0) return false;
  return c.sliding_window.empty() ||
         c.sliding_window[static_cast<size_t>(layer)] <= 0;
}

int64_t KvLayerBytes(const ModelConfig& c, int64_t layer, int64_t context,
                     int64_t slots, DType dtype, const KvPaging& paging) {
  if (!KvLayerPaged(c, layer, paging))
    return KvLayerBytes(c, layer, context, slots, dtype);
  return (c.kv_dim() + c.kv_v_dim()) * paging.num_pages * paging.page_size *
         DTypeSize(dtype);
}

DType KvCacheDType(const KernelCosts& costs) { return costs.activation_dtype; }

}  // namespace loom
