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
  return 2 * c.kv_dim() * KvPositions(c, layer, context) * slots *
         DTypeSize(dtype);
}

}  // namespace loom
