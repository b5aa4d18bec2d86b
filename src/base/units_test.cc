#include "src/base/units.h"

#include <gtest/gtest.h>

#include "src/base/float16.h"

namespace loom {
namespace {

TEST(UnitsTest, ParseBytes) {
  EXPECT_EQ(*ParseBytes("24GiB"), 24 * kGiB);
  EXPECT_EQ(*ParseBytes("80GB"), 80'000'000'000);
  EXPECT_EQ(*ParseBytes("1.5MiB"), 3 * kMiB / 2);
  EXPECT_EQ(*ParseBytes("4096"), 4096);
  EXPECT_FALSE(ParseBytes("GiB").ok());
  EXPECT_FALSE(ParseBytes("12 parsecs").ok());
}

TEST(UnitsTest, FormatBytes) {
  EXPECT_EQ(FormatBytes(17), "17 B");
  EXPECT_EQ(FormatBytes(3 * kGiB / 2), "1.50 GiB");
}

TEST(Float16Test, Bf16RoundTripAndRounding) {
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f)), 1.0f);
  // 1 + 2^-8 is exactly halfway between bf16 neighbours 1 and 1+2^-7: ties to
  // even -> 1.
  EXPECT_EQ(RoundBf16(1.0f + 1.0f / 256), 1.0f);
  EXPECT_EQ(RoundBf16(1.0f + 3.0f / 256), 1.0f + 4.0f / 256);
  EXPECT_EQ(F16ToF32(F32ToF16(0.5f)), 0.5f);
}

}  // namespace
}  // namespace loom
