#include "src/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "src/base/units.h"
#include "src/model/registry.h"
#include "src/plan/kv_layout.h"

namespace loom {
namespace {

bool IsFloat(DType d) {
  return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16 ||
         d == DType::kF64;
}

// Per-layer and model-level bytes a placement adds up.
struct Costs {
  std::vector<int64_t> layer_weights;  // resident bytes per layer
  // Offload: bytes of a layer's pinned host copy and of one device buffer
  // holding it (each tensor 64-byte aligned, as DeviceWeights lays it out).
  std::vector<int64_t> layer_streamed;
  std::vector<int64_t> layer_kv;
  std::vector<int64_t>
      layer_staging;  // captures staged on the computing device
  int64_t pre_weights = 0, post_weights = 0, tied_copy = 0;
  int64_t pre_staging = 0, post_staging = 0;  // model-level captures on device
  int64_t host_staging = 0;
  int64_t act = 0, ws = 0, logits = 0;
  // The KV cache's attention workspace (KernelCosts::kv_attention_workspace),
  // one per cache, on the device that computes layer 0.
  int64_t kv_ws = 0;
  bool needs_head = false;
};

// Resident bytes of one tensor: as stored, or converted once to the compute
// dtype (64-byte aligned) when the job asks for one and the dtype differs.
// Parts of quantized weights (values and scales) stay as stored.
int64_t Resident(const PlannedTensor& t, const JobSpec& job) {
  if (!job.weight_compute_dtype || t.quantized || !IsFloat(t.dtype) ||
      t.dtype == *job.weight_compute_dtype)
    return t.bytes;
  return AlignUp(t.shape.numel() * DTypeSize(*job.weight_compute_dtype), 64);
}

StatusOr<Costs> ComputeCosts(const PlanInput& in,
                             const ActivationLayout& layout,
                             int64_t layers_run) {
  const ModelConfig& c = *in.config;
  const JobSpec& job = in.job;
  Costs k;
  k.layer_weights.assign(c.num_layers, 0);
  k.layer_streamed.assign(c.num_layers, 0);
  k.layer_kv.assign(c.num_layers, 0);
  k.layer_staging.assign(c.num_layers, 0);
  for (const PlannedTensor& t : in.weights->tensors) {
    const int64_t b = Resident(t, job);
    if (t.layer >= 0) {
      k.layer_weights[t.layer] += b;
      k.layer_streamed[t.layer] += AlignUp(std::max<int64_t>(b, 1), 64);
    } else if (IsEmbeddingSide(t.role)) {
      k.pre_weights += b;
    } else {
      k.post_weights += b;
    }
    if (t.role == WeightRole::kEmbed && in.weights->tied_head) k.tied_copy = b;
  }
  k.needs_head = job.NeedsFinalNorm();
  if (job.HasKv()) {
    // As KvCache allocates it (KvCacheDType), for generation and for
    // extract's streamed rows alike, unless the plan is asked for another.
    const bool gen = job.mode == JobMode::kGeneration;
    const DType kv_dtype = job.kv_dtype.value_or(KvCacheDType(in.costs));
    const int64_t seqs = job.kv_seqs > 0 ? job.kv_seqs : gen ? job.Seqs() : 1;
    const int64_t context = job.KvContext();
    for (int64_t l = 0; l < layers_run; ++l)
      k.layer_kv[l] = KvLayerBytes(c, l, context, seqs, kv_dtype,
                                   KvPaging{job.kv_page_size, job.kv_pages});
    if (in.costs.kv_attention_workspace != nullptr && layers_run > 0)
      k.kv_ws = in.costs.kv_attention_workspace(
          context, c.num_heads, c.num_kv_heads, c.head_dim, c.v_head_dim(),
          in.costs.num_threads);
  }
  for (const HookPoint& h : job.hooks.hooks()) {
    ASSIGN_OR_RETURN(int64_t bytes, CaptureBytes(c, job, h));
    bytes = AlignUp(bytes, 64) * job.capture_buffers;
    if (job.capture_to == CaptureTarget::kHost) {
      k.host_staging += bytes;
    } else if (h.layer >= 0) {
      k.layer_staging[h.layer] += bytes;
    } else if (h.site == HookSite::kEmbed || h.site == HookSite::kPosEmbed) {
      k.pre_staging += bytes;
    } else {
      k.post_staging += bytes;
    }
  }
  k.host_staging += AlignUp(job.intervention_bytes, 64);
  // A GPU's executor stages edited rows through the host (EditStageBytes).
  for (const DeviceSpec& d : in.devices)
    if (d.kind == DeviceKind::kCuda && d.compute) {
      k.host_staging += AlignUp(EditStageBytes(c), 64);
      break;
    }
  k.host_staging += AlignUp(job.analysis_bytes, 64);
  k.host_staging += AlignUp(job.backward_bytes, 64);
  k.act = layout.activations.total_bytes;
  k.ws = layout.workspace.total_bytes;
  k.logits = layout.logits.total_bytes;
  return k;
}

// Index of the host and of the disk in the device list (-1 if absent), and
// the computing devices in order. With offload the host is a weight tier
// (`offload`), not a computing device, and `gpu_last` computes its layers.
struct Tiers {
  std::vector<int> compute;
  int host = -1;
  int disk = -1;
  int offload = -1;
  int gpu_last = -1;  // the last computing GPU
  // Where the layers that do not stay on a computing device go.
  int tail() const { return disk >= 0 ? disk : offload; }
};

Tiers GetTiers(const std::vector<DeviceSpec>& devices, bool offload) {
  Tiers t;
  for (size_t i = 0; i < devices.size(); ++i) {
    const int index = static_cast<int>(i);
    if (devices[i].kind == DeviceKind::kDisk) {
      t.disk = index;
      continue;
    }
    if (devices[i].kind == DeviceKind::kCpu) t.host = index;
    if (devices[i].kind == DeviceKind::kCuda && devices[i].compute)
      t.gpu_last = index;
    if (offload && devices[i].kind == DeviceKind::kCpu) continue;
    if (devices[i].compute) t.compute.push_back(index);
  }
  if (offload) t.offload = t.host;
  return t;
}

// The exact per-device bytes of an assignment (layer -> device index; -1 for
// layers not run). Disk layers are computed by the last computing device,
// offloaded (host) layers by the last GPU.
std::vector<DevicePlan> Evaluate(const PlanInput& in, const Costs& k,
                                 const Tiers& tiers,
                                 const std::vector<int>& assign,
                                 int64_t layers_run) {
  std::vector<DevicePlan> out(in.devices.size());
  for (size_t i = 0; i < out.size(); ++i) out[i].device = in.devices[i];
  const int streamer = tiers.compute.back();
  auto runner = [&](int dev) {
    if (dev == tiers.disk) return streamer;
    return dev == tiers.offload ? tiers.gpu_last : dev;
  };
  int64_t max_disk_layer = 0, max_offloaded_layer = 0;
  for (int64_t l = 0; l < layers_run; ++l) {
    const int d = assign[l];
    out[d].layers.push_back(l);
    out[d].weights +=
        d == tiers.offload ? k.layer_streamed[l] : k.layer_weights[l];
    if (d == tiers.disk) {
      max_disk_layer = std::max(max_disk_layer, k.layer_weights[l]);
      out[streamer].streamed_layers += 1;
    }
    if (d == tiers.offload) {
      max_offloaded_layer = std::max(max_offloaded_layer, k.layer_streamed[l]);
      out[tiers.gpu_last].offloaded_layers += 1;
    }
    out[runner(d)].kv += k.layer_kv[l];
    out[runner(d)].staging += k.layer_staging[l];
  }
  const int pre = layers_run > 0 ? runner(assign[0]) : tiers.compute.front();
  const int post = layers_run > 0 ? runner(assign[layers_run - 1]) : pre;
  out[pre].holds_embed = true;
  out[pre].weights += k.pre_weights;
  out[pre].staging += k.pre_staging;
  if (k.needs_head) {
    out[post].holds_head = true;
    out[post].weights += k.post_weights;
    out[post].staging += k.post_staging;
    out[post].logits += k.logits;
    if (post != pre && k.tied_copy > 0 && in.job.NeedsLogits())
      out[post].weights += k.tied_copy;
  }
  if (max_disk_layer > 0) out[streamer].stream = 2 * max_disk_layer;
  // Offload: two device buffers of the largest offloaded layer (copy one
  // while the other is computed); the host keeps every offloaded layer.
  if (max_offloaded_layer > 0)
    out[tiers.gpu_last].stream = 2 * max_offloaded_layer;
  if (tiers.offload >= 0) out[tiers.offload].weights_only = true;
  for (int d : tiers.compute) {
    if (!out[d].computes()) continue;
    out[d].activations = k.act;
    out[d].workspace = k.ws;
    if (out[d].device.kind == DeviceKind::kCuda)
      out[d].runtime = in.costs.device_runtime_bytes;
  }
  // One KV attention workspace on each device that computes layers (the
  // cache holds each layer where it is computed: KvCache).
  for (int d : tiers.compute)
    if (!out[d].layers.empty() || out[d].streamed_layers > 0 ||
        out[d].offloaded_layers > 0)
      out[d].workspace += k.kv_ws;
  if (tiers.host >= 0) out[tiers.host].staging += k.host_staging;
  return out;
}

double Utilization(const DevicePlan& d) {
  if (d.device.kind == DeviceKind::kDisk) return 0.0;
  const int64_t usable = d.device.usable();
  if (usable <= 0)
    return d.total() > 0 ? std::numeric_limits<double>::infinity() : 0.0;
  return static_cast<double>(d.total()) / static_cast<double>(usable);
}

double MaxUtilization(const std::vector<DevicePlan>& ds) {
  double m = 0;
  for (const DevicePlan& d : ds) m = std::max(m, Utilization(d));
  return m;
}

// Balanced: contiguous ranges over the computing devices, the first
// `resident` layers, minimising the largest utilization (dynamic programming
// over split points with an exact segment cost); the rest on disk or, with
// offload, on the host (computed by the last GPU: the last computing device).
std::vector<int> Balanced(const PlanInput& in, const Costs& k,
                          const Tiers& tiers, int64_t layers_run,
                          int64_t resident) {
  const int nd = static_cast<int>(tiers.compute.size());
  const int64_t n = resident;
  const bool disk = resident < layers_run;  // a tail: disk or offload
  std::vector<int64_t> prefix(n + 1, 0);
  for (int64_t l = 0; l < n; ++l)
    prefix[l + 1] =
        prefix[l] + k.layer_weights[l] + k.layer_kv[l] + k.layer_staging[l];
  int64_t max_disk = 0, disk_extra = 0;
  const std::vector<int64_t>& tail_layer =
      tiers.offload >= 0 ? k.layer_streamed : k.layer_weights;
  for (int64_t l = n; l < layers_run; ++l) {
    max_disk = std::max(max_disk, tail_layer[l]);
    disk_extra += k.layer_kv[l] + k.layer_staging[l];
  }
  auto seg = [&](int j, int64_t a, int64_t b) -> double {
    const DeviceSpec& dev = in.devices[tiers.compute[j]];
    const bool last = j == nd - 1;
    int64_t bytes = dev.kind == DeviceKind::kCpu ? k.host_staging : 0;
    const bool runs = a < b || (last && disk) || (n == 0 && j == 0);
    if (runs) bytes += k.act + k.ws;
    if (a < b || (n == 0 && j == 0)) {
      bytes += prefix[b] - prefix[a];
      if (a == 0) bytes += k.pre_weights + k.pre_staging;
    }
    if (a < b || (last && disk)) bytes += k.kv_ws;
    const bool head =
        k.needs_head && ((disk && last) || (!disk && a < b && b == n) ||
                         (n == 0 && j == 0 && !disk));
    if (head) bytes += k.post_weights + k.post_staging + k.logits;
    if (disk && last) bytes += 2 * max_disk + disk_extra;
    const int64_t usable = dev.usable();
    if (usable <= 0)
      return bytes > 0 ? std::numeric_limits<double>::infinity() : 0.0;
    return static_cast<double>(bytes) / static_cast<double>(usable);
  };
  const double kInf = std::numeric_limits<double>::infinity();
  // best[j][b]: devices 0..j hold layers [0, b); from[j][b]: where j's range
  // starts.
  std::vector<std::vector<double>> best(nd, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int64_t>> from(nd, std::vector<int64_t>(n + 1, 0));
  for (int64_t b = 0; b <= n; ++b) best[0][b] = seg(0, 0, b);
  for (int j = 1; j < nd; ++j) {
    for (int64_t b = 0; b <= n; ++b) {
      for (int64_t a = b; a >= 0;
           --a) {  // ties: the later device gets fewer layers
        const double v = std::max(best[j - 1][a], seg(j, a, b));
        if (v < best[j][b] ||
            (std::isinf(v) && std::isinf(best[j][b]) && a == b)) {
          best[j][b] = v;
          from[j][b] = a;
        }
      }
    }
  }
  std::vector<int> assign(in.config->num_layers, -1);
  int64_t b = n;
  for (int j = nd - 1; j >= 0; --j) {
    const int64_t a = j == 0 ? 0 : from[j][b];
    for (int64_t l = a; l < b; ++l) assign[l] = tiers.compute[j];
    b = a;
  }
  for (int64_t l = n; l < layers_run; ++l) assign[l] = tiers.tail();
  return assign;
}

// Sequential: each device takes layers while it still fits, in order; what
// is left goes to disk (or the offload host), or overfills the last device.
std::vector<int> Sequential(const PlanInput& in, const Costs& k,
                            const Tiers& tiers, int64_t layers_run) {
  std::vector<int> assign(in.config->num_layers, -1);
  const int rest = tiers.tail() >= 0 ? tiers.tail() : tiers.compute.back();
  int64_t next = 0;
  for (size_t j = 0; j < tiers.compute.size() && next < layers_run; ++j) {
    const int dev = tiers.compute[j];
    const bool takes_all = j + 1 == tiers.compute.size() && tiers.tail() < 0;
    while (next < layers_run) {
      for (int64_t l = next; l < layers_run; ++l) assign[l] = rest;
      assign[next] = dev;
      if (!takes_all &&
          Evaluate(in, k, tiers, assign, layers_run)[dev].headroom() < 0)
        break;
      ++next;
    }
  }
  for (int64_t l = next; l < layers_run; ++l) assign[l] = rest;
  return assign;
}

StatusOr<MemoryPlan> MakePlanImpl(const PlanInput& in) {
  LOOM_CHECK(in.config != nullptr && in.weights != nullptr)
      << "MakePlan: config and weights are required";
  const ModelConfig& c = *in.config;
  RETURN_IF_ERROR(ValidateJob(c, in.job));
  // Sub-byte types (F4) exist inside quantized weights only.
  for (const auto& [what, d] :
       {std::pair<const char*, std::optional<DType>>{"kv dtype",
                                                     in.job.kv_dtype},
        {"capture dtype", in.job.capture_dtype},
        {"weight compute dtype", in.job.weight_compute_dtype}})
    if (d && DTypeBits(*d) % 8 != 0)
      return InvalidArgumentError(
          std::string("plan: ") + what + " " + std::string(DTypeName(*d)) +
          " is a sub-byte type (it only stores quantized weights)");
  const Tiers tiers = GetTiers(in.devices, in.offload);
  if (in.offload) {
    if (tiers.gpu_last < 0)
      return InvalidArgumentError(
          "--offload needs a GPU to compute the offloaded layers: give "
          "--device cuda:N=SIZE");
    if (tiers.disk >= 0)
      return InvalidArgumentError(
          "--offload and --device disk cannot be combined (offloaded layers "
          "run on the last GPU, disk-streamed ones on the host)");
    if (tiers.host < 0)
      return InvalidArgumentError(
          "--offload needs the host (cpu) device to hold the offloaded "
          "layers");
  }
  if (tiers.compute.empty())
    return InvalidArgumentError(
        "plan: no device computes (give --device cpu or --device cuda:N=SIZE)");
  MemoryPlan plan;
  plan.model_type = c.model_type;
  plan.weight_source = in.weights->source;
  plan.weight_bytes = in.weights->total_bytes();
  plan.index_total_size = in.weights->index_total_size;
  plan.assumed_dtype = in.weights->assumed_dtype;
  plan.quantization = in.weights->quantization;
  plan.job = in.job;
  plan.strategy = in.strategy;
  plan.offload = in.offload;
  plan.num_layers = c.num_layers;
  plan.layers_run = in.job.LayersRun(c.num_layers);
  plan.layout = PlanActivations(c, in.job, in.costs);
  ASSIGN_OR_RETURN(Costs k, ComputeCosts(in, plan.layout, plan.layers_run));
  const int64_t n = plan.layers_run;

  std::vector<int> assign(c.num_layers, -1);
  switch (in.strategy) {
    case Strategy::kBalanced: {
      assign = Balanced(in, k, tiers, n, n);
      if (tiers.tail() >= 0 &&
          MaxUtilization(Evaluate(in, k, tiers, assign, n)) > 1.0) {
        // Move the fewest trailing layers to disk (or the offload host) that
        // makes it fit.
        std::vector<int> best = assign;
        double best_u = std::numeric_limits<double>::infinity();
        for (int64_t resident = n - 1; resident >= 0; --resident) {
          std::vector<int> a = Balanced(in, k, tiers, n, resident);
          const double u = MaxUtilization(Evaluate(in, k, tiers, a, n));
          if (u < best_u) {
            best_u = u;
            best = a;
          }
          if (u <= 1.0) break;
        }
        assign = best;
      }
      break;
    }
    case Strategy::kSequential:
      assign = Sequential(in, k, tiers, n);
      break;
    case Strategy::kManual: {
      const auto& counts = in.layers_per_device;
      if (counts.size() > tiers.compute.size())
        return InvalidArgumentError(
            "--layers-per-device has " + std::to_string(counts.size()) +
            " counts for " + std::to_string(tiers.compute.size()) +
            " computing devices");
      int64_t next = 0;
      for (size_t j = 0; j < counts.size(); ++j) {
        if (counts[j] < 0)
          return InvalidArgumentError("--layers-per-device: negative count");
        for (int64_t i = 0; i < counts[j] && next < n; ++i)
          assign[next++] = tiers.compute[j];
      }
      int64_t sum = 0;
      for (int64_t x : counts) sum += x;
      if (sum > n || (sum < n && tiers.tail() < 0))
        return InvalidArgumentError(
            "--layers-per-device counts add up to " + std::to_string(sum) +
            ", but " + std::to_string(n) + " layers run" +
            (sum < n ? " (add --device disk to stream the rest)" : ""));
      for (; next < n; ++next) assign[next] = tiers.tail();
      break;
    }
  }
  plan.layer_device = assign;
  plan.devices = Evaluate(in, k, tiers, assign, n);
  plan.fits = true;
  for (const DevicePlan& d : plan.devices) {
    if (d.device.kind == DeviceKind::kDisk || d.headroom() >= 0) continue;
    plan.fits = false;
    plan.problems.push_back(
        d.device.name + ": needs " + FormatBytes(d.total()) + ", usable " +
        FormatBytes(d.device.usable()) + " (capacity " +
        FormatBytes(d.device.capacity) +
        (d.device.max_memory
             ? ", max-memory " + FormatBytes(*d.device.max_memory)
             : "") +
        ", reserve " + FormatBytes(d.device.reserve) + "): over by " +
        FormatBytes(-d.headroom()));
  }
  return plan;
}

void AddSuggestions(const PlanInput& in, MemoryPlan* plan) {
  PlanInput q = in;
  q.suggest = false;
  const JobSpec& job = in.job;
  if (auto t = SolveMaxBatchTokens(q, job.batch_tokens);
      t.ok() && *t < job.batch_tokens)
    plan->suggestions.push_back("--batch-tokens " + std::to_string(*t) +
                                " (the largest batch that fits)");
  if (auto ctx = SolveMaxContext(q); ctx.ok() && *ctx < job.context)
    plan->suggestions.push_back("--ctx " + std::to_string(*ctx) +
                                " (the longest context that fits)");
  if (job.mode == JobMode::kAnalysis && job.kv_context > 1) {
    // The longest streamed row whose KV cache fits (binary search).
    PlanInput r = q;
    auto fits = [&](int64_t m) {
      r.job.kv_context = m;
      StatusOr<MemoryPlan> p = MakePlanImpl(r);
      return p.ok() && p->fits;
    };
    if (fits(1)) {
      int64_t lo = 1, hi = job.kv_context;  // lo fits, hi does not
      while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
      }
      plan->suggestions.push_back(
          "--max-row-tokens " + std::to_string(lo) +
          " (loom plan: --kv-context; the longest streamed row whose KV cache "
          "fits)");
    }
  }
  if (job.capture_to == CaptureTarget::kDevice && !job.hooks.empty()) {
    PlanInput h = q;
    h.job.capture_to = CaptureTarget::kHost;
    if (auto p = MakePlanImpl(h); p.ok() && p->fits)
      plan->suggestions.push_back(
          "--capture-to host (stage captures in host memory)");
  }
  if (job.capture_dtype == DType::kF32 && !job.hooks.empty()) {
    PlanInput h = q;
    h.job.capture_dtype = DType::kBF16;
    if (auto p = MakePlanImpl(h); p.ok() && p->fits)
      plan->suggestions.push_back("--dtype bf16 (captures at half the bytes)");
  }
  const Tiers tiers = GetTiers(in.devices, in.offload);
  if (!in.offload && tiers.disk < 0 && tiers.gpu_last >= 0) {
    PlanInput o = q;
    o.offload = true;
    if (o.strategy == Strategy::kManual) o.strategy = Strategy::kBalanced;
    if (auto p = MakePlanImpl(o); p.ok() && p->fits) {
      int64_t offloaded = 0;
      for (int64_t l = 0; l < p->num_layers; ++l)
        offloaded += IsOffloaded(*p, l);
      plan->suggestions.push_back(
          "--offload (" + std::to_string(offloaded) +
          " layers in pinned host memory, computed on " +
          p->devices[static_cast<size_t>(tiers.gpu_last)].device.name + ")");
    }
  }
  if (!in.offload && tiers.disk < 0) {
    PlanInput d = q;
    DeviceSpec disk;
    disk.name = "disk";
    disk.kind = DeviceKind::kDisk;
    disk.capacity = kUnlimitedBytes;
    d.devices.push_back(disk);
    if (d.strategy == Strategy::kManual) d.strategy = Strategy::kBalanced;
    if (auto p = MakePlanImpl(d); p.ok() && p->fits) {
      int64_t streamed = 0;
      for (int dev : p->layer_device)
        streamed +=
            dev >= 0 && p->devices[dev].device.kind == DeviceKind::kDisk;
      plan->suggestions.push_back(
          "--device disk (offload: " + std::to_string(streamed) +
          " layers streamed from the checkpoint; slow)");
    }
  }
  if (auto devs = SolveMinDevices(q, 16); devs.ok()) {
    int computing = 0;
    std::string names;
    for (const DeviceSpec& d : *devs) {
      if (!d.compute || d.kind == DeviceKind::kDisk) continue;
      ++computing;
      names += (names.empty() ? "" : " ") + std::string("--device ") + d.name +
               "=" + FormatBytes(d.capacity);
    }
    if (computing > static_cast<int>(tiers.compute.size()))
      plan->suggestions.push_back(std::to_string(computing) +
                                  " devices: " + names);
  }
}

}  // namespace

int ComputeDeviceOf(const MemoryPlan& plan, int64_t layer) {
  if (layer < 0 || layer >= static_cast<int64_t>(plan.layer_device.size()))
    return -1;
  const int d = plan.layer_device[static_cast<size_t>(layer)];
  if (d < 0) return -1;
  const DeviceKind kind = plan.devices[static_cast<size_t>(d)].device.kind;
  const bool disk = kind == DeviceKind::kDisk;
  if (!disk && !(plan.offload && kind == DeviceKind::kCpu)) return d;
  for (size_t i = 0; i < plan.devices.size(); ++i) {
    const DevicePlan& p = plan.devices[i];
    if (disk ? p.streamed_layers > 0 : p.offloaded_layers > 0)
      return static_cast<int>(i);
  }
  return -1;
}

bool IsOffloaded(const MemoryPlan& plan, int64_t layer) {
  if (!plan.offload || layer < 0 ||
      layer >= static_cast<int64_t>(plan.layer_device.size()))
    return false;
  const int d = plan.layer_device[static_cast<size_t>(layer)];
  return d >= 0 &&
         plan.devices[static_cast<size_t>(d)].device.kind == DeviceKind::kCpu;
}

int64_t DevicePlan::total() const {
  if (device.kind == DeviceKind::kDisk) return 0;
  return weights + activations + workspace + kv + staging + logits + stream +
         runtime;
}

std::string_view StrategyName(Strategy s) {
  switch (s) {
    case Strategy::kBalanced:
      return "balanced";
    case Strategy::kSequential:
      return "sequential";
    case Strategy::kManual:
      return "manual";
  }
  return "?";
}

StatusOr<Strategy> ParseStrategy(std::string_view s) {
  if (s == "balanced") return Strategy::kBalanced;
  if (s == "sequential") return Strategy::kSequential;
  if (s == "manual") return Strategy::kManual;
  return InvalidArgumentError("--strategy '" + std::string(s) +
                              "': expected balanced, sequential or manual");
}

StatusOr<std::vector<int64_t>> ParseLayersPerDevice(std::string_view s) {
  std::vector<int64_t> out;
  size_t begin = 0;
  while (begin <= s.size()) {
    size_t end = s.find(',', begin);
    if (end == std::string_view::npos) end = s.size();
    const std::string item(s.substr(begin, end - begin));
    char* stop = nullptr;
    const long long v = std::strtoll(item.c_str(), &stop, 10);
    if (item.empty() || *stop != '\0' || v < 0)
      return InvalidArgumentError("--layers-per-device '" + std::string(s) +
                                  "': '" + item +
                                  "' is not a non-negative integer");
    out.push_back(v);
    begin = end + 1;
  }
  return out;
}

StatusOr<MemoryPlan> MakePlan(const PlanInput& input) {
  ASSIGN_OR_RETURN(MemoryPlan plan, MakePlanImpl(input));
  if (!plan.fits && input.suggest) AddSuggestions(input, &plan);
  return plan;
}

StatusOr<int64_t> SolveMaxBatchTokens(const PlanInput& input, int64_t limit) {
  PlanInput q = input;
  q.suggest = false;
  auto fits = [&](int64_t t) -> StatusOr<bool> {
    q.job.batch_tokens = t;
    if (q.job.seqs_per_batch > t) q.job.seqs_per_batch = t;
    ASSIGN_OR_RETURN(MemoryPlan p, MakePlanImpl(q));
    return p.fits;
  };
  ASSIGN_OR_RETURN(bool one, fits(1));
  if (!one) return ResourceExhaustedError("not even a batch of 1 token fits");
  int64_t lo = 1, hi = 2;  // lo fits; find hi that does not
  while (hi <= limit) {
    ASSIGN_OR_RETURN(bool f, fits(hi));
    if (!f) break;
    lo = hi;
    hi *= 2;
  }
  if (hi > limit) {
    ASSIGN_OR_RETURN(bool f, fits(limit));
    if (f) return limit;
    hi = limit;
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    ASSIGN_OR_RETURN(bool f, fits(mid));
    (f ? lo : hi) = mid;
  }
  return lo;
}

StatusOr<int64_t> SolveMaxContext(const PlanInput& input) {
  PlanInput q = input;
  q.suggest = false;
  const int64_t tokens = input.job.batch_tokens;
  auto fits = [&](int64_t ctx) -> StatusOr<bool> {
    q.job.context = ctx;
    // A sequence of ctx tokens must fit in one batch.
    q.job.batch_tokens = std::max(tokens, ctx);
    ASSIGN_OR_RETURN(MemoryPlan p, MakePlanImpl(q));
    return p.fits;
  };
  ASSIGN_OR_RETURN(bool one, fits(1));
  if (!one) return ResourceExhaustedError("not even a context of 1 token fits");
  int64_t lo = 1, hi = input.config->max_position_embeddings;
  ASSIGN_OR_RETURN(bool all, fits(hi));
  if (all) return hi;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    ASSIGN_OR_RETURN(bool f, fits(mid));
    (f ? lo : hi) = mid;
  }
  return lo;
}

