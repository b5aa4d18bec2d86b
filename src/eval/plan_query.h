// What `loom plan` computes, as a library call: the plan of a described job
// on described devices, from config.json and the safetensors headers alone
// (no weight is read), optionally solved for the largest batch or context or
// the fewest devices. Shared by `loom plan` and the Python module's
// Model.plan(), so both give the same plan and the same JSON.
#ifndef LOOM_EVAL_PLAN_QUERY_H_
#define LOOM_EVAL_PLAN_QUERY_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/eval/job_plan.h"
#include "src/plan/planner.h"

namespace loom {

// The flags of `loom plan`, by their names there.
struct PlanQuery {
  std::string model_dir;
  // --device, --max-memory, --reserve, --offload (show_plan / verify_plan
  // are not read).
  JobPlanOptions devices;
  std::string assume_dtype;           // --assume-dtype; empty = torch_dtype
  std::string strategy = "balanced";  // --strategy
  std::string layers_per_device;      // --layers-per-device "20,28"
  std::string solve;  // max-batch-tokens | max-context | min-devices | ""
  std::string mode = "analysis";  // analysis | generation
  int64_t batch_tokens = 0;  // 0 = min(kDefaultPlanBatchTokens, max positions)
  int64_t ctx = 0;           // 0 = min(batch tokens, max positions)
  int64_t seqs_per_batch = 0;
  std::vector<std::string> hooks;   // none: the whole forward with logits
  std::vector<std::string> layers;  // none: every layer (bare sites)
  std::string select = "all";       // all | last | mean
  std::string dtype = "f32";        // capture dtype: f32 | bf16 | f16
  std::string capture_to = "host";
  int64_t capture_buffers = 1;
  bool logits = false;  // logits even with hooks
  // The forward and one backward (loom attribute, extract --grad-of): the
  // backward's own bytes for a sequence of batch_tokens, every layer
  // boundary tapped, the head.
  bool backward = false;
  int64_t logits_chunk = 256;
  std::string kv_dtype;  // empty = the planner's default
  int64_t kv_context = 0;
};

// --batch-tokens when not given, unless the model holds fewer positions.
inline constexpr int64_t kDefaultPlanBatchTokens = 2048;

struct PlanQueryResult {
  MemoryPlan plan;
  nlohmann::json solved;    // {"what", "value"} with --solve, else null
  std::string solved_line;  // "max batch tokens: N\n" with --solve
  // `loom plan --json`: PlanToJson(plan) plus "solve" when solved.
  nlohmann::json ToJson() const;
};

// Plans the query. A plan that does not fit is returned (plan.fits false),
// not refused; errors are bad flags (InvalidArgument), a missing model
// (NotFound), or a --solve with no answer (ResourceExhausted with the
// one-token plan's table).
StatusOr<PlanQueryResult> RunPlanQuery(const PlanQuery& query);

// "f32" | "bf16" | "f16" (or a DType name) for the flag `flag`.
StatusOr<DType> ParsePlanDType(const std::string& flag,
                               const std::string& text);

}  // namespace loom

#endif  // LOOM_EVAL_PLAN_QUERY_H_
