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

#include "src/backend/cpu/gemm_internal.h"
#include "src/backend/cpu/gemm_test_util.h"
#include "src/backend/cpu/isa.h"
#include "src/backend/cpu/kernels.h"
#include "src/backend/cpu/reference/reference_kernels.h"
#include "src/base/float16.h"
#include "src/base/units.h"

namespace loom::cpu {
namespace {

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

// MXFP4's decoded values are all bf16 values (the GEMM skips rounding
// them): every code with every scale byte.
TEST(QuantDecode, Mxfp4DecodeIsExactInBf16) {
  ASSERT_TRUE(DecodeIsExactIn(FormatKind::kMxfp4, DType::kBF16));
  ASSERT_FALSE(DecodeIsExactIn(FormatKind::kNvfp4ModelOpt, DType::kBF16));
  ASSERT_FALSE(DecodeIsExactIn(FormatKind::kMxfp4, DType::kF16));
  for (int scale = 0; scale < 255; ++scale)
    for (int code = 0; code < 16; ++code) {
      const float v = E2M1ToF32(static_cast<uint8_t>(code)) *
                      E8M0ToF32(static_cast<uint8_t>(scale));
      ASSERT_TRUE(SameValue(RoundBf16(v), v)) << code << " x 2^" << scale - 127;
    }
}

// The GEMM's row decoders of every ISA this CPU runs (portable always).
struct DecodeIsa {
  const char* name;
  decltype(&portable::DecodeCodesRange) decode;
};
std::vector<DecodeIsa> RunnableDecodeIsas() {
  std::vector<DecodeIsa> v = {{"portable", portable::DecodeCodesRange}};
  if (ActiveIsa() >= CpuIsa::kAvx2)
    v.push_back({"avx2", avx2::DecodeCodesRange});
  if (ActiveIsa() >= CpuIsa::kAvx512)
    v.push_back({"avx512", avx512::DecodeCodesRange});
  return v;
}

// DecodeCodesRange (each ISA) == DecodeRowsReference, bit for bit, on
// ranges that start inside the row (the GEMM's K blocks of 256 and 512).
TEST(QuantDecode, DecodeRangeEqualsReferenceOnEveryIsa) {
  const int64_t n = 13, k = 1056;  // 512 + 512 + 32; FP8 blocks of 48
  for (const DecodeIsa& isa : RunnableDecodeIsas()) {
    for (FormatKind kind : kQuantKinds) {
      Case c = MakeCase(kind, n, k, 23 + static_cast<uint32_t>(kind));
      std::vector<float> want(n * k);
      DecodeRowsReference(c.m, 0, n, want.data());
      for (int64_t chunk : {int64_t{256}, int64_t{512}}) {
        std::vector<float> got(static_cast<size_t>(chunk));
        for (int64_t r = 0; r < n; ++r)
          for (int64_t c0 = 0; c0 < k; c0 += chunk) {
            const int64_t c1 = std::min(k, c0 + chunk);
            isa.decode(c.m, r, c0, c1, got.data());
            for (int64_t j = c0; j < c1; ++j)
              ASSERT_TRUE(SameValue(got[j - c0], want[r * k + j]))
                  << isa.name << " " << FormatName(kind) << " (" << r << ", "
                  << j << "): " << got[j - c0] << " vs " << want[r * k + j];
          }
      }
    }
  }
}

// A group of quantized GEMMs (experts: ragged row ranges of one x, two
// weights reading the same rows, biases, accumulate, one dense item among
// them) equals one Gemm per item byte for byte, at 1, 2 and 3 threads.
TEST(QuantGemm, GroupEqualsOneCallPerItem) {
  const int before = NumThreads();
  const int64_t k = 640, n = 50;
  const std::vector<int64_t> counts = {5, 1, 0, 32, 9, 130};
  std::vector<int64_t> row0 = {0};
  for (int64_t c : counts) row0.push_back(row0.back() + c);
  const int64_t rows = row0.back();
  std::mt19937 g(77);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(rows * k), bias(n);
  for (auto& v : x) v = u(g);
  for (auto& v : bias) v = u(g);
  std::vector<uint16_t> dense(n * k);
  for (auto& v : dense) v = F32ToBf16(u(g));
  std::vector<Case> cases;
  for (size_t e = 0; e < 2 * counts.size(); ++e)
    cases.push_back(
        MakeCase(e % 2 ? FormatKind::kNvfp4ModelOpt : FormatKind::kMxfp4, n, k,
                 500 + static_cast<uint32_t>(e), DType::kBF16, false));
  for (DType compute : {DType::kBF16, DType::kF32}) {
    std::vector<GemmArgs> items;
    for (size_t e = 0; e < counts.size(); ++e) {
      if (counts[e] == 0) continue;
      for (int half = 0; half < 2; ++half) {
        GemmArgs a;
        a.x = x.data() + row0[e] * k;
        a.w_dtype = compute;
        a.bias = half == 0 && e % 2 == 0 ? bias.data() : nullptr;
        a.accumulate = half == 1;
        a.m = counts[e], a.n = n, a.k = k;
        a.ldy = 2 * n;
        a.y = reinterpret_cast<float*>(half * n * 4 + row0[e] * 2 * n * 4);
        if (e == 4 && half == 1 && compute == DType::kBF16)
          a.w = dense.data();  // a dense item in the group
        else
          a.quant = &cases[2 * e + half].m;
        items.push_back(a);
      }
    }
    std::vector<float> first;
    for (int threads : {1, 2, 3}) {
      SetNumThreads(threads);
      const auto [one, grouped] = OneByOneAndGrouped(
          items, x.data(), rows, k, compute, rows * 2 * n, 0.5f);
      ASSERT_EQ(0, std::memcmp(one.data(), grouped.data(), one.size() * 4))
          << DTypeName(compute) << " " << threads << " threads";
      if (first.empty())
        first = grouped;
      else
        ASSERT_EQ(0, std::memcmp(first.data(), grouped.data(), one.size() * 4))
            << DTypeName(compute) << " " << threads << " threads vs 1";
    }
  }
  SetNumThreads(before);
}

// Batch invariance on quantized weights: for every M in 1..600, each row of
// rows [off, off + M) equals that row computed alone, every format, f32 and
// bf16 compute.
TEST(QuantGemm, EveryRowEqualsItselfAloneForMUpTo600) {
  const int64_t n = 37, k = 192, total = 650;
  std::mt19937 g(19);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(total * k);
  for (auto& v : x) v = u(g);
  for (FormatKind kind : kQuantKinds) {
    Case c = MakeCase(kind, n, k, 300 + static_cast<uint32_t>(kind),
                      DType::kBF16, /*edge=*/false);
    for (DType compute : {DType::kBF16, DType::kF32}) {
      GemmContext ctx;
      AlignedBuf ws(GemmWorkspaceBytes(total, k, compute));
      GemmArgs a;
      a.quant = &c.m;
      a.w_dtype = compute;
      a.n = n;
      a.k = k;
      a.workspace = ws.p;
      std::vector<float> alone(total * n);
      for (int64_t r = 0; r < total; ++r) {
        a.x = x.data() + r * k;
        a.m = 1;
        a.y = alone.data() + r * n;
        ctx.Gemm(a);
      }
      for (int64_t m = 1; m <= 600; ++m) {
        const int64_t off = (m * 29) % (total - m + 1);
        std::vector<float> y(m * n);
        a.x = x.data() + off * k;
        a.m = m;
        a.y = y.data();
        ctx.Gemm(a);
        ASSERT_EQ(0, std::memcmp(y.data(), alone.data() + off * n, 4 * m * n))
            << FormatName(kind) << " " << DTypeName(compute) << " M=" << m
            << " (" << GemmPathName(compute) << ")";
      }
    }
  }
}

// A dense GEMM that reuses the x copy a quantized GEMM of the same compute
// dtype left in the workspace gives the bytes of a fresh one.
TEST(QuantGemm, DenseGemmReusesTheCopyOfAQuantizedOne) {
  const int64_t m = 7, n = 40, k = 96;
  Case c = MakeCase(FormatKind::kMxfp4, n, k, 61, DType::kBF16, false);
  std::mt19937 g(8);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(m * k), wf(n * k);
  for (auto& v : x) v = u(g);
  for (auto& v : wf) v = u(g);
  std::vector<uint16_t> w16(n * k);
  for (int64_t i = 0; i < n * k; ++i) w16[i] = F32ToBf16(wf[i]);
  AlignedBuf ws(GemmWorkspaceBytes(m, k, DType::kBF16));
  GemmArgs a;
  a.x = x.data();
  a.w_dtype = DType::kBF16;
  a.m = m, a.n = n, a.k = k;
  a.workspace = ws.p;
  a.quant = &c.m;
  std::vector<float> yq(m * n), got(m * n), want(m * n);
  GemmContext ctx;
  a.y = yq.data();
  ctx.Gemm(a);
  GemmArgs d = a;
  d.quant = nullptr;
  d.w = w16.data();
  d.y = got.data();
  d.reuse_x_workspace = true;  // same x: the caller's claim
  ctx.Gemm(d);
  GemmContext fresh;
  d.y = want.data();
  d.reuse_x_workspace = false;
  fresh.Gemm(d);
  ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4));
}

