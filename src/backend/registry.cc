#include "src/backend/registry.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <mutex>
#include <string>

#include "src/backend/cpu/cpu_backend.h"
#include "src/backend/cpu/isa.h"
#include "src/backend/cpu/kernels.h"
#include "src/backend/cuda/costs.h"
#include "src/backend/cuda/plugin.h"

namespace loom {
namespace {

StatusOr<std::unique_ptr<Backend>> MakeCpu(int index) {
  if (index != 0)
    return NotFoundError("backend cpu has one device (cpu), not cpu:" +
                         std::to_string(index));
  return std::unique_ptr<Backend>(new cpu::CpuBackend());
}

#ifdef LOOM_HAVE_CUDA
// The CUDA plugin (src/backend/cuda/plugin.h), loaded once on first use and
// never unloaded. Looked for at $LOOM_CUDA_PLUGIN, beside the executable, in
// ../lib from it, then where this build put it.
struct CudaPlugin {
  LoomCudaCreateFn create = nullptr;
  LoomCudaListFn list = nullptr;
  std::string error;  // why it could not be loaded
};

const CudaPlugin& LoadCudaPlugin() {
  static CudaPlugin plugin;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("LOOM_CUDA_PLUGIN"); env && *env)
      candidates.push_back(env);
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
      std::string dir(exe, static_cast<size_t>(n));
      dir = dir.substr(0, dir.rfind('/'));
      candidates.push_back(dir + "/" + cuda::kPluginFile);
      candidates.push_back(dir + "/../lib/" + cuda::kPluginFile);
    }
    candidates.push_back(LOOM_CUDA_PLUGIN_DEFAULT);
    std::string tried;
    for (const std::string& path : candidates) {
      void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) {
        const char* e = dlerror();
        tried += "\n  " + path + ": " + (e ? e : "not loadable");
        continue;
      }
      auto abi = reinterpret_cast<LoomCudaAbiFn>(dlsym(h, "loom_cuda_abi"));
      if (abi == nullptr || abi() != cuda::kLoomCudaPluginAbi) {
        tried += "\n  " + path + ": not a plugin of this build (ABI)";
        continue;
      }
      plugin.create =
          reinterpret_cast<LoomCudaCreateFn>(dlsym(h, "loom_cuda_create"));
      plugin.list =
          reinterpret_cast<LoomCudaListFn>(dlsym(h, "loom_cuda_list"));
      if (plugin.create && plugin.list) return;
      tried += "\n  " + path + ": entry points missing";
    }
    plugin.error =
        "the CUDA backend plugin " + std::string(cuda::kPluginFile) +
        " could not be loaded (set LOOM_CUDA_PLUGIN to its path):" + tried;
  });
  return plugin;
}

StatusOr<std::unique_ptr<Backend>> MakeCuda(int index) {
  const CudaPlugin& p = LoadCudaPlugin();
  if (p.create == nullptr) return FailedPreconditionError(p.error);
  char error[1024] = {0};
  Backend* b = p.create(index, error, sizeof(error));
  if (b == nullptr) return FailedPreconditionError(error);
  return std::unique_ptr<Backend>(b);
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
  const CudaPlugin& p = LoadCudaPlugin();
  if (p.list == nullptr) {
    if (reason) *reason = p.error;
    return out;
  }
  LoomGpuInfo gpus[64];
  char why[1024] = {0};
  const int n = p.list(gpus, 64, why, sizeof(why));
  if (n == 0 && reason) *reason = why;
  for (int i = 0; i < std::min(n, 64); ++i)
    out.push_back({gpus[i].index, gpus[i].name, gpus[i].major, gpus[i].minor,
                   gpus[i].total_bytes, gpus[i].free_bytes,
                   gpus[i].multiprocessors});
#else
  if (reason)
    *reason =
        "this build has no CUDA backend (configured with LOOM_CUDA=off "
        "or without the CUDA toolkit)";
#endif
  return out;
}

Status CheckCpuIsaCap() { return cpu::IsaCapFromEnvironment().status(); }

HostDescription DescribeHost() {
  HostDescription h;
  h.detected_isa = std::string(cpu::IsaName(cpu::DetectedIsa()));
  h.active_isa = std::string(cpu::IsaName(cpu::ActiveIsa()));
  h.features = cpu::FeatureList(cpu::DetectedCpuFeatures());
  h.cpu_model = cpu::CpuModelName();
  for (const auto& [name, dtype] :
       {std::pair<const char*, DType>{"f32", DType::kF32},
        {"bf16", DType::kBF16},
        {"f16", DType::kF16}})
    h.precisions.push_back({name, cpu::NativeGemmDType(dtype),
                            cpu::GemmPathDescription(dtype),
                            std::string(cpu::GemmPathName(dtype)),
                            cpu::GemmPeakFlopsPerCycle(dtype)});
  return h;
}

double MeasureHostClockHz() { return cpu::MeasureCoreClockHz(); }

}  // namespace loom
