// Device helpers shared by the CUDA backend's kernels: launch geometry for
// grid-stride loops, and the 16-bit <-> f32 conversions bit for bit as the
// host's (src/base/float16.h: round to nearest even; NaN keeps its sign and
// top payload bits with the quiet bit set — the device instructions would
// return a canonical NaN instead).
#ifndef LOOM_BACKEND_CUDA_DEVICE_UTIL_CUH_
#define LOOM_BACKEND_CUDA_DEVICE_UTIL_CUH_

#include <cuda_fp16.h>

#include <cstdint>

namespace loom::cuda {

inline constexpr int kThreads = 256;
// Grid-stride loops run on at most this many blocks.
inline constexpr int64_t kMaxBlocks = int64_t{1} << 16;

// Blocks of kThreads for n elements, in [1, kMaxBlocks].
inline int GridFor(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

__device__ __forceinline__ float Bf16ToF32(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

__device__ __forceinline__ uint16_t F32ToBf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__device__ __forceinline__ float F16ToF32(uint16_t h) {
  if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0)
    return __uint_as_float((static_cast<uint32_t>(h & 0x8000u) << 16) |
                           0x7fc00000u |
                           (static_cast<uint32_t>(h & 0x3ffu) << 13));
  return __half2float(__ushort_as_half(h));
}

// Overflow to inf, subnormals kept, as the host's _Float16 cast.
__device__ __forceinline__ uint16_t F32ToF16(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7e00u |
                                 ((u >> 13) & 0x3ffu));
  return __half_as_ushort(__float2half_rn(f));
}

__device__ __forceinline__ float RoundBf16(float f) {
  return Bf16ToF32(F32ToBf16(f));
}

}  // namespace loom::cuda

#endif  // LOOM_BACKEND_CUDA_DEVICE_UTIL_CUH_
