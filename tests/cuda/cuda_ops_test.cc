// The CUDA backend's non-GEMM, non-attention ops, through the Backend
// interface, against the CPU backend on odd shapes.
//
// Tolerances, with u = 2^-24 the f32 unit roundoff (one ulp of a value in
// [1, 2) is 2u), and MaxRelError = max |a - b| / max(1, |b|):
//   - Copies, widenings, roundings to bf16 / f16, clamps, additions, scalings,
//     the scatter-add (each product rounded before its sum on both sides),
//     segment sums (one thread walks the rows in order, in double), maxima,
//     routing ids and the grouping by expert are exact: compared bit for bit.
//   - Norms: both sides compute the sum of squares (mean, variance) in
//     double, the inverse root in double rounded once to f32, then the same
//     rounded f32 products. Only the order of the double sum differs (~1e-16
//     relative), which can (rarely) move the f32 inverse root by one ulp
//     (<= 2u relative); each of the two following roundings may then land
//     one ulp apart (<= 2u each): tolerance 8u. LayerNorm's f32 mean can
//     move alike, by ulp(mean) before the subtraction, and its bias adds a
//     rounding: 34u there.
//   - expf / tanhf / erfcf / cosf / sinf: CUDA's are within 2 ulp (erfcf 4),
//     the host's libm within 1 and the CPU's AVX-512 polynomials within 2
//     (erfc 1.2e-7 relative): the function values differ by up to 4 ulp
//     (8 for erfc), and the few rounded operations around them add at most 2
//     each side. The largest sums are 8 + 4 = 12 ulp = 24u relative (the
//     functions' factors are at most 1 in magnitude relative to the output):
//     tolerance 32u (~1.9e-6) for activations, softcap, SwiGLU, sigmoid
//     gates and routing weights; RoPE tables 8u (2 + 1 ulp of cos/sin in
//     [-1, 1] and one product rounding).
//   - ApplyRope: the CPU's AVX-512 path fuses x1 c - x2 s into an FMA, the
//     device (and the portable path) rounds both products: |difference| <=
//     u (|x1 c| + |x2 s|) + one final rounding each side; with |x| <= 1 and
//     |c|, |s| <= 1 that is <= 2u + 2u: tolerance 4u absolute (MaxRelError).
//   - LogSumExp: max exact, each exp term within 4 ulp relative between the
//     sides, the double sum and log exact enough (1e-15): the result differs
//     by at most 4 * 2u = 8u absolute (log of a relative error): tolerance
//     1e-6.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "src/base/float16.h"
#include "tests/cuda/cuda_test_util.h"

namespace loom::cuda_test {
namespace {

constexpr double kU = 1.0 / (1 << 24);
constexpr float kInf = std::numeric_limits<float>::infinity();

// Bit-for-bit equality of two vectors (NaNs compared by their bits).
template <typename T>
void ExpectBits(const std::vector<T>& got, const std::vector<T>& want,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << ": first difference at " << i << " of "
                    << got.size() << ": got " << +got[i] << ", want "
                    << +want[i];
      return;
    }
  }
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 double tol, const std::string& what) {
  const double err = MaxRelError(got, want);
  EXPECT_LE(err, tol) << what;
}

// Values of `n` of a given dtype: host bytes and a device copy.
struct Typed {
  DType dtype = DType::kF32;
  std::vector<uint8_t> bytes;
  DeviceArray<uint8_t> dev;
  const void* host() const { return bytes.data(); }
  const void* device() const { return dev.data(); }
};

Typed MakeTyped(Backend& gpu, const std::vector<float>& v, DType dtype) {
  Typed t;
  t.dtype = dtype;
  if (dtype == DType::kF32) {
    t.bytes.resize(v.size() * 4);
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  } else {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      h[i] = dtype == DType::kBF16 ? F32ToBf16(v[i]) : F32ToF16(v[i]);
    t.bytes.resize(h.size() * 2);
    std::memcpy(t.bytes.data(), h.data(), t.bytes.size());
  }
  t.dev = Upload(gpu, t.bytes);
  return t;
}

const char* Name(DType d) {
  return d == DType::kF32 ? "F32" : d == DType::kBF16 ? "BF16" : "F16";
}

// Finite values around the rounding edges of bf16 and f16, infinities and
// quiet NaNs (sign kept), plus random values.
std::vector<float> SpecialFloats(int64_t random_tail, uint32_t seed) {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          1.00390625f,     // bf16 tie, even below
                          1.01171875f,     // bf16 tie, odd below
                          1.0009765625f,   // f16 ulp
                          1.00048828125f,  // f16 tie
                          65504.0f,
                          65519.0f,
                          65520.0f,  // f16 overflow tie -> inf
                          -70000.0f,
                          1e-8f,
                          5.9604645e-8f,
                          3e-5f,
                          1e-40f,  // f32 subnormal
                          -1e-45f,
                          3.3895314e38f,
                          std::numeric_limits<float>::max(),
                          kInf,
                          -kInf,
                          std::bit_cast<float>(0x7fc00000u),
                          std::bit_cast<float>(0xffc00000u)};
  std::vector<float> r = RandomFloats(random_tail, seed, -100.0f, 100.0f);
  v.insert(v.end(), r.begin(), r.end());
  return v;
}

// ---- Elementwise
// -------------------------------------------------------------

