#include "src/plan/devices.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>

#include "src/base/units.h"

namespace loom {
namespace {

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t begin = 0;
  while (true) {
    const size_t end = s.find(sep, begin);
    out.push_back(s.substr(begin, end == std::string_view::npos
                                      ? std::string_view::npos
                                      : end - begin));
    if (end == std::string_view::npos) break;
    begin = end + 1;
  }
  return out;
}

// "0" -> "cuda:0", "cpu" -> "cpu", "cuda:1" -> "cuda:1".
StatusOr<std::string> CanonicalName(std::string_view key,
                                    std::string_view flag) {
  if (key.empty())
    return InvalidArgumentError(std::string(flag) + ": empty device name");
  if (std::all_of(key.begin(), key.end(),
                  [](char ch) { return ch >= '0' && ch <= '9'; }))
    return "cuda:" + std::string(key);
  if (key == "cpu" || key == "disk") return std::string(key);
  if (key.rfind("cuda:", 0) == 0 && key.size() > 5 &&
      std::all_of(key.begin() + 5, key.end(),
                  [](char ch) { return ch >= '0' && ch <= '9'; }))
    return std::string(key);
  if (key == "cuda") return std::string("cuda:0");
  return InvalidArgumentError(std::string(flag) + ": device '" +
                              std::string(key) +
                              "' is not one of cpu, cuda:N (or N), disk");
}

// The items of the --device flags: each may list several, comma-separated;
// empty items are skipped.
std::vector<std::string_view> DeviceItems(
    const std::vector<std::string>& device_flags) {
  std::vector<std::string_view> items;
  for (std::string_view group : device_flags) {
    while (!group.empty()) {
      const size_t comma = group.find(',');
      const std::string_view item = group.substr(0, comma);
      if (!item.empty()) items.push_back(item);
      if (comma == std::string_view::npos) break;
      group.remove_prefix(comma + 1);
    }
  }
  return items;
}

// The index of a canonical "cuda:N" (nullopt past 2^20 or not a number).
std::optional<int> GpuIndex(const std::string& name) {
  int64_t index = 0;
  const auto [end, ec] =
      std::from_chars(name.data() + 5, name.data() + name.size(), index);
  if (ec != std::errc() || end != name.data() + name.size() || index > 1 << 20)
    return std::nullopt;
  return static_cast<int>(index);
}

DeviceKind KindOf(const std::string& name) {
  if (name == "cpu") return DeviceKind::kCpu;
  if (name == "disk") return DeviceKind::kDisk;
  return DeviceKind::kCuda;
}

DeviceSpec* FindDevice(std::vector<DeviceSpec>* devices,
                       const std::string& name) {
  for (DeviceSpec& d : *devices)
    if (d.name == name) return &d;
  return nullptr;
}

// The byte size `size` of `item` given to `flag`; an error names all three:
// "--max-memory 'cpu=lots': byte size 'lots': expected a number, …".
StatusOr<int64_t> FlagBytes(const char* flag, std::string_view item,
                            std::string_view size) {
  StatusOr<int64_t> bytes = ParseBytes(size);
  if (!bytes.ok())
    return InvalidArgumentError(std::string(flag) + " '" + std::string(item) +
                                "': " + bytes.status().message());
  return bytes;
}

}  // namespace

int64_t DeviceSpec::usable() const {
  if (kind == DeviceKind::kDisk) return kUnlimitedBytes;
  const int64_t cap = max_memory ? std::min(capacity, *max_memory) : capacity;
  return cap - reserve;
}

StatusOr<DeviceSpec> ParseDevice(std::string_view text,
                                 int64_t detected_host_bytes,
                                 std::optional<int64_t> detected_cuda_bytes) {
  const size_t eq = text.find('=');
  ASSIGN_OR_RETURN(std::string name,
                   CanonicalName(text.substr(0, eq), "--device"));
  DeviceSpec d;
  d.name = name;
  d.kind = KindOf(name);
  if (d.kind == DeviceKind::kDisk) {
    if (eq != std::string_view::npos)
      return InvalidArgumentError("--device " + std::string(text) +
                                  ": disk takes no size (it is unlimited)");
    d.capacity = kUnlimitedBytes;
    return d;
  }
  if (eq != std::string_view::npos) {
    ASSIGN_OR_RETURN(d.capacity,
                     FlagBytes("--device", text, text.substr(eq + 1)));
    if (d.capacity <= 0)
      return InvalidArgumentError("--device " + std::string(text) +
                                  ": capacity must be > 0");
    d.capacity_given = true;
    return d;
  }
  if (d.kind == DeviceKind::kCpu) {
    d.capacity = detected_host_bytes;
    return d;
  }
  if (!detected_cuda_bytes)
    return InvalidArgumentError("--device " + std::string(text) +
                                ": no such GPU is visible to this build, so "
                                "its capacity must be declared (--device " +
                                name + "=80GiB)");
  d.capacity = *detected_cuda_bytes;
  return d;
}

