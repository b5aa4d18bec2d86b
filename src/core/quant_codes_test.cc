// Exhaustive tests of the quantized code tables against values computed here
// from each format's bit-field definition (sign, exponent, mantissa, bias),
// and the per-format decode rule on hand-built blocks.
#include "src/core/quant_codes.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "src/base/float16.h"

namespace loom {
namespace {

// value = (-1)^s * 2^(e - bias) * (1 + m / 2^mbits), or the subnormal
// 2^(1 - bias) * m / 2^mbits when e == 0, computed in double.
double FromFields(int s, int e, int m, int ebits, int mbits) {
  (void)ebits;
  const int bias = (1 << (ebits - 1)) - 1;
  const double frac = static_cast<double>(m) / static_cast<double>(1 << mbits);
  const double mag = e == 0 ? std::pow(2.0, 1 - bias) * frac
                            : std::pow(2.0, e - bias) * (1.0 + frac);
  return s ? -mag : mag;
}

void ExpectSameFloat(float actual, double expected, int code) {
  ASSERT_EQ(static_cast<double>(actual), expected) << "code " << code;
  // Signed zeros keep their sign.
  ASSERT_EQ(std::signbit(actual), std::signbit(expected)) << "code " << code;
}

TEST(QuantCodesTest, E2M1AllSixteenCodes) {
  for (int code = 0; code < 16; ++code) {
    const double want =
        FromFields(code >> 3, (code >> 1) & 3, code & 1, /*ebits=*/2, 1);
    ExpectSameFloat(E2M1ToF32(static_cast<uint8_t>(code)), want, code);
    ExpectSameFloat(E2M1Table()[code], want, code);
    // Only the low nibble is read.
    ExpectSameFloat(E2M1ToF32(static_cast<uint8_t>(code | 0xF0)), want, code);
  }
  // The magnitudes the formats document: 0, .5, 1, 1.5, 2, 3, 4, 6.
  EXPECT_EQ(E2M1ToF32(7), 6.0f);
  EXPECT_EQ(E2M1ToF32(15), -6.0f);
}

TEST(QuantCodesTest, E4M3FnAll256Codes) {
  int nans = 0;
  for (int code = 0; code < 256; ++code) {
    const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
    const float got = E4M3ToF32(static_cast<uint8_t>(code));
    ASSERT_EQ(std::bit_cast<uint32_t>(got),
              std::bit_cast<uint32_t>(E4M3Table()[code]));
    if (e == 15 && m == 7) {  // S.1111.111: the only NaNs; no infinities
      EXPECT_TRUE(std::isnan(got)) << code;
      ++nans;
      continue;
    }
    ExpectSameFloat(got, FromFields(s, e, m, 4, 3), code);
    EXPECT_TRUE(std::isfinite(got));
  }
  EXPECT_EQ(nans, 2);
  EXPECT_EQ(E4M3ToF32(0x7E), 448.0f);                // max
  EXPECT_EQ(E4M3ToF32(0x01), std::ldexp(1.0f, -9));  // min subnormal
}

TEST(QuantCodesTest, E8M0All256Codes) {
  for (int code = 0; code < 256; ++code) {
    const float got = E8M0ToF32(static_cast<uint8_t>(code));
    if (code == 255) {
      EXPECT_TRUE(std::isnan(got));
      continue;
    }
    ExpectSameFloat(got, std::pow(2.0, code - 127), code);
  }
}

// A [2, 64] matrix in each FP4 format, decoded by the rule written out here
// from the table.
TEST(QuantCodesTest, Fp4DecodeRules) {
  const int64_t n = 2, k = 64;
  std::vector<uint8_t> codes(n * k / 2);
  for (size_t i = 0; i < codes.size(); ++i)
    codes[i] = static_cast<uint8_t>((i * 37 + 11) & 0xFF);
  auto code_at = [&](int64_t r, int64_t c) {
    const uint8_t b = codes[static_cast<size_t>(r * k / 2 + c / 2)];
    return static_cast<uint8_t>(c % 2 == 0 ? b & 15 : b >> 4);
  };
  // MXFP4: one E8M0 exponent per 32 values.
  {
    std::vector<uint8_t> scales = {120, 127, 130, 0};  // [2, 2]
    QuantMatrix m{FormatKind::kMxfp4,
                  codes.data(),
                  scales.data(),
                  DType::kF8E8M0,
                  n,
                  k,
                  1,
                  32};
    std::vector<float> out(n * k);
    DecodeRowsReference(m, 0, n, out.data());
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c)
        ASSERT_EQ(out[r * k + c],
                  E2M1ToF32(code_at(r, c)) *
                      std::ldexp(1.0f, scales[r * 2 + c / 32] - 127))
            << r << "," << c;
  }
  // NVFP4: E4M3 per 16 values, times (ModelOpt) or over (CT) the global.
  std::vector<uint8_t> scales(n * k / 16);
  for (size_t i = 0; i < scales.size(); ++i)
    scales[i] = static_cast<uint8_t>(0x30 + 5 * i);
  for (bool ct : {false, true}) {
    const float g = ct ? 1.0f / 3.0e-4f : 3.0e-4f;
    QuantMatrix m{
        ct ? FormatKind::kNvfp4CompressedTensors : FormatKind::kNvfp4ModelOpt,
        codes.data(),
        scales.data(),
        DType::kF8E4M3,
        n,
        k,
        1,
        16,
        g,
        ct};
    std::vector<float> out(n * k);
    DecodeRowsReference(m, 0, n, out.data());
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) {
        const float s = E4M3ToF32(scales[r * 4 + c / 16]);
        const float block = ct ? s / g : s * g;  // f32, block product first
        ASSERT_EQ(out[r * k + c], E2M1ToF32(code_at(r, c)) * block);
      }
  }
}

TEST(QuantCodesTest, Fp8DecodeRules) {
  const int64_t n = 5, k = 7;  // ragged blocks: ceil-sized scale grid
  std::vector<uint8_t> codes(n * k);
  for (size_t i = 0; i < codes.size(); ++i)
    codes[i] = static_cast<uint8_t>(i * 29 + 3);
  // Block [2, 3] with BF16 scale_inv [3, 3] (a multiplier).
  std::vector<uint16_t> sinv(9);
  for (size_t i = 0; i < sinv.size(); ++i)
    sinv[i] = F32ToBf16(0.001f * static_cast<float>(i + 1));
  QuantMatrix b{FormatKind::kFp8Block,
                codes.data(),
                sinv.data(),
                DType::kBF16,
                n,
                k,
                2,
                3};
  std::vector<float> out(n * k);
  DecodeRowsReference(b, 0, n, out.data());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const float want =
          E4M3ToF32(codes[r * k + c]) * Bf16ToF32(sinv[(r / 2) * 3 + c / 3]);
      if (std::isnan(want))
        ASSERT_TRUE(std::isnan(out[r * k + c]));
      else
        ASSERT_EQ(out[r * k + c], want) << r << "," << c;
    }
  // Per tensor.
  QuantMatrix t{FormatKind::kFp8PerTensor,
                codes.data(),
                nullptr,
                DType::kF32,
                n,
                k,
                1,
                0,
                0.25f};
  DecodeRowsReference(t, 1, 2, out.data());
  for (int64_t i = 0; i < 2 * k; ++i) {
    const float want = E4M3ToF32(codes[k + i]) * 0.25f;
    if (!std::isnan(want)) {
      ASSERT_EQ(out[i], want) << i;
    }
  }
}

}  // namespace
}  // namespace loom
