// Binding an architecture's weight declaration to a checkpoint: the one
// matcher (src/model/match.h) finds every declared tensor (or its tie
// target), checks shapes and dtypes and that every checkpoint tensor is
// consumed; then tensors whose storage dtype differs from the compute dtype
// are converted once into an owned weight arena. Quantized weights are
// matched but not run yet: binding them is Unimplemented.
#ifndef LOOM_MODEL_BIND_H_
#define LOOM_MODEL_BIND_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "src/base/status.h"
#include "src/core/tensor.h"
#include "src/io/safetensors.h"
#include "src/model/config.h"
#include "src/model/match.h"
#include "src/model/weights.h"

namespace loom {

// The checkpoint's tensors as the matcher sees them (id = index into
// checkpoint.entries()).
std::vector<StoredTensor> StoredTensorsOf(const Checkpoint& checkpoint);

// MatchCheckpoint (src/model/match.h) against an opened checkpoint.
StatusOr<std::vector<MatchedWeight>> MatchCheckpoint(
    const ModelConfig& config, const ArchWeights& decl,
    const Checkpoint& checkpoint);

// Bound weights, indexed by (role, layer) and, for expert weights, (role,
// layer, expert) (expert = an index, or kAllExperts for a stacked [E, ...]
// tensor). Views point into the checkpoint's mapping when the stored dtype
// equals the compute dtype (used in place), else into `arena` (converted once
// at load).
class BoundWeights {
 public:
  const TensorView* Get(WeightRole role, int64_t layer = -1) const;
  const TensorView& Require(WeightRole role, int64_t layer = -1) const;
  MatrixLayout Layout(WeightRole role, int64_t layer = -1) const;
  // Expert weights.
  const TensorView* Get(WeightRole role, int64_t layer, int64_t expert) const;
  const TensorView& Require(WeightRole role, int64_t layer,
                            int64_t expert) const;
  MatrixLayout Layout(WeightRole role, int64_t layer, int64_t expert) const;
  // Makes the weights of layers 0..last_layer (and the embeddings; the final
  // norm and lm_head when `head`) resident now, so memory use is what the
  // plan says from the start and no forward pays page faults. Weights of
  // layers a job does not run are never read.
  void FaultIn(int64_t last_layer, bool head) const;
  int64_t converted_bytes() const { return converted_bytes_; }
  int64_t in_place_bytes() const { return in_place_bytes_; }

  static StatusOr<BoundWeights> Bind(const ModelConfig& config,
                                     const ArchWeights& decl,
                                     const Checkpoint& checkpoint,
                                     DType compute_dtype);

 private:
  struct Slot {
    TensorView view;
    MatrixLayout layout = MatrixLayout::kOutIn;
    bool present = false;
  };
  Slot* SlotFor(const WeightSpec& spec);
  const Slot* FindSlot(WeightRole role, int64_t layer, int64_t expert) const;
  int64_t num_layers_ = 0;
  std::vector<Slot>
      slots_;  // (num_layers + 1) x kNumWeightRoles; last row = model-level
  // Expert weights: (role, layer, expert) -> slot.
  std::map<std::tuple<int, int64_t, int64_t>, Slot> expert_slots_;
  std::shared_ptr<uint8_t> arena_;
  int64_t converted_bytes_ = 0;
  int64_t in_place_bytes_ = 0;
};

}  // namespace loom

#endif  // LOOM_MODEL_BIND_H_
