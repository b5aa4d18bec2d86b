// THE checkpoint matcher: one function that resolves every declared logical
// weight's storage format (ModelConfig::quant, src/core/format.h), expands it
// to its physical tensors, and matches those against what a checkpoint holds:
// the tensors of mapped shards (the loader, src/model/bind.h), their headers
// or only the index's names (the planner, src/plan/weight_table.h, and
// `loom inspect`), or nothing at all (planning from config.json alone).
#ifndef LOOM_MODEL_MATCH_H_
#define LOOM_MODEL_MATCH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/core/format.h"
#include "src/model/config.h"
#include "src/model/weights.h"

namespace loom {

// One tensor as the checkpoint lists it.
struct StoredTensor {
  std::string name;
  std::optional<DType> dtype;  // nullopt: not read (an index without shards)
  std::optional<Shape> shape;  // idem
  std::string file;            // for messages ("" = the match's source)
  int64_t id = -1;             // the caller's handle (e.g. an entry index)
};

// One physical tensor of a matched weight.
struct MatchedTensor {
  PhysicalTensor tensor;    // declared name, shape, stored dtype, exact bytes
  std::string stored_name;  // its name in the checkpoint (optional prefixes)
  int64_t id = -1;          // StoredTensor::id; -1 when nothing was read
  bool dtype_assumed = false;  // the dtype was not read from a header
};

struct MatchedWeight {
  WeightFormat format;   // resolved
  bool present = false;  // false: optional and absent (tensors empty)
  // Absent and tied: `tensors` are those of the tie target (counted with it).
  bool tied = false;
  std::vector<MatchedTensor> tensors;
  int64_t bytes() const;  // 0 when tied or absent
};

struct MatchOptions {
  // What the stored list came from (the index, model.safetensors, or
  // config.json), for messages.
  std::string source;
  // Stored dtype of dense tensors whose dtype was not read.
  DType assumed_dense_dtype = DType::kF32;
};

// The format `spec` is stored in under `config.quant` (dense weights get
// `dense_dtype`).
WeightFormat ResolveFormat(const ModelConfig& config, const WeightSpec& spec,
                           std::optional<DType> dense_dtype);

// The [..., out, in] shape of a declared weight (its shape with the last two
// dimensions swapped when declared [in, out]): the shape a quantized format
// stores.
Shape LogicalWeightShape(const WeightSpec& spec);

// Matches `decl` against `stored` (nullptr: config only, every required weight
// assumed present, a tied one tied). Returns one MatchedWeight per
// decl.specs entry, in order. Errors name the tensor and file: a required
// tensor missing (NotFound), a shape or dtype that differs from the
// declaration, a dense tensor that is not F32/BF16/F16, a checkpoint tensor
// no declaration uses (InvalidArgument).
StatusOr<std::vector<MatchedWeight>> MatchCheckpoint(
    const ModelConfig& config, const ArchWeights& decl,
    const std::vector<StoredTensor>* stored, const MatchOptions& options);

}  // namespace loom

#endif  // LOOM_MODEL_MATCH_H_
