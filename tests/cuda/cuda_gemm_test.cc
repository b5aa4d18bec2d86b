// The CUDA backend's GEMM (cuBLASLt runner, src/backend/cuda/gemm.cc) and
// quantized decode (DecodeRows, kernels_gemm.cu) against the CPU backend's
// GEMM and the scalar decode reference (src/core/quant_codes.h).
//
// Tolerance of a GEMM element (both backends against each other), with
// u = 2^-24 and mag = sum_p |x_p w_p| + |bias| + |y_old| (accumulate):
//   - Both sides form the same products. x is rounded to the weight's
//     16-bit dtype the same way on both (round to nearest even: the CPU's
//     conversion and cuda::ConvertRows), and a product of two bf16 / f16
//     values is exact in f32 (at most 2 x 11 significand bits < 24). For f32
//     weights each product is rounded once (<= u |x w|).
//   - What differs is the order / grouping of the k + 2 f32 additions
//     (oneDNN's blocking vs cuBLASLt's tiles and split-k; the bias and
//     y_old added in another order). Any order of summing k + 2 terms in f32
//     errs by at most (k + 1) u sum|terms| (first order), so the CPU is
//     within (k + 2) u mag of the exact sum. Tensor-core MMAs may truncate
//     rather than round inside an instruction (up to 2u per addition): the
//     GPU is within 2 (k + 2) u mag. The difference is below
//     3 (k + 2) u mag; we allow 4 (k + 2) u mag.
// A wrong index, layout, dtype or a missing bias / accumulate term changes an
// element by about one |x_p w_p|, far above this; TF32 inputs (10 mantissa
// bits) would err by ~2^-11 |x w| per term, also above it for small k (and
// F32IsTrueF32 checks an exact case).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/backend/cuda/kernels.h"
#include "src/base/float16.h"
#include "src/core/quant_codes.h"
#include "tests/cuda/cuda_test_util.h"

namespace loom::cuda_test {
namespace {

constexpr double kU = 1.0 / (1 << 24);

// v stored in `dtype` (F32 / BF16 / F16), little-endian bytes.
std::vector<uint8_t> StoreAs(const std::vector<float>& v, DType dtype) {
  const int64_t es = DTypeSize(dtype);
  std::vector<uint8_t> out(v.size() * es);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h =
          dtype == DType::kBF16 ? F32ToBf16(v[i]) : F32ToF16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// The value `v` has once stored in `dtype`.
float RoundTo(float v, DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return Bf16ToF32(F32ToBf16(v));
    case DType::kF16:
      return F16ToF32(F32ToF16(v));
    default:
      return v;
  }
}

std::vector<uint8_t> RandomBytes(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint8_t> b(static_cast<size_t>(n));
  for (auto& v : b) v = static_cast<uint8_t>(g() & 0xFF);
  return b;
}

// Same bits, or both NaN (NaN payloads differ between CPU and GPU
// arithmetic).
bool SameValue(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}

// One GEMM's inputs, in host memory; RunOn uploads them to a backend.
struct GemmCase {
  int64_t m = 0;
  WeightOperand w;                   // data / scales filled by RunOn
  std::vector<uint8_t> w_bytes;      // as stored (dense: in w.format.layout)
  std::vector<uint8_t> scale_bytes;  // quantized block scales (may be empty)
  std::vector<float> x;              // [m, k]
  std::vector<float> y0;             // [m, ldy_eff]: y before the GEMM
  std::vector<uint8_t> bias_bytes;   // [n] in bias_dtype, empty = no bias
  DType bias_dtype = DType::kF32;
  int64_t ldy = 0;  // as in GemmOp (0 = n)
  bool accumulate = false;

