#include "src/runtime/kv_cache.h"

#include <algorithm>
#include <limits>
#include <string>

namespace loom {

StatusOr<std::unique_ptr<KvCache>> KvCache::Create(
    const ModelConfig& c, int64_t slots, int64_t context, Backend& backend,
    KvPaging paging, int64_t layers) {
  if (layers < 0) layers = c.num_layers;
  if (layers > c.num_layers)
    return InvalidArgumentError("kv cache: " + std::to_string(layers) +
                                " layers, the model has " +
                                std::to_string(c.num_layers));
  const std::vector<Backend*> placement(static_cast<size_t>(layers), &backend);
  return Create(c, slots, context, placement, paging);
}

StatusOr<std::unique_ptr<KvCache>> KvCache::Create(
    const ModelConfig& c, int64_t slots, int64_t context,
    std::span<Backend* const> layer_backends, KvPaging paging) {
  const auto layers = static_cast<int64_t>(layer_backends.size());
  if (slots <= 0 || context <= 0)
    return InvalidArgumentError("kv cache: slots (" + std::to_string(slots) +
                                ") and context (" + std::to_string(context) +
                                ") must be > 0");
  if (layers > c.num_layers)
    return InvalidArgumentError("kv cache: " + std::to_string(layers) +
                                " layers, the model has " +
                                std::to_string(c.num_layers));
  if (paging.page_size < 0 ||
      (paging.page_size > 0 &&
       (paging.num_pages <= 0 ||
        paging.num_pages > std::numeric_limits<int32_t>::max())))
    return InvalidArgumentError(
        "kv cache: paging needs page_size > 0 (got " +
        std::to_string(paging.page_size) + ") and a number of pages in [1, " +
        std::to_string(std::numeric_limits<int32_t>::max()) + "] (got " +
        std::to_string(paging.num_pages) + ")");
  if (paging.page_size == 0) paging.num_pages = 0;
  // The backends in layer order, each once; every one must have attention
  // over a KV cache and store it in the same dtype.
  std::vector<Backend*> distinct;
  for (Backend* b : layer_backends) {
    if (b == nullptr)
      return InvalidArgumentError("kv cache: a layer without a backend");
    if (std::find(distinct.begin(), distinct.end(), b) == distinct.end())
      distinct.push_back(b);
  }
  DType dtype = DType::kF32;
  for (size_t i = 0; i < distinct.size(); ++i) {
    const KernelCosts costs = distinct[i]->Costs();
    if (costs.kv_attention_workspace == nullptr)
      return UnimplementedError("kv cache: backend '" +
                                std::string(distinct[i]->name()) +
                                "' has no attention over a KV cache");
    if (i > 0 && KvCacheDType(costs) != dtype)
      return UnimplementedError(
          "kv cache: backends '" + std::string(distinct[0]->name()) +
          "' and '" + std::string(distinct[i]->name()) +
          "' keep their caches in different dtypes (" +
          std::string(DTypeName(dtype)) + ", " +
          std::string(DTypeName(KvCacheDType(costs))) + ")");
    dtype = KvCacheDType(costs);
  }
  auto cache = std::unique_ptr<KvCache>(new KvCache());
  cache->slots_ = slots;
  cache->context_ = context;
  cache->paging_ = paging;
  cache->dtype_ = dtype;
  cache->lengths_.assign(static_cast<size_t>(slots), 0);
  if (paging.page_size > 0) {
    cache->pages_per_seq_ = (context + paging.page_size - 1) / paging.page_size;
    cache->page_tables_.assign(
        static_cast<size_t>(slots * cache->pages_per_seq_), -1);
    cache->reserved_.assign(static_cast<size_t>(slots), 0);
    // Taken from the back: pages 0, 1, 2, ... first.
    for (int64_t p = paging.num_pages - 1; p >= 0; --p)
      cache->free_.push_back(static_cast<int32_t>(p));
  }
  for (int64_t l = 0; l < layers; ++l) {
    Backend& backend = *layer_backends[static_cast<size_t>(l)];
    Layer layer;
    layer.positions = KvPositions(c, l, context);
    layer.paged = KvLayerPaged(c, l, paging);
    layer.device = backend.device();
    layer.workspace = static_cast<size_t>(
        std::find(distinct.begin(), distinct.end(), &backend) -
        distinct.begin());
    const int64_t bytes =
        KvLayerBytes(c, l, context, slots, cache->dtype_, paging);
    if (layer.paged) {
      cache->page_bytes_ += bytes / paging.num_pages;
    } else {
      cache->slot_ring_bytes_ += bytes / slots;
    }
    ASSIGN_OR_RETURN(layer.buffer,
                     backend.Allocate(bytes, MemoryKind::kDevice));
    layer.buffer.bytes = bytes;
    layer.k = layer.buffer.data();
    // k rows [.., kv_dim] first, then v rows [.., kv_v_dim].
    layer.v = static_cast<char*>(layer.buffer.data()) +
              bytes / (c.kv_dim() + c.kv_v_dim()) * c.kv_dim();
    cache->layers_.push_back(std::move(layer));
  }
  for (Backend* b : distinct) {
    const KernelCosts costs = b->Costs();
    const int64_t ws = costs.kv_attention_workspace(
        context, c.num_heads, c.num_kv_heads, c.head_dim, c.v_head_dim(),
        costs.num_threads);
    ASSIGN_OR_RETURN(Buffer w, b->Allocate(ws, MemoryKind::kDevice));
    w.bytes = ws;
    cache->workspaces_.push_back(std::move(w));
  }
  return cache;
}

int64_t KvCache::workspace_bytes() const {
  int64_t total = 0;
  for (const Buffer& w : workspaces_) total += w.bytes;
  return total;
}

int64_t KvCache::storage_bytes() const {
  int64_t total = 0;
  for (const Layer& l : layers_) total += l.buffer.bytes;
  return total;
}

int64_t KvCache::PagesFor(int64_t positions) const {
  if (!paged() || positions <= 0) return 0;
  return (positions + page_size() - 1) / page_size();
}

Status KvCache::Reserve(int64_t slot, int64_t positions) {
  if (slot < 0 || slot >= slots_)
    return OutOfRangeError("kv cache: slot " + std::to_string(slot) +
                           " outside [0, " + std::to_string(slots_) + ")");
  if (positions < 0 || positions > context_)
    return OutOfRangeError("kv cache: " + std::to_string(positions) +
                           " positions for slot " + std::to_string(slot) +
                           ", outside the context of [0, " +
                           std::to_string(context_) + "]");
  if (!paged()) return Status();
  int64_t& held = reserved_[static_cast<size_t>(slot)];
  const int64_t need = PagesFor(positions) - held;
  if (need <= 0) return Status();
  if (need > free_pages())
    return ResourceExhaustedError(
        "kv cache: slot " + std::to_string(slot) + " needs " +
        std::to_string(need) + " more pages of " + std::to_string(page_size()) +
        " positions for " + std::to_string(positions) + " positions, " +
        std::to_string(free_pages()) + " of " + std::to_string(num_pages()) +
        " pages are free");
  int32_t* table = page_tables_.data() + slot * pages_per_seq_;
  for (int64_t i = 0; i < need; ++i) {
    table[held] = free_.back();
    free_.pop_back();
    ++held;
  }
  return Status();
}

void KvCache::Reset(int64_t slot) {
  set_length(slot, 0);
  if (!paged()) return;
  int64_t& held = reserved_[static_cast<size_t>(slot)];
  int32_t* table = page_tables_.data() + slot * pages_per_seq_;
  // Pushed back in table order: the next Reserve reuses them last-first.
  for (int64_t i = 0; i < held; ++i) {
    free_.push_back(table[i]);
    table[i] = -1;
  }
  held = 0;
}

}  // namespace loom
