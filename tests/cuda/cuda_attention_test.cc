// CUDA attention against the CPU backend's attention, through the Backend
// interface: packed variable-length sequences, GQA, sliding window, softcap,
// sinks; the f32 kernel, the 16-bit tensor-core kernel and the probabilities.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "src/backend/backend.h"
#include "src/base/float16.h"
#include "tests/cuda/cuda_test_util.h"

namespace loom {
namespace {

using cuda_test::Download;
using cuda_test::RandomFloats;
using cuda_test::Upload;

struct Case {
  std::vector<int64_t> lens;  // packed sequence lengths
  int64_t q_heads = 4, kv_heads = 4, head_dim = 64;
  int64_t window = 0;
  float softcap = 0.0f;
  bool sinks = false;
  DType sinks_dtype = DType::kF32;
  DType compute = DType::kF32;
  bool probs = false;        // single sequence only
  bool pass_max_len = true;  // give max_seq_len (else 0: computed)
  uint32_t seed = 1;

  std::string Name() const {
    std::string s = "lens=";
    for (int64_t l : lens) s += std::to_string(l) + ",";
    return s + " heads=" + std::to_string(q_heads) + "/" +
           std::to_string(kv_heads) + " hd=" + std::to_string(head_dim) +
           " window=" + std::to_string(window) +
           " softcap=" + std::to_string(softcap) +
           " sinks=" + std::to_string(sinks) +
           " compute=" + std::string(DTypeName(compute)) +
           " probs=" + std::to_string(probs);
  }
};

float RoundTo(float x, DType dt) {
  if (dt == DType::kBF16) return RoundBf16(x);
  if (dt == DType::kF16) return F16ToF32(F32ToF16(x));
  return x;
}

struct Result {
  std::vector<float> z, probs;
};

// Runs the case on `be`. q, k, v (host) are [T, heads, hd] with row strides
// q_rs, k_rs, v_rs; seq_start [num_seqs + 1].
Result Run(Backend& be, const Case& c, const std::vector<float>& q,
           int64_t q_rs, const std::vector<float>& k, int64_t k_rs,
           const std::vector<float>& v, int64_t v_rs,
           const std::vector<int64_t>& seq_start,
           const std::vector<uint16_t>& sinks16,
           const std::vector<float>& sinks32) {
  const bool device = be.device().kind == DeviceKind::kCuda;
  const int64_t T = seq_start.back();
  const int64_t num_seqs = static_cast<int64_t>(c.lens.size());
  const int64_t max_len = *std::max_element(c.lens.begin(), c.lens.end());
  const int64_t zn = T * c.q_heads * c.head_dim;
  auto dq = Upload(be, q);
  auto dk = Upload(be, k);
  auto dv = Upload(be, v);
  // A sentinel, so that an output the kernel never writes shows.
  auto dz = Upload(be, std::vector<float>(zn, 777.0f));
  auto dseq = Upload(be, seq_start);
  auto ds16 = Upload(be, sinks16.empty() ? std::vector<uint16_t>(1) : sinks16);
  auto ds32 = Upload(be, sinks32.empty() ? std::vector<float>(1) : sinks32);
  const int64_t pn = c.probs ? c.q_heads * max_len * max_len : 1;
  auto dp = Upload(be, std::vector<float>(pn, 555.0f));
  const int64_t ws_bytes = std::max<int64_t>(
      64, be.Costs().attention_workspace(max_len, c.q_heads, c.head_dim,
                                         be.NumThreads()));
  auto ws = be.Allocate(ws_bytes, MemoryKind::kDevice);
  EXPECT_TRUE(ws.ok());
  Result r;
  if (!ws.ok()) return r;

  AttentionOp op;
  op.q = dq.data();
  op.q_rs = q_rs;
  op.k = dk.data();
  op.k_rs = k_rs;
  op.v = dv.data();
  op.v_rs = v_rs;
  op.z = dz.data();
  op.seq_start = seq_start.data();
  op.seq_start_device = device ? dseq.data() : nullptr;
  op.num_seqs = num_seqs;
  op.max_seq_len = c.pass_max_len ? max_len : 0;
  op.q_heads = c.q_heads;
  op.kv_heads = c.kv_heads;
  op.head_dim = c.head_dim;
  op.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  op.softcap = c.softcap;
  op.window = c.window;
  if (c.sinks) {
    op.sinks = c.sinks_dtype == DType::kF32
                   ? static_cast<const void*>(ds32.data())
                   : ds16.data();
    op.sinks_dtype = c.sinks_dtype;
  }
  // The CPU always computes in f32 (its inputs are pre-rounded instead).
  op.compute = device ? c.compute : DType::kF32;
  if (c.probs) {
    op.probs = dp.data();
    op.probs_seq = 0;
  }
  op.workspace = ws->data();
  const Status st = be.Attention(op);
  EXPECT_TRUE(st.ok()) << be.name() << ": " << st.message();
  r.z = Download(be, dz);
  if (c.probs) r.probs = Download(be, dp);
  return r;
}

void Check(Backend& gpu, Backend& cpu, const Case& c) {
  SCOPED_TRACE(c.Name());
  const int64_t hd = c.head_dim;
  std::vector<int64_t> seq_start = {0};
  for (int64_t l : c.lens) seq_start.push_back(seq_start.back() + l);
  const int64_t T = seq_start.back();
  // Padded row strides (odd) exercise q_rs / k_rs / v_rs.
  const int64_t q_rs = c.q_heads * hd + 3;
  const int64_t k_rs = c.kv_heads * hd + 5;
  const int64_t v_rs = c.kv_heads * hd + 1;
  std::vector<float> q = RandomFloats(T * q_rs, c.seed, -1.0f, 1.0f);
  std::vector<float> k = RandomFloats(T * k_rs, c.seed + 1, -1.0f, 1.0f);
  std::vector<float> v = RandomFloats(T * v_rs, c.seed + 2, -1.0f, 1.0f);
  // Sharper scores than scale * U(-1,1) dots give (|s| up to ~2 sqrt(hd)/4):
  // q times 2, so the softmax is far from uniform and the softcap bites.
  for (float& x : q) x *= 2.0f;
  std::vector<float> sinks32 = RandomFloats(c.q_heads, c.seed + 3, -1.0f, 3.0f);
  std::vector<uint16_t> sinks16;
  if (c.sinks_dtype == DType::kBF16) {
    for (float& s : sinks32) s = RoundBf16(s);
    for (float s : sinks32) sinks16.push_back(F32ToBf16(s));
  } else if (c.sinks_dtype == DType::kF16) {
    for (float& s : sinks32) s = F16ToF32(F32ToF16(s));
    for (float s : sinks32) sinks16.push_back(F32ToF16(s));
  }
  const bool tc = c.compute != DType::kF32 && !c.probs;
  // The CPU reference of the 16-bit kernel runs on q, k, v pre-rounded to
  // the compute dtype (the kernel rounds the same f32 values the same way,
  // round to nearest even, so the scores' inputs are identical).
  std::vector<float> qr = q, kr = k, vr = v;
  if (tc) {
    for (float& x : qr) x = RoundTo(x, c.compute);
    for (float& x : kr) x = RoundTo(x, c.compute);
    for (float& x : vr) x = RoundTo(x, c.compute);
  }
  const Result want =
      Run(cpu, c, qr, q_rs, kr, k_rs, vr, v_rs, seq_start, sinks16, sinks32);
  const Result got =
      Run(gpu, c, q, q_rs, k, k_rs, v, v_rs, seq_start, sinks16, sinks32);
  ASSERT_EQ(got.z.size(), want.z.size());

  // Tolerances. f32 path: the scores differ only by the order of the f32
  // dot-product sums: |ds| <~ sqrt(hd) * 2^-24 * scale * sum_d |q_d k_d|
  // (random-walk rounding), with scale * sum |q k| <= 2 sqrt(hd) here, so
  // |ds| <~ 2 hd 2^-24. A relative error ds of each p, plus a few ulps from
  // exp, the sum and 1/sum, moves z = sum p v by <= (|ds| + 8 * 2^-24) *
  // max|v|; times 4 for safety: 4 (2 hd + 8) 2^-24 (about 3e-5 at hd 256).
  // 16-bit path: each p is rounded to the compute dtype before P V (relative
  // 2^-9 for bf16, 2^-12 for f16, round to nearest), while l sums the
  // unrounded p: |dz| <= 2^-9 * sum p * max|v| <= 2^-9 max|v|; we allow 2^-8
  // max|v| (the brief's bound) plus the f32 term above. max|v| = 1.
  const double eps32 = std::ldexp(1.0, -24);
  const double tol32 = 4.0 * (2.0 * hd + 8.0) * eps32;
  const double tol = tc ? std::ldexp(1.0, -8) + tol32 : tol32;
  double worst = 0;
  int64_t worst_at = -1;
  for (size_t i = 0; i < want.z.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got.z[i]) - want.z[i]);
    if (!(d <= worst) || std::isnan(got.z[i])) {
      worst = std::isnan(got.z[i]) ? INFINITY : d;
      worst_at = static_cast<int64_t>(i);
    }
  }
  EXPECT_LE(worst, tol) << "worst |dz| at " << worst_at << " (token "
                        << worst_at / (c.q_heads * hd) << "): got "
                        << got.z[worst_at] << " want " << want.z[worst_at];
  // The 16-bit result must be much closer to the CPU than to noise: a
  // sanity check that the bound is not vacuous (outputs are O(0.1..1)).
  double zmax = 0;
  for (float x : want.z) zmax = std::max<double>(zmax, std::fabs(x));
  EXPECT_GT(zmax, 20 * tol) << "outputs too small for the tolerance";

