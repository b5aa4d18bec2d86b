// The MXFP4 encoder against an independent decode of the spec (the golden
// README's rules: low nibble = even element, E2M1 table, E8M0 2^(b - 127)):
// every decoded value is a nearest representable value of its block's scale
// (ties to the even code, saturating at 6 X), re-encoding is idempotent, and
// every exactly representable block round-trips bit for bit over all codes
// and scale bytes.
#include "src/model/mxfp4_encode.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace loom {
namespace {

constexpr double kE2M1[16] = {0,  0.5,  1,  1.5,  2,  3,  4,  6,
                              -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};

// Reference decode of one block, in double.
std::vector<double> Decode(const uint8_t* codes, uint8_t scale) {
  std::vector<double> out(32);
  for (int j = 0; j < 16; ++j) {
    out[2 * j] = std::ldexp(kE2M1[codes[j] & 0x0F], scale - 127);
    out[2 * j + 1] = std::ldexp(kE2M1[codes[j] >> 4], scale - 127);
  }
  return out;
}

int CodeOf(const uint8_t* codes, int i) {
  return i % 2 == 0 ? codes[i / 2] & 0x0F : codes[i / 2] >> 4;
}

TEST(Mxfp4Encode, DecodedValuesAreNearestWithTiesToEven) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-30, 30);
  for (int b = 0; b < 4000; ++b) {
    float x[32];
    const float s = std::ldexp(1.0f, expo(rng));
    for (float& v : x) v = normal(rng) * s;
    if (b % 7 == 0) x[b % 32] = 0.0f;
    uint8_t codes[16];
    const uint8_t scale = EncodeMxfp4Block(x, codes);
    // The scale: floor(log2(max |x|)) - 2, computed here with log2.
    double amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(static_cast<double>(v)));
    ASSERT_EQ(scale - 127, static_cast<int>(std::floor(std::log2(amax))) - 2);
    const std::vector<double> y = Decode(codes, scale);
    const double X = std::ldexp(1.0, scale - 127);
    for (int i = 0; i < 32; ++i) {
      // Nearest over the grid (the sign of x's side), ties to an even code.
      double best = 1e300;
      int best_code = -1;
      for (int c = 0; c < 8; ++c) {
        const double cand = std::copysign(kE2M1[c] * X, x[i]);
        const double err = std::fabs(cand - x[i]);
        if (err < best || (err == best && c % 2 == 0))
          best = err, best_code = c;
      }
      ASSERT_EQ(CodeOf(codes, i) & 7, best_code)
          << "block " << b << " i " << i << " x " << x[i];
      ASSERT_EQ(CodeOf(codes, i) >> 3, std::signbit(x[i]) ? 1 : 0);
      ASSERT_LE(std::fabs(y[i]), 6 * X);
    }
    // Idempotent: encoding the decoded values gives the same bytes.
    float xd[32];
    for (int i = 0; i < 32; ++i) xd[i] = static_cast<float>(y[i]);
    uint8_t codes2[16];
    ASSERT_EQ(EncodeMxfp4Block(xd, codes2), scale);
    ASSERT_EQ(std::memcmp(codes, codes2, 16), 0) << "block " << b;
  }
}

TEST(Mxfp4Encode, ExhaustiveCodesAndScalesRoundTrip) {
  // Block: element 0 = 6 X (so the scale is X), the others cycle over all 16
  // codes. Scale bytes 0..252 (6 * 2^126 would overflow f32).
  for (int scale = 0; scale <= 252; ++scale) {
    uint8_t want[16];
    for (int j = 0; j < 16; ++j) {
      const int lo = j == 0 ? 7 : (2 * j) % 16, hi = (2 * j + 1) % 16;
      want[j] = static_cast<uint8_t>(lo | hi << 4);
    }
    const std::vector<double> y = Decode(want, static_cast<uint8_t>(scale));
    float x[32];
    for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(y[i]);
    uint8_t codes[16];
    ASSERT_EQ(EncodeMxfp4Block(x, codes), scale);
    ASSERT_EQ(std::memcmp(codes, want, 16), 0) << "scale " << scale;
  }
}

TEST(Mxfp4Encode, TiesSaturationAndZeros) {
  // Midpoints go to the even code; past 6 saturates; the sign of zero is kept.
  const float q[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f,
                     3.5f,  5.0f,  7.9f,  -0.1f, 0.0f};
  const uint8_t want[] = {0, 2, 2, 4, 4, 6, 6, 7, 8, 0};
  for (size_t i = 0; i < sizeof(q) / sizeof(q[0]); ++i)
    EXPECT_EQ(EncodeE2M1(q[i]), want[i]) << q[i];
  float zeros[32] = {};
  uint8_t codes[16];
  EXPECT_EQ(EncodeMxfp4Block(zeros, codes), 0);
  for (uint8_t c : codes) EXPECT_EQ(c, 0);
}

}  // namespace
}  // namespace loom