  int64_t ld() const { return ldy == 0 ? w.n : ldy; }
  std::string Describe() const {
    return "m=" + std::to_string(m) + " n=" + std::to_string(w.n) +
           " k=" + std::to_string(w.k) + " " +
           std::string(FormatName(w.format.kind)) + " " +
           std::string(DTypeName(w.format.dtype)) + " -> " +
           std::string(DTypeName(w.gemm_dtype())) +
           (w.format.layout == MatrixLayout::kOutIn ? " [n,k]" : " [k,n]") +
           " ldy=" + std::to_string(ldy) +
           (bias_bytes.empty()
                ? std::string(" no bias")
                : " bias " + std::string(DTypeName(bias_dtype))) +
           (accumulate ? " accumulate" : "");
  }
};

// Runs `c` on `be` through the Backend interface, with workspaces of the
// sizes its Costs() give; returns y [m, ldy_eff].
std::vector<float> RunOn(Backend& be, const GemmCase& c) {
  const WeightOperand& w0 = c.w;
  auto w = Upload(be, c.w_bytes);
  auto scales = Upload(be, c.scale_bytes);
  auto x = Upload(be, c.x);
  auto y = Upload(be, c.y0);
  auto bias = Upload(be, c.bias_bytes);
  const KernelCosts costs = be.Costs();
  const DType dt = w0.gemm_dtype();
  const int64_t ws_bytes =
      costs.gemm_workspace ? costs.gemm_workspace(c.m, w0.k, dt) : 0;
  auto ws = Zeros<uint8_t>(be, std::max<int64_t>(ws_bytes, 64));
  const int64_t sp_bytes =
      costs.gemm_scratchpad
          ? costs.gemm_scratchpad(c.m, w0.n, w0.k, dt,
                                  w0.format.layout == MatrixLayout::kInOut)
          : 0;
  auto sp = Zeros<uint8_t>(be, std::max<int64_t>(sp_bytes, 64));
  be.SetGemmScratchpad(sp_bytes > 0 ? sp.data() : nullptr, sp_bytes);
  const int64_t dec_bytes =
      costs.weight_decode_workspace
          ? costs.weight_decode_workspace(w0.n, w0.k, w0.format.kind, dt)
          : 0;
  auto dec = Zeros<uint8_t>(be, std::max<int64_t>(dec_bytes, 64));
  be.SetWeightDecodeWorkspace(dec_bytes > 0 ? dec.data() : nullptr, dec_bytes);

  GemmOp op;
  op.x = x.data();
  op.m = c.m;
  op.w = w0;
  op.w.data = w.data();
  op.w.scales = c.scale_bytes.empty() ? nullptr : scales.data();
  op.bias = c.bias_bytes.empty() ? nullptr : bias.data();
  op.bias_dtype = c.bias_dtype;
  op.y = y.data();
  op.ldy = c.ldy;
  op.accumulate = c.accumulate;
  op.workspace = ws.data();
  be.Gemm(op);
  std::vector<float> out = Download(be, y);  // synchronises, checks errors
  be.SetGemmScratchpad(nullptr, 0);
  be.SetWeightDecodeWorkspace(nullptr, 0);
  return out;
}

// Bias values [n] as the GEMM reads them (0 when there is none).
std::vector<float> BiasValues(const GemmCase& c) {
  std::vector<float> b(static_cast<size_t>(c.w.n), 0.0f);
  if (c.bias_bytes.empty()) return b;
  for (int64_t j = 0; j < c.w.n; ++j) {
    if (c.bias_dtype == DType::kF32) {
      std::memcpy(&b[j], c.bias_bytes.data() + 4 * j, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, c.bias_bytes.data() + 2 * j, 2);
      b[j] = c.bias_dtype == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h);
    }
  }
  return b;
}

// got (CUDA) against want (CPU) with the tolerance of the file comment; wv
// [n, k] = the weight values the GEMM multiplies (in the compute dtype).
// Columns [n, ldy) of y must be untouched (bitwise).
void ExpectGemmClose(const GemmCase& c, const std::vector<float>& wv,
                     const std::vector<float>& got,
                     const std::vector<float>& want) {
  const int64_t m = c.m, n = c.w.n, k = c.w.k, ld = c.ld();
  const DType dt = c.w.gemm_dtype();
  ASSERT_EQ(got.size(), static_cast<size_t>(m * ld));
  ASSERT_EQ(want.size(), static_cast<size_t>(m * ld));
  const std::vector<float> bias = BiasValues(c);
  std::vector<double> xr(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m * k; ++i) xr[i] = RoundTo(c.x[i], dt);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double mag = std::abs(bias[j]);
      if (c.accumulate) mag += std::abs(c.y0[i * ld + j]);
      for (int64_t p = 0; p < k; ++p)
        mag += std::abs(xr[i * k + p] * wv[j * k + p]);
      const double tol = 4.0 * static_cast<double>(k + 2) * kU * mag;
      ASSERT_NEAR(got[i * ld + j], want[i * ld + j], tol)
          << c.Describe() << " at (" << i << ", " << j << ")";
    }
    for (int64_t j = n; j < ld; ++j)
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i * ld + j]),
                std::bit_cast<uint32_t>(c.y0[i * ld + j]))
          << c.Describe() << ": column " << j << " >= n written, row " << i;
  }
}

