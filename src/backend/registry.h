// The backends this build has, by name ("cpu", and "cuda" when built with
// LOOM_CUDA). Adding a backend: its directory src/backend/<name>/ and one line
// in registry.cc. A device index follows the name: "cuda:1" (default 0).
#ifndef LOOM_BACKEND_REGISTRY_H_
#define LOOM_BACKEND_REGISTRY_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/backend/backend.h"
#include "src/base/status.h"

namespace loom {

using BackendFactory = StatusOr<std::unique_ptr<Backend>> (*)(int index);

struct BackendEntry {
  std::string_view name;
  BackendFactory create;
};

// Every registered backend, in registration order.
const std::vector<BackendEntry>& Backends();

// A new instance of backend `name` ("cpu", "cuda", "cuda:1"); NotFound naming
// the known backends, or the backend's own error (no such device, no driver).
StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view name);
// The instance for a planned device (DeviceKind::kCpu -> "cpu", kCuda ->
// "cuda:N").
StatusOr<std::unique_ptr<Backend>> CreateBackend(DeviceKind kind, int index);

// A GPU as `loom devices` lists it.
struct GpuDescription {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;
  int64_t total_bytes = 0, free_bytes = 0;
  int multiprocessors = 0;
};
// The GPUs this build can use (empty without the CUDA backend or a device;
// `reason` says why).
std::vector<GpuDescription> ListGpus(std::string* reason);
// The planner's kernel costs of the backend for `kind` (the CPU's for the
// host and the disk tier; the CUDA backend's for kCuda, in every build).
KernelCosts BackendCosts(DeviceKind kind);
// Whether this build has the CUDA backend.
bool HasCudaBackend();

// The host CPU as the CPU backend sees it: the instruction-set level it
// detected, the level in use (LOOM_CPU_ISA caps it), the CPUID features, and
// how a GEMM runs in each compute precision.
struct HostDescription {
  std::string detected_isa, active_isa, features;
  std::string cpu_model;  // /proc/cpuinfo's model name
  struct PrecisionPath {
    std::string precision;  // "f32", "bf16", "f16"
    bool native = false;    // multiplied in that type (else widened to f32)
    std::string how;
    std::string gemm_path;  // "amx", "avx512bf16", "avx512", "avx2", "baseline"
    int64_t peak_flops_per_cycle = 0;  // of that path, one core
  };
  std::vector<PrecisionPath> precisions;
};
HostDescription DescribeHost();
// One core's clock, measured now (cpu::MeasureCoreClockHz; about 50 ms).
double MeasureHostClockHz();
// InvalidArgument when LOOM_CPU_ISA holds a value that is not a level
// (commands refuse to run rather than silently ignore the cap).
Status CheckCpuIsaCap();

}  // namespace loom

#endif  // LOOM_BACKEND_REGISTRY_H_
