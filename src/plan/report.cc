#include "src/plan/report.h"

#include <cstdio>

#include "src/base/units.h"

namespace loom {
namespace {

// "0-23", "0-9, 12", "-".
std::string Ranges(const std::vector<int64_t>& layers) {
  if (layers.empty()) return "-";
  std::string s;
  size_t i = 0;
  while (i < layers.size()) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + std::to_string(layers[i]);
    if (j > i) s += "-" + std::to_string(layers[j]);
    i = j + 1;
  }
  return s;
}

std::string Bytes(int64_t b) { return b == 0 ? "-" : FormatBytes(b); }
std::string Signed(int64_t b) {
  return b < 0 ? "-" + FormatBytes(-b) : FormatBytes(b);
}

}  // namespace

std::string FormatPlanTable(const MemoryPlan& p) {
  std::string out;
  char line[512];
  const JobSpec& j = p.job;
  std::snprintf(
      line, sizeof(line),
      "model %s: %lld layers (%lld run), weights %s from %s%s%s\n",
      p.model_type.c_str(), static_cast<long long>(p.num_layers),
      static_cast<long long>(p.layers_run), FormatBytes(p.weight_bytes).c_str(),
      std::string(WeightSourceName(p.weight_source)).c_str(),
      p.quantization.empty() ? "" : (", " + p.quantization).c_str(),
      p.assumed_dtype
          ? (", assumed " + std::string(DTypeName(*p.assumed_dtype))).c_str()
          : "");
  out += line;
  if (p.index_total_size && *p.index_total_size != p.weight_bytes) {
    std::snprintf(
        line, sizeof(line),
        "warning: the index's total_size is %lld bytes, the plan counts %lld\n",
        static_cast<long long>(*p.index_total_size),
        static_cast<long long>(p.weight_bytes));
    out += line;
  }
  std::snprintf(
      line, sizeof(line),
      "job: %s, %lld batch tokens, context %lld, %lld sequence(s)/batch, %zu "
      "hooks (%s, select %s, to %s)%s%s, "
      "strategy %s%s\n",
      std::string(JobModeName(j.mode)).c_str(),
      static_cast<long long>(j.batch_tokens), static_cast<long long>(j.context),
      static_cast<long long>(j.Seqs()), j.hooks.hooks().size(),
      std::string(DTypeName(j.capture_dtype)).c_str(),
      std::string(SelectorName(j.selector)).c_str(),
      j.capture_to == CaptureTarget::kHost ? "host" : "device",
      j.NeedsLogits()
          ? (", logits in chunks of " + std::to_string(j.logits_chunk_rows))
                .c_str()
          : "",
      j.mode == JobMode::kAnalysis && j.kv_context > 0
          ? (", KV cache of " + std::to_string(j.kv_seqs > 0 ? j.kv_seqs : 1) +
             " x " + std::to_string(j.kv_context) +
             " positions (streamed long rows)")
                .c_str()
          : "",
      std::string(StrategyName(p.strategy)).c_str(),
      p.offload ? ", offload (host layers computed on the last GPU)" : "");
  out += line;
  if (j.intervention_bytes > 0)
    out += "interventions: " + Bytes(j.intervention_bytes) +
           " of vectors in host memory (in the host's staging)\n";
  if (j.analysis_bytes > 0)
    out += "SAEs / lenses: " + Bytes(j.analysis_bytes) +
           " of weights and chunk buffers in host memory (in the host's "
           "staging)\n";
  if (j.backward_bytes > 0)
    out += "backward: " + Bytes(j.backward_bytes) +
           " of saved residuals, recomputed layer internals, gradients and "
           "workspaces in host memory (in the host's staging)\n";
  std::snprintf(
      line, sizeof(line),
      "%-8s %11s %11s %11s %11s %11s %11s %11s %11s %11s %11s %11s %11s "
      "%11s  %s\n",
      "device", "weights", "activations", "workspace", "kv", "staging",
      "logits", "stream", "runtime", "total", "reserve", "usable", "free",
      "headroom", "layers");
  out += line;
  for (const DevicePlan& d : p.devices) {
    const bool disk = d.device.kind == DeviceKind::kDisk;
    std::string layers = Ranges(d.layers);
    if (d.holds_embed) layers += " +embed";
    if (d.holds_head) layers += " +head";
    if (d.streamed_layers > 0)
      layers +=
          " (+" + std::to_string(d.streamed_layers) + " streamed from disk)";
    if (d.offloaded_layers > 0)
      layers +=
          " (+" + std::to_string(d.offloaded_layers) + " offloaded from host)";
    if (disk) layers += " (streamed)";
    if (d.weights_only && !d.layers.empty()) {
      layers += " (offloaded: weights only)";
    } else if ((!d.device.compute || d.weights_only) && !disk) {
      layers = "(host: staging only)";
    }
    std::snprintf(line, sizeof(line),
                  "%-8s %11s %11s %11s %11s %11s %11s %11s %11s %11s %11s %11s "
                  "%11s %11s  %s%s\n",
                  d.device.name.c_str(), Bytes(d.weights).c_str(),
                  Bytes(d.activations).c_str(), Bytes(d.workspace).c_str(),
                  Bytes(d.kv).c_str(), Bytes(d.staging).c_str(),
                  Bytes(d.logits).c_str(), Bytes(d.stream).c_str(),
                  Bytes(d.runtime).c_str(),
                  disk ? "-" : FormatBytes(d.total()).c_str(),
                  disk ? "-" : Bytes(d.device.reserve).c_str(),
                  disk ? "unlimited" : FormatBytes(d.device.usable()).c_str(),
                  disk ? "-" : Signed(d.free()).c_str(),
                  disk ? "-" : Signed(d.headroom()).c_str(), layers.c_str(),
                  !disk && d.headroom() < 0 ? "  OVER" : "");
    out += line;
  }
  std::snprintf(line, sizeof(line),
                "activation arena: %s packed by liveness (%s if nothing were "
                "reused), %zu regions\n",
                FormatBytes(p.layout.activations.total_bytes).c_str(),
                FormatBytes(p.layout.activations.naive_bytes).c_str(),
                p.layout.activations.regions.size());
  out += line;
  if (const int i = p.layout.workspace.Find(BufferId::kWeightDecode); i >= 0) {
    // The "decompression tax" of quantized weights: one decoded panel, part
    // of every computing device's workspace.
    const PlannedRegion& r = p.layout.workspace.regions[static_cast<size_t>(i)];
    std::snprintf(line, sizeof(line),
                  "weight decode workspace: %s (%s), in each computing "
                  "device's workspace\n",
                  FormatBytes(r.bytes).c_str(), r.shape.c_str());
    out += line;
  }
  out += p.fits ? "fits\n" : "DOES NOT FIT\n";
  for (const std::string& s : p.problems) out += "  " + s + "\n";
  if (!p.suggestions.empty()) {
    out += "would fit with:\n";
    for (const std::string& s : p.suggestions) out += "  " + s + "\n";
  } else if (!p.fits) {
    out +=
        "no single change found that fits (smaller batch, shorter context, "
        "captures to host, disk, more devices)\n";
  }
  return out;
}