Status ApplyMaxMemory(std::string_view text, std::vector<DeviceSpec>* devices) {
  // The devices known before the budgets: what --device gave, and the host.
  std::string known;
  bool gpu_given = false;
  for (const DeviceSpec& d : *devices) {
    known += (known.empty() ? "" : ", ") + d.name;
    gpu_given = gpu_given || d.kind == DeviceKind::kCuda;
  }
  if (FindDevice(devices, "cpu") == nullptr)
    known += std::string(known.empty() ? "" : ", ") + "cpu";
  // GPUs declared by their budget alone, by index, with the item naming each.
  std::map<int64_t, std::string> budget_only;
  for (std::string_view item : Split(text, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      return InvalidArgumentError(
          "--max-memory '" + std::string(item) +
          "': expected DEVICE=SIZE (0=38GiB, cpu=50GiB)");
    ASSIGN_OR_RETURN(std::string name,
                     CanonicalName(item.substr(0, eq), "--max-memory"));
    if (name == "disk")
      return InvalidArgumentError("--max-memory: disk has no budget");
    ASSIGN_OR_RETURN(int64_t bytes,
                     FlagBytes("--max-memory", item, item.substr(eq + 1)));
    if (bytes <= 0)
      return InvalidArgumentError("--max-memory " + std::string(item) +
                                  ": budget must be > 0");
    DeviceSpec* d = FindDevice(devices, name);
    if (d == nullptr && KindOf(name) == DeviceKind::kCuda) {
      // A key caps a device, as accelerate's max_memory: with GPUs given by
      // --device, one of them; without, the key declares the GPU.
      if (gpu_given)
        return InvalidArgumentError(
            "--max-memory " + std::string(item) + ": no device " + name +
            " among the devices given (" + known +
            "); a key caps a device: declare the GPU with --device " + name +
            "=SIZE");
      int64_t index = 0;
      const char* digits = name.data() + 5;
      const auto [end, ec] =
          std::from_chars(digits, name.data() + name.size(), index);
      if (ec != std::errc() || end != name.data() + name.size())
        return InvalidArgumentError("--max-memory " + std::string(item) +
                                    ": GPU index out of range");
      budget_only[index] = std::string(item);
    }
    if (d == nullptr) {
      DeviceSpec nd;
      nd.name = name;
      nd.kind = KindOf(name);
      nd.capacity = bytes;
      nd.capacity_given = true;
      devices->push_back(nd);
      d = &devices->back();
    }
    d->max_memory = bytes;
    d->compute = true;
  }
  // GPUs declared by budgets are numbered as a machine numbers its GPUs:
  // 0..N-1, no gap (`5=1GiB` alone names a sixth GPU of a machine of one).
  int64_t next = 0;
  for (const auto& [index, item] : budget_only) {
    if (index != next)
      return InvalidArgumentError(
          "--max-memory " + item + ": no device cuda:" + std::to_string(index) +
          " among the devices given (" + known +
          "); without --device, the keys declare the GPUs, numbered from 0 "
          "as a machine's are, and cuda:" +
          std::to_string(next) +
          " is missing: declare the GPU with --device cuda:" +
          std::to_string(index) + "=SIZE");
    ++next;
  }
  return Status();
}

Status ApplyReserve(std::string_view text, std::vector<DeviceSpec>* devices) {
  if (text.find('=') == std::string_view::npos) {
    ASSIGN_OR_RETURN(int64_t bytes, FlagBytes("--reserve", text, text));
    if (bytes < 0)
      return InvalidArgumentError("--reserve " + std::string(text) +
                                  ": must be >= 0");
    for (DeviceSpec& d : *devices)
      if (d.kind != DeviceKind::kDisk) d.reserve = bytes;
    return Status();
  }
  for (std::string_view item : Split(text, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      return InvalidArgumentError(
          "--reserve '" + std::string(item) +
          "': expected DEVICE=SIZE or one SIZE for all");
    ASSIGN_OR_RETURN(std::string name,
                     CanonicalName(item.substr(0, eq), "--reserve"));
    DeviceSpec* d = FindDevice(devices, name);
    if (d == nullptr)
      return InvalidArgumentError("--reserve " + std::string(item) +
                                  ": no device " + name +
                                  " (give it with --device or --max-memory)");
    ASSIGN_OR_RETURN(d->reserve,
                     FlagBytes("--reserve", item, item.substr(eq + 1)));
    if (d->reserve < 0)
      return InvalidArgumentError("--reserve " + std::string(item) +
                                  ": must be >= 0");
  }
  return Status();
}

Status NormalizeDevices(std::vector<DeviceSpec>* devices, int64_t host_bytes) {
  std::set<std::string> seen;
  for (const DeviceSpec& d : *devices)
    if (!seen.insert(d.name).second)
      return InvalidArgumentError("--device " + d.name + " is given twice");
  if (FindDevice(devices, "cpu") == nullptr) {
    DeviceSpec host;
    host.name = "cpu";
    host.kind = DeviceKind::kCpu;
    host.capacity = host_bytes;
    host.compute = false;
    devices->push_back(host);
  }
  // Without a computing device (no --device at all, or only disk) the host
  // computes.
  bool any_compute = false;
  for (const DeviceSpec& d : *devices)
    any_compute |= d.kind != DeviceKind::kDisk && d.compute;
  if (!any_compute) FindDevice(devices, "cpu")->compute = true;
  auto rank = [](const DeviceSpec& d) {
    return d.kind == DeviceKind::kCuda ? 0 : d.kind == DeviceKind::kCpu ? 1 : 2;
  };
  std::stable_sort(devices->begin(), devices->end(),
                   [&](const DeviceSpec& a, const DeviceSpec& b) {
                     return rank(a) < rank(b);
                   });
  return Status();
}

StatusOr<std::vector<DeviceSpec>> DevicesFromFlags(
    const std::vector<std::string>& device_flags, std::string_view max_memory,
    std::string_view reserve, int64_t host_bytes,
    const std::map<int, int64_t>* gpu_bytes) {
  std::vector<DeviceSpec> devices;
  for (const std::string_view item : DeviceItems(device_flags)) {
    std::optional<int64_t> detected;
    if (gpu_bytes != nullptr) {
      ASSIGN_OR_RETURN(
          const std::string name,
          CanonicalName(item.substr(0, item.find('=')), "--device"));
      if (KindOf(name) == DeviceKind::kCuda)
        if (const std::optional<int> index = GpuIndex(name)) {
          const auto it = gpu_bytes->find(*index);
          if (it != gpu_bytes->end()) detected = it->second;
        }
    }
    ASSIGN_OR_RETURN(DeviceSpec spec, ParseDevice(item, host_bytes, detected));
    devices.push_back(spec);
  }
  if (!max_memory.empty())
    RETURN_IF_ERROR(ApplyMaxMemory(max_memory, &devices));
  RETURN_IF_ERROR(NormalizeDevices(&devices, host_bytes));
  if (!reserve.empty()) RETURN_IF_ERROR(ApplyReserve(reserve, &devices));
  return devices;
}

bool FlagsNameAGpu(const std::vector<std::string>& device_flags,
                   std::string_view max_memory) {
  std::vector<std::string_view> keys = DeviceItems(device_flags);
  if (!max_memory.empty())
    for (const std::string_view item : Split(max_memory, ','))
      keys.push_back(item);
  for (const std::string_view item : keys) {
    const StatusOr<std::string> name =
        CanonicalName(item.substr(0, item.find('=')), "");
    if (name.ok() && KindOf(*name) == DeviceKind::kCuda) return true;
  }
  return false;
}

StatusOr<std::vector<int>> GpusOfDeviceFlags(
    const std::vector<std::string>& device_flags) {
  std::vector<int> gpus;
  for (const std::string_view item : DeviceItems(device_flags)) {
    ASSIGN_OR_RETURN(const std::string name,
                     CanonicalName(item.substr(0, item.find('=')), "--device"));
    if (KindOf(name) != DeviceKind::kCuda) continue;
    const std::optional<int> index = GpuIndex(name);
    if (!index)
      return InvalidArgumentError("--device " + std::string(item) +
                                  ": GPU index out of range");
    gpus.push_back(*index);
  }
  return gpus;
}

}  // namespace loom
