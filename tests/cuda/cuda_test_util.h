// Helpers of the `cuda` tests: a CUDA backend or a loud skip, and device
// buffers filled from / read back to host vectors through the Backend
// interface (so the tests exercise the same Allocate / Copy the runtime uses).
#ifndef LOOM_TESTS_CUDA_CUDA_TEST_UTIL_H_
#define LOOM_TESTS_CUDA_CUDA_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "src/backend/backend.h"

namespace loom::cuda_test {

// A CUDA backend on GPU 0, or null with `*why` saying why none is available
// (no driver, no device).
std::unique_ptr<Backend> MakeCuda(std::string* why);
std::unique_ptr<Backend> MakeCpu();

// In a TEST body: `auto gpu = REQUIRE_GPU();` skips the test, naming the
// reason, when there is no GPU.
#define REQUIRE_GPU()                                                  \
  ({                                                                   \
    std::string why_;                                                  \
    auto be_ = ::loom::cuda_test::MakeCuda(&why_);                     \
    if (!be_) GTEST_SKIP() << "SKIPPED: no CUDA device here (" << why_ \
                           << "); run `ctest -L cuda` on a GPU";       \
    std::move(be_);                                                    \
  })

// A device allocation of `count` values of T, optionally filled from host.
template <typename T>
struct DeviceArray {
  Buffer buffer;
  int64_t count = 0;
  T* data() const { return static_cast<T*>(buffer.data()); }
};

template <typename T>
DeviceArray<T> Upload(Backend& be, const std::vector<T>& host) {
  DeviceArray<T> a;
  a.count = static_cast<int64_t>(host.size());
  auto b = be.Allocate(std::max<int64_t>(a.count * sizeof(T), 64),
                       MemoryKind::kDevice);
  EXPECT_TRUE(b.ok()) << b.status().message();
  if (!b.ok()) return a;
  a.buffer = *b;
  if (!host.empty()) {
    const Status s = be.Copy(a.data(), be.device(), host.data(), DeviceRef{},
                             a.count * sizeof(T));
    EXPECT_TRUE(s.ok()) << s.message();
  }
  return a;
}

template <typename T>
DeviceArray<T> Zeros(Backend& be, int64_t count) {
  return Upload(be, std::vector<T>(static_cast<size_t>(count)));
}

// Synchronises (reporting the backend's sticky errors) and copies back.
template <typename T>
std::vector<T> Download(Backend& be, const DeviceArray<T>& a) {
  std::vector<T> host(static_cast<size_t>(a.count));
  Status s = be.Synchronize();
  EXPECT_TRUE(s.ok()) << s.message();
  s = be.Copy(host.data(), DeviceRef{}, a.data(), be.device(),
              a.count * sizeof(T));
  EXPECT_TRUE(s.ok()) << s.message();
  return host;
}

// Deterministic pseudo-random values in [lo, hi).
std::vector<float> RandomFloats(int64_t n, uint32_t seed, float lo = -1.0f,
                                float hi = 1.0f);

// max |a - b| / max(1, |b|) over the vectors (sizes must match).
double MaxRelError(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace loom::cuda_test

#endif  // LOOM_TESTS_CUDA_CUDA_TEST_UTIL_H_
