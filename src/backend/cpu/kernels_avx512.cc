// AVX-512 versions of the per-row kernels (see kernels_internal.h). This file
// is compiled with -mavx512{f,bw,dq,vl}; its functions are only called
// after HasAvx512() said yes.
//
// Transcendentals are evaluated here rather than through libm:
//   exp(x):  x = n ln2 + r, |r| <= ln2/2, degree-7 Taylor polynomial of e^r,
//            scaled by 2^n with vscalefps (truncation error 5e-9; ~2 ulp
//            total).
//   tanh(y): em / (em + 2) with em = expm1(2y): a degree-10 Taylor series for
//            |2y| < 1.1 (no cancellation near 0), exp(2y) - 1 beyond.
//   erfc(z): the Chebyshev-fitted form t exp(-z^2 + P(t)), t = 1/(1 + z/2),
//            fractional error < 1.2e-7 for z >= 0 (Numerical Recipes' erfcc).
// GELU is evaluated as x sigmoid(2u) (tanh form) and 0.5 x erfc(-x/sqrt2)
// (exact form): the same functions as torch's, without the cancellation of
// 1 + tanh / 1 + erf for x << 0.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "src/backend/cpu/kernels_internal.h"
#include "src/base/check.h"

namespace loom::cpu::avx512 {
namespace {

inline __mmask16 TailMask(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1u);
}

// p = c[0]; p = p x + c[i] (the shared coefficient tables).
template <size_t N>
inline __m512 Horner(const float (&c)[N], __m512 x) {
  __m512 p = _mm512_set1_ps(c[0]);
  for (size_t i = 1; i < N; ++i)
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(c[i]));
  return p;
}

inline __m512 Exp(__m512 x) {
  // Clamp so that n stays finite: e^-110 underflows to exactly 0, e^89
  // overflows to inf.
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(89.0f)),
                    _mm512_set1_ps(-110.0f));
  const __m512 n = _mm512_roundscale_ps(
      _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n ln2 in two steps (ln2 split into a short high part and the rest).
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  const __m512 p = Horner(kExpPoly, r);
  return _mm512_scalef_ps(p, n);
}

inline __m512 Tanh(__m512 y) {
  y = _mm512_max_ps(_mm512_min_ps(y, _mm512_set1_ps(9.0f)),
                    _mm512_set1_ps(-9.0f));
  const __m512 z = _mm512_add_ps(y, y);
  // expm1(z) by Taylor series z + z^2/2! + ... + z^10/10! for small |z|.
  const __m512 p = Horner(kExpm1Poly, z);
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), z, z);
  const __m512 large = _mm512_sub_ps(Exp(z), _mm512_set1_ps(1.0f));
  const __mmask16 is_small =
      _mm512_cmp_ps_mask(_mm512_abs_ps(z), _mm512_set1_ps(1.1f), _CMP_LT_OQ);
  const __m512 em = _mm512_mask_blend_ps(is_small, large, small);
  return _mm512_div_ps(em, _mm512_add_ps(em, _mm512_set1_ps(2.0f)));
}

// erfc(z) for any z.
inline __m512 Erfc(__m512 z) {
  const __m512 a = _mm512_abs_ps(z);
  const __m512 t = _mm512_div_ps(
      _mm512_set1_ps(1.0f),
      _mm512_fmadd_ps(_mm512_set1_ps(0.5f), a, _mm512_set1_ps(1.0f)));
  const __m512 p = Horner(kErfcPoly, t);
  // exponent -a^2 + p; a^2 with its rounding error folded back in.
  const __m512 a2 = _mm512_mul_ps(a, a);
  const __m512 a2_lo = _mm512_fmsub_ps(a, a, a2);
  const __m512 e = Exp(_mm512_sub_ps(_mm512_sub_ps(p, a2), a2_lo));
  const __m512 r = _mm512_mul_ps(t, e);
  const __mmask16 neg = _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_mask_sub_ps(r, neg, _mm512_set1_ps(2.0f), r);
}

