// Planning before loading, for every job command (extract, perplexity,
// compare): the job is planned on the given devices from config.json and the
// safetensors headers alone; a plan that does not fit is refused with the
// byte breakdown before any weight is read. --show-plan prints the table;
// --verify-plan compares resident memory after the run with the plan.
#ifndef LOOM_EVAL_JOB_PLAN_H_
#define LOOM_EVAL_JOB_PLAN_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/plan/devices.h"
#include "src/plan/planner.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"

namespace loom {

struct JobPlanOptions {
  std::vector<std::string> devices;  // --device (default: the host's RAM)
  std::string max_memory;            // --max-memory 0=38GiB,cpu=50GiB
  std::string reserve;               // --reserve 2GiB | cpu=2GiB
  bool show_plan = false;            // print the plan table on stderr
  bool verify_plan = false;          // measure resident memory and compare
  // --offload: layers placed on the host run on the last GPU, their weights
  // streamed from pinned host memory (PlanInput::offload).
  bool offload = false;
};

// The context a job runs at when none is asked for: min(`fallback`,
// max_position_embeddings). Evaluations (perplexity, compare) use
// kEvalContext, generation and serving kGenerationContext.
inline constexpr int64_t kEvalContext = 512;
inline constexpr int64_t kGenerationContext = 2048;
int64_t DefaultContext(const ModelConfig& config, int64_t fallback);

// Physical RAM of this machine.
int64_t HostMemoryBytes();

// The devices of the placement flags (DevicesFromFlags; the host alone when
// none is given). Every GPU they name (--device, or declared by a
// --max-memory key) must be on this machine and in this build: UNAVAILABLE
// naming it otherwise, before anything is read. A GPU named without a size
// gets its free memory as its capacity. The GPUs are listed only when the
// flags name one. `gpu_capability`: the lowest of the computing GPUs (0 =
// none), for the precision rules.
struct JobDevices {
  std::vector<DeviceSpec> devices;
  int gpu_capability = 0;
};
StatusOr<JobDevices> ResolveJobDevices(const JobPlanOptions& options);

// Plans `job` for `model_dir`, prints the table when asked, and returns
// ResourceExhausted with the breakdown and suggestions when it does not fit.
StatusOr<MemoryPlan> PlanJobOrRefuse(const std::string& command,
                                     const std::string& model_dir,
                                     const JobSpec& job,
                                     const JobPlanOptions& options);
// The same on devices already resolved (ResolveJobDevices of `options`).
StatusOr<MemoryPlan> PlanJobOrRefuse(const std::string& command,
                                     const std::string& model_dir,
                                     const JobSpec& job,
                                     const JobDevices& devices,
                                     const JobPlanOptions& options);

// The backends a plan computes on and the executor segments of its layer
// placement: one backend per computing device (the host's is borrowed), the
// layers of each device as contiguous segments in layer order (layers the
// plan does not run go to the last segment; disk-streamed layers run on the
// host). Offloaded layers (plan.offload) form an offload segment on the GPU
// that computes them (ComputeDeviceOf); that GPU's resident layers and its
// offloaded ones share its one backend instance (and its arenas).
struct JobBackends {
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<ExecutorSegment> segments;
  // The lowest compute capability of the GPUs used (0 = none), for the
  // precision rules (ResolvePrecisionOn).
  int gpu_capability = 0;
};
StatusOr<JobBackends> CreateJobBackends(const MemoryPlan& plan, Backend* host);

// The job an evaluation (perplexity / compare) runs per window: `ctx` tokens
// to the final norm, logits `chunk_rows` rows at a time. ctx 0 = the
// commands' default, min(512, max_position_embeddings). The session sets
// the compute dtype.
JobSpec EvalJobOf(const ModelConfig& config, int64_t ctx, int64_t chunk_rows);

// Bytes the plan puts on the host (the CPU device).
int64_t PlannedHostBytes(const MemoryPlan& plan);

// Resident memory when a job started, for --verify-plan.
struct RssWatch {
  int64_t before = 0;          // resident bytes then
  bool peak_reset = false;     // VmHWM was reset then (else: not readable)
  int64_t library_before = 0;  // of which the libraries' (ReadSmapsRss)
};
// Resets the peak (VmHWM) and notes the resident bytes now.
RssWatch StartRssWatch();
// --verify-plan's report: the peak resident bytes since `watch` started (the
// arenas are freed before the job returns, so the peak, not the final
// resident size, is what the plan must cover), against `planned`, and whether
// they agree within 1 %. The resident bytes now where the peak was not reset.
// The libraries' resident pages (their files' pages, those copied on write
// included, and the code they generate, such as oneDNN's kernels, faulted in
// as they first run) are reported as library_bytes and left out. When
// they do not agree, a warning naming both figures is printed on stderr
// after "<who>: warning: ".
nlohmann::json VerifyPlan(int64_t planned, const RssWatch& watch,
                          const char* who);

}  // namespace loom

#endif  // LOOM_EVAL_JOB_PLAN_H_