TEST(CudaOps, AddScaleSetZeroExact) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  for (int64_t n : {1, 7, 33, 1000, 65537}) {
    const std::vector<float> x = RandomFloats(n, 1 + n, -3.0f, 3.0f);
    std::vector<float> y = RandomFloats(n, 2 + n, -3.0f, 3.0f);
    auto dx = Upload(*gpu, x);
    auto dy = Upload(*gpu, y);
    gpu->Add(dx.data(), dy.data(), n);
    cpu->Add(x.data(), y.data(), n);
    ExpectBits(Download(*gpu, dy), y, "add n=" + std::to_string(n));
    gpu->Scale(dy.data(), n, 0.37f);
    cpu->Scale(y.data(), n, 0.37f);
    ExpectBits(Download(*gpu, dy), y, "scale n=" + std::to_string(n));
    gpu->SetZero(dy.data(), n);
    cpu->SetZero(y.data(), n);
    ExpectBits(Download(*gpu, dy), y, "set zero n=" + std::to_string(n));
  }
}

TEST(CudaOps, ClampAndRoundToBf16Strided) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  for (int64_t cols : {1, 7, 33, 1000}) {
    const int64_t rows = 5, ld = cols + 3;
    std::vector<float> x = SpecialFloats(rows * ld, 7);
    x.resize(static_cast<size_t>(rows * ld));
    auto dx = Upload(*gpu, x);
    gpu->Clamp(dx.data(), rows, cols, ld, -2.5f, 60000.0f);
    cpu->Clamp(x.data(), rows, cols, ld, -2.5f, 60000.0f);
    ExpectBits(Download(*gpu, dx), x, "clamp cols=" + std::to_string(cols));

    std::vector<float> y = SpecialFloats(rows * ld, 8);
    y.resize(static_cast<size_t>(rows * ld));
    y.back() = std::bit_cast<float>(0x7fc12345u);  // NaN with a payload
    auto dy = Upload(*gpu, y);
    gpu->RoundToBf16(dy.data(), rows, cols, ld);
    cpu->RoundToBf16(y.data(), rows, cols, ld);
    ExpectBits(Download(*gpu, dy), y, "bf16 cols=" + std::to_string(cols));
  }
}

TEST(CudaOps, DeinterleaveBlocksExact) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  for (int64_t width : {1, 16, 20}) {
    const int64_t rows = 7, groups = 4, parts = 3,
                  cols = groups * parts * width, ldx = cols + 3, ldy = cols + 5;
    std::vector<float> x = SpecialFloats(rows * ldx, 9);
    x.resize(static_cast<size_t>(rows * ldx));
    std::vector<float> y(static_cast<size_t>(rows * ldy), -7.0f);
    auto dx = Upload(*gpu, x);
    auto dy = Upload(*gpu, y);
    gpu->DeinterleaveBlocks(dx.data(), ldx, rows, groups, parts, width,
                            dy.data(), ldy);
    cpu->DeinterleaveBlocks(x.data(), ldx, rows, groups, parts, width, y.data(),
                            ldy);
    ExpectBits(Download(*gpu, dy), y,
               "deinterleave width=" + std::to_string(width));
  }
}

TEST(CudaOps, ConvertExact) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  const std::vector<float> x = SpecialFloats(1000, 9);
  const int64_t n = static_cast<int64_t>(x.size());
  auto dx = Upload(*gpu, x);
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int64_t es = d == DType::kF32 ? 4 : 2;
    std::vector<uint8_t> want(static_cast<size_t>(n * es));
    cpu->ConvertFromF32(x.data(), want.data(), d, n);
    auto dd = Zeros<uint8_t>(*gpu, n * es);
    gpu->ConvertFromF32(dx.data(), dd.data(), d, n);
    const std::vector<uint8_t> got = Download(*gpu, dd);
    ExpectBits(got, want, std::string("from f32 to ") + Name(d));

    // And back (widening is exact).
    std::vector<float> back_want(static_cast<size_t>(n));
    cpu->ConvertToF32(want.data(), d, back_want.data(), n);
    auto db = Zeros<float>(*gpu, n);
    gpu->ConvertToF32(dd.data(), d, db.data(), n);
    ExpectBits(Download(*gpu, db), back_want,
               std::string("to f32 from ") + Name(d));
  }
  // A NaN with a payload to f16: a NaN of the same sign (the payload bits
  // kept are the host conversion's business).
  const std::vector<float> nan = {std::bit_cast<float>(0x7fc12345u),
                                  std::bit_cast<float>(0xff812345u)};
  auto dn = Upload(*gpu, nan);
  auto dh = Zeros<uint16_t>(*gpu, 2);
  gpu->ConvertFromF32(dn.data(), dh.data(), DType::kF16, 2);
  const std::vector<uint16_t> h = Download(*gpu, dh);
  EXPECT_TRUE(std::isnan(F16ToF32(h[0])) && !(h[0] & 0x8000)) << h[0];
  EXPECT_TRUE(std::isnan(F16ToF32(h[1])) && (h[1] & 0x8000)) << h[1];
}