inline __m512 Act(Activation act, __m512 x) {
  switch (act) {
    case Activation::kSilu:
      return _mm512_div_ps(
          x, _mm512_add_ps(_mm512_set1_ps(1.0f),
                           Exp(_mm512_sub_ps(_mm512_setzero_ps(), x))));
    case Activation::kGeluTanh: {
      // u = sqrt(2/pi) (x + 0.044715 x^3); gelu = x / (1 + exp(-2u)).
      const __m512 x2 = _mm512_mul_ps(x, x);
      const __m512 inner = _mm512_mul_ps(
          x,
          _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), x2, _mm512_set1_ps(1.0f)));
      const __m512 m2u =
          _mm512_mul_ps(inner, _mm512_set1_ps(-2.0f * 0.7978845608028654f));
      return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), Exp(m2u)));
    }
    case Activation::kGeluExact: {
      const __m512 z = _mm512_mul_ps(x, _mm512_set1_ps(-0.70710678118654752f));
      return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), Erfc(z));
    }
    case Activation::kRelu:
      return _mm512_max_ps(x, _mm512_setzero_ps());
    case Activation::kReluSquared: {
      const __m512 r = _mm512_max_ps(x, _mm512_setzero_ps());
      return _mm512_mul_ps(r, r);
    }
  }
  return x;
}

// Loads 16 (or n < 16, zero-filled) values of an F32/BF16/F16 array as f32.
inline __m512 LoadAs(const void* p, DType dtype, int64_t i, __mmask16 m) {
  switch (dtype) {
    case DType::kBF16: {
      const __m256i h =
          _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
      return _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case DType::kF16:
      return _mm512_cvtph_ps(
          _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i));
    default:
      return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  }
}

// f32 -> bf16 round-to-nearest-even with integer arithmetic (vcvtneps2bf16
// would flush denormals to zero, torch does not). NaN -> quiet NaN.
inline __m256i ToBf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb =
      _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb),
      16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  const __m512i quiet =
      _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

// Sum of the 16 lanes in double.
inline double HsumD(__m512d a) { return _mm512_reduce_add_pd(a); }

}  // namespace

void RmsNormRow(const float* x, const void* w, DType w_dtype, float offset,
                float eps, float* y, int64_t dim) {
  __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
  for (int64_t i = 0; i < dim; i += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(TailMask(dim - i), x + i);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
    acc0 = _mm512_fmadd_pd(lo, lo, acc0);
    acc1 = _mm512_fmadd_pd(hi, hi, acc1);
  }
  const double ss = HsumD(_mm512_add_pd(acc0, acc1));
  const __m512 inv = _mm512_set1_ps(
      static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps)));
  const __m512 off = _mm512_set1_ps(offset);
  for (int64_t i = 0; i < dim; i += 16) {
    const __mmask16 m = TailMask(dim - i);
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv);
    if (w != nullptr)
      v = _mm512_mul_ps(v, _mm512_add_ps(LoadAs(w, w_dtype, i, m), off));
    _mm512_mask_storeu_ps(y + i, m, v);
  }
}

