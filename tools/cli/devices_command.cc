// loom devices [--json]: the devices this build can compute on — the host
// (RAM, the precision `auto` picks there) and every visible GPU (name,
// compute capability, memory total / free, multiprocessors, the precision
// `auto` picks: bf16 on capability >= 8.0, f16 below, where f32 checkpoints
// stay f32).
#include <cctype>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "src/backend/registry.h"
#include "src/base/units.h"
#include "src/eval/job_plan.h"
#include "src/runtime/model.h"
#include "tools/cli/commands.h"

namespace loom::cli {
namespace {

// "bf16", as --precision spells it.
std::string PrecisionName(DType d) {
  std::string s(DTypeName(d));
  for (char& c : s) c = static_cast<char>(std::tolower(c));
  return s;
}

}  // namespace

void AddDevicesCommand(CLI::App& app, int* exit_code) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "devices",
      "List the devices Loom can compute on: the host and every visible GPU "
      "(name, compute capability, memory total/free, the precision `auto` "
      "picks)");
  cmd->add_flag("--json", *json, "Print JSON");
  cmd->callback([json, exit_code] {
    std::string reason;
    const std::vector<GpuDescription> gpus = ListGpus(&reason);
    std::string host_warning;
    const StatusOr<DType> host_auto =
        ResolvePrecision(Precision::kAuto, DType::kBF16, &host_warning);
    const std::string host_precision =
        host_auto.ok() ? PrecisionName(*host_auto) : "f32";
    const HostDescription host = DescribeHost();
    nlohmann::json out;
    out["cuda_backend"] = HasCudaBackend();
    out["host"] = {{"device", "cpu"},
                   {"memory_bytes", HostMemoryBytes()},
                   {"auto_precision", host_precision},
                   {"isa", host.active_isa},
                   {"detected_isa", host.detected_isa},
                   {"cpu_features", host.features}};
    nlohmann::json paths = nlohmann::json::object();
    for (const auto& p : host.precisions)
      paths[p.precision] = {{"native", p.native}, {"gemm", p.how}};
    out["host"]["precisions"] = paths;

    out["gpus"] = nlohmann::json::array();
    for (const GpuDescription& g : gpus) {
      const DType pick = GpuAutoPrecision(g.major * 10 + g.minor, DType::kBF16);
      out["gpus"].push_back({{"device", "cuda:" + std::to_string(g.index)},
                             {"name", g.name},
                             {"capability", std::to_string(g.major) + "." +
                                                std::to_string(g.minor)},
                             {"memory_total_bytes", g.total_bytes},
                             {"memory_free_bytes", g.free_bytes},
                             {"multiprocessors", g.multiprocessors},
                             {"auto_precision", PrecisionName(pick)}});
    }
    if (gpus.empty()) out["no_gpu_reason"] = reason;
    if (*json) {
      std::printf("%s\n", out.dump(2).c_str());
      *exit_code = 0;
      return;
    }
    std::printf("%-8s %-28s %-5s %12s %12s  %s\n", "device", "name", "cap",
                "total", "free", "auto precision");
    std::printf("%-8s %-28s %-5s %12s %12s  %s (bf16 checkpoints)\n", "cpu",
                "host", "-", FormatBytes(HostMemoryBytes()).c_str(), "-",
                host_precision.c_str());
    for (const auto& g : out["gpus"])
      std::printf("%-8s %-28s %-5s %12s %12s  %s (bf16 checkpoints)\n",
                  g["device"].get<std::string>().c_str(),
                  g["name"].get<std::string>().c_str(),
                  g["capability"].get<std::string>().c_str(),
                  FormatBytes(g["memory_total_bytes"].get<int64_t>()).c_str(),
                  FormatBytes(g["memory_free_bytes"].get<int64_t>()).c_str(),
                  g["auto_precision"].get<std::string>().c_str());
    std::printf("\ncpu isa: %s (detected %s; features: %s)\n",
                host.active_isa.c_str(), host.detected_isa.c_str(),
                host.features.c_str());
    for (const auto& p : host.precisions)
      std::printf("  %-5s %s\n", p.precision.c_str(), p.how.c_str());
    if (gpus.empty()) std::printf("no GPU: %s\n", reason.c_str());
    *exit_code = 0;
  });
}

}  // namespace loom::cli
