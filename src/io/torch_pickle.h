// Tensors of a torch.save'd state dict (the zip format of torch >= 1.6:
// <archive>/data.pkl, <archive>/data/<key>, <archive>/byteorder) read
// without running Python's pickle. data.pkl is interpreted by a restricted
// unpickler that knows the opcodes a state dict of tensors uses and calls
// nothing: the only globals it accepts are collections.OrderedDict,
// torch._utils._rebuild_tensor_v2 / _rebuild_parameter and the typed
// storages (torch.FloatStorage, HalfStorage, BFloat16Storage, DoubleStorage,
// LongStorage, IntStorage); it builds them as data. Anything else (another
// global, an opcode outside that set, a non-contiguous tensor, a storage
// shorter than its tensor) is refused naming the file and what it found.
// A tuned lens's params.pt is such a file.
#ifndef LOOM_IO_TORCH_PICKLE_H_
#define LOOM_IO_TORCH_PICKLE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"

namespace loom {

struct TorchTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // row-major, numel x DTypeSize(dtype) bytes
};

// The state dict's entries, in the file's order.
StatusOr<std::vector<std::pair<std::string, TorchTensor>>> ReadTorchStateDict(
    const std::string& path);

// The same from data.pkl's bytes and a reader of the storages' bytes by key
// (what ReadTorchStateDict does with the zip's members; exposed for tests
// and the fuzz harness). `name` names the source in errors.
using TorchStorageReader =
    std::function<StatusOr<std::string>(const std::string& key)>;
StatusOr<std::vector<std::pair<std::string, TorchTensor>>> ParseTorchStateDict(
    const std::string& pickle, const TorchStorageReader& storage,
    const std::string& name);

}  // namespace loom

#endif  // LOOM_IO_TORCH_PICKLE_H_
