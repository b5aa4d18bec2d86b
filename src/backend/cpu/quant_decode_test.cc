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

#include "src/backend/cpu/codes_gemm.h"
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
  // Or one decode tile per thread for the few-row path, where that is more.
  EXPECT_EQ(
      QuantDecodeWorkspaceBytes(64, 128, FormatKind::kFp8Block, DType::kF32),
      std::max<int64_t>(64 * 128 * 4, NumThreads() * CodesGemmTileBytes(128)));
  EXPECT_EQ(CodesGemmTileBytes(2880), kCodesTileCols * kCodesTileK * 4);
}

// MXFP4's decoded values are all bf16 values (GemmQuantized skips rounding
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

// The codes path's kernels of every ISA this CPU runs (portable always).
struct CodesIsa {
  const char* name;
  decltype(&portable::DecodeCodesRange) decode;
  decltype(&portable::DotTile) dot;
};
std::vector<CodesIsa> RunnableCodesIsas() {
  std::vector<CodesIsa> v = {
      {"portable", portable::DecodeCodesRange, portable::DotTile}};
  if (ActiveIsa() >= CpuIsa::kAvx2)
    v.push_back({"avx2", avx2::DecodeCodesRange, avx2::DotTile});
  if (ActiveIsa() >= CpuIsa::kAvx512)
    v.push_back({"avx512", avx512::DecodeCodesRange, avx512::DotTile});
  return v;
}

// DecodeCodesRange (each ISA) == DecodeRowsReference, bit for bit, on chunks
// that start inside the row (the codes path's 512-column chunks).
TEST(CodesGemm, DecodeRangeEqualsReferenceOnEveryIsa) {
  const int64_t n = 13, k = 1056;  // 512 + 512 + 32; FP8 blocks of 48
  for (const CodesIsa& isa : RunnableCodesIsas()) {
    for (FormatKind kind : kQuantKinds) {
      Case c = MakeCase(kind, n, k, 23 + static_cast<uint32_t>(kind));
      std::vector<float> want(n * k), got(kCodesTileK);
      DecodeRowsReference(c.m, 0, n, want.data());
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c0 = 0; c0 < k; c0 += kCodesTileK) {
          const int64_t c1 = std::min(k, c0 + kCodesTileK);
          isa.decode(c.m, r, c0, c1, got.data());
          for (int64_t j = c0; j < c1; ++j)
            ASSERT_TRUE(SameValue(got[j - c0], want[r * k + j]))
                << isa.name << " " << FormatName(kind) << " (" << r << ", " << j
                << "): " << got[j - c0] << " vs " << want[r * k + j];
        }
    }
  }
}

// DotTile (each ISA) adds x . w to y within f32 summation error, for every
// row / column remainder of its 4 x 3 blocks and lengths off the lane width.
TEST(CodesGemm, DotTileMatchesDoubleOnEveryIsa) {
  std::mt19937 g(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const CodesIsa& isa : RunnableCodesIsas()) {
    for (int64_t m : {1, 2, 3, 4, 5, 7, 9}) {
      for (int64_t nb : {1, 2, 3, 5, 12}) {
        for (int64_t kc : {1, 7, 8, 17, 64, 512}) {
          const int64_t ldx = kc + 5, ldy = nb + 2;
          std::vector<float> x(m * ldx), w(nb * kc), y(m * ldy);
          for (auto& v : x) v = u(g);
          for (auto& v : w) v = u(g);
          for (auto& v : y) v = u(g);
          std::vector<float> y0 = y;
          isa.dot(x.data(), ldx, m, w.data(), nb, kc, y.data(), ldy);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < ldy; ++j) {
              if (j >= nb) {
                ASSERT_EQ(y[i * ldy + j], y0[i * ldy + j]) << "column " << j;
                continue;
              }
              double want = y0[i * ldy + j], mag = std::abs(want);
              for (int64_t c = 0; c < kc; ++c) {
                want += static_cast<double>(x[i * ldx + c]) * w[j * kc + c];
                mag += std::abs(x[i * ldx + c] * w[j * kc + c]);
              }
              ASSERT_NEAR(y[i * ldy + j], want,
                          (kc + 2) * mag / (1 << 23) + 1e-30)
                  << isa.name << " m=" << m << " nb=" << nb << " kc=" << kc
                  << " (" << i << ", " << j << ")";
            }
        }
      }
    }
  }
}

