#include "src/runtime/kv_cache.h"

#include <string>

#include "src/plan/kv_layout.h"

namespace loom {

StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const ModelConfig& c,
                                                   int64_t slots,
                                                   int64_t context,
                                                   Backend& backend,
                                                   int64_t layers) {
  if (slots <= 0 || context <= 0)
    return InvalidArgumentError("kv cache: slots (" + std::to_string(slots) +
                                ") and context (" + std::to_string(context) +
                                ") must be > 0");
  if (layers < 0) layers = c.num_layers;
  if (layers > c.num_layers)
    return InvalidArgumentError("kv cache: " + std::to_string(layers) +
                                " layers, the model has " +
                                std::to_string(c.num_layers));
  const KernelCosts costs = backend.Costs();
  if (costs.kv_attention_workspace == nullptr)
    return UnimplementedError("kv cache: backend '" +
                              std::string(backend.name()) +
                              "' has no attention over a KV cache");
  auto cache = std::unique_ptr<KvCache>(new KvCache());
  cache->slots_ = slots;
  cache->context_ = context;
  cache->dtype_ = costs.activation_dtype;
  cache->device_ = backend.device();
  cache->lengths_.assign(static_cast<size_t>(slots), 0);
  for (int64_t l = 0; l < layers; ++l) {
    Layer layer;
    layer.positions = KvPositions(c, l, context);
    const int64_t bytes = KvLayerBytes(c, l, context, slots, cache->dtype_);
    ASSIGN_OR_RETURN(layer.buffer,
                     backend.Allocate(bytes, MemoryKind::kDevice));
    layer.buffer.bytes = bytes;
    layer.k = layer.buffer.data();
    layer.v = static_cast<char*>(layer.buffer.data()) + bytes / 2;
    cache->layers_.push_back(std::move(layer));
  }
  const int64_t ws = costs.kv_attention_workspace(
      context, c.num_heads, c.num_kv_heads, c.head_dim, costs.num_threads);
  ASSIGN_OR_RETURN(cache->workspace_,
                   backend.Allocate(ws, MemoryKind::kDevice));
  cache->workspace_.bytes = ws;
  return cache;
}

int64_t KvCache::storage_bytes() const {
  int64_t total = 0;
  for (const Layer& l : layers_) total += l.buffer.bytes;
  return total;
}

}  // namespace loom