TEST(CudaOps, ActivationsAndSoftcap) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  const double tol = 32 * kU;
  for (int64_t n : {1, 7, 33, 1000, 4099}) {
    std::vector<float> x0 = RandomFloats(n, 11 + n, -9.0f, 9.0f);
    x0[0] = 0.0f;
    for (ActivationFn fn : {ActivationFn::kSilu, ActivationFn::kGeluTanh,
                            ActivationFn::kGeluExact, ActivationFn::kRelu,
                            ActivationFn::kReluSquared}) {
      std::vector<float> x = x0;
      auto dx = Upload(*gpu, x);
      gpu->Activation(fn, dx.data(), n);
      cpu->Activation(fn, x.data(), n);
      const std::vector<float> got = Download(*gpu, dx);
      const std::string what = "activation " +
                               std::to_string(static_cast<int>(fn)) +
                               " n=" + std::to_string(n);
      if (fn == ActivationFn::kRelu || fn == ActivationFn::kReluSquared)
        ExpectBits(got, x, what);
      else
        ExpectClose(got, x, tol, what);
    }
    std::vector<float> x = RandomFloats(n, 12 + n, -100.0f, 100.0f);
    auto dx = Upload(*gpu, x);
    gpu->Softcap(dx.data(), n, 30.0f);
    cpu->Softcap(x.data(), n, 30.0f);
    ExpectClose(Download(*gpu, dx), x, tol, "softcap n=" + std::to_string(n));
  }
}

TEST(CudaOps, GatedActivationStrided) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  for (int64_t n : {1, 7, 33, 1000}) {
    const int64_t rows = 5;
    // A fused [gate | up] buffer: gate at column 0, up at column n + 1.
    const int64_t rs = 2 * n + 3;
    const std::vector<float> gu = RandomFloats(rows * rs, 21 + n, -6.0f, 6.0f);
    auto dgu = Upload(*gpu, gu);
    for (ActivationFn fn : {ActivationFn::kSilu, ActivationFn::kGeluTanh,
                            ActivationFn::kGeluExact, ActivationFn::kRelu,
                            ActivationFn::kReluSquared}) {
      std::vector<float> want(static_cast<size_t>(rows * n));
      cpu->GatedActivation(fn, gu.data(), rs, gu.data() + n + 1, rs,
                           want.data(), rows, n);
      auto dout = Zeros<float>(*gpu, rows * n);
      gpu->GatedActivation(fn, dgu.data(), rs, dgu.data() + n + 1, rs,
                           dout.data(), rows, n);
      const std::vector<float> got = Download(*gpu, dout);
      const std::string what = "gated " + std::to_string(static_cast<int>(fn)) +
                               " n=" + std::to_string(n);
      if (fn == ActivationFn::kRelu || fn == ActivationFn::kReluSquared)
        ExpectBits(got, want, what);
      else
        ExpectClose(got, want, 32 * kU, what);
    }
  }
}

TEST(CudaOps, ClampedSwigluAndSigmoidGate) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  for (int64_t n : {1, 7, 33, 1000}) {
    const int64_t rows = 3, rs = 2 * n + 5;
    const std::vector<float> gu = RandomFloats(rows * rs, 31 + n, -9.0f, 9.0f);
    auto dgu = Upload(*gpu, gu);
    std::vector<float> want(static_cast<size_t>(rows * n));
    cpu->ClampedSwiglu(gu.data(), rs, want.data(), rows, n, 1.702f, 7.0f);
    auto dout = Zeros<float>(*gpu, rows * n);
    gpu->ClampedSwiglu(dgu.data(), rs, dout.data(), rows, n, 1.702f, 7.0f);
    // g * alpha is rounded alike on both sides: only exp differs.
    ExpectClose(Download(*gpu, dout), want, 32 * kU,
                "clamped swiglu n=" + std::to_string(n));

    const int64_t cols = n, ldy = n + 2;
    const std::vector<float> x = RandomFloats(rows * cols, 32 + n);
    const std::vector<float> g = RandomFloats(rows, 33 + n, -5.0f, 5.0f);
    std::vector<float> y = RandomFloats(rows * ldy, 34 + n);
    auto dx = Upload(*gpu, x);
    auto dg = Upload(*gpu, g);
    auto dy = Upload(*gpu, y);
    gpu->SigmoidGateAddRows(dx.data(), dg.data(), rows, cols, dy.data(), ldy);
    cpu->SigmoidGateAddRows(x.data(), g.data(), rows, cols, y.data(), ldy);
    ExpectClose(Download(*gpu, dy), y, 32 * kU,
                "sigmoid gate n=" + std::to_string(n));
  }
}

// ---- Norms
// -------------------------------------------------------------------

