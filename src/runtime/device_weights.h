// DeviceWeights: the weights one placement segment reads, copied once into a
// single allocation of its device (a backend whose memory is not the host's).
// The copy holds exactly the tensors the planner counts for that device
// (src/plan/planner.h): its layers' tensors as bound (converted dense weights
// in the compute dtype, quantized ones as stored codes and block scales), the
// embeddings when it runs layer 0 and the final norm / lm_head when it runs
// the last layer. A tensor bound twice (a tied lm_head) is copied once per
// device. Quantized weights' per-tensor global scales are read on the host
// when a GEMM is issued and stay there.
//
// Made before the first forward; the bindings it returns are those the
// segment's steps read (Executor::Device::weights).
//
// Streamed (offload, UploadStreamed): the layers' tensors are copied once
// into one pinned host allocation, layer after layer (layer l's tensors
// together, each 64-byte aligned; StagedLayer), and the bindings map layer
// l's tensors into device buffer (l - first_layer) % 2 at the same offsets
// within the layer (a static mapping: a layer always uses the same buffer).
// The model-level weights of the selection stay resident in device memory.
// The caller copies layer l from StagedLayer(l) into Buffer((l - first) % 2)
// before running it (Executor: double-buffered, on a copier instance).
#ifndef LOOM_RUNTIME_DEVICE_WEIGHTS_H_
#define LOOM_RUNTIME_DEVICE_WEIGHTS_H_

#include <cstdint>
#include <vector>

#include "src/backend/backend.h"
#include "src/base/status.h"
#include "src/model/bind.h"

namespace loom {

struct WeightSelection {
  int64_t first_layer = 0, last_layer = -1;  // layers run on the device
  bool embed = false;                        // token / position embeddings
  bool head = false;                         // final norm, lm_head
};

class DeviceWeights {
 public:
  // Bytes Upload will allocate for `selection` (64-byte aligned tensors).
  static int64_t Bytes(const BoundWeights& host,
                       const WeightSelection& selection);
  static StatusOr<DeviceWeights> Upload(const BoundWeights& host,
                                        const WeightSelection& selection,
                                        Backend& backend);
  // Streamed: bytes of the pinned host copy of the selection's layers and of
  // one of the two device buffers (the largest layer), each tensor 64-byte
  // aligned.
  static int64_t StagedBytes(const BoundWeights& host,
                             const WeightSelection& selection);
  static int64_t StreamBufferBytes(const BoundWeights& host,
                                   const WeightSelection& selection);
  // The selection's layers staged in pinned host memory (Allocate
  // kPinnedHost of `backend`), two device buffers of the largest layer, the
  // model-level weights uploaded.
  static StatusOr<DeviceWeights> UploadStreamed(
      const BoundWeights& host, const WeightSelection& selection,
      Backend& backend);

  const BoundWeights& weights() const { return weights_; }
  // Device bytes: the uploaded weights (+ the two buffers when streamed).
  int64_t bytes() const {
    return buffer_.bytes + stream_[0].bytes + stream_[1].bytes;
  }

  bool streamed() const { return staged_.bytes > 0; }
  int64_t staged_bytes() const { return staged_.bytes; }
  int64_t stream_buffer_bytes() const { return stream_[0].bytes; }
  int64_t first_layer() const { return first_layer_; }
  // Streamed: layer l's bytes (all its tensors, aligned) in pinned host
  // memory, and the device buffer it runs from (0 or 1).
  const void* StagedLayer(int64_t layer) const;
  int64_t LayerBytes(int64_t layer) const;
  int SlotOf(int64_t layer) const {
    return static_cast<int>((layer - first_layer_) % 2);
  }
  void* Slot(int i) const { return stream_[i].data(); }

 private:
  Buffer buffer_;                // [bytes] device: model-level (or all) weights
  Buffer staged_;                // [staged bytes] pinned host: the layers
  Buffer stream_[2];             // [largest layer bytes] device, each
  std::vector<int64_t> layer_offset_;  // [layers + 1] bytes into staged_
  int64_t first_layer_ = 0;
  BoundWeights weights_;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_DEVICE_WEIGHTS_H_