// The codes path gives the same bytes at 1, 2 and 3 threads, alone and in a
// group of items (each output column is one task's, in a fixed order).
TEST(CodesGemm, SameBytesAtEveryThreadCount) {
  const int64_t n = 301, k = 1056;
  Case a = MakeCase(FormatKind::kMxfp4, n, k, 41, DType::kBF16, false);
  Case b = MakeCase(FormatKind::kMxfp4, n, k, 42, DType::kBF16, false);
  std::mt19937 g(9);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t rows = 40;
  std::vector<float> x(rows * k);
  for (auto& v : x) v = u(g);
  const int before = NumThreads();
  std::vector<float> first;
  for (int threads : {1, 2, 3}) {
    SetNumThreads(threads);
    AlignedBuf tiles(threads * CodesGemmTileBytes(k));
    std::vector<float> y(rows * n, 0.0f);
    CodesGemmItem items[2];
    items[0].x = x.data();
    items[0].m = 25;
    items[0].w = a.m;
    items[0].y = y.data();
    items[1] = items[0];
    items[1].x = x.data() + 25 * k;
    items[1].m = rows - 25;
    items[1].w = b.m;
    items[1].y = y.data() + 25 * n;
    CodesGemm(items, 2, DType::kBF16, tiles.p, threads * CodesGemmTileBytes(k));
    if (first.empty())
      first = y;
    else
      ASSERT_EQ(0, std::memcmp(first.data(), y.data(), y.size() * 4))
          << threads << " threads";
    // Tiles for one thread only (the thread count grew after planning):
    // one thread runs, the same bytes.
    std::fill(y.begin(), y.end(), 0.0f);
    CodesGemm(items, 2, DType::kBF16, tiles.p, CodesGemmTileBytes(k));
    ASSERT_EQ(0, std::memcmp(first.data(), y.data(), y.size() * 4))
        << threads << " threads, one tile";
  }
  SetNumThreads(before);
}

