// Devices a plan places memory on, and their command-line spellings:
//   --device cpu            the host, capacity detected by the caller
//   --device cpu=24GiB      the host, capacity declared
//   --device cuda:0=80GiB   a GPU, declared (plans for machines without it)
//   --device disk           the last tier: weights streamed from the mmap
//   --max-memory 0=38GiB,1=90GiB,cpu=50GiB   accelerate's syntax: a budget
//                           per device (an integer key is cuda:N). A key
//                           names a device, as accelerate's: with GPUs given
//                           by --device, one of them; with none, the keys
//                           declare the GPUs (0..N-1, no gap) with their
//                           budget as capacity
//   --reserve 1GiB | cuda:0=2GiB,cpu=4GiB    bytes set aside per device
// usable = min(capacity, max_memory) - reserve; a plan fits when every
// device's total <= usable. Nothing here queries hardware.
#ifndef LOOM_PLAN_DEVICES_H_
#define LOOM_PLAN_DEVICES_H_

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"

namespace loom {

enum class DeviceKind { kCpu, kCuda, kDisk };

struct DeviceSpec {
  std::string name;  // "cpu", "cuda:0", "disk"
  DeviceKind kind = DeviceKind::kCpu;
  int64_t capacity = 0;               // bytes (disk: unlimited)
  std::optional<int64_t> max_memory;  // --max-memory budget
  int64_t reserve = 0;                // --reserve
  bool capacity_given = false;        // declared (=SIZE) rather than detected
  // Holds layers. The host is always present to stage captures; it computes
  // only when it was named with --device or --max-memory.
  bool compute = true;

  int64_t usable() const;
};

inline constexpr int64_t kUnlimitedBytes =
    std::numeric_limits<int64_t>::max() / 4;

// "cpu", "cpu=24GiB", "cuda:1=80GiB", "disk". A cpu without a size gets
// capacity `detected_host_bytes`; a cuda device without one is an error
// unless `detected_cuda_bytes` knows it (nullopt: not detectable here).
StatusOr<DeviceSpec> ParseDevice(
    std::string_view text, int64_t detected_host_bytes,
    std::optional<int64_t> detected_cuda_bytes = std::nullopt);

// Applies --max-memory to `devices`: caps the devices there; the host and,
// when `devices` holds no GPU, GPUs cuda:0..N-1 named only here are added as
// compute devices. InvalidArgument, naming the key and the devices known, for
// a GPU that is not among those `devices` holds, or a gap in the numbering.
Status ApplyMaxMemory(std::string_view text, std::vector<DeviceSpec>* devices);

// Applies --reserve: "SIZE" for every non-disk device, or "NAME=SIZE,...".
Status ApplyReserve(std::string_view text, std::vector<DeviceSpec>* devices);

// Orders the devices: GPUs in the order given, then the host, then disk;
// adds a non-computing host with `host_bytes` when none is listed; rejects
// duplicates.
Status NormalizeDevices(std::vector<DeviceSpec>* devices, int64_t host_bytes);

// The device flags of every command that plans: --device (repeatable; each
// may list several, comma-separated), --max-memory and --reserve, parsed,
// normalized and with the reserve applied. `host_bytes`: this machine's RAM.
// `gpu_bytes` (may be null): the usable bytes of the GPUs this machine has,
// by index, for a `cuda:N` given without a size (else that is an error).
StatusOr<std::vector<DeviceSpec>> DevicesFromFlags(
    const std::vector<std::string>& device_flags, std::string_view max_memory,
    std::string_view reserve, int64_t host_bytes,
    const std::map<int, int64_t>* gpu_bytes = nullptr);

// Whether --device or a --max-memory key names a GPU (malformed items are
// left to DevicesFromFlags to report).
bool FlagsNameAGpu(const std::vector<std::string>& device_flags,
                   std::string_view max_memory);

// The GPU indices --device names (cuda:N, N or cuda), in the order given;
// InvalidArgument for a name that is no device.
StatusOr<std::vector<int>> GpusOfDeviceFlags(
    const std::vector<std::string>& device_flags);

}  // namespace loom

#endif  // LOOM_PLAN_DEVICES_H_