TEST(CudaOps, RmsNorm) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  for (int64_t dim : {1, 7, 33, 65, 512, 1000, 4099}) {
    for (int64_t rows : {1, 5, 17}) {
      const std::vector<float> x =
          RandomFloats(rows * dim, 41 + dim + rows, -4.0f, 4.0f);
      const std::vector<float> w = RandomFloats(dim, 42 + dim, -2.0f, 2.0f);
      auto dx = Upload(*gpu, x);
      for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
        const Typed tw = MakeTyped(*gpu, w, d);
        for (float offset : {0.0f, 1.0f}) {
          for (bool null_w : {false, true}) {
            const std::string what = std::string("rms norm ") + Name(d) +
                                     " dim=" + std::to_string(dim) +
                                     " rows=" + std::to_string(rows) +
                                     " offset=" + std::to_string(offset) +
                                     (null_w ? " (no w)" : "");
            std::vector<float> want(x.size());
            cpu->RmsNorm(x.data(), null_w ? nullptr : tw.host(), d, offset,
                         1e-6f, want.data(), rows, dim);
            auto dy = Zeros<float>(*gpu, rows * dim);
            gpu->RmsNorm(dx.data(), null_w ? nullptr : tw.device(), d, offset,
                         1e-6f, dy.data(), rows, dim);
            ExpectClose(Download(*gpu, dy), want, 8 * kU, what);
          }
        }
      }
      // In place (x and y alias).
      std::vector<float> want = x;
      const Typed tw = MakeTyped(*gpu, w, DType::kBF16);
      cpu->RmsNorm(want.data(), tw.host(), DType::kBF16, 0.0f, 1e-5f,
                   want.data(), rows, dim);
      auto dy = Upload(*gpu, x);
      gpu->RmsNorm(dy.data(), tw.device(), DType::kBF16, 0.0f, 1e-5f, dy.data(),
                   rows, dim);
      ExpectClose(Download(*gpu, dy), want, 8 * kU,
                  "rms norm in place dim=" + std::to_string(dim));
    }
  }
}

TEST(CudaOps, RmsNormBf16) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  for (int64_t dim : {1, 7, 65, 1000, 4099}) {
    const int64_t rows = 9;
    const std::vector<float> x =
        RandomFloats(rows * dim, 51 + dim, -4.0f, 4.0f);
    const Typed w =
        MakeTyped(*gpu, RandomFloats(dim, 52 + dim, 0.5f, 2.0f), DType::kBF16);
    std::vector<float> want(x.size());
    cpu->RmsNormBf16(x.data(), w.host(), 1e-6f, want.data(), rows, dim);
    auto dx = Upload(*gpu, x);
    auto dy = Zeros<float>(*gpu, rows * dim);
    gpu->RmsNormBf16(dx.data(), w.device(), 1e-6f, dy.data(), rows, dim);
    const std::vector<float> got = Download(*gpu, dy);
    // Equal unless the inverse root moved by an ulp (see the top), which
    // can flip either bf16 rounding by one bf16 ulp (2^-8 relative) each:
    // all within 2^-7, and nearly all identical.
    ExpectClose(got, want, 1.0 / 64,
                "rms norm bf16 dim=" + std::to_string(dim));
    int64_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
    EXPECT_LE(differ, static_cast<int64_t>(got.size()) / 1000)
        << "rms norm bf16 dim=" << dim;
  }
}

TEST(CudaOps, RmsNormRowsStrided) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  for (int64_t dim : {7, 64, 128, 1000}) {
    for (int64_t groups : {1, 3}) {
      const int64_t tokens = 7, ld = groups * dim + 5;
      std::vector<float> x = RandomFloats(tokens * ld, 61 + dim + groups);
      const std::vector<float> w = RandomFloats(dim, 62 + dim, 0.0f, 2.0f);
      for (DType d : {DType::kF32, DType::kBF16}) {
        const Typed tw = MakeTyped(*gpu, w, d);
        std::vector<float> want = x;
        const float offset = groups > 1 ? 1.0f : 0.0f;  // Gemma 3's (1 + w)
        cpu->RmsNormRows(want.data(), tokens, ld, groups, dim, tw.host(), d,
                         offset, 1e-6f);
        auto dx = Upload(*gpu, x);
        gpu->RmsNormRows(dx.data(), tokens, ld, groups, dim, tw.device(), d,
                         offset, 1e-6f);
        // The padding columns stay as they were (compared too).
        ExpectClose(Download(*gpu, dx), want, 8 * kU,
                    std::string("rms norm rows ") + Name(d) +
                        " dim=" + std::to_string(dim) +
                        " groups=" + std::to_string(groups));
      }
    }
  }
}

TEST(CudaOps, LayerNorm) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  for (int64_t dim : {1, 7, 33, 65, 1000, 4099}) {
    const int64_t rows = 6;
    const std::vector<float> x =
        RandomFloats(rows * dim, 71 + dim, -3.0f, 5.0f);
    const std::vector<float> w = RandomFloats(dim, 72 + dim, -2.0f, 2.0f);
    const std::vector<float> b = RandomFloats(dim, 73 + dim, -1.0f, 1.0f);
    auto dx = Upload(*gpu, x);
    for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
      const Typed tw = MakeTyped(*gpu, w, d), tb = MakeTyped(*gpu, b, d);
      for (bool with_wb : {true, false}) {
        // LayerNorm1P's (1 + w) where there is a gain.
        const float offset = with_wb ? 1.0f : 0.0f;
        std::vector<float> want(x.size());
        cpu->LayerNorm(x.data(), with_wb ? tw.host() : nullptr,
                       with_wb ? tb.host() : nullptr, d, offset, 1e-5f,
                       want.data(), rows, dim);
        auto dy = Zeros<float>(*gpu, rows * dim);
        gpu->LayerNorm(dx.data(), with_wb ? tw.device() : nullptr,
                       with_wb ? tb.device() : nullptr, d, offset, 1e-5f,
                       dy.data(), rows, dim);
        // |v w| up to ~ 8 (the normalised value times |w| <= 2): 4 ulp
        // relative of the product plus the bias addition.
        ExpectClose(Download(*gpu, dy), want, 4 * kU * 8.0 + 2 * kU,
                    std::string("layer norm ") + Name(d) + " dim=" +
                        std::to_string(dim) + (with_wb ? "" : " (no w, b)"));
      }
    }
  }
}

