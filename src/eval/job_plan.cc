#include "src/eval/job_plan.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "src/backend/registry.h"
#include "src/base/units.h"
#include "src/model/registry.h"
#include "src/plan/devices.h"
#include "src/plan/report.h"
#include "src/runtime/executor.h"
#include "src/runtime/memory_stats.h"

namespace loom {

int64_t DefaultContext(const ModelConfig& config, int64_t fallback) {
  return std::min<int64_t>(fallback, config.max_position_embeddings);
}

int64_t HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

StatusOr<JobDevices> ResolveJobDevices(const JobPlanOptions& o) {
  JobDevices out;
  ASSIGN_OR_RETURN(const std::vector<int> named, GpusOfDeviceFlags(o.devices));
  // The GPUs are listed only when the flags name one: the CUDA runtime's
  // start costs memory and time a host job should not pay.
  std::string reason;
  const std::vector<GpuDescription> gpus =
      HasCudaBackend() && FlagsNameAGpu(o.devices, o.max_memory)
          ? ListGpus(&reason)
          : std::vector<GpuDescription>{};
  if (!HasCudaBackend())
    reason =
        "this build has no CUDA backend (configure with -DLOOM_CUDA=on where "
        "the CUDA toolkit is installed)";
  std::map<int, int64_t> gpu_bytes;
  std::map<int, int> capability;
  for (const GpuDescription& g : gpus) {
    gpu_bytes[g.index] = g.free_bytes;
    capability[g.index] = g.major * 10 + g.minor;
  }
  auto missing = [&](int index, const std::string& flag) {
    return UnavailableError(
        flag + " cuda:" + std::to_string(index) + ": no such GPU here (" +
        (reason.empty() ? std::to_string(gpus.size()) + " GPU(s) visible"
                        : reason) +
        "); nothing was loaded. Plan GPU placements on this machine with "
        "`loom plan --device cuda:N=SIZE`");
  };
  for (const int index : named)
    if (!gpu_bytes.contains(index)) return missing(index, "--device");
  const std::vector<std::string> cpu_only = {"cpu"};
  ASSIGN_OR_RETURN(
      out.devices,
      DevicesFromFlags(o.devices.empty() ? cpu_only : o.devices, o.max_memory,
                       o.reserve, HostMemoryBytes(), &gpu_bytes));
  for (const DeviceSpec& d : out.devices) {
    if (d.kind != DeviceKind::kCuda || !d.compute) continue;
    const int index = std::stoi(d.name.substr(5));
    if (!capability.contains(index)) return missing(index, "--max-memory");
    const int cap = capability[index];
    out.gpu_capability =
        out.gpu_capability == 0 ? cap : std::min(out.gpu_capability, cap);
  }
  return out;
}

StatusOr<MemoryPlan> PlanJobOrRefuse(const std::string& command,
                                     const std::string& model_dir,
                                     const JobSpec& job,
                                     const JobPlanOptions& o) {
  // Job commands compute on the host unless told otherwise; a GPU named
  // must be here.
  ASSIGN_OR_RETURN(const JobDevices devices, ResolveJobDevices(o));
  return PlanJobOrRefuse(command, model_dir, job, devices, o);
}

StatusOr<MemoryPlan> PlanJobOrRefuse(const std::string& command,
                                     const std::string& model_dir,
                                     const JobSpec& job, const JobDevices& jd,
                                     const JobPlanOptions& o) {
  const int64_t host = HostMemoryBytes();
  const std::vector<DeviceSpec>& devices = jd.devices;
  bool gpu = false;
  for (const DeviceSpec& d : devices)
    gpu |= d.kind == DeviceKind::kCuda && d.compute;
  // The kernels' costs of the backend the layers run on (a placement is of
  // one kind of accelerator, plus the host).
  const KernelCosts costs =
      BackendCosts(gpu ? DeviceKind::kCuda : DeviceKind::kCpu);
  ASSIGN_OR_RETURN(MemoryPlan plan,
                   PlanModelDir(model_dir, job, devices, host, costs,
                                Strategy::kBalanced, std::nullopt, o.offload));
  if (o.show_plan)
    std::fprintf(stderr, "loom %s: memory plan\n%s\n", command.c_str(),
                 FormatPlanTable(plan).c_str());
  RETURN_IF_ERROR(CheckFits(plan));
  return plan;
}

StatusOr<JobBackends> CreateJobBackends(const MemoryPlan& plan, Backend* host) {
  JobBackends jb;
  std::vector<Backend*> by_device(plan.devices.size(), nullptr);
  for (size_t i = 0; i < plan.devices.size(); ++i) {
    const DeviceSpec& d = plan.devices[i].device;
    if (!plan.devices[i].computes()) continue;
    if (d.kind != DeviceKind::kCuda) {
      by_device[i] = host;  // the host, and the disk tier it streams from
      continue;
    }
    const int index = std::stoi(d.name.substr(d.name.find(':') + 1));
    StatusOr<std::unique_ptr<Backend>> b =
        CreateBackend(DeviceKind::kCuda, index);
    if (!b.ok())
      return FailedPreconditionError("--device " + d.name + ": " +
                                     b.status().message());
    by_device[i] = b->get();
    jb.owned.push_back(std::move(*b));
    std::string reason;
    for (const GpuDescription& g : ListGpus(&reason))
      if (g.index == index) {
        const int cap = g.major * 10 + g.minor;
        jb.gpu_capability =
            jb.gpu_capability == 0 ? cap : std::min(jb.gpu_capability, cap);
      }
  }
  Backend* last = host;
  bool last_offload = false, last_disk = false;
  for (int64_t l = 0; l < plan.num_layers; ++l) {
    // Disk-streamed layers keep their holder (the disk: the host's backend);
    // offloaded ones run on the GPU that computes them, streamed.
    bool offload = IsOffloaded(plan, l);
    const int held = plan.layer_device[static_cast<size_t>(l)];
    const int dev = offload ? ComputeDeviceOf(plan, l) : held;
    Backend* b = dev >= 0 ? by_device[static_cast<size_t>(dev)] : last;
    if (b == nullptr) b = host;
    bool disk =
        held >= 0 && plan.devices[static_cast<size_t>(held)].device.kind ==
                         DeviceKind::kDisk;
    if (dev < 0) {  // not run: the last segment's
      offload = last_offload;
      disk = last_disk;
    }
    if (jb.segments.empty() || jb.segments.back().backend != b ||
        jb.segments.back().offload != offload ||
        jb.segments.back().from_disk != disk)
      jb.segments.push_back({b, l, l, offload, disk});
    else
      jb.segments.back().last_layer = l;
    last = b;
    last_offload = offload;
    last_disk = disk;
  }
  // (No layers: no segments; the executor then runs on its own host
  // backend.)
  return jb;
}

JobSpec EvalJobOf(const ModelConfig& c, int64_t ctx, int64_t chunk_rows) {
  JobSpec job;
  job.batch_tokens = ctx > 0 ? ctx : DefaultContext(c, kEvalContext);
  job.context = job.batch_tokens;
  job.hooks.Add({HookSite::kFinalNorm, -1});
  job.selector = Selector::kAll;
  job.capture_dtype = DType::kF32;
  job.logits = true;
  job.logits_chunk_rows = chunk_rows > 0 ? chunk_rows : 256;
  return job;
}

int64_t PlannedHostBytes(const MemoryPlan& plan) {
  int64_t total = 0;
  for (const DevicePlan& d : plan.devices)
    if (d.device.kind == DeviceKind::kCpu) total += d.total();
  return total;
}

RssWatch StartRssWatch() {
  RssWatch w;
  w.peak_reset = ResetPeakRss();
  w.before = CurrentRssBytes();
  w.library_before = ReadSmapsRss(".safetensors").library;
  return w;
}

nlohmann::json VerifyPlan(int64_t planned, const RssWatch& watch,
                          const char* who) {
  const int64_t now = CurrentRssBytes();
  const int64_t grown =
      (watch.peak_reset ? std::max(now, PeakRssBytes()) : now) - watch.before;
  // The libraries' pages (their code and data as it first runs, and the
  // code they generate: oneDNN's kernels) are no memory the plan allocates;
  // they are reported apart and left out of the comparison.
  const SmapsRss maps = ReadSmapsRss(".safetensors");
  const int64_t code =
      maps.ok ? std::max<int64_t>(0, maps.library - watch.library_before) : 0;
  const int64_t resident = grown - code;
  const double ratio =
      planned > 0 ? static_cast<double>(resident) / static_cast<double>(planned)
                  : 0.0;
  const bool agree = ratio > 0.99 && ratio < 1.01;
  if (!agree) {
    const std::string off =
        resident > planned
            ? FormatBytes(resident - planned) +
                  " that the plan does not describe, such as heap no plan "
                  "counts (the tokenizer, the model's description, thread "
                  "stacks, the libraries' small objects: a fixed cost that "
                  "shows on small models)"
            : FormatBytes(planned - resident) +
                  " planned but never resident (buffers the job did not "
                  "touch)";
    std::fprintf(stderr,
                 "%s: warning: --verify-plan: resident %s, planned %s (ratio "
                 "%.3f, not within 1%%): %s. The libraries' code and data "
                 "pages, generated code included (%s), are not counted.\n",
                 who, FormatBytes(resident).c_str(),
                 FormatBytes(planned).c_str(), ratio, off.c_str(),
                 FormatBytes(code).c_str());
  }
  return nlohmann::json{{"planned_bytes", planned},
                        {"resident_bytes", resident},
                        {"library_bytes", code},
                        {"ratio", ratio},
                        {"within_1_percent", agree}};
}

}  // namespace loom
