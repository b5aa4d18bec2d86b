// The entry points of libloom_cuda.so (plugin.h).
#include "src/backend/cuda/plugin.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "src/backend/cuda/cuda_backend.h"

namespace {

void CopyMessage(const std::string& message, char* out, int size) {
  if (out == nullptr || size <= 0) return;
  const size_t n = std::min(message.size(), static_cast<size_t>(size - 1));
  std::memcpy(out, message.data(), n);
  out[n] = '\0';
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int loom_cuda_abi() {
  return loom::cuda::kLoomCudaPluginAbi;
}

__attribute__((visibility("default"))) loom::Backend* loom_cuda_create(
    int device, char* error, int error_size) {
  auto b = loom::cuda::CudaBackend::Create(device);
  if (!b.ok()) {
    CopyMessage(b.status().message(), error, error_size);
    return nullptr;
  }
  return b->release();
}

__attribute__((visibility("default"))) int loom_cuda_list(LoomGpuInfo* out,
                                                          int max,
                                                          char* reason,
                                                          int reason_size) {
  std::string why;
  const std::vector<loom::cuda::GpuInfo> gpus = loom::cuda::ListGpus(&why);
  if (gpus.empty()) CopyMessage(why, reason, reason_size);
  for (int i = 0; i < std::min(max, static_cast<int>(gpus.size())); ++i) {
    const loom::cuda::GpuInfo& g = gpus[static_cast<size_t>(i)];
    LoomGpuInfo& o = out[i];
    o.index = g.index;
    CopyMessage(g.name, o.name, sizeof(o.name));
    o.major = g.major;
    o.minor = g.minor;
    o.total_bytes = g.total_bytes;
    o.free_bytes = g.free_bytes;
    o.multiprocessors = g.multiprocessors;
  }
  return static_cast<int>(gpus.size());
}

}  // extern "C"