// A dense GEMM case with random values in [-1, 1); returns the weight
// values [n, k] in *wv.
GemmCase MakeDense(int64_t m, int64_t n, int64_t k, DType dt,
                   MatrixLayout layout, bool has_bias, DType bias_dt,
                   bool accumulate, int64_t ldy, uint32_t seed,
                   std::vector<float>* wv) {
  GemmCase c;
  c.m = m;
  c.w.format = WeightStorage{FormatKind::kDense, dt, layout};
  c.w.n = n;
  c.w.k = k;
  const std::vector<float> w = RandomFloats(n * k, seed);  // [n, k]
  wv->resize(static_cast<size_t>(n * k));
  std::vector<float> stored(static_cast<size_t>(n * k));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t p = 0; p < k; ++p) {
      (*wv)[j * k + p] = RoundTo(w[j * k + p], dt);
      stored[layout == MatrixLayout::kOutIn ? j * k + p : p * n + j] =
          w[j * k + p];
    }
  c.w_bytes = StoreAs(stored, dt);
  c.x = RandomFloats(m * k, seed + 1);
  c.ldy = ldy;
  c.y0 = RandomFloats(m * c.ld(), seed + 2);
  if (has_bias) c.bias_bytes = StoreAs(RandomFloats(n, seed + 3), bias_dt);
  c.bias_dtype = bias_dt;
  c.accumulate = accumulate;
  return c;
}

const DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
const MatrixLayout kLayouts[] = {MatrixLayout::kOutIn, MatrixLayout::kInOut};

// Every m, n, k of the sweep with every dtype and layout; bias (none / f32 /
// bf16 / f16), accumulate and ldy (0, n, n + 5) rotate with the case index.
TEST(CudaGemm, DenseMatchesCpu) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  ASSERT_NE(cpu, nullptr);
  const DType bias_types[] = {DType::kF32, DType::kF32, DType::kBF16,
                              DType::kF16};
  uint32_t idx = 0;
  for (int64_t m : {1, 7, 129})
    for (int64_t n : {1, 65, 300})
      for (int64_t k : {16, 72, 520})
        for (DType dt : kDTypes)
          for (MatrixLayout layout : kLayouts) {
            const bool has_bias = idx % 4 != 0;
            const bool accumulate = (idx / 4) % 2 == 1;
            const int64_t ldy =
                (idx / 8) % 3 == 0 ? 0 : ((idx / 8) % 3 == 1 ? n : n + 5);
            std::vector<float> wv;
            const GemmCase c =
                MakeDense(m, n, k, dt, layout, has_bias, bias_types[idx % 4],
                          accumulate, ldy, 1000 + 7 * idx, &wv);
            ++idx;
            SCOPED_TRACE(c.Describe());
            ExpectGemmClose(c, wv, RunOn(*gpu, c), RunOn(*cpu, c));
            if (HasFatalFailure()) return;
          }
}

// Every bias dtype with and without accumulate and ldy > n, one shape.
TEST(CudaGemm, BiasAccumulateAndLdy) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  ASSERT_NE(cpu, nullptr);
  uint32_t seed = 77;
  for (DType dt : kDTypes)
    for (MatrixLayout layout : kLayouts)
      for (int bias = 0; bias < 4; ++bias)
        for (bool acc : {false, true})
          for (int64_t ldy : {int64_t{0}, int64_t{68}}) {
            const DType bias_dt =
                bias == 1 ? DType::kF32
                          : (bias == 2 ? DType::kBF16 : DType::kF16);
            std::vector<float> wv;
            const GemmCase c = MakeDense(7, 65, 72, dt, layout, bias != 0,
                                         bias_dt, acc, ldy, seed += 5, &wv);
            SCOPED_TRACE(c.Describe());
            ExpectGemmClose(c, wv, RunOn(*gpu, c), RunOn(*cpu, c));
            if (HasFatalFailure()) return;
          }
}

