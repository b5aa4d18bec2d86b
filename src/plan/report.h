// Presenting a MemoryPlan: the table `loom plan` prints (and job commands print
// with --show-plan), and its JSON form.
#ifndef LOOM_PLAN_REPORT_H_
#define LOOM_PLAN_REPORT_H_

#include <nlohmann/json.hpp>
#include <string>

namespace loom {

struct MemoryPlan;

// Per device: weights, activations, workspace, KV, staging, logits, total,
// usable, free, headroom; then the layers each device holds, the problems
// and suggestions when it does not fit.
std::string FormatPlanTable(const MemoryPlan& plan);

// {"fits", "model_type", "weights": {...}, "job": {...},
//  "devices": [{"name", "kind", "capacity_bytes", "max_memory_bytes",
//   "reserve_bytes", "usable_bytes", "weights_bytes", "activations_bytes",
//   "workspace_bytes", "kv_bytes", "staging_bytes", "logits_bytes",
//   "stream_bytes", "total_bytes", "free_bytes", "headroom_bytes", "layers",
//   "embed", "head"}], "activation_regions": [...], "problems", "suggestions"}
// Disk: capacity_bytes null.
nlohmann::json PlanToJson(const MemoryPlan& plan);

}  // namespace loom

#endif  // LOOM_PLAN_REPORT_H_
