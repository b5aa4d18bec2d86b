#include "src/model/mxfp4_encode.h"

#include <algorithm>
#include <cmath>

namespace loom {

uint8_t EncodeE2M1(float q) {
  const uint8_t sign = std::signbit(q) ? 0x8 : 0x0;
  const float a = std::fabs(q);
  // Midpoints between neighbours of the grid; a tie goes to the code with an
  // even mantissa bit (0, 1, 2, 4 are even codes 0, 2, 4, 6; .5, 1.5, 3, 6
  // are odd codes 1, 3, 5, 7).
  uint8_t mag;
  if (a <= 0.25f) {
    mag = 0;  // 0
  } else if (a < 0.75f) {
    mag = 1;  // 0.5
  } else if (a <= 1.25f) {
    mag = 2;  // 1
  } else if (a < 1.75f) {
    mag = 3;  // 1.5
  } else if (a <= 2.5f) {
    mag = 4;  // 2
  } else if (a < 3.5f) {
    mag = 5;  // 3
  } else if (a <= 5.0f) {
    mag = 6;  // 4
  } else {
    mag = 7;  // 6 (saturating)
  }
  return sign | mag;
}

uint8_t EncodeMxfp4Block(const float* x, uint8_t* codes) {
  float amax = 0.0f;
  for (int64_t i = 0; i < kMxfp4Block; ++i)
    amax = std::max(amax, std::fabs(x[i]));
  int shared_exp = -127;
  if (amax > 0.0f) {
    int e = 0;
    std::frexp(amax, &e);  // amax = m * 2^e, m in [0.5, 1): floor(log2) = e - 1
    shared_exp = std::clamp(e - 1 - 2, -127, 127);
  }
  for (int64_t j = 0; j < kMxfp4Block / 2; ++j) {
    // Scaling by a power of two is exact (q < 8 by the choice of shared_exp).
    const uint8_t lo = EncodeE2M1(static_cast<float>(
        std::ldexp(static_cast<double>(x[2 * j]), -shared_exp)));
    const uint8_t hi = EncodeE2M1(static_cast<float>(
        std::ldexp(static_cast<double>(x[2 * j + 1]), -shared_exp)));
    codes[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
  return static_cast<uint8_t>(shared_exp + 127);
}

}  // namespace loom