// q/k LayerNorms on strided rows: per head (groups = heads) and shared.
TEST(CudaOps, LayerNormRows) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  const int64_t tokens = 9, heads = 4, hd = 16, ld = heads * hd + 24;
  for (int64_t groups : {heads, int64_t{1}}) {
    const int64_t dim = heads * hd / groups;
    const std::vector<float> x = RandomFloats(tokens * ld, 81, -3.0f, 5.0f);
    const std::vector<float> w = RandomFloats(dim, 82, -2.0f, 2.0f);
    const std::vector<float> b = RandomFloats(dim, 83, -1.0f, 1.0f);
    const Typed tw = MakeTyped(*gpu, w, DType::kF32),
                tb = MakeTyped(*gpu, b, DType::kF32);
    std::vector<float> want = x;
    cpu->LayerNormRows(want.data(), tokens, ld, groups, dim, tw.host(),
                       tb.host(), DType::kF32, 1e-5f);
    auto dx = Upload(*gpu, x);
    gpu->LayerNormRows(dx.data(), tokens, ld, groups, dim, tw.device(),
                       tb.device(), DType::kF32, 1e-5f);
    ExpectClose(Download(*gpu, dx), want, 4 * kU * 8.0 + 2 * kU,
                "layer norm rows groups=" + std::to_string(groups));
  }
}

// ---- RoPE
// --------------------------------------------------------------------

TEST(CudaOps, RopeTablesAndApply) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  for (int64_t half : {1, 16, 32, 64}) {
    std::vector<int32_t> pos = {0, 1, 2, 7, 100, 4095, 32767, 131071, 5};
    const int64_t tokens = static_cast<int64_t>(pos.size());
    std::vector<float> inv(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i)
      inv[i] = static_cast<float>(
          1.0 / std::pow(10000.0, 2.0 * static_cast<double>(i) /
                                      static_cast<double>(2 * half)));
    for (float scaling : {1.0f, 1.2f}) {
      std::vector<float> c(static_cast<size_t>(tokens * half)), s(c.size());
      cpu->RopeTables(pos.data(), tokens, inv.data(), half, scaling, c.data(),
                      s.data());
      auto dpos = Upload(*gpu, pos);
      auto dinv = Upload(*gpu, inv);
      auto dc = Zeros<float>(*gpu, tokens * half);
      auto ds = Zeros<float>(*gpu, tokens * half);
      gpu->RopeTables(dpos.data(), tokens, dinv.data(), half, scaling,
                      dc.data(), ds.data());
      const std::string what = "rope tables half=" + std::to_string(half) +
                               " scaling=" + std::to_string(scaling);
      ExpectClose(Download(*gpu, dc), c, 8 * kU * scaling, what + " cos");
      ExpectClose(Download(*gpu, ds), s, 8 * kU * scaling, what + " sin");

      if (scaling != 1.0f) continue;
      // Apply with the CPU's tables on both sides; a partial rotary head
      // (head_dim > 2 half) and padded rows.
      for (int64_t head_dim : {2 * half, 2 * half + 6}) {
        const int64_t heads = 3, rs = heads * head_dim + 4;
        std::vector<float> x = RandomFloats(tokens * rs, 81 + half + head_dim);
        auto dx = Upload(*gpu, x);
        auto dct = Upload(*gpu, c);
        auto dst = Upload(*gpu, s);
        gpu->ApplyRope(dx.data(), tokens, heads, head_dim, rs, dct.data(),
                       dst.data(), half);
        cpu->ApplyRope(x.data(), tokens, heads, head_dim, rs, c.data(),
                       s.data(), half);
        ExpectClose(Download(*gpu, dx), x, 4 * kU,
                    "apply rope half=" + std::to_string(half) +
                        " head_dim=" + std::to_string(head_dim));
      }
    }
  }
}

// ---- Gather / scatter
// ----------------------------------------------------------

TEST(CudaOps, GatherEmbeddingsExact) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  for (int64_t dim : {1, 7, 33, 1000}) {
    const int64_t vocab = 53;
    const std::vector<int32_t> ids = {0, 52, 7, 7, 13, 1, 52, 30, 2};
    const int64_t tokens = static_cast<int64_t>(ids.size());
    const std::vector<float> table = RandomFloats(vocab * dim, 91 + dim);
    auto dids = Upload(*gpu, ids);
    for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
      const Typed t = MakeTyped(*gpu, table, d);
      std::vector<float> want(static_cast<size_t>(tokens * dim));
      cpu->Gather(t.host(), d, ids.data(), tokens, dim, want.data());
      for (bool device_ids : {true, false}) {
        auto dout = Zeros<float>(*gpu, tokens * dim);
        gpu->Gather(t.device(), d, device_ids ? dids.data() : ids.data(),
                    tokens, dim, dout.data());
        ExpectBits(Download(*gpu, dout), want,
                   std::string("gather ") + Name(d) +
                       " dim=" + std::to_string(dim) +
                       (device_ids ? " (device ids)" : " (host ids)"));
      }
    }
  }
}