// f32 weights multiply in true f32: x = 1 + 2^-18 times w = 1 over k = 16
// sums exactly to 16 + 2^-14 (every partial sum fits in 24 bits), while
// TF32 (10 mantissa bits) would round x to 1 and give 16.
TEST(CudaGemm, F32IsTrueF32) {
  auto gpu = REQUIRE_GPU();
  const int64_t m = 3, n = 5, k = 16;
  for (MatrixLayout layout : kLayouts) {
    GemmCase c;
    c.m = m;
    c.w.format = WeightStorage{FormatKind::kDense, DType::kF32, layout};
    c.w.n = n;
    c.w.k = k;
    c.w_bytes = StoreAs(std::vector<float>(n * k, 1.0f), DType::kF32);
    c.x.assign(m * k, 1.0f + std::ldexp(1.0f, -18));
    c.y0.assign(m * n, 0.0f);
    const std::vector<float> y = RunOn(*gpu, c);
    for (float v : y) ASSERT_EQ(v, 16.0f + std::ldexp(1.0f, -14));
  }
}

// reuse_x_workspace: the second GEMM multiplies the x converted by the first
// (the device x is overwritten in between), as the CPU backend does.
TEST(CudaGemm, ReuseXWorkspace) {
  auto gpu = REQUIRE_GPU();
  const int64_t m = 7, n = 65, k = 72;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const std::vector<float> x1 = RandomFloats(m * k, 11),
                             x2 = RandomFloats(m * k, 12);
    const std::vector<float> w1 = RandomFloats(n * k, 13),
                             w2 = RandomFloats(n * k, 14);
    auto xd = Upload(*gpu, x1);
    auto w1d = Upload(*gpu, StoreAs(w1, dt));
    auto w2d = Upload(*gpu, StoreAs(w2, dt));
    auto y = Zeros<float>(*gpu, m * n);
    const int64_t ws_bytes = gpu->Costs().gemm_workspace(m, k, dt);
    auto ws = Zeros<uint8_t>(*gpu, ws_bytes);
    const int64_t sp_bytes = gpu->Costs().gemm_scratchpad(m, n, k, dt, false);
    auto sp = Zeros<uint8_t>(*gpu, sp_bytes);
    gpu->SetGemmScratchpad(sp.data(), sp_bytes);
    GemmOp op;
    op.x = xd.data();
    op.m = m;
    op.w.format = WeightStorage{FormatKind::kDense, dt, MatrixLayout::kOutIn};
    op.w.n = n;
    op.w.k = k;
    op.w.data = w1d.data();
    op.y = y.data();
    op.workspace = ws.data();
    gpu->Gemm(op);
    ASSERT_TRUE(gpu->Synchronize().ok());
    ASSERT_TRUE(
        gpu->Copy(xd.data(), gpu->device(), x2.data(), DeviceRef{}, m * k * 4)
            .ok());
    op.w.data = w2d.data();
    op.reuse_x_workspace = true;
    gpu->Gemm(op);
    const std::vector<float> got = Download(*gpu, y);
    gpu->SetGemmScratchpad(nullptr, 0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double want = 0, mag = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double t = static_cast<double>(RoundTo(x1[i * k + p], dt)) *
                           RoundTo(w2[j * k + p], dt);
          want += t;
          mag += std::abs(t);
        }
        // One side (the GPU) against an exact sum: 2 (k + 2) u mag.
        ASSERT_NEAR(got[i * n + j], want, 2.0 * (k + 2) * kU * mag)
            << DTypeName(dt) << " (" << i << ", " << j << ")";
      }
  }
}

