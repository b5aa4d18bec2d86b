#include "src/core/quant_codes.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "src/base/float16.h"

namespace loom {
namespace {

float DecodeE2M1(uint8_t code) {
  const int s = (code >> 3) & 1, e = (code >> 1) & 3, m = code & 1;
  const float mag =
      e == 0 ? 0.5f * static_cast<float>(m)
             : std::ldexp(1.0f + 0.5f * static_cast<float>(m), e - 1);
  return s ? -mag : mag;
}

float DecodeE4M3(uint8_t code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  const float mag =
      e == 0 ? std::ldexp(static_cast<float>(m) / 8.0f, -6)
             : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
  return s ? -mag : mag;
}

template <int N, typename F>
std::array<float, N> MakeTable(F f) {
  std::array<float, N> t{};
  for (int i = 0; i < N; ++i) t[i] = f(static_cast<uint8_t>(i));
  return t;
}

float LoadScale(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, static_cast<const uint8_t*>(p) + 2 * i, 2);
      return Bf16ToF32(h);
    }
    case DType::kF8E4M3:
      return E4M3ToF32(static_cast<const uint8_t*>(p)[i]);
    case DType::kF8E8M0:
    case DType::kU8:
      return E8M0ToF32(static_cast<const uint8_t*>(p)[i]);
    default: {
      float f;
      std::memcpy(&f, static_cast<const uint8_t*>(p) + 4 * i, 4);
      return f;
    }
  }
}

}  // namespace

const float* E2M1Table() {
  static const std::array<float, 16> t = MakeTable<16>(DecodeE2M1);
  return t.data();
}

const float* E4M3Table() {
  static const std::array<float, 256> t = MakeTable<256>(DecodeE4M3);
  return t.data();
}

float E2M1ToF32(uint8_t code) { return E2M1Table()[code & 15]; }
float E4M3ToF32(uint8_t code) { return E4M3Table()[code]; }
float E8M0ToF32(uint8_t code) {
  // A table: ldexp is a library call, and MXFP4 decodes one scale per 32
  // values.
  static const std::array<float, 256> t = MakeTable<256>([](uint8_t c) {
    if (c == 255) return std::numeric_limits<float>::quiet_NaN();
    return std::ldexp(1.0f, static_cast<int>(c) - 127);
  });
  return t[code];
}

void FormatBlock(const WeightFormat& format, int64_t* block_out,
                 int64_t* block_in) {
  const FormatInfo& info = GetFormatInfo(format.kind);
  *block_out = 1;
  *block_in = info.block_in;
  if (info.block_in < 0) {
    *block_out = format.block_out;
    *block_in = format.block_in;
  }
}

float BlockFactor(const QuantMatrix& m, int64_t r, int64_t c) {
  switch (m.kind) {
    case FormatKind::kFp8PerTensor:
      return m.global_scale;
    case FormatKind::kFp8Block: {
      const int64_t cols = (m.k + m.block_in - 1) / m.block_in;
      return LoadScale(m.scales, m.scale_dtype,
                       (r / m.block_out) * cols + c / m.block_in);
    }
    case FormatKind::kMxfp4:
      return E8M0ToF32(
          static_cast<const uint8_t*>(m.scales)[r * (m.k / 32) + c / 32]);
    case FormatKind::kNvfp4ModelOpt:
    case FormatKind::kNvfp4CompressedTensors: {
      const float s = E4M3ToF32(
          static_cast<const uint8_t*>(m.scales)[r * (m.k / 16) + c / 16]);
      return m.divide_global ? s / m.global_scale : s * m.global_scale;
    }
    case FormatKind::kDense:
      break;
  }
  return std::numeric_limits<float>::quiet_NaN();
}

void DecodeRowsReference(const QuantMatrix& m, int64_t row0, int64_t rows,
                         float* out) {
  const auto* v = static_cast<const uint8_t*>(m.values);
  const bool fp4 = GetFormatInfo(m.kind).value_bits == 4;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = row0 + i;
    for (int64_t c = 0; c < m.k; ++c) {
      float q;
      if (fp4) {
        const uint8_t byte = v[r * (m.k / 2) + c / 2];
        q = E2M1ToF32(c % 2 == 0 ? byte & 15 : byte >> 4);
      } else {
        q = E4M3ToF32(v[r * m.k + c]);
      }
      out[i * m.k + c] = q * BlockFactor(m, r, c);
    }
  }
}

}  // namespace loom