Status CheckFits(const MemoryPlan& plan) {
  if (plan.fits) return Status();
  return ResourceExhaustedError("the plan does not fit:\n" +
                                FormatPlanTable(plan));
}

nlohmann::json PlanToJson(const MemoryPlan& p) {
  using nlohmann::json;
  json j;
  j["fits"] = p.fits;
  j["model_type"] = p.model_type;
  j["num_layers"] = p.num_layers;
  j["layers_run"] = p.layers_run;
  j["strategy"] = StrategyName(p.strategy);
  j["offload"] = p.offload;
  json w;
  w["bytes"] = p.weight_bytes;
  w["source"] = WeightSourceName(p.weight_source);
  w["index_total_size"] =
      p.index_total_size ? json(*p.index_total_size) : json(nullptr);
  w["assumed_dtype"] =
      p.assumed_dtype ? json(DTypeName(*p.assumed_dtype)) : json(nullptr);
  w["quantization"] =
      p.quantization.empty() ? json(nullptr) : json(p.quantization);
  j["weights"] = w;
  json job;
  job["mode"] = JobModeName(p.job.mode);
  job["batch_tokens"] = p.job.batch_tokens;
  job["context"] = p.job.context;
  job["seqs_per_batch"] = p.job.Seqs();
  job["hooks"] = p.job.hooks.hooks().size();
  job["capture_dtype"] = DTypeName(p.job.capture_dtype);
  job["select"] = SelectorName(p.job.selector);
  job["capture_to"] =
      p.job.capture_to == CaptureTarget::kHost ? "host" : "device";
  job["logits"] = p.job.NeedsLogits();
  job["logits_chunk_rows"] = p.job.logits_chunk_rows;
  if (p.job.intervention_bytes > 0)
    job["intervention_bytes"] = p.job.intervention_bytes;
  if (p.job.analysis_bytes > 0) job["analysis_bytes"] = p.job.analysis_bytes;
  if (p.job.backward_bytes > 0) job["backward_bytes"] = p.job.backward_bytes;
  if (p.job.mode == JobMode::kAnalysis && p.job.kv_context > 0) {
    job["kv_context"] = p.job.kv_context;
    job["kv_seqs"] = p.job.kv_seqs > 0 ? p.job.kv_seqs : 1;
  }
  j["job"] = job;
  json devices = json::array();
  for (const DevicePlan& d : p.devices) {
    const bool disk = d.device.kind == DeviceKind::kDisk;
    json e;
    e["name"] = d.device.name;
    e["kind"] = disk                                ? "disk"
                : d.device.kind == DeviceKind::kCpu ? "cpu"
                                                    : "cuda";
    e["computes"] = d.device.compute && !disk;
    e["capacity_bytes"] = disk ? json(nullptr) : json(d.device.capacity);
    e["max_memory_bytes"] =
        d.device.max_memory ? json(*d.device.max_memory) : json(nullptr);
    e["reserve_bytes"] = d.device.reserve;
    e["usable_bytes"] = disk ? json(nullptr) : json(d.device.usable());
    e["weights_bytes"] = d.weights;
    e["activations_bytes"] = d.activations;
    e["workspace_bytes"] = d.workspace;
    e["kv_bytes"] = d.kv;
    e["staging_bytes"] = d.staging;
    e["logits_bytes"] = d.logits;
    e["stream_bytes"] = d.stream;
    e["runtime_bytes"] = d.runtime;
    e["total_bytes"] = d.total();
    e["free_bytes"] = disk ? json(nullptr) : json(d.free());
    e["headroom_bytes"] = disk ? json(nullptr) : json(d.headroom());
    e["layers"] = d.layers;
    e["streamed_layers"] = d.streamed_layers;
    e["offloaded_layers"] = d.offloaded_layers;
    e["embed"] = d.holds_embed;
    e["head"] = d.holds_head;
    devices.push_back(std::move(e));
  }
  j["devices"] = std::move(devices);
  auto arena = [](const ArenaPlan& a) {
    json r = json::array();
    for (const PlannedRegion& x : a.regions)
      r.push_back({{"name", x.name},
                   {"shape", x.shape},
                   {"bytes", x.bytes},
                   {"offset", x.offset},
                   {"first_step", x.first_step},
                   {"last_step", x.last_step}});
    return json{{"total_bytes", a.total_bytes},
                {"naive_bytes", a.naive_bytes},
                {"regions", r}};
  };
  j["activations"] = arena(p.layout.activations);
  j["workspace"] = arena(p.layout.workspace);
  j["logits"] = arena(p.layout.logits);
  j["steps"] = p.layout.steps;
  j["problems"] = p.problems;
  j["suggestions"] = p.suggestions;
  return j;
}

}  // namespace loom