TEST(CudaGemm, CostFunctions) {
  auto gpu = REQUIRE_GPU();
  const KernelCosts c = gpu->Costs();
  EXPECT_EQ(c.gemm_workspace(7, 72, DType::kBF16), 7 * 72 * 2);
  EXPECT_EQ(c.gemm_workspace(7, 72, DType::kF16), 7 * 72 * 2);
  EXPECT_EQ(c.gemm_workspace(7, 72, DType::kF32), 0);
  EXPECT_EQ(c.gemm_scratchpad(7, 65, 72, DType::kBF16, false),
            int64_t{32} << 20);
  EXPECT_EQ(
      c.weight_decode_workspace(5000, 64, FormatKind::kMxfp4, DType::kBF16),
      4096 * 64 * 2);
  EXPECT_EQ(
      c.weight_decode_workspace(100, 64, FormatKind::kFp8Block, DType::kF32),
      100 * 64 * 4);
  EXPECT_EQ(
      c.weight_decode_workspace(100, 64, FormatKind::kDense, DType::kBF16), 0);
}

// ---- Quantized weights -----------------------------------------------------

// A random quantized matrix of `kind` [n, k] (host bytes) with its operand:
// scales in a sane range; `edge` adds NaN / -0 / max / subnormal codes and
// NaN / extreme scales (decode tests only).
struct QuantCase {
  QuantMatrix m;  // pointers into values / scales
  WeightOperand w;
  std::vector<uint8_t> values, scales;
};

QuantCase MakeQuant(FormatKind kind, int64_t n, int64_t k, uint32_t seed,
                    DType scale_dtype, bool edge) {
  QuantCase c;
  const bool fp4 = GetFormatInfo(kind).value_bits == 4;
  c.values = RandomBytes(fp4 ? n * k / 2 : n * k, seed);
  std::mt19937 g(seed + 1);
  QuantMatrix& m = c.m;
  m.kind = kind;
  m.n = n;
  m.k = k;
  switch (kind) {
    case FormatKind::kMxfp4:
      m.block_in = 32;
      m.scale_dtype = DType::kF8E8M0;
      c.scales.resize(static_cast<size_t>(n * k / 32));
      for (auto& s : c.scales) s = static_cast<uint8_t>(112 + g() % 24);
      if (edge)  // every E8M0 code, 0 (subnormal 2^-127) and 255 (NaN) too
        for (size_t i = 0; i < c.scales.size(); ++i)
          c.scales[i] = static_cast<uint8_t>(i * 7 % 256);
      break;
    case FormatKind::kNvfp4ModelOpt:
    case FormatKind::kNvfp4CompressedTensors:
      m.block_in = 16;
      m.scale_dtype = DType::kF8E4M3;
      c.scales.resize(static_cast<size_t>(n * k / 16));
      for (auto& s : c.scales) s = static_cast<uint8_t>(g() % 0x7F);
      if (edge) c.scales[0] = 0x7F, c.scales[1] = 0x80, c.scales[2] = 0x7E;
      m.divide_global = kind == FormatKind::kNvfp4CompressedTensors;
      m.global_scale = m.divide_global ? 1.0f / 3.3e-4f : 3.3e-4f;
      break;
    case FormatKind::kFp8Block: {
      m.block_out = 32;
      m.block_in = 48;
      m.scale_dtype = scale_dtype;
      const int64_t cells = ((n + 31) / 32) * ((k + 47) / 48);
      std::vector<float> s(static_cast<size_t>(cells));
      for (auto& v : s) v = 1e-3f * static_cast<float>(1 + g() % 100);
      c.scales = StoreAs(s, scale_dtype);
      break;
    }
    case FormatKind::kFp8PerTensor:
      m.global_scale = 0.0123f;
      break;
    case FormatKind::kDense:
      break;
  }
  if (!fp4) {
    if (edge) {
      // Every E4M3 code appears (NaN 0x7F / 0xFF, -0 0x80, 448 0x7E, the
      // smallest subnormal 0x01, ...).
      for (int64_t i = 0; i < std::min<int64_t>(256, n * k); ++i)
        c.values[i] = static_cast<uint8_t>(i);
    } else {
      for (auto& v : c.values)
        if ((v & 0x7F) == 0x7F) v = 0;  // no NaN codes in GEMM tests
    }
  }
  m.values = c.values.data();
  m.scales = c.scales.empty() ? nullptr : c.scales.data();
  WeightOperand& w = c.w;
  w.format = WeightStorage{kind, fp4 ? DType::kF4E2M1 : DType::kF8E4M3,
                           MatrixLayout::kOutIn};
  w.n = n;
  w.k = k;
  w.scales_dtype = m.scale_dtype;
  w.block_out = m.block_out;
  w.block_in = m.block_in;
  w.global_scale = m.global_scale;
  w.divide_global = m.divide_global;
  return c;
}

