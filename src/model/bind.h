// Binding an architecture's weight declaration to a checkpoint: every
// declared tensor is found (or its tie target used), shapes checked, and
// every checkpoint tensor consumed; then tensors whose storage dtype differs
// from the compute dtype are converted once into an owned weight arena.
#ifndef LOOM_MODEL_BIND_H_
#define LOOM_MODEL_BIND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/core/tensor.h"
#include "src/io/safetensors.h"
#include "src/model/config.h"
#include "src/model/weights.h"

namespace loom {

// Where each declared tensor lives in a checkpoint.
struct WeightMatch {
  const Checkpoint::Entry* entry = nullptr;  // null: optional and absent
  bool tied = false;                         // found through tied_to
};

// Validates the checkpoint against the declaration. Errors name the tensor
// and file: missing required tensor, shape mismatch, non-float dtype for a
// computed tensor, unused (unconsumed) checkpoint tensor.
StatusOr<std::vector<WeightMatch>> MatchWeights(const ModelConfig& config,
                                                const ArchWeights& decl,
                                                const Checkpoint& checkpoint);

// Bound weights, indexed by (role, layer). Views point into the checkpoint's
// mapping when the stored dtype equals the compute dtype (used in place), else
// into `arena` (converted once at load).
class BoundWeights {
 public:
  const TensorView* Get(WeightRole role, int64_t layer = -1) const;
  const TensorView& Require(WeightRole role, int64_t layer = -1) const;
  MatrixLayout Layout(WeightRole role, int64_t layer = -1) const;
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
  int64_t num_layers_ = 0;
  std::vector<Slot>
      slots_;  // (num_layers + 1) x kNumWeightRoles; last row = model-level
  std::shared_ptr<uint8_t> arena_;
  int64_t converted_bytes_ = 0;
  int64_t in_place_bytes_ = 0;
};

}  // namespace loom

#endif  // LOOM_MODEL_BIND_H_
