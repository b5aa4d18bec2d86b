#include "tests/cuda/cuda_test_util.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "src/backend/registry.h"

namespace loom::cuda_test {

std::unique_ptr<Backend> MakeCuda(std::string* why) {
  std::vector<GpuDescription> gpus = ListGpus(why);
  if (gpus.empty()) return nullptr;
  auto b = CreateBackend("cuda:0");
  if (!b.ok()) {
    *why = b.status().message();
    return nullptr;
  }
  return std::move(*b);
}

std::unique_ptr<Backend> MakeCpu() {
  auto b = CreateBackend("cpu");
  EXPECT_TRUE(b.ok());
  return b.ok() ? std::move(*b) : nullptr;
}

std::vector<float> RandomFloats(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

double MaxRelError(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]) /
                     std::max(1.0, std::fabs(static_cast<double>(b[i])));
    if (std::isnan(d)) return INFINITY;
    worst = std::max(worst, d);
  }
  return worst;
}

}  // namespace loom::cuda_test