const FormatKind kQuantKinds[] = {
    FormatKind::kFp8PerTensor, FormatKind::kFp8Block, FormatKind::kMxfp4,
    FormatKind::kNvfp4ModelOpt, FormatKind::kNvfp4CompressedTensors};

// DecodeRows (called directly on a stream of our own) against
// DecodeRowsReference: f32 bit-identical (NaN: any NaN), 16-bit = the
// reference rounded to nearest even (src/base/float16.h).
TEST(CudaQuant, DecodeRowsMatchesReference) {
  auto gpu = REQUIRE_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (FormatKind kind : kQuantKinds) {
    for (DType sd : {DType::kBF16, DType::kF32}) {
      if (sd == DType::kF32 && kind != FormatKind::kFp8Block) continue;
      const int64_t n = 75, k = 160;  // FP8 block: ragged last block row/col
      const QuantCase c =
          MakeQuant(kind, n, k, 17 + static_cast<uint32_t>(kind), sd,
                    /*edge=*/true);
      std::vector<float> want(static_cast<size_t>(n * k));
      DecodeRowsReference(c.m, 0, n, want.data());
      auto values = Upload(*gpu, c.values);
      auto scales = Upload(*gpu, c.scales);
      QuantMatrix dm = c.m;
      dm.values = values.data();
      dm.scales = c.scales.empty() ? nullptr : scales.data();
      for (DType out : kDTypes) {
        // Rows [5, 70): a panel that does not start at row 0.
        const int64_t r0 = 5, rows = 65;
        auto got_d = Zeros<uint8_t>(*gpu, rows * k * DTypeSize(out));
        cuda::DecodeRows(dm, r0, rows, got_d.data(), out, stream);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        const std::vector<uint8_t> got = Download(*gpu, got_d);
        for (int64_t i = 0; i < rows * k; ++i) {
          const float ref = want[r0 * k + i];
          if (out == DType::kF32) {
            float g;
            std::memcpy(&g, got.data() + 4 * i, 4);
            ASSERT_TRUE(SameValue(g, ref))
                << FormatName(kind) << " f32 element " << i << ": " << g
                << " vs " << ref;
          } else {
            uint16_t h;
            std::memcpy(&h, got.data() + 2 * i, 2);
            const float g = out == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h);
            if (std::isnan(ref)) {
              ASSERT_TRUE(std::isnan(g)) << FormatName(kind) << " " << i;
            } else {
              const uint16_t r16 =
                  out == DType::kBF16 ? F32ToBf16(ref) : F32ToF16(ref);
              ASSERT_EQ(h, r16) << FormatName(kind) << " " << DTypeName(out)
                                << " element " << i << " (" << ref << ")";
            }
          }
        }
      }
    }
  }
  cudaStreamDestroy(stream);
}

// A quantized GEMM case; *wv = the reference-decoded weights [n, k] rounded
// to the compute dtype.
GemmCase MakeQuantGemm(const QuantCase& q, DType compute, int64_t m,
                       bool has_bias, DType bias_dt, bool accumulate,
                       int64_t ldy, uint32_t seed, std::vector<float>* wv) {
  GemmCase c;
  c.m = m;
  c.w = q.w;
  c.w.decode_dtype = compute;
  c.w_bytes = q.values;
  c.scale_bytes = q.scales;
  const int64_t n = q.m.n, k = q.m.k;
  wv->resize(static_cast<size_t>(n * k));
  DecodeRowsReference(q.m, 0, n, wv->data());
  for (float& v : *wv) v = RoundTo(v, compute);
  c.x = RandomFloats(m * k, seed);
  c.ldy = ldy;
  c.y0 = RandomFloats(m * c.ld(), seed + 1);
  if (has_bias) c.bias_bytes = StoreAs(RandomFloats(n, seed + 2), bias_dt);
  c.bias_dtype = bias_dt;
  c.accumulate = accumulate;
  return c;
}

