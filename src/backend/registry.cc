#include "src/backend/registry.h"

#include <charconv>

#include "src/backend/cpu/cpu_backend.h"
#include "src/backend/cuda/costs.h"
#ifdef LOOM_HAVE_CUDA
#include "src/backend/cuda/cuda_backend.h"
#endif

namespace loom {
namespace {

StatusOr<std::unique_ptr<Backend>> MakeCpu(int index) {
  if (index != 0)
    return NotFoundError("backend cpu has one device (cpu), not cpu:" +
                         std::to_string(index));
  return std::unique_ptr<Backend>(new cpu::CpuBackend());
}

#ifdef LOOM_HAVE_CUDA
StatusOr<std::unique_ptr<Backend>> MakeCuda(int index) {
  ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaBackend> b,
                   cuda::CudaBackend::Create(index));
  return std::unique_ptr<Backend>(std::move(b));
}
#endif

}  // namespace

const std::vector<BackendEntry>& Backends() {
  static const std::vector<BackendEntry> kBackends = {
      {"cpu", &MakeCpu},
#ifdef LOOM_HAVE_CUDA
      {"cuda", &MakeCuda},
#endif
  };
  return kBackends;
}

KernelCosts BackendCosts(DeviceKind kind) {
  if (kind == DeviceKind::kCuda) return cuda::CudaKernelCosts();
  return cpu::CpuKernelCosts();
}

bool HasCudaBackend() {
#ifdef LOOM_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view spec) {
  std::string_view name = spec;
  int index = 0;
  if (const size_t colon = spec.find(':'); colon != std::string_view::npos) {
    name = spec.substr(0, colon);
    const std::string_view digits = spec.substr(colon + 1);
    const auto [p, ec] =
        std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec != std::errc() || p != digits.data() + digits.size() || index < 0)
      return InvalidArgumentError("backend '" + std::string(spec) +
                                  "': the device index must be a number "
                                  "(cuda:1)");
  }
  std::string known;
  for (const BackendEntry& e : Backends()) {
    if (e.name == name) return e.create(index);
    known += (known.empty() ? "" : ", ") + std::string(e.name);
  }
  return NotFoundError("no backend named '" + std::string(name) +
                       "' in this build (available: " + known + ")" +
                       (name == "cuda" ? "; rebuild with -DLOOM_CUDA=on on a "
                                         "machine with the CUDA toolkit"
                                       : ""));
}

StatusOr<std::unique_ptr<Backend>> CreateBackend(DeviceKind kind, int index) {
  switch (kind) {
    case DeviceKind::kCpu:
      return CreateBackend("cpu");
    case DeviceKind::kCuda:
      return CreateBackend("cuda:" + std::to_string(index));
    case DeviceKind::kDisk:
      break;
  }
  return InvalidArgumentError(
      "the disk tier computes on the host; it has no backend of its own");
}

std::vector<GpuDescription> ListGpus(std::string* reason) {
  std::vector<GpuDescription> out;
#ifdef LOOM_HAVE_CUDA
  for (const cuda::GpuInfo& g : cuda::ListGpus(reason))
    out.push_back({g.index, g.name, g.major, g.minor, g.total_bytes,
                   g.free_bytes, g.multiprocessors});
#else
  if (reason)
    *reason = "this build has no CUDA backend (configured with LOOM_CUDA=off "
              "or without the CUDA toolkit)";
#endif
  return out;
}

}  // namespace loom