TEST(CudaOps, GatherAndScatterAddRowsExact) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  for (int64_t cols : {1, 7, 33, 1000}) {
    const int64_t src_rows = 40, ldx = cols + 3, ldy = cols + 1;
    // Distinct rows, in no particular order.
    std::vector<int32_t> rows(static_cast<size_t>(src_rows));
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), std::mt19937(101 + cols));
    rows.resize(17);
    const int64_t n = static_cast<int64_t>(rows.size());
    const std::vector<float> x = RandomFloats(src_rows * ldx, 102 + cols);
    auto dx = Upload(*gpu, x);
    auto drows = Upload(*gpu, rows);
    std::vector<float> want(static_cast<size_t>(n * cols));
    cpu->GatherRows(x.data(), ldx, rows.data(), n, cols, want.data());
    auto dout = Zeros<float>(*gpu, n * cols);
    gpu->GatherRows(dx.data(), ldx, drows.data(), n, cols, dout.data());
    ExpectBits(Download(*gpu, dout), want,
               "gather rows cols=" + std::to_string(cols));

    const std::vector<float> xs = RandomFloats(n * cols, 103 + cols);
    const std::vector<float> w = RandomFloats(n, 104 + cols, 0.0f, 1.0f);
    auto dxs = Upload(*gpu, xs);
    auto dw = Upload(*gpu, w);
    for (bool null_w : {false, true}) {
      std::vector<float> y = RandomFloats(src_rows * ldy, 105 + cols);
      auto dy = Upload(*gpu, y);
      cpu->ScatterAddRows(xs.data(), rows.data(), null_w ? nullptr : w.data(),
                          n, cols, y.data(), ldy);
      gpu->ScatterAddRows(dxs.data(), drows.data(),
                          null_w ? nullptr : dw.data(), n, cols, dy.data(),
                          ldy);
      ExpectBits(Download(*gpu, dy), y,
                 "scatter-add rows cols=" + std::to_string(cols) +
                     (null_w ? " (no weights)" : ""));
    }
  }
}

// ---- Mixture of experts
// ----------------------------------------------------------

// Logits [tokens, ld]: per row a shuffled ladder of distinct values 8 /
// experts apart (no near-ties between the sides' rounding); columns past
// `experts` hold garbage that must be ignored.
std::vector<float> LadderLogits(int64_t tokens, int64_t experts, int64_t ld,
                                uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(static_cast<size_t>(tokens * ld), 1e30f);
  std::vector<int> perm(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < experts; ++j)
      x[t * ld + j] = static_cast<float>(perm[j]) * (8.0f / experts) - 4.0f;
  }
  return x;
}

void CheckRoute(Backend& gpu, Backend& cpu, const std::vector<float>& x,
                int64_t tokens, int64_t experts, int64_t ld, int64_t k,
                RouterKind kind, bool renorm, const std::string& what) {
  std::vector<int32_t> ids(static_cast<size_t>(tokens * k));
  std::vector<float> w(ids.size());
  RouteOp op;
  op.kind = kind;
  op.renormalize = renorm;
  ASSERT_TRUE(
      cpu.TopKRoute(x.data(), tokens, experts, ld, k, op, ids.data(), w.data())
          .ok());
  auto dx = Upload(gpu, x);
  auto dids = Zeros<int32_t>(gpu, tokens * k);
  auto dw = Zeros<float>(gpu, tokens * k);
  ASSERT_TRUE(gpu.TopKRoute(dx.data(), tokens, experts, ld, k, op, dids.data(),
                            dw.data())
                  .ok());
  ExpectBits(Download(gpu, dids), ids, what + " ids");
  // A softmax over n values: (n + 4) u each side (see kernels_moe_test), plus
  // the exp functions' 4 ulp: renormalised or not, within 32u + 2 n u.
  ExpectClose(Download(gpu, dw), w,
              32 * kU + 2.0 * static_cast<double>(experts) * kU,
              what + " weights");
}

TEST(CudaOps, TopKRoute) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  for (int64_t experts : {1, 8, 60, 128, 1000, 1024}) {
    for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{8}, experts}) {
      if (k > experts) continue;
      const int64_t tokens = 37, ld = experts + 3;
      const std::vector<float> x =
          LadderLogits(tokens, experts, ld, 111 + experts + k);
      for (RouterKind kind :
           {RouterKind::kSoftmaxTopK, RouterKind::kTopKSoftmax})
        for (bool renorm : {false, true})
          CheckRoute(*gpu, *cpu, x, tokens, experts, ld, k, kind, renorm,
                     "route experts=" + std::to_string(experts) +
                         " k=" + std::to_string(k) +
                         " kind=" + std::to_string(static_cast<int>(kind)) +
                         (renorm ? " renorm" : ""));
    }
  }
}

TEST(CudaOps, TopKRouteTiesGoToTheLowerExpert) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  // Few distinct values: many exact ties, identical on both sides.
  const int64_t tokens = 9, experts = 64, k = 8;
  std::mt19937 rng(121);
  std::vector<float> x(static_cast<size_t>(tokens * experts));
  for (float& v : x) v = static_cast<float>(rng() % 4) * 0.5f;
  for (RouterKind kind : {RouterKind::kSoftmaxTopK, RouterKind::kTopKSoftmax})
    CheckRoute(*gpu, *cpu, x, tokens, experts, experts, k, kind, true,
               "ties kind=" + std::to_string(static_cast<int>(kind)));
}

