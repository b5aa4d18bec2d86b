#include "src/backend/cpu/quant_decode.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "src/backend/cpu/isa.h"
#include "src/backend/cpu/kernels.h"
#include "src/backend/cpu/kernels_internal.h"
#include "src/backend/cpu/quant_decode_internal.h"
#include "src/base/check.h"
#include "src/base/float16.h"
#include "src/base/units.h"

namespace loom::cpu {
namespace {

// One byte of two FP4 codes -> its two E2M1 values (low nibble first).
struct Fp4Pair {
  float lo, hi;
};
const Fp4Pair* Fp4PairTable() {
  static const std::array<Fp4Pair, 256> t = [] {
    std::array<Fp4Pair, 256> p{};
    for (int b = 0; b < 256; ++b)
      p[b] = {E2M1ToF32(static_cast<uint8_t>(b & 15)),
              E2M1ToF32(static_cast<uint8_t>(b >> 4))};
    return p;
  }();
  return t.data();
}

// Stores `n` f32 values in `dtype` (RNE for 16-bit types).
inline void Store(const float* src, DType dtype, void* dst, int64_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      break;
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = F32ToBf16(src[i]);
      break;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = F32ToF16(src[i]);
      break;
    }
    default:
      LOOM_CHECK(false) << "quantized decode into " << DTypeName(dtype);
  }
}

// One FP4 row (k values, k / 2 bytes) with a block factor per `block` values.
void DecodeFp4Row(const QuantMatrix& m, int64_t r, float* out) {
  const Fp4Pair* lut = Fp4PairTable();
  const auto* v = static_cast<const uint8_t*>(m.values) + r * (m.k / 2);
  const int64_t block = m.kind == FormatKind::kMxfp4 ? 32 : 16;
  for (int64_t c0 = 0; c0 < m.k; c0 += block) {
    const float f = BlockFactor(m, r, c0);
    const uint8_t* b = v + c0 / 2;
    float* o = out + c0;
    for (int64_t j = 0; j < block / 2; ++j) {
      const Fp4Pair p = lut[b[j]];
      o[2 * j] = p.lo * f;
      o[2 * j + 1] = p.hi * f;
    }
  }
}

// One FP8 row: the block factor changes every block_in values (per-tensor:
// once).
void DecodeFp8Row(const QuantMatrix& m, int64_t r, float* out) {
  const float* lut = E4M3Table();
  const auto* v = static_cast<const uint8_t*>(m.values) + r * m.k;
  const int64_t block = m.kind == FormatKind::kFp8Block ? m.block_in : m.k;
  for (int64_t c0 = 0; c0 < m.k; c0 += block) {
    const float f = BlockFactor(m, r, c0);
    const int64_t c1 = std::min(m.k, c0 + block);
    for (int64_t c = c0; c < c1; ++c) out[c] = lut[v[c]] * f;
  }
}

}  // namespace

bool DecodeIsExactIn(FormatKind kind, DType dtype) {
  return dtype == DType::kF32 ||
         (kind == FormatKind::kMxfp4 && dtype == DType::kBF16);
}

void DecodeRows(const QuantMatrix& m, int64_t row0, int64_t rows,
                DType out_dtype, void* out) {
  LOOM_CHECK(m.kind != FormatKind::kDense && row0 >= 0 && rows >= 0 &&
             row0 + rows <= m.n)
      << "decode rows [" << row0 << ", " << row0 + rows << ") of " << m.n;
  const bool fp4 = GetFormatInfo(m.kind).value_bits == 4;
  const int64_t esize = DTypeSize(out_dtype);
  auto* o = static_cast<uint8_t*>(out);
  constexpr int64_t kMaxStack = 8192;
  // FP4 into f32 or bf16 on AVX-512: 16 values per instruction sequence.
  constexpr int64_t kMaxBlocks = 2048;
  const int64_t block = m.kind == FormatKind::kMxfp4 ? 32 : 16;
  if (fp4 && HasAvx512() && m.k / block <= kMaxBlocks &&
      (out_dtype == DType::kF32 || out_dtype == DType::kBF16)) {
    const int64_t blocks = m.k / block;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t r = row0 + i;
      float factors[kMaxBlocks];
      for (int64_t g = 0; g < blocks; ++g)
        factors[g] = BlockFactor(m, r, g * block);
      avx512::DecodeFp4Row(
          static_cast<const uint8_t*>(m.values) + r * (m.k / 2), factors, m.k,
          block, E2M1Table(), out_dtype, o + i * m.k * esize);
    }
    return;
  }
#pragma omp parallel
  {
    // f32 row staging for 16-bit outputs (rows longer than kMaxStack are
    // decoded in place when f32, else in chunks of whole blocks).
    alignas(64) float row_buf[kMaxStack];
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t r = row0 + i;
      if (out_dtype == DType::kF32) {
        float* dst = reinterpret_cast<float*>(o + i * m.k * esize);
        fp4 ? DecodeFp4Row(m, r, dst) : DecodeFp8Row(m, r, dst);
        continue;
      }
      if (m.k <= kMaxStack) {
        fp4 ? DecodeFp4Row(m, r, row_buf) : DecodeFp8Row(m, r, row_buf);
        Store(row_buf, out_dtype, o + i * m.k * esize, m.k);
        continue;
      }
      // Long rows: decode the row through the reference-identical path one
      // value at a time (rare: k > 8192).
      for (int64_t c0 = 0; c0 < m.k; c0 += kMaxStack) {
        const int64_t c1 = std::min(m.k, c0 + kMaxStack);
        for (int64_t c = c0; c < c1; ++c) {
          float q;
          const auto* v = static_cast<const uint8_t*>(m.values);
          if (fp4) {
            const uint8_t b = v[r * (m.k / 2) + c / 2];
            q = E2M1ToF32(c % 2 == 0 ? b & 15 : b >> 4);
          } else {
            q = E4M3ToF32(v[r * m.k + c]);
          }
          row_buf[c - c0] = q * BlockFactor(m, r, c);
        }
        Store(row_buf, out_dtype, o + (i * m.k + c0) * esize, c1 - c0);
      }
    }
  }
}

}  // namespace loom::cpu