  if (c.probs) {
    ASSERT_EQ(got.probs.size(), want.probs.size());
    // p = exp(s - max) / sum with the same |ds| as above: |dp| <= p (|ds| +
    // 8 2^-24) <= tol32 (max|v| = 1 in that bound). Masked entries are
    // exactly 0 on both.
    double pworst = 0;
    int64_t bad_zero = 0;
    for (size_t i = 0; i < want.probs.size(); ++i) {
      pworst = std::max(
          pworst, std::fabs(static_cast<double>(got.probs[i]) - want.probs[i]));
      if (want.probs[i] == 0.0f && got.probs[i] != 0.0f) ++bad_zero;
    }
    EXPECT_LE(pworst, tol32);
    EXPECT_EQ(bad_zero, 0) << "masked probabilities not exactly 0";
  }
}

// f32 kernel: head dims x GQA ratios x (window, softcap, sinks) variants on
// packed sequences {1, 17, 64, 130} (max_seq_len 130 < 212 tokens).
TEST(CudaAttentionTest, F32MatchesCpu) {
  auto gpu = REQUIRE_GPU();
  auto cpu = cuda_test::MakeCpu();
  ASSERT_NE(cpu, nullptr);
  uint32_t seed = 10;
  for (int64_t hd : {64, 80, 96, 128, 256}) {
    for (int64_t group : {1, 2, 4}) {
      for (int variant = 0; variant < 4; ++variant) {
        Case c;
        c.lens = {1, 17, 64, 130};
        c.q_heads = 4;
        c.kv_heads = 4 / group;
        c.head_dim = hd;
        c.window = (variant & 1) ? 40 : 0;
        c.softcap = (variant & 2) ? 3.0f : 0.0f;
        c.sinks = variant == 1 || variant == 3;
        c.seed = seed++;
        Check(*gpu, *cpu, c);
      }
    }
  }
}

