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

#if defined(__FLT16_MANT_DIG__)
// The compiler's _Float16 (F16C instructions where the target has them).
inline float F16ToF32(uint16_t h) {
  return static_cast<float>(std::bit_cast<_Float16>(h));
}
inline uint16_t F32ToF16(float f) {
  return std::bit_cast<uint16_t>(static_cast<_Float16>(f));
}
#else
// Compilers without _Float16 on this target (clang before 15 on x86-64, used
// by the fuzzing build): the same conversions in integer arithmetic,
// bit-identical to the hardware ones (float16_test checks every f16 value and
// the rounding boundaries against float16's definition).
inline float F16ToF32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in f32
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
  }
  if (exp == 31)  // inf, or NaN made quiet with its payload kept
    return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13) |
                                (mant != 0 ? 0x00400000u : 0u));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}
inline uint16_t F32ToF16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u)  // NaN: quiet, top payload bits kept
    return static_cast<uint16_t>(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
  if (u >= 0x477ff000u) return sign | 0x7c00u;  // rounds to infinity
  if (u < 0x38800000u) {
    // Below the smallest normal: adding 0.5 leaves the value in units of
    // 2^-24 in the low mantissa bits, rounded to nearest even by the FPU.
    const float v = std::bit_cast<float>(u) + 0.5f;
    return static_cast<uint16_t>(sign |
                                 (std::bit_cast<uint32_t>(v) - 0x3f000000u));
  }
  // Normal: rebias the exponent (-112) and round the 13 dropped bits to
  // nearest even.
  u += 0xc8000fffu + ((u >> 13) & 1u);
  return static_cast<uint16_t>(sign | (u >> 13));
}
#endif

// Rounds f32 through bf16 and back (what storing an activation in bf16 does).
inline float RoundBf16(float f) { return Bf16ToF32(F32ToBf16(f)); }

}  // namespace loom

#endif  // LOOM_BASE_FLOAT16_H_
