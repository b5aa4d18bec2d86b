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
#ifndef LOOM_RUNTIME_DEVICE_WEIGHTS_H_
#define LOOM_RUNTIME_DEVICE_WEIGHTS_H_

#include <cstdint>

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
  const BoundWeights& weights() const { return weights_; }
  int64_t bytes() const { return buffer_.bytes; }

 private:
  Buffer buffer_;
  BoundWeights weights_;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_DEVICE_WEIGHTS_H_
