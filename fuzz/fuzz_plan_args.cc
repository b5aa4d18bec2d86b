// Harness: the plan's size and device arguments (--device, repeatable and
// comma-separated; --max-memory; --reserve; --batch-tokens / --context;
// --strategy; --layers-per-device), parsed and used to plan a bundled model.
// Input: newline-separated fields
//   DEVICE_FLAGS (';' between repeated --device) \n MAX_MEMORY \n RESERVE \n
//   STRATEGY \n LAYERS_PER_DEVICE \n BATCH_TOKENS \n CONTEXT \n SIZE
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "src/base/units.h"
#include "src/plan/devices.h"
#include "src/plan/planner.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto f = fuzz::Split(text, '\n', 8);
  auto field = [&](size_t i) {
    return i < f.size() ? f[i] : std::string_view();
  };

  (void)ParseBytes(field(7));
  std::vector<std::string> device_flags;
  if (!field(0).empty())
    for (std::string_view d : fuzz::Split(field(0), ';', 16))
      device_flags.emplace_back(d);
  const int64_t host = int64_t{24} << 30;
  auto devices = DevicesFromFlags(device_flags, field(1), field(2), host);
  auto strategy = ParseStrategy(field(3));
  auto per_device = ParseLayersPerDevice(field(4));
  auto batch = ParseBytes(field(5));  // plain counts parse as byte counts
  auto context = ParseBytes(field(6));
  if (!devices.ok()) return 0;
  for (const DeviceSpec& d : *devices)
    if (d.capacity < 0 || d.reserve < 0 ||
        (d.max_memory.has_value() && *d.max_memory < 0))
      fuzz::Fail("device " + d.name + " has a negative size after parsing");
  JobSpec job;
  if (batch.ok() && *batch > 0 && *batch <= (1 << 20))
    job.batch_tokens = *batch;
  if (context.ok() && *context > 0 && *context <= (1 << 20))
    job.context = *context;
  // Small, dense and MoE (the arguments are what is fuzzed; a model of
  // thousands of expert tensors would make every plan slow).
  static const std::vector<std::string> kDirs = {
      fuzz::SourcePath("models/stories260K"),
      fuzz::SourcePath("tests/data/configs/Llama-3.1-8B"),
      fuzz::SourcePath("tests/data/configs/Mixtral-8x7B-v0.1")};
  const std::string& dir = kDirs[size % kDirs.size()];
  (void)PlanModelDir(dir, job, *devices, host, KernelCosts{},
                     strategy.ok() ? *strategy : Strategy::kBalanced);
  (void)per_device;
  return 0;
}
