// bf16 / f16 <-> f32 conversion. Round-to-nearest-even, NaN preserved, exactly
// as PyTorch's casts do it.
#ifndef LOOM_BASE_FLOAT16_H_
#define LOOM_BASE_FLOAT16_H_

#include <bit>
#include <cstdint>

namespace loom {

inline float Bf16ToF32(uint16_t h) {
  return std::bit_cast<float>(uint32_t{h} << 16);
}

inline uint16_t F32ToBf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float F16ToF32(uint16_t h) {
  return static_cast<float>(std::bit_cast<_Float16>(h));
}
inline uint16_t F32ToF16(float f) {
  return std::bit_cast<uint16_t>(static_cast<_Float16>(f));
}

// Rounds f32 through bf16 and back (what storing an activation in bf16 does).
inline float RoundBf16(float f) { return Bf16ToF32(F32ToBf16(f)); }

}  // namespace loom

#endif  // LOOM_BASE_FLOAT16_H_
