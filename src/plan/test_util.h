// Shared helpers of the planner tests.
#ifndef LOOM_PLAN_TEST_UTIL_H_
#define LOOM_PLAN_TEST_UTIL_H_

#include <string>

#include "src/base/units.h"
#include "src/plan/planner.h"
#include "src/plan/report.h"

namespace loom::plan_test {

// Stand-ins for a backend's workspace functions (the planner takes any).
inline int64_t FakeGemmWorkspace(int64_t m, int64_t k, DType w) {
  return DTypeSize(w) == 2 ? m * k * 2 : 0;
}
inline int64_t FakeAttentionWorkspace(int64_t l, int64_t heads, int64_t hd,
                                      int threads) {
  return int64_t{threads} * (64 * hd + 64 * l) * 4;
}
inline KernelCosts FakeCosts() {
  KernelCosts k;
  k.gemm_workspace = FakeGemmWorkspace;
  k.attention_workspace = FakeAttentionWorkspace;
  k.num_threads = 4;
  return k;
}

inline std::string ConfigDir(const std::string& name) {
  return std::string(LOOM_TESTDATA_DIR) + "/configs/" + name;
}

inline DeviceSpec Gpu(int index, int64_t bytes) {
  DeviceSpec d;
  d.name = "cuda:" + std::to_string(index);
  d.kind = DeviceKind::kCuda;
  d.capacity = bytes;
  d.capacity_given = true;
  return d;
}
inline DeviceSpec Host(int64_t bytes, bool compute) {
  DeviceSpec d;
  d.name = "cpu";
  d.kind = DeviceKind::kCpu;
  d.capacity = bytes;
  d.compute = compute;
  return d;
}
inline DeviceSpec Disk() {
  DeviceSpec d;
  d.name = "disk";
  d.kind = DeviceKind::kDisk;
  d.capacity = kUnlimitedBytes;
  return d;
}

}  // namespace loom::plan_test

#endif  // LOOM_PLAN_TEST_UTIL_H_