void LayerNormRow(const float* x, const void* w, const void* b, DType w_dtype,
                  float offset, float eps, float* y, int64_t dim) {
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  for (int64_t i = 0; i < dim; i += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(TailMask(dim - i), x + i);
    s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
    s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));
  }
  const double mean = HsumD(_mm512_add_pd(s0, s1)) / static_cast<double>(dim);
  const __m512d meand = _mm512_set1_pd(mean);
  __m512d v0 = _mm512_setzero_pd(), v1 = _mm512_setzero_pd();
  for (int64_t i = 0; i < dim; i += 16) {
    const __mmask16 m = TailMask(dim - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    // Masked-off lanes must contribute 0, not mean^2.
    const __m512d lo =
        _mm512_maskz_sub_pd(static_cast<__mmask8>(m),
                            _mm512_cvtps_pd(_mm512_castps512_ps256(v)), meand);
    const __m512d hi = _mm512_maskz_sub_pd(
        static_cast<__mmask8>(m >> 8),
        _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)), meand);
    v0 = _mm512_fmadd_pd(lo, lo, v0);
    v1 = _mm512_fmadd_pd(hi, hi, v1);
  }
  const double var = HsumD(_mm512_add_pd(v0, v1)) / static_cast<double>(dim);
  const __m512 inv =
      _mm512_set1_ps(static_cast<float>(1.0 / std::sqrt(var + eps)));
  const __m512 meanf = _mm512_set1_ps(static_cast<float>(mean));
  const __m512 off = _mm512_set1_ps(offset);
  for (int64_t i = 0; i < dim; i += 16) {
    const __mmask16 m = TailMask(dim - i);
    __m512 v = _mm512_mul_ps(
        _mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), meanf), inv);
    if (w != nullptr)
      v = _mm512_mul_ps(v, _mm512_add_ps(LoadAs(w, w_dtype, i, m), off));
    if (b != nullptr) v = _mm512_add_ps(v, LoadAs(b, w_dtype, i, m));
    _mm512_mask_storeu_ps(y + i, m, v);
  }
}

void GatedRow(Activation act, const float* gate, const float* up, float* out,
              int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512 g = Act(act, _mm512_maskz_loadu_ps(m, gate + i));
    _mm512_mask_storeu_ps(out + i, m,
                          _mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

void ActivationSpan(Activation act, float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(x + i, m, Act(act, _mm512_maskz_loadu_ps(m, x + i)));
  }
}

void SoftcapSpan(float* x, int64_t n, float cap) {
  const __m512 c = _mm512_set1_ps(cap), ic = _mm512_set1_ps(1.0f / cap);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    _mm512_mask_storeu_ps(x + i, m,
                          _mm512_mul_ps(c, Tanh(_mm512_mul_ps(v, ic))));
  }
}

void AddSpan(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(y + i, m,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i),
                                        _mm512_maskz_loadu_ps(m, x + i)));
  }
}

void ScaleSpan(float* x, int64_t n, float s) {
  const __m512 sv = _mm512_set1_ps(s);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(x + i, m,
                          _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), sv));
  }
}

void FromF32Span(const float* src, void* dst, DType dtype, int64_t n) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, src + i);
    const __m256i h =
        dtype == DType::kBF16
            ? ToBf16(v)
            : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_epi16(d + i, m, h);
  }
}

void ToF32Span(const void* src, DType dtype, float* dst, int64_t n) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(dst + i, m, LoadAs(src, dtype, i, m));
  }
}

double LogSumExpRow(const float* x, int64_t n) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 mx = ninf;
  for (int64_t i = 0; i < n; i += 16)
    mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(ninf, TailMask(n - i), x + i));
  const float m = _mm512_reduce_max_ps(mx);
  if (std::isinf(m)) return m;
  const __m512 mv = _mm512_set1_ps(m);
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = TailMask(n - i);
    const __m512 e = _mm512_maskz_mov_ps(
        k, Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv)));
    s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
  }
  return static_cast<double>(m) + std::log(HsumD(_mm512_add_pd(s0, s1)));
}

void RopeToken(float* x, int64_t heads, int64_t head_dim, const float* cos,
               const float* sin, int64_t half) {
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; i += 16) {
      const __mmask16 m = TailMask(half - i);
      const __m512 x1 = _mm512_maskz_loadu_ps(m, v + i),
                   x2 = _mm512_maskz_loadu_ps(m, v + half + i);
      const __m512 c = _mm512_maskz_loadu_ps(m, cos + i),
                   s = _mm512_maskz_loadu_ps(m, sin + i);
      _mm512_mask_storeu_ps(v + i, m,
                            _mm512_fmsub_ps(x1, c, _mm512_mul_ps(x2, s)));
      _mm512_mask_storeu_ps(v + half + i, m,
                            _mm512_fmadd_ps(x2, c, _mm512_mul_ps(x1, s)));
    }
  }
}