void CheckGroup(Backend& gpu, Backend& cpu, const std::vector<int32_t>& ids,
                int64_t tokens, int64_t k, int64_t experts,
                const std::string& what) {
  const int64_t n = tokens * k;
  const std::vector<float> w = RandomFloats(n, 131 + static_cast<uint32_t>(n));
  std::vector<int32_t> off(static_cast<size_t>(experts + 1)), rows(n),
      host_off(off.size());
  std::vector<float> rw(static_cast<size_t>(n));
  ASSERT_TRUE(cpu.GroupByExpert(ids.data(), w.data(), tokens, k, experts,
                                off.data(), rows.data(), rw.data(),
                                host_off.data())
                  .ok());
  auto dids = Upload(gpu, ids);
  auto dw = Upload(gpu, w);
  auto doff = Zeros<int32_t>(gpu, experts + 1);
  auto drows = Zeros<int32_t>(gpu, n);
  auto drw = Zeros<float>(gpu, n);
  std::vector<int32_t> got_host_off(off.size(), -7);
  const Status s =
      gpu.GroupByExpert(dids.data(), dw.data(), tokens, k, experts, doff.data(),
                        drows.data(), drw.data(), got_host_off.data());
  ASSERT_TRUE(s.ok()) << what << ": " << s.message();
  ExpectBits(Download(gpu, doff), off, what + " offsets");
  ExpectBits(got_host_off, off, what + " host offsets");
  ExpectBits(Download(gpu, drows), rows, what + " rows");
  ExpectBits(Download(gpu, drw), rw, what + " row weights");
}

TEST(CudaOps, GroupByExpertExact) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  struct Shape {
    int64_t tokens, k, experts;
  };
  for (const Shape& sh :
       {Shape{1, 1, 1}, Shape{7, 2, 4}, Shape{33, 8, 60}, Shape{1000, 4, 128},
        Shape{4099, 8, 1024}, Shape{131072, 8, 1024}, Shape{65, 3, 300}}) {
    std::mt19937 rng(141 + sh.tokens + sh.experts);
    std::vector<int32_t> ids(static_cast<size_t>(sh.tokens * sh.k));
    // Skewed: half the pairs go to a few experts (long runs per expert).
    for (int32_t& e : ids)
      e = static_cast<int32_t>(rng() % 2
                                   ? rng() % std::min<int64_t>(3, sh.experts)
                                   : rng() % sh.experts);
    CheckGroup(*gpu, *cpu, ids, sh.tokens, sh.k, sh.experts,
               "group tokens=" + std::to_string(sh.tokens) +
                   " k=" + std::to_string(sh.k) +
                   " experts=" + std::to_string(sh.experts));
  }
  // No tokens at all: every offset 0.
  CheckGroup(*gpu, *cpu, {}, 0, 2, 16, "group of nothing");
}

