// The fast quantized decoders against the scalar reference (src/core/
// quant_codes.h) on random bytes with the edge codes included, and the
// quantized GEMM against the reference GEMM on the reference-decoded weights.
#include "src/backend/cpu/quant_decode.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/backend/cpu/isa.h"
#include "src/backend/cpu/kernels.h"
#include "src/backend/cpu/reference/reference_kernels.h"
#include "src/base/float16.h"
#include "src/base/units.h"

namespace loom::cpu {
namespace {

struct AlignedBuf {
  explicit AlignedBuf(int64_t bytes)
      : p(std::aligned_alloc(64, static_cast<size_t>(AlignUp(
                                     std::max<int64_t>(bytes, 64), 64)))) {}
  ~AlignedBuf() { std::free(p); }
  void* p;
};

std::vector<uint8_t> RandomBytes(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint8_t> b(static_cast<size_t>(n));
  for (auto& v : b) v = static_cast<uint8_t>(g() & 0xFF);
  return b;
}

// A random quantized matrix of `kind` with its storage (scales chosen in a
// sane range, plus edge codes: NaN E4M3 / E8M0 scales, 0x80 (-0), max).
struct Case {
  QuantMatrix m;
  std::vector<uint8_t> values, scales;
};

Case MakeCase(FormatKind kind, int64_t n, int64_t k, uint32_t seed,
              DType scale_dtype = DType::kBF16, bool edge = true) {
  Case c;
  const bool fp4 = GetFormatInfo(kind).value_bits == 4;
  c.values = RandomBytes(fp4 ? n * k / 2 : n * k, seed);
  std::mt19937 g(seed + 1);
  QuantMatrix& m = c.m;
  m.kind = kind;
  m.n = n;
  m.k = k;
  switch (kind) {
    case FormatKind::kMxfp4: {
      m.block_in = 32;
      m.scale_dtype = DType::kF8E8M0;
      c.scales.resize(static_cast<size_t>(n * k / 32));
      for (auto& s : c.scales) s = static_cast<uint8_t>(110 + g() % 30);
      if (edge) c.scales[0] = 255, c.scales.back() = 0;
      break;
    }
    case FormatKind::kNvfp4ModelOpt:
    case FormatKind::kNvfp4CompressedTensors: {
      m.block_in = 16;
      m.scale_dtype = DType::kF8E4M3;
      c.scales.resize(static_cast<size_t>(n * k / 16));
      for (auto& s : c.scales) s = static_cast<uint8_t>(g() % 0x7F);
      if (edge) c.scales[0] = 0x7F, c.scales[1] = 0x80, c.scales[2] = 0x7E;
      m.divide_global = kind == FormatKind::kNvfp4CompressedTensors;
      m.global_scale = m.divide_global ? 1.0f / 3.3e-4f : 3.3e-4f;
      break;
    }
    case FormatKind::kFp8Block: {
      m.block_out = 32;
      m.block_in = 48;
      m.scale_dtype = scale_dtype;
      const int64_t cells = ((n + 31) / 32) * ((k + 47) / 48);
      c.scales.resize(static_cast<size_t>(cells * DTypeSize(scale_dtype)));
      for (int64_t i = 0; i < cells; ++i) {
        const float s = 1e-3f * static_cast<float>(1 + g() % 100);
        if (scale_dtype == DType::kBF16) {
          const uint16_t h = F32ToBf16(s);
          std::memcpy(c.scales.data() + 2 * i, &h, 2);
        } else {
          std::memcpy(c.scales.data() + 4 * i, &s, 4);
        }
      }
      break;
    }
    case FormatKind::kFp8PerTensor:
      m.global_scale = 0.0123f;
      break;
    case FormatKind::kDense:
      break;
  }
  if (!edge && !fp4)  // no NaN codes
    for (auto& v : c.values)
      if ((v & 0x7F) == 0x7F) v = 0;
  if (edge && !fp4) {
    c.values[0] = 0x7F;  // NaN
    c.values[1] = 0x80;  // -0
    c.values[2] = 0x7E;  // 448
    c.values[3] = 0x01;  // min subnormal
  }
  m.values = c.values.data();
  m.scales = c.scales.empty() ? nullptr : c.scales.data();
  return c;
}

// Same bits, or both NaN.
bool SameValue(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}

const FormatKind kQuantKinds[] = {
    FormatKind::kFp8PerTensor, FormatKind::kFp8Block, FormatKind::kMxfp4,
    FormatKind::kNvfp4ModelOpt, FormatKind::kNvfp4CompressedTensors};

TEST(QuantDecode, FastEqualsReferenceOnRandomBytes) {
  for (FormatKind kind : kQuantKinds) {
    for (DType sd : {DType::kBF16, DType::kF32}) {
      if (sd == DType::kF32 && kind != FormatKind::kFp8Block) continue;
      const int64_t n = 75, k = 160;  // FP8 block: ragged last block row/col
      Case c = MakeCase(kind, n, k, 17 + static_cast<uint32_t>(kind), sd);
      std::vector<float> want(n * k);
      DecodeRowsReference(c.m, 0, n, want.data());
      for (DType out : {DType::kF32, DType::kBF16, DType::kF16}) {
        // Rows [5, 70): a panel that does not start at row 0.
        const int64_t r0 = 5, rows = 65;
        std::vector<uint8_t> got(static_cast<size_t>(rows * k * 4));
        DecodeRows(c.m, r0, rows, out, got.data());
        for (int64_t i = 0; i < rows * k; ++i) {
          const float ref = want[r0 * k + i];
          float g;
          if (out == DType::kF32) {
            std::memcpy(&g, got.data() + 4 * i, 4);
            ASSERT_TRUE(SameValue(g, ref))
                << FormatName(kind) << " f32 element " << i << ": " << g
                << " vs " << ref;
          } else {
            uint16_t h;
            std::memcpy(&h, got.data() + 2 * i, 2);
            const uint16_t r16 =
                out == DType::kBF16 ? F32ToBf16(ref) : F32ToF16(ref);
            if (std::isnan(ref))
              ASSERT_TRUE(
                  std::isnan(out == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h)));
            else
              ASSERT_EQ(h, r16) << FormatName(kind) << " " << DTypeName(out)
                                << " element " << i;
          }
        }
      }
    }
  }
}

TEST(QuantDecode, WorkspaceIsOnePanel) {
  EXPECT_EQ(
      QuantDecodeWorkspaceBytes(5760, 2880, FormatKind::kDense, DType::kBF16),
      0);
  // In the compute dtype where it is multiplied natively, else in f32 (the
  // panel is then rounded to bf16 in place).
  EXPECT_EQ(
      QuantDecodeWorkspaceBytes(5760, 2880, FormatKind::kMxfp4, DType::kBF16),
      AlignUp(kQuantPanelRows * 2880 * (NativeGemmDType(DType::kBF16) ? 2 : 4),
              64));
  EXPECT_EQ(
      QuantDecodeWorkspaceBytes(64, 128, FormatKind::kFp8Block, DType::kF32),
      64 * 128 * 4);
}

// GemmQuantized == the reference GEMM on the reference-decoded weights (in
// the compute dtype), across panel boundaries, with bias, ldy and accumulate.
TEST(QuantGemm, MatchesReferenceOnDecodedWeights) {
  GemmContext ctx;
  const int64_t n = 300, k = 96;  // 256 + 44: two panels
  for (FormatKind kind : kQuantKinds) {
    Case c = MakeCase(kind, n, k, 91 + static_cast<uint32_t>(kind),
                      DType::kBF16, /*edge=*/false);
    std::vector<float> wf(n * k);
    DecodeRowsReference(c.m, 0, n, wf.data());
    for (DType compute : {DType::kF32, DType::kBF16}) {
      for (int64_t m : {int64_t{1}, int64_t{3}, int64_t{37}}) {
        std::mt19937 g(5);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        std::vector<float> x(m * k), y0(m * (n + 3)), bias(n);
        for (auto& v : x) v = u(g);
        for (auto& v : y0) v = u(g);
        for (auto& v : bias) v = u(g);
        std::vector<uint16_t> bias16(n);
        for (int64_t j = 0; j < n; ++j) bias16[j] = F32ToBf16(bias[j]);
        std::vector<uint16_t> w16(n * k);
        for (int64_t i = 0; i < n * k; ++i) w16[i] = F32ToBf16(wf[i]);
        AlignedBuf ws(GemmWorkspaceBytes(m, k, compute));
        const int64_t decode_bytes =
            QuantDecodeWorkspaceBytes(n, k, kind, compute);
        AlignedBuf decode(decode_bytes);
        GemmArgs a;
        a.x = x.data();
        a.w_dtype = compute;
        a.m = m;
        a.n = n;
        a.k = k;
        a.bias = bias16.data();
        a.bias_dtype = DType::kBF16;
        a.ldy = n + 3;
        a.accumulate = true;
        a.workspace = ws.p;
        std::vector<float> got = y0, want = y0;
        a.y = got.data();
        ctx.GemmQuantized(a, c.m, decode.p, decode_bytes);
        a.w = compute == DType::kF32 ? static_cast<const void*>(wf.data())
                                     : static_cast<const void*>(w16.data());
        a.y = want.data();
        ref::Gemm(a);
        constexpr double kU = 1.0 / (1 << 24);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double mag = std::abs(bias[j]) + std::abs(y0[i * (n + 3) + j]);
            for (int64_t p = 0; p < k; ++p)
              mag += std::abs(x[i * k + p] * wf[j * k + p]);
            const double tol = 2.0 * (k + 2) * kU * mag + 1e-30;
            ASSERT_NEAR(got[i * (n + 3) + j], want[i * (n + 3) + j], tol)
                << FormatName(kind) << " " << DTypeName(compute) << " m=" << m
                << " (" << i << ", " << j << ")";
          }
        // Columns n..ldy untouched.
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = n; j < n + 3; ++j)
            ASSERT_EQ(got[i * (n + 3) + j], y0[i * (n + 3) + j]);
      }
    }
  }
}

}  // namespace
}  // namespace loom::cpu