// MXFP4 in a bf16 GEMM equals the same GEMM on the decoded weights stored as
// bf16, bit for bit: the packing's exponent shift (scales 2..252) and its
// f32 fallback (the others: 0 and 1 give subnormal or zero products, 253 and
// 254 overflow) give the bytes of the f32 decode rounded to bf16.
TEST(QuantGemm, Mxfp4Bf16EqualsItsDecodedBf16Weights) {
  GemmContext ctx;
  const int64_t n = 80, k = 32 * 40;
  Case c = MakeCase(FormatKind::kMxfp4, n, k, 17, DType::kBF16, false);
  // Edge scales in the first strip's rows (16 rows: packed through f32),
  // the exact-shift bounds in the other strips (packed by the shift).
  const uint8_t edges[] = {0, 1, 253, 254, 2, 252};
  const int64_t blocks = k / 32;
  for (int64_t r = 0; r < 16; ++r)
    c.scales[r * blocks + r % blocks] = edges[r % std::size(edges)];
  c.scales[16 * blocks] = 2;
  c.scales[33 * blocks + 3] = 252;
  std::vector<float> wf(n * k);
  DecodeRowsReference(c.m, 0, n, wf.data());
  std::vector<uint16_t> w16(n * k);
  for (int64_t i = 0; i < n * k; ++i) w16[i] = F32ToBf16(wf[i]);
  for (int64_t m : {int64_t{1}, int64_t{5}, int64_t{33}}) {
    std::mt19937 g(9);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(m * k);
    for (auto& v : x) v = u(g);
    AlignedBuf ws(GemmWorkspaceBytes(m, k, DType::kBF16));
    GemmArgs a;
    a.x = x.data();
    a.quant = &c.m;
    a.w_dtype = DType::kBF16;
    a.m = m;
    a.n = n;
    a.k = k;
    a.workspace = ws.p;
    std::vector<float> got(m * n), want(m * n);
    a.y = got.data();
    ctx.Gemm(a);
    a.quant = nullptr;
    a.w = w16.data();
    a.y = want.data();
    ctx.Gemm(a);
    for (int64_t i = 0; i < m * n; ++i)
      ASSERT_TRUE(SameValue(got[i], want[i]))
          << "m=" << m << " (" << i / n << ", " << i % n << "): " << got[i]
          << " vs " << want[i];
  }
}