TEST(CudaOps, GroupByExpertRejectsABadId) {
  auto gpu = REQUIRE_GPU();
  const int64_t tokens = 1000, k = 2, experts = 16;
  for (int32_t bad_id : {-1, 16, 1 << 30}) {
    std::vector<int32_t> ids(static_cast<size_t>(tokens * k));
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<int32_t>(i % experts);
    ids[321 * k + 1] = bad_id;  // token 321, slot 1
    auto dids = Upload(*gpu, ids);
    auto dw = Zeros<float>(*gpu, tokens * k);
    auto doff = Zeros<int32_t>(*gpu, experts + 1);
    auto drows = Zeros<int32_t>(*gpu, tokens * k);
    auto drw = Zeros<float>(*gpu, tokens * k);
    std::vector<int32_t> host_off(static_cast<size_t>(experts + 1));
    const Status s = gpu->GroupByExpert(dids.data(), dw.data(), tokens, k,
                                        experts, doff.data(), drows.data(),
                                        drw.data(), host_off.data());
    ASSERT_FALSE(s.ok()) << "id " << bad_id;
    EXPECT_NE(s.message().find("token 321"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("slot 1"), std::string::npos) << s.message();
    // The backend stays usable: a good grouping afterwards works.
    ids[321 * k + 1] = 0;
    auto cpu = MakeCpu();
    CheckGroup(*gpu, *cpu, ids, tokens, k, experts, "after a bad id");
  }
}

// ---- Head
// ------------------------------------------------------------------------

TEST(CudaOps, LogSumExpAndTargetLogProbs) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  for (int64_t vocab : {1, 7, 1000, 32001, 151936}) {
    const int64_t rows = 5;
    std::vector<float> x =
        RandomFloats(rows * vocab, 151 + vocab, -20.0f, 20.0f);
    if (vocab > 1) {
      x[vocab] = 80.0f;  // row 1: one dominant logit
      std::fill(x.begin() + 2 * vocab, x.begin() + 3 * vocab, -kInf);  // row 2
      x[3 * vocab + vocab / 2] = kInf;  // row 3: +inf
    }
    std::vector<double> want(static_cast<size_t>(rows)), got(want.size());
    cpu->LogSumExp(x.data(), rows, vocab, want.data());
    auto dx = Upload(*gpu, x);
    gpu->LogSumExp(dx.data(), rows, vocab, got.data());
    ASSERT_TRUE(gpu->Synchronize().ok());
    for (int64_t r = 0; r < rows; ++r) {
      if (std::isinf(want[r])) {
        EXPECT_EQ(got[r], want[r]) << "vocab=" << vocab << " row " << r;
      } else {
        EXPECT_NEAR(got[r], want[r], 1e-6) << "vocab=" << vocab << " row " << r;
      }
    }
    std::vector<int32_t> targets(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      targets[r] = static_cast<int32_t>((r * 7919) % vocab);
    if (vocab > 1) {
      targets[2] = 0;
      targets[3] = static_cast<int32_t>(vocab - 1);
    }
    std::vector<double> lp_want(want.size()), lp_got(want.size());
    cpu->TargetLogProbs(x.data(), rows, vocab, targets.data(), lp_want.data());
    gpu->TargetLogProbs(dx.data(), rows, vocab, targets.data(), lp_got.data());
    ASSERT_TRUE(gpu->Synchronize().ok());
    for (int64_t r = 0; r < rows; ++r) {
      if (!std::isfinite(lp_want[r])) {
        // -inf - (-inf) etc.: the same IEEE result on both sides.
        EXPECT_EQ(std::isnan(lp_got[r]), std::isnan(lp_want[r])) << r;
        if (!std::isnan(lp_want[r])) {
          EXPECT_EQ(lp_got[r], lp_want[r]) << r;
        }
      } else {
        EXPECT_NEAR(lp_got[r], lp_want[r], 1e-6)
            << "vocab=" << vocab << " row " << r;
      }
    }
  }
}

// ---- Capture
// ---------------------------------------------------------------------

TEST(CudaOps, GatherRowsConvertExact) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  for (int64_t cols : {1, 7, 33, 1000}) {
    const int64_t src_rows = 12, ld = cols + 2;
    std::vector<float> src = SpecialFloats(src_rows * ld, 161 + cols);
    src.resize(static_cast<size_t>(src_rows * ld));
    const std::vector<int32_t> index = {3, 0, 11, 3, 7};
    const int64_t n = static_cast<int64_t>(index.size());
    auto dsrc = Upload(*gpu, src);
    auto dindex = Upload(*gpu, index);
    for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
      const int64_t bytes = n * cols * (d == DType::kF32 ? 4 : 2);
      std::vector<uint8_t> want(static_cast<size_t>(bytes));
      cpu->GatherRowsConvert(src.data(), ld, index.data(), n, cols, want.data(),
                             d);
      // Into device memory.
      auto ddst = Zeros<uint8_t>(*gpu, bytes);
      gpu->GatherRowsConvert(dsrc.data(), ld, dindex.data(), n, cols,
                             ddst.data(), d);
      ExpectBits(
          Download(*gpu, ddst), want,
          std::string("capture ") + Name(d) + " cols=" + std::to_string(cols));
      // Straight into mapped pinned host memory.
      auto pinned = gpu->Allocate(bytes, MemoryKind::kPinnedHost);
      ASSERT_TRUE(pinned.ok()) << pinned.status().message();
      gpu->GatherRowsConvert(dsrc.data(), ld, dindex.data(), n, cols,
                             pinned->data(), d);
      ASSERT_TRUE(gpu->Synchronize().ok());
      std::vector<uint8_t> got(static_cast<size_t>(bytes));
      std::memcpy(got.data(), pinned->data(), got.size());
      ExpectBits(got, want,
                 std::string("capture to pinned ") + Name(d) +
                     " cols=" + std::to_string(cols));
    }
  }
}

TEST(CudaOps, SegmentReduceExact) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  for (int64_t cols : {1, 7, 33, 1000}) {
    const int64_t src_rows = 300, ld = cols + 1;
    // Values of very different magnitudes: the sum's order matters.
    std::vector<float> src = RandomFloats(src_rows * ld, 171 + cols);
    for (size_t i = 0; i < src.size(); i += 5) src[i] *= 1e7f;
    // Overlapping, empty and single-row segments.
    const std::vector<int32_t> begin = {0, 5, 5, 299, 100, 10};
    const std::vector<int32_t> end = {300, 5, 6, 300, 250, 290};
    const int64_t segs = static_cast<int64_t>(begin.size());
    auto dsrc = Upload(*gpu, src);
    auto dbegin = Upload(*gpu, begin);
    auto dend = Upload(*gpu, end);
    for (bool max : {false, true}) {
      std::vector<double> want(static_cast<size_t>(segs * cols));
      for (size_t i = 0; i < want.size(); ++i)
        want[i] = static_cast<double>(i % 13) - 6.5;  // accumulated into
      auto dout = Upload(*gpu, want);
      for (bool accumulate : {true, false, true}) {
        cpu->SegmentReduce(src.data(), ld, begin.data(), end.data(), segs, cols,
                           max, accumulate, want.data());
        gpu->SegmentReduce(dsrc.data(), ld, dbegin.data(), dend.data(), segs,
                           cols, max, accumulate, dout.data());
        ExpectBits(Download(*gpu, dout), want,
                   std::string("segment ") + (max ? "max" : "sum") +
                       (accumulate ? " accumulate" : "") +
                       " cols=" + std::to_string(cols));
      }
    }
  }
}

}  // namespace
}  // namespace loom::cuda_test