// ---- Attention tile
// ------------------------------------------------------------
//
// Scores are kept transposed, S^T [nk, 64] (one key per row, the tile's query
// rows along the vector lanes), so that masking, the running max, exp and the
// row sums are all lane-parallel over queries:
//   1. Q^T [head_dim, 64] is packed once per tile (zero rows past `rows`).
//   2. S^T[j, :] = scale * sum_d K[j, d] Q^T[d, :], 4 keys x NV vectors of 16
//      queries in registers; softcap, mask (-inf), running max.
//   3. Per chunk of kKeyChunk keys: E = exp(S^T - max) in place (row sums
//      accumulate), V of the chunk packed densely, and
//   4. O[r, :] += sum_j E[j, r] V[j, :], R rows x DV vectors of head_dim in
//      registers (O lives in scratch between chunks), keys limited to those
//      visible to the R rows. Finally Z = O / sum.
namespace {

constexpr int64_t kB = kAttnBlock;  // 64 = 4 vectors of 16 queries

template <int NV>
void Scores(const AttnTile& t, const float* qt, float* st, float* rmax) {
  const int64_t d = t.head_dim;
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 scale = _mm512_set1_ps(t.scale);
  const bool cap = t.softcap > 0.0f;
  const __m512 capv = _mm512_set1_ps(t.softcap),
               icap = _mm512_set1_ps(1.0f / t.softcap);
  const __m512i lane =
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  __m512 mx[NV];
  for (int v = 0; v < NV; ++v) mx[v] = _mm512_loadu_ps(rmax + 16 * v);
  // Finishes key jj: scale, softcap, mask, store, max.
  auto finish = [&](int64_t jj, __m512* acc) {
    const int64_t rel =
        t.j_lo + jj -
        t.i0;  // row r sees key j iff r >= rel and r < rel + window
    const __m512i lo =
        _mm512_set1_epi32(static_cast<int32_t>(std::max<int64_t>(rel, -1)));
    const int64_t hi64 =
        t.window > 0 ? std::min(rel + t.window, t.rows) : t.rows;
    const __m512i hi = _mm512_set1_epi32(static_cast<int32_t>(hi64));
    const __m512 bias =
        _mm512_set1_ps(t.alibi * static_cast<float>(t.j_lo + jj));
    for (int v = 0; v < NV; ++v) {
      __m512 s = _mm512_mul_ps(acc[v], scale);
      if (t.alibi != 0.0f) s = _mm512_add_ps(s, bias);
      if (cap) s = _mm512_mul_ps(capv, Tanh(_mm512_mul_ps(s, icap)));
      const __m512i r = _mm512_add_epi32(lane, _mm512_set1_epi32(16 * v));
      const __mmask16 vis = _mm512_cmp_epi32_mask(r, lo, _MM_CMPINT_GE) &
                            _mm512_cmp_epi32_mask(r, hi, _MM_CMPINT_LT);
      s = _mm512_mask_blend_ps(vis, ninf, s);
      _mm512_storeu_ps(st + jj * kB + 16 * v, s);
      mx[v] = _mm512_max_ps(mx[v], s);
    }
  };
  int64_t jj = 0;
  for (; jj + 4 <= t.nk; jj += 4) {
    const float* k0 = t.k + jj * t.k_rs;
    const float* k1 = k0 + t.k_rs;
    const float* k2 = k1 + t.k_rs;
    const float* k3 = k2 + t.k_rs;
    __m512 a0[NV], a1[NV], a2[NV], a3[NV];
    for (int v = 0; v < NV; ++v)
      a0[v] = a1[v] = a2[v] = a3[v] = _mm512_setzero_ps();
    for (int64_t p = 0; p < d; ++p) {
      const __m512 b0 = _mm512_set1_ps(k0[p]), b1 = _mm512_set1_ps(k1[p]);
      const __m512 b2 = _mm512_set1_ps(k2[p]), b3 = _mm512_set1_ps(k3[p]);
      for (int v = 0; v < NV; ++v) {
        const __m512 q = _mm512_load_ps(qt + p * kB + 16 * v);
        a0[v] = _mm512_fmadd_ps(b0, q, a0[v]);
        a1[v] = _mm512_fmadd_ps(b1, q, a1[v]);
        a2[v] = _mm512_fmadd_ps(b2, q, a2[v]);
        a3[v] = _mm512_fmadd_ps(b3, q, a3[v]);
      }
    }
    finish(jj, a0);
    finish(jj + 1, a1);
    finish(jj + 2, a2);
    finish(jj + 3, a3);
  }
  for (; jj < t.nk; ++jj) {
    const float* k0 = t.k + jj * t.k_rs;
    __m512 a0[NV];
    for (int v = 0; v < NV; ++v) a0[v] = _mm512_setzero_ps();
    for (int64_t p = 0; p < d; ++p) {
      const __m512 b0 = _mm512_set1_ps(k0[p]);
      for (int v = 0; v < NV; ++v)
        a0[v] =
            _mm512_fmadd_ps(b0, _mm512_load_ps(qt + p * kB + 16 * v), a0[v]);
    }
    finish(jj, a0);
  }
  for (int v = 0; v < NV; ++v) _mm512_storeu_ps(rmax + 16 * v, mx[v]);
}

// Keys per chunk of steps 3-4: the chunk's E (kKeyChunk x 64) and packed V
// (kKeyChunk x head_dim) stay in L1/L2 while every row group sweeps them.
constexpr int64_t kKeyChunk = 64;
static_assert(kKeyChunk <= kAttnBlock,
              "the packed-V chunk also holds the tile's query rows");

// E = exp(S^T - max) in place for keys [c0, c0 + kc), adding to the row sums.
template <int NV>
void ExpChunk(float* st, int64_t c0, int64_t kc, const __m512* mx,
              __m512* sum) {
  for (int64_t jj = c0; jj < c0 + kc; ++jj) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* p = st + jj * kB + 16 * v;
      const __m512 e = Exp(_mm512_sub_ps(_mm512_loadu_ps(p), mx[v]));
      _mm512_storeu_ps(p, e);
      sum[v] = _mm512_add_ps(sum[v], e);
    }
  }
}

