// The f16 / bf16 conversions against float16's definition (IEEE binary16:
// 1 sign, 5 exponent, 10 mantissa bits; round to nearest, ties to even),
// computed here in double arithmetic. Covers every f16 value, every rounding
// boundary between two of them, and a sweep of f32 values; holds for the
// _Float16 path and the integer path of float16.h alike.
#include "src/base/float16.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <map>

namespace loom {
namespace {

// binary16's value of `h` by definition.
double F16Value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
  double v;
  if (exp == 0) {
    v = std::ldexp(mant, -24);
  } else if (exp == 31) {
    v = mant == 0 ? INFINITY : NAN;
  } else {
    v = std::ldexp(1024 + mant, exp - 25);
  }
  return sign ? -v : v;
}

// Nearest binary16 (ties to even) of a finite or infinite `f`.
uint16_t ReferenceF32ToF16(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const double quantum = a < 0x1p-14 ? 0x1p-24 : std::ldexp(1.0, e - 1 - 10);
  const double n = a / quantum;  // exact
  double r = std::floor(n);
  if (n - r > 0.5 || (n - r == 0.5 && std::fmod(r, 2.0) != 0)) r += 1;
  const double v = r * quantum;
  // Encode v (a binary16 value by construction).
  if (v < 0x1p-14) return sign | static_cast<uint16_t>(r);
  std::frexp(v, &e);
  const int exp = e - 1 + 15;
  const int mant = static_cast<int>(std::ldexp(v, -(e - 1)) * 1024) - 1024;
  return sign | static_cast<uint16_t>(exp << 10 | mant);
}

TEST(Float16Test, EveryF16DecodesToItsValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    const double v = F16Value(static_cast<uint16_t>(h));
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(f)) << h;
      EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << h;
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f)))) << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), v) << "f16 " << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << h;
    ASSERT_EQ(F32ToF16(f), h) << "round trip of f16 " << h;
  }
}

TEST(Float16Test, RoundsToNearestEvenAtEveryBoundary) {
  int checked = 0;
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    // The midpoint between h and h + 1 (exact in f32) and its neighbours.
    const double mid = (F16Value(h) + F16Value(h + 1)) / 2;
    const float m = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(m), mid);
    for (float f : {m, std::nextafter(m, 0.0f), std::nextafter(m, INFINITY)}) {
      for (float s : {f, -f}) {
        ASSERT_EQ(F32ToF16(s), ReferenceF32ToF16(s))
            << "f32 " << std::bit_cast<uint32_t>(s);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 0x7c00 * 6);
}

TEST(Float16Test, F32SweepMatchesDefinition) {
  // Every 4099th f32 bit pattern (a prime stride reaches every exponent and
  // many mantissas), both signs, infinities included.
  for (uint64_t u = 0; u <= 0x7f800000u; u += 4099) {
    for (uint32_t bits :
         {static_cast<uint32_t>(u), static_cast<uint32_t>(u) | 0x80000000u}) {
      const float f = std::bit_cast<float>(bits);
      ASSERT_EQ(F32ToF16(f), ReferenceF32ToF16(f)) << "f32 bits " << bits;
    }
  }
  EXPECT_EQ(F32ToF16(INFINITY), 0x7c00);
  EXPECT_EQ(F32ToF16(-INFINITY), 0xfc00);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(NAN))));
}

TEST(Float16Test, Bf16RoundsToNearestEven) {
  // Between bf16 1.0 (0x3f80) and the next (0x3f81): the tie goes to even.
  EXPECT_EQ(F32ToBf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);
  EXPECT_EQ(F32ToBf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);
  EXPECT_EQ(F32ToBf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(NAN))));
}

}  // namespace
}  // namespace loom
