#include "src/eval/job_plan.h"

#include <unistd.h>

#include <cstdio>

#include "src/backend/registry.h"
#include "src/model/registry.h"
#include "src/plan/devices.h"
#include "src/plan/report.h"
#include "src/runtime/executor.h"
#include "src/runtime/memory_stats.h"

namespace loom {

int64_t HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

StatusOr<DType> PlannedComputeDType(const ModelConfig& config,
                                    Precision precision) {
  std::string warning;
  return ResolvePrecision(precision, config.torch_dtype, &warning);
}

StatusOr<MemoryPlan> PlanJobOrRefuse(const std::string& command,
                                     const std::string& model_dir,
                                     const JobSpec& job,
                                     const JobPlanOptions& o) {
  const int64_t host = HostMemoryBytes();
  // Job commands compute on the host unless told otherwise.
  const std::vector<std::string> cpu_only = {"cpu"};
  ASSIGN_OR_RETURN(std::vector<DeviceSpec> devices,
                   DevicesFromFlags(o.devices.empty() ? cpu_only : o.devices,
                                    o.max_memory, o.reserve, host));
  for (const DeviceSpec& d : devices)
    if (d.kind == DeviceKind::kCuda)
      return UnimplementedError("--device " + d.name +
                                ": this build runs on the CPU only; plan GPU "
                                "placements with `loom plan`");
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend("cpu"));
  ASSIGN_OR_RETURN(MemoryPlan plan, PlanModelDir(model_dir, job, devices, host,
                                                 backend->Costs()));
  if (o.show_plan)
    std::fprintf(stderr, "loom %s: memory plan\n%s\n", command.c_str(),
                 FormatPlanTable(plan).c_str());
  RETURN_IF_ERROR(CheckFits(plan));
  return plan;
}

StatusOr<JobSpec> EvalJob(const std::string& model_dir, Precision precision,
                          int64_t ctx, int64_t chunk_rows) {
  ASSIGN_OR_RETURN(ModelConfig c, LoadModelConfig(model_dir));
  ASSIGN_OR_RETURN(DType dtype, PlannedComputeDType(c, precision));
  JobSpec job;
  job.batch_tokens =
      ctx > 0 ? ctx : std::min<int64_t>(512, c.max_position_embeddings);
  job.context = job.batch_tokens;
  job.hooks.Add({HookSite::kFinalNorm, -1});
  job.selector = Selector::kAll;
  job.capture_dtype = DType::kF32;
  job.logits = true;
  job.logits_chunk_rows = chunk_rows > 0 ? chunk_rows : 256;
  job.weight_compute_dtype = dtype;
  return job;
}

int64_t PlannedHostBytes(const MemoryPlan& plan) {
  int64_t total = 0;
  for (const DevicePlan& d : plan.devices)
    if (d.device.kind == DeviceKind::kCpu) total += d.total();
  return total;
}

nlohmann::json VerifyPlan(int64_t planned, int64_t rss_before) {
  const int64_t resident = CurrentRssBytes() - rss_before;
  const double ratio =
      planned > 0 ? static_cast<double>(resident) / static_cast<double>(planned)
                  : 0.0;
  return nlohmann::json{{"planned_bytes", planned},
                        {"resident_bytes", resident},
                        {"ratio", ratio},
                        {"within_1_percent", ratio > 0.99 && ratio < 1.01}};
}

}  // namespace loom
