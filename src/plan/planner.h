// The memory planner: from a model (config + weight table with real storage
// dtypes), a job and a list of devices, every byte a run will hold, per device
// and per arena, decided before anything is loaded or allocated.
//
// Pure: no device calls, no allocation proportional to the model; the kernel
// workspace comes from the injected KernelCosts. Deterministic: the same
// input gives the same plan.
//
// Per device that computes layers:
//   weights     its layers' tensors as stored (or converted, when the job asks
//               for a compute dtype), + the embedding on the device running
//               layer 0, + final norm / lm_head on the device running the last
//               layer (a tied lm_head held twice if those differ)
//   activations the liveness-packed activation arena (PlanActivations)
//   workspace   the kernels' scratch (KernelCosts); with a KV cache, its
//               attention workspace on the device running layer 0
//   kv          generation: 2 x kv_dim x min(ctx, window) x sequences x dtype
//               for each of its layers; analysis with kv_context (extract's
//               streamed long rows): the same for one sequence of kv_context
//               positions in the activation dtype
//   staging     captures of its layers' hooks when captures stay on device;
//               the host's when they go to the host
//   logits      [chunk, V] f32 on the device running the lm_head
//   stream      with the disk tier: two layers' weights (compute one, read the
//               next) on the device that runs the streamed layers; with
//               offload: two offloaded layers' weights on the last GPU
//   runtime     on a GPU: the CUDA context, modules and library handles (a
//               measured constant of the backend, KernelCosts)
//
// Offload (PlanInput::offload, --offload): the host is a weight tier for the
// GPUs. Layers placed on the host (the trailing layers that do not fit the
// GPUs under the balanced strategy; what the GPUs leave under sequential and
// manual) keep their weights in (pinned) host memory and are computed by the
// last GPU, which copies them in layer by layer into two buffers of the
// largest such layer (its `stream`). layer_device keeps naming the host for
// them (it holds them); ComputeDeviceOf says who computes a layer. Offloaded
// layers are counted as the executor lays them out: each tensor 64-byte
// aligned, on the host (the pinned copy) and in each of the two buffers.
// See docs/design/memory-plan.md.
#ifndef LOOM_PLAN_PLANNER_H_
#define LOOM_PLAN_PLANNER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/model/config.h"
#include "src/plan/activations.h"
#include "src/plan/devices.h"
#include "src/plan/job.h"
#include "src/plan/weight_table.h"

namespace loom {

enum class Strategy {
  kBalanced,    // contiguous layer ranges minimising the largest used fraction
                // of any device's usable bytes (its peak, not its weight bytes)
  kSequential,  // fill each device in order before the next (accelerate's)
  kManual,      // --layers-per-device counts, in device order
};
std::string_view StrategyName(Strategy s);
StatusOr<Strategy> ParseStrategy(std::string_view s);
// "20,28" -> {20, 28}.
StatusOr<std::vector<int64_t>> ParseLayersPerDevice(std::string_view s);

struct PlanInput {
  const ModelConfig* config = nullptr;
  const WeightTable* weights = nullptr;
  JobSpec job;
  std::vector<DeviceSpec> devices;  // normalized (NormalizeDevices)
  Strategy strategy = Strategy::kBalanced;
  std::vector<int64_t> layers_per_device;  // kManual
  KernelCosts costs;
  // When the plan does not fit, try the alternatives (smaller batch, shorter
  // context, captures to host, disk, offload, more devices) and list those
  // that fit.
  bool suggest = true;
  // Layers placed on the host are computed by the last GPU, their weights
  // streamed from pinned host memory (needs a GPU device; not with disk).
  // The host then computes nothing; manual counts are the GPUs' (the rest
  // goes to the host).
  bool offload = false;
};

struct DevicePlan {
  DeviceSpec device;
  std::vector<int64_t> layers;  // resident layers (disk: streamed ones)
  bool holds_embed = false;
  bool holds_head = false;
  int64_t streamed_layers = 0;   // disk layers this device computes
  int64_t offloaded_layers = 0;  // host-resident layers this GPU computes
  // The host under offload: holds offloaded layers, computes nothing.
  bool weights_only = false;
  int64_t weights = 0, activations = 0, workspace = 0, kv = 0, staging = 0,
          logits = 0, stream = 0;
  // A GPU's runtime (KernelCosts::device_runtime_bytes): context, modules,
  // library handles.
  int64_t runtime = 0;

