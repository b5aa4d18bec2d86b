// Binding an architecture's weight declaration to a checkpoint: the one
// matcher (src/model/match.h) finds every declared tensor (or its tie
// target), checks shapes and dtypes and that every checkpoint tensor is
// consumed; then tensors whose storage dtype differs from the compute dtype
// are converted once into an owned weight arena. Quantized weights are bound
// in place, in their stored format (values, block scales and global scale
// are views into the mapping; never a dequantized copy): the GEMM decodes
// them. Input and KV-cache scales are matched and ignored (weight-only).
#ifndef LOOM_MODEL_BIND_H_
#define LOOM_MODEL_BIND_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
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
  // A weight kept in its quantized storage format (views into the mapping).
  struct Quantized {
    WeightFormat format;
    Shape logical;      // [..., out, in] (stacked experts: [E, out, in])
    TensorView values;  // the codes as stored (U8 / F8_E4M3)
    TensorView scales;  // block scales as stored; data null if none
    TensorView global;  // per-tensor scale ([] / [1] / [E]); null if none
    DType scales_element = DType::kF32;  // what the scale bytes encode
    int64_t block_out = 1, block_in = 0;
  };

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
  // Repacks, at most once per tensor, the dense [out, in] GEMM matrices (of
  // the compute dtype) of layers [first_layer, last_layer], and the lm_head
  // when `head`, into the layout `layout_of` names for each (kOutIn: left as
  // stored): `repack` rewrites one [n, k] block of rows (each expert of a
  // stacked [E, out, in] tensor alone, in blocks of kRepackRows rows) into
  // `out`, and Layout() then says so. Converted tensors (the owned arena)
  // are rewritten in place; mapped ones into one anonymous allocation of
  // the same bytes (huge pages where whole), the mapped pages released
  // block by block as they are done, so resident memory stays the weights'
  // bytes plus one block. Tensors read as anything but a GEMM weight (the
  // embedding table a tied lm_head shares) are never offered; nor a packed
  // [E, 2I, H] gate/up whose halves are not whole 16-row blocks. Serialised
  // with other Repack calls; a forward must not read the layers being
  // repacked (an executor repacks its own layers before its first forward,
  // and a tensor already repacked is skipped).
  static constexpr int64_t kRepackRows = 256;
  using LayoutFn = std::function<MatrixLayout(int64_t n, int64_t k, DType)>;
  using RepackFn = std::function<void(const void* data, int64_t n, int64_t k,
                                      DType, void* out)>;
  Status Repack(int64_t first_layer, int64_t last_layer, bool head,
                const LayoutFn& layout_of, const RepackFn& repack) const;
  // The quantized storage of a weight, or nullptr when it is dense (Get()
  // then returns its values tensor as stored).
  const Quantized* GetQuantized(WeightRole role, int64_t layer,
                                int64_t expert = kNoExpert) const;
  // The dtype GEMMs compute in (dense weights are stored in it; quantized
  // ones are decoded to it).
  DType compute_dtype() const { return compute_dtype_; }
  int64_t converted_bytes() const { return converted_bytes_; }
  int64_t in_place_bytes() const { return in_place_bytes_; }

  // A copy of these bindings placed elsewhere (a device's weight arena):
  // `place(layer, view)` is called once for every tensor view of every bound
  // weight (layer -1 = model-level; a quantized weight's codes and block
  // scales; its global scale, read on the host, is not passed and stays) and
  // returns where that view's bytes now live, or nullptr to leave the weight
  // out of the copy (e.g. layers another device runs). A view shared by two
  // weights (a tied lm_head) is passed twice.
  using PlaceFn = void* (*)(void* context, int64_t layer,
                            const TensorView& view);
  BoundWeights Placed(PlaceFn place, void* context) const;

  static StatusOr<BoundWeights> Bind(const ModelConfig& config,
                                     const ArchWeights& decl,
                                     const Checkpoint& checkpoint,
                                     DType compute_dtype);

 private:
  struct Slot {
    mutable TensorView view;
    // Mutable: Repack changes them (under repack_mutex_) with the bytes.
    mutable MatrixLayout layout = MatrixLayout::kOutIn;
    bool present = false;
    bool quantized = false;
    Quantized quant;
  };
  Slot* SlotFor(const WeightSpec& spec);
  const Slot* FindSlot(WeightRole role, int64_t layer, int64_t expert) const;
  int64_t num_layers_ = 0;
  std::vector<Slot>
      slots_;  // (num_layers + 1) x kNumWeightRoles; last row = model-level
  // Expert weights: (role, layer, expert) -> slot.
  std::map<std::tuple<int, int64_t, int64_t>, Slot> expert_slots_;
  std::shared_ptr<uint8_t> arena_;
  int64_t arena_bytes_ = 0;
  std::shared_ptr<std::mutex> repack_mutex_ = std::make_shared<std::mutex>();
  // The allocations Repack moved mapped weights into (shared with copies).
  std::shared_ptr<std::vector<std::shared_ptr<uint8_t>>> repacked_ =
      std::make_shared<std::vector<std::shared_ptr<uint8_t>>>();
  DType compute_dtype_ = DType::kF32;
  int64_t converted_bytes_ = 0;
  int64_t in_place_bytes_ = 0;
};

}  // namespace loom

#endif  // LOOM_MODEL_BIND_H_
