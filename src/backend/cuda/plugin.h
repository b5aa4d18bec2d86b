// The CUDA backend as a plugin: `libloom_cuda.so`, loaded by the backend
// registry (dlopen) the first time a GPU is asked for, so that processes that
// compute on the host never map the CUDA runtime and cuBLASLt (which alone
// add ~200 MiB of resident memory at load). Both sides are built from this
// tree by the same compiler; the entry points below are the whole ABI.
#ifndef LOOM_BACKEND_CUDA_PLUGIN_H_
#define LOOM_BACKEND_CUDA_PLUGIN_H_

#include <cstdint>

namespace loom {
class Backend;
}

extern "C" {

// One GPU as the plugin reports it.
struct LoomGpuInfo {
  int index;
  char name[256];
  int major, minor;
  int64_t total_bytes, free_bytes;
  int multiprocessors;
};

// Must equal kLoomCudaPluginAbi of the loading registry.
typedef int (*LoomCudaAbiFn)();
// A new CudaBackend on `device` (the caller owns it; never unload the
// plugin while it lives), or null with `error` (NUL-terminated) set.
typedef loom::Backend* (*LoomCudaCreateFn)(int device, char* error,
                                           int error_size);
// Fills up to `max` GPUs into `out`; returns how many there are (0 with
// `reason` set when none is usable).
typedef int (*LoomCudaListFn)(LoomGpuInfo* out, int max, char* reason,
                              int reason_size);
}

namespace loom::cuda {
// 2: the row-edit ops (AddRowsBroadcast, ProjectOutRows, SetRows, CopyRows).
// 3: AddRowsBroadcast's norm_match.
// 4: DeinterleaveBlocks (per-head fused q/k/v).
// 5: TopKRoute takes a RouteOp (router kind + data) and returns a Status;
//    StridedCopy (MLA's per-head copies).
inline constexpr int kLoomCudaPluginAbi = 5;
inline constexpr const char* kPluginFile = "libloom_cuda.so";
}  // namespace loom::cuda

#endif  // LOOM_BACKEND_CUDA_PLUGIN_H_
