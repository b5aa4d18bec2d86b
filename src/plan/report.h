// Presenting a MemoryPlan: the table `loom plan` prints (and job commands print
// with --show-plan), its JSON form, and the refusal job commands give when a
// plan does not fit. One-way: the report reads the planner's types; the
// planner never formats (the layering test holds plan/report apart).
#ifndef LOOM_PLAN_REPORT_H_
#define LOOM_PLAN_REPORT_H_

#include <nlohmann/json.hpp>
#include <string>

#include "src/base/status.h"
#include "src/plan/planner.h"

namespace loom {

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

// ResourceExhausted with the byte breakdown (FormatPlanTable) and the
// suggestions when the plan does not fit; OK otherwise. What job commands call
// before loading.
Status CheckFits(const MemoryPlan& plan);

}  // namespace loom

#endif  // LOOM_PLAN_REPORT_H_