  bool computes() const {
    if (weights_only) return false;
    return !layers.empty() || holds_embed || holds_head ||
           streamed_layers > 0 || offloaded_layers > 0;
  }
  // Bytes held (disk: 0; its weights stay in the checkpoint).
  int64_t total() const;
  // usable - total (fits when >= 0).
  int64_t headroom() const { return device.usable() - total(); }
  // capacity - reserve - total: what is physically left.
  int64_t free() const { return device.capacity - device.reserve - total(); }
};

struct MemoryPlan {
  bool fits = false;
  std::string model_type;
  WeightSource weight_source = WeightSource::kConfig;
  int64_t weight_bytes = 0;  // all declared tensors as stored
  std::optional<int64_t> index_total_size;
  std::optional<DType> assumed_dtype;
  std::string quantization;  // the checkpoint's scheme ("" = none): "mxfp4"
  JobSpec job;
  Strategy strategy = Strategy::kBalanced;
  int64_t num_layers = 0;
  int64_t layers_run = 0;
  ActivationLayout layout;
  std::vector<DevicePlan> devices;
  // [num_layers]: index into devices of the device holding the layer's
  // weights; -1 = not run. A layer held by the disk is computed by the device
  // with streamed_layers > 0; one held by the host when `offload` is set by
  // the GPU with offloaded_layers > 0 (ComputeDeviceOf).
  std::vector<int> layer_device;
  bool offload = false;  // PlanInput::offload
  std::vector<std::string> problems;     // one line per overfull device
  std::vector<std::string> suggestions;  // alternatives that fit
};

// The index into plan.devices of the device that computes `layer` (-1 = not
// run): layer_device, except for disk-streamed and offloaded layers.
int ComputeDeviceOf(const MemoryPlan& plan, int64_t layer);
// Whether `layer` is offloaded: held by the host, computed by a GPU.
bool IsOffloaded(const MemoryPlan& plan, int64_t layer);

// Errors for invalid input (bad job, manual counts that do not add up, no
// computing device); a plan that does not fit is returned with fits = false.
StatusOr<MemoryPlan> MakePlan(const PlanInput& input);

// Solvers: the planner answers by planning (binary search; plans are monotone
// in batch tokens and context). NotFound-free: ResourceExhausted when even the
// smallest value does not fit.
StatusOr<int64_t> SolveMaxBatchTokens(const PlanInput& input,
                                      int64_t limit = int64_t{1} << 24);
StatusOr<int64_t> SolveMaxContext(const PlanInput& input);
// The fewest computing devices: the first k of the list, the last GPU (or the
// host) repeated when the list runs out, up to `limit`. Returns the devices.
StatusOr<std::vector<DeviceSpec>> SolveMinDevices(const PlanInput& input,
                                                  int limit = 64);

// Convenience for job commands (extract, perplexity, compare): reads
// MODEL_DIR's config.json and weight metadata and plans `job` on `devices`
// (normalized here). The caller checks CheckFits (report.h) before loading
// and prints FormatPlanTable for --show-plan.
StatusOr<MemoryPlan> PlanModelDir(
    const std::string& model_dir, const JobSpec& job,
    std::vector<DeviceSpec> devices, int64_t host_bytes,
    const KernelCosts& costs, Strategy strategy = Strategy::kBalanced,
    std::optional<DType> assume_dtype = std::nullopt, bool offload = false);

}  // namespace loom

#endif  // LOOM_PLAN_PLANNER_H_