// Every format decoded to every compute dtype, against the CPU backend's
// quantized GEMM (same decode, same rounding of x).
TEST(CudaQuant, GemmMatchesCpu) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  ASSERT_NE(cpu, nullptr);
  const int64_t n = 300, k = 96;
  for (FormatKind kind : kQuantKinds) {
    const QuantCase q = MakeQuant(kind, n, k, 91 + static_cast<uint32_t>(kind),
                                  DType::kBF16, /*edge=*/false);
    for (DType compute : kDTypes)
      for (int64_t m : {int64_t{1}, int64_t{7}}) {
        std::vector<float> wv;
        const GemmCase c =
            MakeQuantGemm(q, compute, m, /*has_bias=*/true, DType::kBF16,
                          /*accumulate=*/m == 7, m == 7 ? n + 3 : 0, 5, &wv);
        SCOPED_TRACE(c.Describe());
        ExpectGemmClose(c, wv, RunOn(*gpu, c), RunOn(*cpu, c));
        if (HasFatalFailure()) return;
      }
  }
}

// n > kDecodePanelRows (4096): two panels, the second of 4 rows, with an f32
// bias (offset per panel), accumulate and ldy > n.
TEST(CudaQuant, PanelLoop) {
  auto gpu = REQUIRE_GPU();
  auto cpu = MakeCpu();
  ASSERT_NE(cpu, nullptr);
  const int64_t n = 4100, k = 32;
  for (FormatKind kind : {FormatKind::kMxfp4, FormatKind::kFp8Block,
                          FormatKind::kNvfp4CompressedTensors}) {
    const QuantCase q = MakeQuant(kind, n, k, 300 + static_cast<uint32_t>(kind),
                                  DType::kF32, /*edge=*/false);
    for (DType bias_dt : {DType::kF32, DType::kBF16}) {
      std::vector<float> wv;
      const GemmCase c =
          MakeQuantGemm(q, DType::kBF16, 3, /*has_bias=*/true, bias_dt,
                        /*accumulate=*/true, n + 1, 9, &wv);
      SCOPED_TRACE(c.Describe());
      ExpectGemmClose(c, wv, RunOn(*gpu, c), RunOn(*cpu, c));
      if (HasFatalFailure()) return;
    }
  }
}

// A decode workspace smaller than the cost function's is a clear error.
TEST(CudaQuant, SmallDecodeWorkspaceIsAnError) {
  auto gpu = REQUIRE_GPU();
  const int64_t n = 64, k = 32, m = 2;
  const QuantCase q =
      MakeQuant(FormatKind::kMxfp4, n, k, 5, DType::kBF16, false);
  auto values = Upload(*gpu, q.values);
  auto scales = Upload(*gpu, q.scales);
  auto x = Upload(*gpu, RandomFloats(m * k, 3));
  auto y = Zeros<float>(*gpu, m * n);
  auto ws =
      Zeros<uint8_t>(*gpu, gpu->Costs().gemm_workspace(m, k, DType::kBF16));
  const int64_t need = gpu->Costs().weight_decode_workspace(
      n, k, FormatKind::kMxfp4, DType::kBF16);
  ASSERT_EQ(need, n * k * 2);
  auto dec = Zeros<uint8_t>(*gpu, need);
  gpu->SetWeightDecodeWorkspace(dec.data(), need - 2);
  GemmOp op;
  op.x = x.data();
  op.m = m;
  op.w = q.w;
  op.w.data = values.data();
  op.w.scales = scales.data();
  op.w.decode_dtype = DType::kBF16;
  op.y = y.data();
  op.workspace = ws.data();
  gpu->Gemm(op);
  const Status s = gpu->Synchronize();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("decode workspace"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace loom::cuda_test