StatusOr<std::vector<DeviceSpec>> SolveMinDevices(const PlanInput& input,
                                                  int limit) {
  PlanInput q = input;
  q.suggest = false;
  std::vector<DeviceSpec> computing, others;
  for (const DeviceSpec& d : input.devices)
    (d.compute && d.kind != DeviceKind::kDisk ? computing : others)
        .push_back(d);
  if (computing.empty())
    return InvalidArgumentError("plan: no device computes");
  for (int k = 1; k <= limit; ++k) {
    std::vector<DeviceSpec> devs;
    int next_cuda = 0;
    for (const DeviceSpec& d : computing)
      if (d.kind == DeviceKind::kCuda)
        next_cuda = std::max(next_cuda, std::atoi(d.name.c_str() + 5) + 1);
    for (int i = 0; i < k; ++i) {
      if (i < static_cast<int>(computing.size())) {
        devs.push_back(computing[i]);
        continue;
      }
      DeviceSpec extra = computing.back();
      if (extra.kind != DeviceKind::kCuda) break;  // one host only
      extra.name = "cuda:" + std::to_string(next_cuda++);
      devs.push_back(extra);
    }
    if (static_cast<int>(devs.size()) < k) break;
    // The host keeps staging captures even when it does not compute.
    for (const DeviceSpec& d : others) devs.push_back(d);
    bool has_host = false;
    for (const DeviceSpec& d : devs) has_host |= d.kind == DeviceKind::kCpu;
    if (!has_host)
      for (const DeviceSpec& d : computing)
        if (d.kind == DeviceKind::kCpu) {
          DeviceSpec h = d;
          h.compute = false;
          devs.push_back(h);
        }
    RETURN_IF_ERROR(NormalizeDevices(&devs, 0));
    q.devices = devs;
    if (q.strategy == Strategy::kManual) q.strategy = Strategy::kBalanced;
    ASSIGN_OR_RETURN(MemoryPlan p, MakePlanImpl(q));
    if (p.fits) return devs;
  }
  return ResourceExhaustedError("no number of devices up to " +
                                std::to_string(limit) + " fits this job");
}

StatusOr<MemoryPlan> PlanModelDir(const std::string& model_dir,
                                  const JobSpec& job,
                                  std::vector<DeviceSpec> devices,
                                  int64_t host_bytes, const KernelCosts& costs,
                                  Strategy strategy,
                                  std::optional<DType> assume_dtype,
                                  bool offload) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  const ArchWeights decl = FindArch(config.model_type)->declare_weights(config);
  WeightTableOptions options;
  options.assume_dtype = assume_dtype;
  ASSIGN_OR_RETURN(WeightTable table,
                   BuildWeightTable(model_dir, config, decl, options));
  RETURN_IF_ERROR(NormalizeDevices(&devices, host_bytes));
  PlanInput in;
  in.config = &config;
  in.weights = &table;
  in.job = job;
  in.devices = std::move(devices);
  in.strategy = strategy;
  in.costs = costs;
  in.offload = offload;
  return MakePlan(in);
}

}  // namespace loom
