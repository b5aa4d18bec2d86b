// The planner's weight table: every declared tensor a run will hold, with its
// REAL storage dtype and byte count, grouped by layer.
//
// Sources, best first (WeightSource):
//   kHeaders: the safetensors headers of the model directory's weight files
//             (read with pread, never mapped): dtypes and shapes as stored.
//   kIndex:   model.safetensors.index.json without its shards (planning before
//             a download): the tensor names come from the index, shapes from
//             the declaration, dtypes from a format-fixed storage dtype
//             (WeightSpec::storage_dtype, e.g. MXFP4 blocks are U8) or else
//             the assumed dtype (--assume-dtype, default config.json's
//             torch_dtype).
//   kConfig:  config.json alone: the declaration's tensors, dtypes as above.
// Both checkpoint sources are validated like the loader does: a required
// tensor missing, a shape or fixed dtype that differs, or a tensor the
// architecture does not use is an error naming the tensor.
//
// Pure apart from reading the directory's metadata files; thread-compatible.
#ifndef LOOM_PLAN_WEIGHT_TABLE_H_
#define LOOM_PLAN_WEIGHT_TABLE_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"
#include "src/core/tensor.h"
#include "src/model/config.h"
#include "src/model/weights.h"

namespace loom {

enum class WeightSource { kHeaders, kIndex, kConfig };
std::string_view WeightSourceName(
    WeightSource s);  // "safetensors headers", ...

struct PlannedTensor {
  std::string name;  // name in the checkpoint (may lack an optional prefix)
  WeightRole role = WeightRole::kOther;
  int64_t layer = -1;  // -1 = model-level
  Shape shape;
  DType dtype = DType::kBF16;  // storage dtype
  int64_t bytes = 0;           // numel x dtype size, as stored
};

struct WeightTable {
  WeightSource source = WeightSource::kConfig;
  std::string source_path;  // the index or config.json the table came from
  std::vector<PlannedTensor> tensors;  // present tensors, declaration order
  std::vector<int64_t> layer_bytes;    // [num_layers]
  int64_t pre_bytes =
      0;  // model-level tensors used before the blocks (embeddings)
  int64_t post_bytes =
      0;  // model-level tensors after them (final norm, lm_head)
  // lm_head is absent and tied to the embedding: the embedding is used at both
  // ends (a placement that splits them holds it twice).
  bool tied_head = false;
  int64_t embed_bytes = 0;  // the embedding alone (what a tied head shares)
  // The index's metadata.total_size, when an index was read.
  std::optional<int64_t> index_total_size;
  // Dtype assumed for tensors whose dtype was not read (kIndex / kConfig).
  std::optional<DType> assumed_dtype;

  int64_t total_bytes() const;
  // Bytes of layers [begin, end).
  int64_t LayerRangeBytes(int64_t begin, int64_t end) const;
};

struct WeightTableOptions {
  // Dtype for tensors whose dtype is not known from a header (index-only or
  // config-only planning); default: config.json's torch_dtype.
  std::optional<DType> assume_dtype;
};

// Reads the model directory's weight metadata (see the header comment).
StatusOr<WeightTable> BuildWeightTable(const std::string& model_dir,
                                       const ModelConfig& config,
                                       const ArchWeights& decl,
                                       const WeightTableOptions& options);

// The pure core: the declaration matched against a list of checkpoint tensor
// names (nullptr = config only), dtypes from the fixed storage dtype or
// `dtype`. Used for kIndex and kConfig.
StatusOr<WeightTable> WeightTableFromNames(const ModelConfig& config,
                                           const ArchWeights& decl,
                                           const std::set<std::string>* names,
                                           DType dtype,
                                           const std::string& source);

}  // namespace loom

#endif  // LOOM_PLAN_WEIGHT_TABLE_H_