// Odd head dims, bf16 / f16 sinks, max_seq_len computed by the backend.
TEST(CudaAttentionTest, F32OddShapes) {
  auto gpu = REQUIRE_GPU();
  auto cpu = cuda_test::MakeCpu();
  ASSERT_NE(cpu, nullptr);
  Case c;
  c.lens = {7, 33, 65};
  c.q_heads = 6;
  c.kv_heads = 2;
  c.head_dim = 33;
  c.sinks = true;
  c.sinks_dtype = DType::kBF16;
  c.pass_max_len = false;
  Check(*gpu, *cpu, c);
  c.head_dim = 200;
  c.sinks_dtype = DType::kF16;
  c.window = 5;
  c.seed = 2;
  Check(*gpu, *cpu, c);
}

// Tensor-core kernel (bf16): the same matrix of shapes.
TEST(CudaAttentionTest, Bf16MatchesCpuOnRoundedInputs) {
  auto gpu = REQUIRE_GPU();
  auto cpu = cuda_test::MakeCpu();
  ASSERT_NE(cpu, nullptr);
  uint32_t seed = 100;
  for (int64_t hd : {64, 80, 96, 128, 256}) {
    for (int64_t group : {1, 2, 4}) {
      for (int variant = 0; variant < 4; ++variant) {
        Case c;
        c.lens = {1, 17, 64, 130};
        c.q_heads = 4;
        c.kv_heads = 4 / group;
        c.head_dim = hd;
        c.window = (variant & 1) ? 40 : 0;
        c.softcap = (variant & 2) ? 3.0f : 0.0f;
        c.sinks = variant == 1 || variant == 3;
        c.compute = DType::kBF16;
        c.seed = seed++;
        Check(*gpu, *cpu, c);
      }
    }
  }
}

