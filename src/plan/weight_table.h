// The planner's weight table: every physical tensor a run will hold, with its
// REAL storage dtype and exact byte count, grouped by layer.
//
// Sources, best first (WeightSource):
//   kHeaders: the safetensors headers of the model directory's weight files
//             (read with pread, never mapped): dtypes and shapes as stored.
//   kIndex:   model.safetensors.index.json without its shards (planning before
//             a download): the tensor names come from the index, shapes and
//             dtypes from the declaration in the checkpoint's own storage
//             format (config.json's quantization_config or
//             hf_quant_config.json: MXFP4 blocks are U8, NVFP4 scales E4M3,
//             ...) and the dense dtype config.json's torch_dtype names
//             (--assume-dtype overrides it). The sum is checked against the
//             index's total_size (MemoryPlan::index_total_size; the plan
//             table warns when they differ).
//   kConfig:  config.json alone: the declaration's tensors, dtypes as above.
// All sources go through the one checkpoint matcher (src/model/match.h), as
// the loader and `loom inspect` do: a required tensor missing, a shape or
// dtype that differs, or a tensor the architecture does not use is an error
// naming the tensor.
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
  int64_t layer = -1;          // -1 = model-level
  int64_t expert = kNoExpert;  // or an expert index / kAllExperts
  Shape shape;
  DType dtype = DType::kBF16;  // storage dtype
  int64_t bytes = 0;           // exact stored bytes
  // Part of a quantized weight (values or scales): held as stored, never
  // converted to a compute dtype.
  bool quantized = false;
  ComponentKind component = ComponentKind::kValues;
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
  // Dtype assumed for dense tensors whose dtype was not read (kIndex /
  // kConfig): --assume-dtype, else config.json's torch_dtype.
  std::optional<DType> assumed_dtype;
  // The checkpoint's quantization scheme ("" = none), e.g. "mxfp4".
  std::string quantization;

  int64_t total_bytes() const;
  // Bytes of layers [begin, end).
  int64_t LayerRangeBytes(int64_t begin, int64_t end) const;
};

struct WeightTableOptions {
  // Dtype for dense tensors whose dtype is not known from a header (index-only
  // or config-only planning); default: config.json's torch_dtype.
  std::optional<DType> assume_dtype;
};

// Reads the model directory's weight metadata (see the header comment).
StatusOr<WeightTable> BuildWeightTable(const std::string& model_dir,
                                       const ModelConfig& config,
                                       const ArchWeights& decl,
                                       const WeightTableOptions& options);

// The pure core: the declaration matched against a list of checkpoint tensor
// names (nullptr = config only), dense dtypes `dtype`, the others from the
// storage format. Used for kIndex and kConfig.
StatusOr<WeightTable> WeightTableFromNames(const ModelConfig& config,
                                           const ArchWeights& decl,
                                           const std::set<std::string>* names,
                                           DType dtype,
                                           const std::string& source);

}  // namespace loom

#endif  // LOOM_PLAN_WEIGHT_TABLE_H_