// The quantized GEMM == the reference GEMM on the reference-decoded weights
// (in the compute dtype), across K blocks, with bias, ldy and accumulate.
TEST(QuantGemm, MatchesReferenceOnDecodedWeights) {
  GemmContext ctx;
  const int64_t n = 300, k = 96 * 6;  // K blocks of 256 / 512 and a tail
  for (FormatKind kind : kQuantKinds) {
    Case c = MakeCase(kind, n, k, 91 + static_cast<uint32_t>(kind),
                      DType::kBF16, /*edge=*/false);
    std::vector<float> wf(n * k);
    DecodeRowsReference(c.m, 0, n, wf.data());
    for (DType compute : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int64_t m : {int64_t{1}, int64_t{3}, int64_t{37}}) {
        std::mt19937 g(5);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        std::vector<float> x(m * k), y0(m * (n + 3)), bias(n);
        for (auto& v : x) v = u(g);
        for (auto& v : y0) v = u(g);
        for (auto& v : bias) v = u(g);
        std::vector<uint16_t> bias16(n);
        for (int64_t j = 0; j < n; ++j) bias16[j] = F32ToBf16(bias[j]);
        // The weights as the GEMM multiplies them: rounded to the compute
        // dtype.
        std::vector<uint16_t> w16(n * k);
        for (int64_t i = 0; i < n * k; ++i)
          w16[i] = compute == DType::kF16 ? F32ToF16(wf[i]) : F32ToBf16(wf[i]);
        AlignedBuf ws(GemmWorkspaceBytes(m, k, compute));
        GemmArgs a;
        a.x = x.data();
        a.quant = &c.m;
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
        ctx.Gemm(a);
        a.quant = nullptr;
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