// f16 compute, and head dims that run padded (40 -> 64, 160 -> 256).
TEST(CudaAttentionTest, F16AndPaddedHeadDims) {
  auto gpu = REQUIRE_GPU();
  auto cpu = cuda_test::MakeCpu();
  ASSERT_NE(cpu, nullptr);
  uint32_t seed = 200;
  for (int64_t hd : {40, 64, 128, 160}) {
    Case c;
    c.lens = {3, 70, 129, 1};
    c.q_heads = 8;
    c.kv_heads = 2;
    c.head_dim = hd;
    c.window = hd == 64 ? 17 : 0;
    c.sinks = hd != 40;
    c.compute = DType::kF16;
    c.seed = seed++;
    Check(*gpu, *cpu, c);
  }
}

// A long sequence among short ones (several key tiles, window skipping),
// both kernels.
TEST(CudaAttentionTest, LongSequence) {
  auto gpu = REQUIRE_GPU();
  auto cpu = cuda_test::MakeCpu();
  ASSERT_NE(cpu, nullptr);
  uint32_t seed = 300;
  for (DType compute : {DType::kF32, DType::kBF16}) {
    for (int64_t window : {0, 256}) {
      Case c;
      c.lens = {5, 1000, 3};
      c.q_heads = 8;
      c.kv_heads = 4;
      c.head_dim = 128;
      c.window = window;
      c.sinks = window != 0;
      c.compute = compute;
      c.seed = seed++;
      Check(*gpu, *cpu, c);
    }
  }
}

// Probabilities [q_heads, L, L] of one sequence (computed by the f32 kernel
// even when a 16-bit compute dtype is requested).
TEST(CudaAttentionTest, ProbabilitiesMatchCpu) {
  auto gpu = REQUIRE_GPU();
  auto cpu = cuda_test::MakeCpu();
  ASSERT_NE(cpu, nullptr);
  uint32_t seed = 400;
  for (int variant = 0; variant < 4; ++variant) {
    Case c;
    c.lens = {variant == 3 ? int64_t{300} : int64_t{77}};
    c.q_heads = 4;
    c.kv_heads = variant == 2 ? 1 : 2;
    c.head_dim = variant == 1 ? 96 : 64;
    c.window = variant == 1 ? 20 : 0;
    c.softcap = variant == 2 ? 3.0f : 0.0f;
    c.sinks = variant != 0;
    c.compute = variant == 3 ? DType::kBF16 : DType::kF32;
    c.probs = true;
    c.seed = seed++;
    Check(*gpu, *cpu, c);
  }
}

}  // namespace
}  // namespace loom