// GemmQuantized == the reference GEMM on the reference-decoded weights (in
// the compute dtype), across panel boundaries, with bias, ldy and accumulate.
// GemmQuantizedGroup (experts on the codes: ragged row ranges of one x, two
// weights reading the same rows, biases, accumulate) equals one
// GemmQuantized per item byte for byte, at 1, 2 and 3 threads.
TEST(QuantGemm, GroupOnCodesEqualsOneCallPerItem) {
  const int before = NumThreads();
  const int64_t k = 640, n = 50;
  const std::vector<int64_t> counts = {5, 1, 0, 32, 9};
  std::vector<int64_t> row0 = {0};
  for (int64_t c : counts) row0.push_back(row0.back() + c);
  const int64_t rows = row0.back();
  std::mt19937 g(77);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(rows * k), bias(n);
  for (auto& v : x) v = u(g);
  for (auto& v : bias) v = u(g);
  std::vector<Case> cases;
  for (size_t e = 0; e < 2 * counts.size(); ++e)
    cases.push_back(
        MakeCase(e % 2 ? FormatKind::kNvfp4ModelOpt : FormatKind::kMxfp4, n, k,
                 500 + static_cast<uint32_t>(e), DType::kBF16, false));
  std::vector<GemmArgs> items;
  std::vector<QuantMatrix> ws;
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] == 0) continue;
    for (int half = 0; half < 2; ++half) {
      GemmArgs a;
      a.x = x.data() + row0[e] * k;
      a.w_dtype = DType::kBF16;
      a.bias = half == 0 && e % 2 == 0 ? bias.data() : nullptr;
      a.accumulate = half == 1;
      a.m = counts[e], a.n = n, a.k = k;
      a.ldy = 2 * n;
      a.y = reinterpret_cast<float*>(half * n * 4 + row0[e] * 2 * n * 4);
      items.push_back(a);
      ws.push_back(cases[2 * e + half].m);
    }
  }
  std::vector<float> first;
  for (int threads : {1, 2, 3}) {
    SetNumThreads(threads);
    GemmContext ctx;
    AlignedBuf xcopy(GemmWorkspaceBytes(rows, k, DType::kBF16));
    const int64_t decode_bytes =
        QuantDecodeWorkspaceBytes(n, k, FormatKind::kMxfp4, DType::kBF16);
    AlignedBuf decode(decode_bytes);
    std::vector<float> one(rows * 2 * n, 0.5f), grouped = one;
    for (size_t i = 0; i < items.size(); ++i) {
      GemmArgs a = items[i];  // y holds the offset into the output
      ASSERT_TRUE(ctx.UsesCodes(a.m, ws[i].kind));
      a.y = one.data() + reinterpret_cast<intptr_t>(a.y) / 4;
      a.workspace = xcopy.p;
      ctx.GemmQuantized(a, ws[i], decode.p, decode_bytes);
    }
    std::vector<GemmArgs> gi = items;
    for (GemmArgs& a : gi)
      a.y = grouped.data() + reinterpret_cast<intptr_t>(a.y) / 4;
    ctx.GemmQuantizedGroup(gi.data(), ws.data(),
                           static_cast<int64_t>(gi.size()), x.data(), rows,
                           xcopy.p, decode.p, decode_bytes);
    ASSERT_EQ(0, std::memcmp(one.data(), grouped.data(), one.size() * 4))
        << threads << " threads";
    if (first.empty())
      first = grouped;
    else
      ASSERT_EQ(0, std::memcmp(first.data(), grouped.data(), one.size() * 4))
          << threads << " threads vs 1";
  }
  SetNumThreads(before);
}

// A dense 16-bit Gemm that asks to reuse the x copy right after a GEMM on
// the codes (which left its f32 copy in the workspace) makes its own copy:
// the same bytes as on a fresh context (a native bf16 GEMM reads a bf16 copy).
TEST(QuantGemm, DenseGemmAfterTheCodesPathDoesNotReuseItsCopy) {
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
  const int64_t decode_bytes =
      QuantDecodeWorkspaceBytes(n, k, FormatKind::kMxfp4, DType::kBF16);
  AlignedBuf decode(decode_bytes);
  GemmArgs a;
  a.x = x.data();
  a.w_dtype = DType::kBF16;
  a.m = m, a.n = n, a.k = k;
  a.workspace = ws.p;
  std::vector<float> yq(m * n), got(m * n), want(m * n);
  GemmContext ctx;
  a.y = yq.data();
  ASSERT_TRUE(ctx.UsesCodes(m, FormatKind::kMxfp4));
  ctx.GemmQuantized(a, c.m, decode.p, decode_bytes);
  GemmArgs d = a;
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

void QuantGemmMatchesReference(GemmContext::QuantPath path);

// Both paths: panels and codes (the latter's chunk boundary inside k).
TEST(QuantGemm, MatchesReferenceOnDecodedWeights) {
  for (auto path :
       {GemmContext::QuantPath::kPanels, GemmContext::QuantPath::kCodes}) {
    QuantGemmMatchesReference(path);
  }
}

void QuantGemmMatchesReference(GemmContext::QuantPath path) {
  GemmContext ctx;
  ctx.SetQuantPath(path);
  const int64_t n = 300, k = 96 * 6;  // 256 + 44: two panels
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
                << " (" << i << ", " << j << ") codes path "
                << (path == GemmContext::QuantPath::kCodes);
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