// O[r0 .. r0+R, c .. c+16 DV] += sum_{jj in [jb, je)} E[jj, r] V[jj, :], with
// O [64, vs] in scratch (the last vector masked by `last`); e points at E of
// key 0 of the chunk, vp at the chunk's packed V [kKeyChunk, vs].
template <int DV, int R>
void PvRows(const float* e, const float* vp, int64_t vs, float* o, int64_t r0,
            int64_t jb, int64_t je, int64_t c, __mmask16 last) {
  __m512 acc[R][DV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < DV; ++v)
      acc[r][v] = _mm512_load_ps(o + (r0 + r) * vs + c + 16 * v);
  for (int64_t jj = jb; jj < je; ++jj) {
    const float* vrow = vp + jj * vs + c;
    __m512 vv[DV];
#pragma GCC unroll 16
    for (int v = 0; v < DV; ++v)
      vv[v] = _mm512_maskz_load_ps(v == DV - 1 ? last : __mmask16(0xffff),
                                   vrow + 16 * v);
    const float* er = e + jj * kB + r0;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 p = _mm512_set1_ps(er[r]);
#pragma GCC unroll 16
      for (int v = 0; v < DV; ++v)
        acc[r][v] = _mm512_fmadd_ps(p, vv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < DV; ++v)
      _mm512_store_ps(o + (r0 + r) * vs + c + 16 * v, acc[r][v]);
}

// One key chunk [c0, c0 + kc) for all rows, columns [c, min(d, c + 16 DV)).
template <int DV>
void PvChunk(const AttnTile& t, const float* st, const float* vp, int64_t vs,
             float* o, int64_t c0, int64_t kc, int64_t c) {
  // R x DV accumulators + DV values + 1 broadcast fit in the 32 registers.
  constexpr int R = DV == 1   ? 12
                    : DV == 2 ? 12
                    : DV == 3 ? 8
                    : DV == 4 ? 6
                    : DV == 5 ? 4
                              : 3;
  const __mmask16 last = TailMask(t.head_dim - c - 16 * (DV - 1));
  const float* e = st + c0 * kB;
  // Chunk-local keys visible to some row of [r0, r0 + nr).
  auto range = [&](int64_t r0, int64_t nr, int64_t* jb, int64_t* je) {
    const int64_t first_i = t.i0 + r0, last_i = t.i0 + r0 + nr - 1;
    const int64_t lo = t.window > 0 ? first_i - t.window + 1 - t.j_lo : 0;
    *jb = std::max<int64_t>(0, lo - c0);
    *je = std::min(kc, last_i - t.j_lo + 1 - c0);
  };
  int64_t r0 = 0, jb, je;
  for (; r0 + R <= t.rows; r0 += R) {
    range(r0, R, &jb, &je);
    if (jb < je) PvRows<DV, R>(e, vp, vs, o, r0, jb, je, c, last);
  }
  if constexpr (R > 4) {
    for (; r0 + 4 <= t.rows; r0 += 4) {
      range(r0, 4, &jb, &je);
      if (jb < je) PvRows<DV, 4>(e, vp, vs, o, r0, jb, je, c, last);
    }
  }
  for (; r0 < t.rows; ++r0) {
    range(r0, 1, &jb, &je);
    if (jb < je) PvRows<DV, 1>(e, vp, vs, o, r0, jb, je, c, last);
  }
}

template <int NV>
void TileNV(const AttnTile& t) {
  const int64_t d = t.head_dim;
  const int64_t vs = (d + 15) / 16 * 16;
  float* qt = t.scratch;         // [d, 64]
  float* st = qt + d * kB;       // [nk, 64]
  float* rmax = st + t.nk * kB;  // [64]
  float* rinv = rmax + kB;       // [64]
  float* o = rinv + kB;          // [64, vs]
  float* vp = o + kB * vs;       // [kKeyChunk, vs]
  // Q^T: copy the query rows densely first (reading the strided rows column
  // by column would thrash a few cache sets: the rows of a fused QKV buffer
  // sit at a large, nearly power-of-two stride), then transpose.
  for (int64_t r = 0; r < t.rows; ++r) {
    const float* src = t.q + r * t.q_rs;
    for (int64_t c = 0; c < d; c += 16)
      _mm512_store_ps(vp + r * vs + c,
                      _mm512_maskz_loadu_ps(TailMask(d - c), src + c));
  }
  for (int64_t p = 0; p < d; ++p) {
    float* dst = qt + p * kB;
    for (int64_t r = 0; r < t.rows; ++r) dst[r] = vp[r * vs + p];
    for (int64_t r = t.rows; r < 16 * NV; ++r) dst[r] = 0.0f;
  }
  // The running max starts at the sink logit: it covers keys and sink.
  for (int64_t r = 0; r < kB; ++r)
    rmax[r] = t.has_sink ? t.sink : -std::numeric_limits<float>::infinity();
  Scores<NV>(t, qt, st, rmax);

  __m512 mx[NV], sum[NV];
  for (int v = 0; v < NV; ++v) {
    // Rows past `rows` have max -inf; use 0 there to keep the lanes finite.
    const __m512 m = _mm512_loadu_ps(rmax + 16 * v);
    mx[v] = _mm512_mask_blend_ps(
        _mm512_cmp_ps_mask(m, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ),
        _mm512_setzero_ps(), m);
    // The sink's exp joins the row sum; its column is dropped (no V row).
    sum[v] = t.has_sink ? Exp(_mm512_sub_ps(_mm512_set1_ps(t.sink), mx[v]))
                        : _mm512_setzero_ps();
  }
  std::memset(o, 0, sizeof(float) * kB * vs);
  for (int64_t c0 = 0; c0 < t.nk; c0 += kKeyChunk) {
    const int64_t kc = std::min(kKeyChunk, t.nk - c0);
    ExpChunk<NV>(st, c0, kc, mx, sum);
    for (int64_t jj = 0; jj < kc; ++jj) {
      const float* src = t.v + (c0 + jj) * t.v_rs;
      for (int64_t c = 0; c < d; c += 16)
        _mm512_store_ps(vp + jj * vs + c,
                        _mm512_maskz_loadu_ps(TailMask(d - c), src + c));
    }
    // head_dim in pieces of at most 128 columns (8 vectors) per sweep.
    for (int64_t c = 0; c < d; c += 128) {
      switch ((std::min<int64_t>(d - c, 128) + 15) / 16) {
        case 1:
          PvChunk<1>(t, st, vp, vs, o, c0, kc, c);
          break;
        case 2:
          PvChunk<2>(t, st, vp, vs, o, c0, kc, c);
          break;
        case 3:
          PvChunk<3>(t, st, vp, vs, o, c0, kc, c);
          break;
        case 4:
          PvChunk<4>(t, st, vp, vs, o, c0, kc, c);
          break;
        case 5:
          PvChunk<5>(t, st, vp, vs, o, c0, kc, c);
          break;
        case 6:
          PvChunk<6>(t, st, vp, vs, o, c0, kc, c);
          break;
        case 7:
          PvChunk<7>(t, st, vp, vs, o, c0, kc, c);
          break;
        default:
          PvChunk<8>(t, st, vp, vs, o, c0, kc, c);
          break;
      }
    }
  }
  for (int v = 0; v < NV; ++v) {
    const __mmask16 nz =
        _mm512_cmp_ps_mask(sum[v], _mm512_setzero_ps(), _CMP_GT_OQ);
    _mm512_storeu_ps(rinv + 16 * v,
                     _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0f), sum[v]));
  }
  for (int64_t r = 0; r < t.rows; ++r) {
    const __m512 inv = _mm512_set1_ps(rinv[r]);
    float* z = t.z + r * t.z_rs;
    for (int64_t c = 0; c < d; c += 16)
      _mm512_mask_storeu_ps(z + c, TailMask(d - c),
                            _mm512_mul_ps(_mm512_load_ps(o + r * vs + c), inv));
  }
  if (t.probs != nullptr) {
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t jj = 0; jj < t.nk; ++jj)
        t.probs[r * t.probs_rs + t.j_lo + jj] = st[jj * kB + r] * rinv[r];
  }
}

}  // namespace

void AttentionTile(const AttnTile& t) {
  switch ((t.rows + 15) / 16) {
    case 1:
      TileNV<1>(t);
      break;
    case 2:
      TileNV<2>(t);
      break;
    case 3:
      TileNV<3>(t);
      break;
    default:
      TileNV<4>(t);
      break;
  }
}

// ---- Decode-sized GEMM
// -----------------------------------------------------------

void RoundSpan(const float* src, float* dst, DType dtype, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, src + i);
    __m512 r = v;
    if (dtype == DType::kBF16) {
      r = _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(ToBf16(v)), 16));
    } else if (dtype == DType::kF16) {
      r = _mm512_cvtph_ps(
          _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    _mm512_mask_storeu_ps(dst + i, m, r);
  }
}

}  // namespace loom::cpu::avx512
