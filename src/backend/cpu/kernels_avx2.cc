// AVX2 + FMA versions of the per-row kernels (see kernels_internal.h). This
// file alone is compiled with -mavx2 -mfma -mf16c; its functions are only
// called after ActiveIsa() >= kAvx2.
//
// Attention, the norms, the activations, softcap and LogSumExp are written
// here with the AVX-512 versions' math and summation structure (8 lanes
// instead of 16; exp, tanh and erfc by the same polynomials, 2^n applied as
// two exact power-of-two products since AVX2 has no vscalefps). The simple
// element loops (add, scale, conversions, RoPE) are the portable source
// compiled again for AVX2 (namespace avx2_auto), which the compiler
// vectorises 8 wide.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "src/backend/cpu/kernels_internal.h"
#include "src/base/check.h"

#define LOOM_PORTABLE_NS avx2_auto
#define LOOM_PORTABLE_KERNELS_ONLY
#include "src/backend/cpu/kernels_portable.cc"  // NOLINT(build/include)

namespace loom::cpu::avx2 {
namespace {

// Lane i of the mask is set when i < n (n clamped to [0, 8]).
inline __m256i TailMask(int64_t n) {
  const int32_t k = static_cast<int32_t>(std::clamp<int64_t>(n, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
// The first min(n, 8) floats at p, zeros after.
inline __m256 Load(const float* p, int64_t n) {
  return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, TailMask(n));
}
inline void Store(float* p, __m256 v, int64_t n) {
  if (n >= 8)
    _mm256_storeu_ps(p, v);
  else
    _mm256_maskstore_ps(p, TailMask(n), v);
}

// p = c[0]; p = p x + c[i] (the shared coefficient tables).
template <size_t N>
inline __m256 Horner(const float (&c)[N], __m256 x) {
  __m256 p = _mm256_set1_ps(c[0]);
  for (size_t i = 1; i < N; ++i)
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(c[i]));
  return p;
}

inline __m256 Exp(__m256 x) {
  // Clamp so that n stays finite: e^-110 underflows to exactly 0, e^89
  // overflows to inf.
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(89.0f)),
                    _mm256_set1_ps(-110.0f));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  const __m256 p = Horner(kExpPoly, r);
  // 2^n = 2^n1 2^n2 with both halves normal (n in [-159, 129]): the first
  // product is exact, the second rounds once, as vscalefps would.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

inline __m256 Abs(__m256 x) {
  return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
}

inline __m256 Tanh(__m256 y) {
  y = _mm256_max_ps(_mm256_min_ps(y, _mm256_set1_ps(9.0f)),
                    _mm256_set1_ps(-9.0f));
  const __m256 z = _mm256_add_ps(y, y);
  // expm1(z) by Taylor series z + z^2/2! + ... + z^10/10! for small |z|.
  const __m256 p = Horner(kExpm1Poly, z);
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), z, z);
  const __m256 large = _mm256_sub_ps(Exp(z), _mm256_set1_ps(1.0f));
  const __m256 is_small =
      _mm256_cmp_ps(Abs(z), _mm256_set1_ps(1.1f), _CMP_LT_OQ);
  const __m256 em = _mm256_blendv_ps(large, small, is_small);
  return _mm256_div_ps(em, _mm256_add_ps(em, _mm256_set1_ps(2.0f)));
}

// erfc(z) for any z (the AVX-512 version's fit).
inline __m256 Erfc(__m256 z) {
  const __m256 a = Abs(z);
  const __m256 t = _mm256_div_ps(
      _mm256_set1_ps(1.0f),
      _mm256_fmadd_ps(_mm256_set1_ps(0.5f), a, _mm256_set1_ps(1.0f)));
  const __m256 p = Horner(kErfcPoly, t);
  const __m256 a2 = _mm256_mul_ps(a, a);
  const __m256 a2_lo = _mm256_fmsub_ps(a, a, a2);
  const __m256 e = Exp(_mm256_sub_ps(_mm256_sub_ps(p, a2), a2_lo));
  const __m256 r = _mm256_mul_ps(t, e);
  const __m256 neg = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);
  return _mm256_blendv_ps(r, _mm256_sub_ps(_mm256_set1_ps(2.0f), r), neg);
}

inline __m256 Act(Activation act, __m256 x) {
  switch (act) {
    case Activation::kSilu:
      return _mm256_div_ps(
          x, _mm256_add_ps(_mm256_set1_ps(1.0f),
                           Exp(_mm256_sub_ps(_mm256_setzero_ps(), x))));
    case Activation::kGeluTanh: {
      const __m256 x2 = _mm256_mul_ps(x, x);
      const __m256 inner = _mm256_mul_ps(
          x,
          _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x2, _mm256_set1_ps(1.0f)));
      const __m256 m2u =
          _mm256_mul_ps(inner, _mm256_set1_ps(-2.0f * 0.7978845608028654f));
      return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), Exp(m2u)));
    }
    case Activation::kGeluExact: {
      const __m256 z = _mm256_mul_ps(x, _mm256_set1_ps(-0.70710678118654752f));
      return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), Erfc(z));
    }
    case Activation::kRelu:
      return _mm256_max_ps(x, _mm256_setzero_ps());
    case Activation::kReluSquared: {
      const __m256 r = _mm256_max_ps(x, _mm256_setzero_ps());
      return _mm256_mul_ps(r, r);
    }
  }
  return x;
}

// Up to 8 values of an F32/BF16/F16 array from element i as f32 (zeros past
// n).
inline __m256 LoadAs(const void* p, DType dtype, int64_t i, int64_t n) {
  if (dtype == DType::kF32) return Load(static_cast<const float*>(p) + i, n);
  alignas(16) uint16_t h[8] = {};
  std::memcpy(h, static_cast<const uint16_t*>(p) + i,
              static_cast<size_t>(std::min<int64_t>(n, 8)) * 2);
  const __m128i v = _mm_load_si128(reinterpret_cast<const __m128i*>(h));
  if (dtype == DType::kF16) return _mm256_cvtph_ps(v);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

// 8 floats widened to two vectors of 4 doubles.
inline __m256d Lo(__m256 v) {
  return _mm256_cvtps_pd(_mm256_castps256_ps128(v));
}
inline __m256d Hi(__m256 v) {
  return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
}
inline double HsumD(__m256d a) {
  const __m128d s =
      _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}
inline float Hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

}  // namespace

void RmsNormRow(const float* x, const void* w, DType w_dtype, float offset,
                float eps, float* y, int64_t dim) {
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  for (int64_t i = 0; i < dim; i += 8) {
    const __m256 v = Load(x + i, dim - i);
    acc0 = _mm256_fmadd_pd(Lo(v), Lo(v), acc0);
    acc1 = _mm256_fmadd_pd(Hi(v), Hi(v), acc1);
  }
  const double ss = HsumD(_mm256_add_pd(acc0, acc1));
  const __m256 inv = _mm256_set1_ps(
      static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps)));
  const __m256 off = _mm256_set1_ps(offset);
  for (int64_t i = 0; i < dim; i += 8) {
    __m256 v = _mm256_mul_ps(Load(x + i, dim - i), inv);
    if (w != nullptr)
      v = _mm256_mul_ps(v, _mm256_add_ps(LoadAs(w, w_dtype, i, dim - i), off));
    Store(y + i, v, dim - i);
  }
}

void LayerNormRow(const float* x, const void* w, const void* b, DType w_dtype,
                  float offset, float eps, float* y, int64_t dim) {
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  for (int64_t i = 0; i < dim; i += 8) {
    const __m256 v = Load(x + i, dim - i);
    s0 = _mm256_add_pd(s0, Lo(v));
    s1 = _mm256_add_pd(s1, Hi(v));
  }
  const double mean = HsumD(_mm256_add_pd(s0, s1)) / static_cast<double>(dim);
  const __m256d meand = _mm256_set1_pd(mean);
  __m256d v0 = _mm256_setzero_pd(), v1 = _mm256_setzero_pd();
  for (int64_t i = 0; i < dim; i += 8) {
    const __m256 v = Load(x + i, dim - i);
    // Lanes past the end must contribute 0, not mean^2.
    const __m256i m = TailMask(dim - i);
    const __m256d mlo =
        _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(m)));
    const __m256d mhi = _mm256_castsi256_pd(
        _mm256_cvtepi32_epi64(_mm256_extracti128_si256(m, 1)));
    const __m256d lo = _mm256_and_pd(_mm256_sub_pd(Lo(v), meand), mlo);
    const __m256d hi = _mm256_and_pd(_mm256_sub_pd(Hi(v), meand), mhi);
    v0 = _mm256_fmadd_pd(lo, lo, v0);
    v1 = _mm256_fmadd_pd(hi, hi, v1);
  }
  const double var = HsumD(_mm256_add_pd(v0, v1)) / static_cast<double>(dim);
  const __m256 inv =
      _mm256_set1_ps(static_cast<float>(1.0 / std::sqrt(var + eps)));
  const __m256 meanf = _mm256_set1_ps(static_cast<float>(mean));
  const __m256 off = _mm256_set1_ps(offset);
  for (int64_t i = 0; i < dim; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_sub_ps(Load(x + i, dim - i), meanf), inv);
    if (w != nullptr)
      v = _mm256_mul_ps(v, _mm256_add_ps(LoadAs(w, w_dtype, i, dim - i), off));
    if (b != nullptr) v = _mm256_add_ps(v, LoadAs(b, w_dtype, i, dim - i));
    Store(y + i, v, dim - i);
  }
}

void GatedRow(Activation act, const float* gate, const float* up, float* out,
              int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 g = Act(act, Load(gate + i, n - i));
    Store(out + i, _mm256_mul_ps(g, Load(up + i, n - i)), n - i);
  }
}

void ActivationSpan(Activation act, float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 8)
    Store(x + i, Act(act, Load(x + i, n - i)), n - i);
}

void SoftcapSpan(float* x, int64_t n, float cap) {
  const __m256 c = _mm256_set1_ps(cap), ic = _mm256_set1_ps(1.0f / cap);
  for (int64_t i = 0; i < n; i += 8)
    Store(x + i, _mm256_mul_ps(c, Tanh(_mm256_mul_ps(Load(x + i, n - i), ic))),
          n - i);
}

double LogSumExpRow(const float* x, int64_t n) {
  const float ninf = -std::numeric_limits<float>::infinity();
  __m256 mx = _mm256_set1_ps(ninf);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = Load(x + i, n - i);
    // Lanes past the end stay -inf.
    mx = _mm256_max_ps(mx,
                       _mm256_blendv_ps(_mm256_set1_ps(ninf), v,
                                        _mm256_castsi256_ps(TailMask(n - i))));
  }
  const float m = Hmax(mx);
  if (std::isinf(m)) return m;
  const __m256 mv = _mm256_set1_ps(m);
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 e = _mm256_and_ps(Exp(_mm256_sub_ps(Load(x + i, n - i), mv)),
                                   _mm256_castsi256_ps(TailMask(n - i)));
    s0 = _mm256_add_pd(s0, Lo(e));
    s1 = _mm256_add_pd(s1, Hi(e));
  }
  return static_cast<double>(m) + std::log(HsumD(_mm256_add_pd(s0, s1)));
}

void AddSpan(const float* x, float* y, int64_t n) {
  avx2_auto::AddSpan(x, y, n);
}
void ScaleSpan(float* x, int64_t n, float s) { avx2_auto::ScaleSpan(x, n, s); }
void FromF32Span(const float* src, void* dst, DType dtype, int64_t n) {
  avx2_auto::FromF32Span(src, dst, dtype, n);
}
void ToF32Span(const void* src, DType dtype, float* dst, int64_t n) {
  avx2_auto::ToF32Span(src, dtype, dst, n);
}
void RoundSpan(const float* src, float* dst, DType dtype, int64_t n) {
  avx2_auto::RoundSpan(src, dst, dtype, n);
}
void RopeToken(float* x, int64_t heads, int64_t head_dim, const float* cos,
               const float* sin, int64_t half) {
  avx2_auto::RopeToken(x, heads, head_dim, cos, sin, half);
}

// ---- Attention tile
// ------------------------------------------------------------
//
// The AVX-512 tile's algorithm with 8-lane vectors (16 registers): scores
// transposed, S^T [nk, 64] with the tile's query rows along the lanes,
// computed 16 queries x 4 keys at a time; the exact two-pass softmax in f32;
// then O[r, :] += sum_j E[j, r] V[j, :] per chunk of 64 keys, 6 rows x 16
// columns in registers, over the keys visible to those rows.
namespace {

constexpr int64_t kB = kAttnBlock;  // 64 = 8 vectors of 8 queries
constexpr int64_t kKeyChunk = 64;

// S^T for query rows [16 g, 16 g + 16) (two vectors); rmax updated.
void Scores16(const AttnTile& t, const float* qt, float* st, float* rmax,
              int64_t g) {
  const int64_t d = t.head_dim;
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256 scale = _mm256_set1_ps(t.scale);
  const bool cap = t.softcap > 0.0f;
  const __m256 capv = _mm256_set1_ps(t.softcap),
               icap = _mm256_set1_ps(1.0f / t.softcap);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int64_t q0 = 16 * g;
  __m256 mx0 = _mm256_loadu_ps(rmax + q0), mx1 = _mm256_loadu_ps(rmax + q0 + 8);
  auto finish = [&](int64_t jj, __m256 a0, __m256 a1) {
    // Row r sees key j iff r >= rel and r < rel + window (and r < rows).
    const int64_t rel = t.j_lo + jj - t.i0;
    const __m256i lo =
        _mm256_set1_epi32(static_cast<int32_t>(std::max<int64_t>(rel, -1)));
    const int64_t hi64 =
        t.window > 0 ? std::min(rel + t.window, t.rows) : t.rows;
    const __m256i hi = _mm256_set1_epi32(static_cast<int32_t>(hi64));
    __m256 acc[2] = {a0, a1};
    const __m256 bias =
        _mm256_set1_ps(t.alibi * static_cast<float>(t.j_lo + jj));
    for (int v = 0; v < 2; ++v) {
      __m256 s = _mm256_mul_ps(acc[v], scale);
      if (t.alibi != 0.0f) s = _mm256_add_ps(s, bias);
      if (cap) s = _mm256_mul_ps(capv, Tanh(_mm256_mul_ps(s, icap)));
      const __m256i r = _mm256_add_epi32(
          lane, _mm256_set1_epi32(static_cast<int32_t>(q0 + 8 * v)));
      // lo <= r < hi
      const __m256i vis = _mm256_andnot_si256(_mm256_cmpgt_epi32(lo, r),
                                              _mm256_cmpgt_epi32(hi, r));
      s = _mm256_blendv_ps(ninf, s, _mm256_castsi256_ps(vis));
      _mm256_storeu_ps(st + jj * kB + q0 + 8 * v, s);
      if (v == 0)
        mx0 = _mm256_max_ps(mx0, s);
      else
        mx1 = _mm256_max_ps(mx1, s);
    }
  };
  int64_t jj = 0;
  for (; jj + 4 <= t.nk; jj += 4) {
    const float* k0 = t.k + jj * t.k_rs;
    const float* k1 = k0 + t.k_rs;
    const float* k2 = k1 + t.k_rs;
    const float* k3 = k2 + t.k_rs;
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00,
           a20 = a00, a21 = a00, a30 = a00, a31 = a00;
    for (int64_t p = 0; p < d; ++p) {
      const __m256 qa = _mm256_load_ps(qt + p * kB + q0);
      const __m256 qb = _mm256_load_ps(qt + p * kB + q0 + 8);
      __m256 b = _mm256_broadcast_ss(k0 + p);
      a00 = _mm256_fmadd_ps(b, qa, a00);
      a01 = _mm256_fmadd_ps(b, qb, a01);
      b = _mm256_broadcast_ss(k1 + p);
      a10 = _mm256_fmadd_ps(b, qa, a10);
      a11 = _mm256_fmadd_ps(b, qb, a11);
      b = _mm256_broadcast_ss(k2 + p);
      a20 = _mm256_fmadd_ps(b, qa, a20);
      a21 = _mm256_fmadd_ps(b, qb, a21);
      b = _mm256_broadcast_ss(k3 + p);
      a30 = _mm256_fmadd_ps(b, qa, a30);
      a31 = _mm256_fmadd_ps(b, qb, a31);
    }
    finish(jj, a00, a01);
    finish(jj + 1, a10, a11);
    finish(jj + 2, a20, a21);
    finish(jj + 3, a30, a31);
  }
  for (; jj < t.nk; ++jj) {
    const float* k0 = t.k + jj * t.k_rs;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (int64_t p = 0; p < d; ++p) {
      const __m256 b = _mm256_broadcast_ss(k0 + p);
      a0 = _mm256_fmadd_ps(b, _mm256_load_ps(qt + p * kB + q0), a0);
      a1 = _mm256_fmadd_ps(b, _mm256_load_ps(qt + p * kB + q0 + 8), a1);
    }
    finish(jj, a0, a1);
  }
  _mm256_storeu_ps(rmax + q0, mx0);
  _mm256_storeu_ps(rmax + q0 + 8, mx1);
}

// O[r0 .. r0 + R, c .. c + 16] += sum_{jj in [jb, je)} E[jj, r] V[jj, :]
// (O [64, vs] in scratch, vp the chunk's packed V [kKeyChunk, vs], e E of the
// chunk's first key).
template <int R>
void PvRows(const float* e, const float* vp, int64_t vs, float* o, int64_t r0,
            int64_t jb, int64_t je, int64_t c) {
  __m256 acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    acc[r][0] = _mm256_load_ps(o + (r0 + r) * vs + c);
    acc[r][1] = _mm256_load_ps(o + (r0 + r) * vs + c + 8);
  }
  for (int64_t jj = jb; jj < je; ++jj) {
    const __m256 v0 = _mm256_load_ps(vp + jj * vs + c);
    const __m256 v1 = _mm256_load_ps(vp + jj * vs + c + 8);
    const float* er = e + jj * kB + r0;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 p = _mm256_broadcast_ss(er + r);
      acc[r][0] = _mm256_fmadd_ps(p, v0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(p, v1, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(o + (r0 + r) * vs + c, acc[r][0]);
    _mm256_store_ps(o + (r0 + r) * vs + c + 8, acc[r][1]);
  }
}

// One key chunk [c0, c0 + kc) for every row, all columns.
void PvChunk(const AttnTile& t, const float* st, const float* vp, int64_t vs,
             float* o, int64_t c0, int64_t kc) {
  constexpr int R = 6;  // 12 accumulators + 2 values + 1 broadcast
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
    if (jb < je)
      for (int64_t c = 0; c < vs; c += 16)
        PvRows<R>(e, vp, vs, o, r0, jb, je, c);
  }
  for (; r0 < t.rows; ++r0) {
    range(r0, 1, &jb, &je);
    if (jb < je)
      for (int64_t c = 0; c < vs; c += 16)
        PvRows<1>(e, vp, vs, o, r0, jb, je, c);
  }
}

}  // namespace

void AttentionTile(const AttnTile& t) {
  const int64_t d = t.head_dim, dv = t.v_dim;
  const int64_t qs = (d + 15) / 16 * 16, vs = (dv + 15) / 16 * 16;
  float* qt = t.scratch;         // [d, 64]
  float* st = qt + d * kB;       // [nk, 64]
  float* rmax = st + t.nk * kB;  // [64]
  float* rinv = rmax + kB;       // [64]
  float* o = rinv + kB;          // [64, vs]
  float* vp = o + kB * vs;       // [kKeyChunk, vs] (first: [rows, qs])
  const int64_t groups = (t.rows + 15) / 16;
  // Q^T: the query rows copied densely first (the rows of a fused QKV buffer
  // sit at a large, nearly power-of-two stride), then transposed.
  for (int64_t r = 0; r < t.rows; ++r) {
    const float* src = t.q + r * t.q_rs;
    for (int64_t c = 0; c < qs; c += 8)
      _mm256_store_ps(vp + r * qs + c, Load(src + c, d - c));
  }
  for (int64_t p = 0; p < d; ++p) {
    float* dst = qt + p * kB;
    for (int64_t r = 0; r < t.rows; ++r) dst[r] = vp[r * qs + p];
    for (int64_t r = t.rows; r < 16 * groups; ++r) dst[r] = 0.0f;
  }
  // The running max starts at the sink logit: it covers keys and sink.
  for (int64_t r = 0; r < kB; ++r)
    rmax[r] = t.has_sink ? t.sink : -std::numeric_limits<float>::infinity();
  for (int64_t g = 0; g < groups; ++g) Scores16(t, qt, st, rmax, g);

  const int64_t nv = 2 * groups;  // vectors of 8 query rows
  __m256 mx[8], sum[8];
  for (int64_t v = 0; v < nv; ++v) {
    // Rows past `rows` have max -inf; use 0 there to keep the lanes finite.
    const __m256 m = _mm256_loadu_ps(rmax + 8 * v);
    mx[v] = _mm256_blendv_ps(
        _mm256_setzero_ps(), m,
        _mm256_cmp_ps(m, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ));
    // The sink's exp joins the row sum; its column is dropped (no V row).
    sum[v] = t.has_sink ? Exp(_mm256_sub_ps(_mm256_set1_ps(t.sink), mx[v]))
                        : _mm256_setzero_ps();
  }
  std::memset(o, 0, sizeof(float) * kB * vs);
  for (int64_t c0 = 0; c0 < t.nk; c0 += kKeyChunk) {
    const int64_t kc = std::min(kKeyChunk, t.nk - c0);
    for (int64_t jj = c0; jj < c0 + kc; ++jj)
      for (int64_t v = 0; v < nv; ++v) {
        float* p = st + jj * kB + 8 * v;
        const __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(p), mx[v]));
        _mm256_storeu_ps(p, e);
        sum[v] = _mm256_add_ps(sum[v], e);
      }
    for (int64_t jj = 0; jj < kc; ++jj) {
      const float* src = t.v + (c0 + jj) * t.v_rs;
      for (int64_t c = 0; c < vs; c += 8)
        _mm256_store_ps(vp + jj * vs + c, Load(src + c, dv - c));
    }
    PvChunk(t, st, vp, vs, o, c0, kc);
  }
  for (int64_t v = 0; v < nv; ++v) {
    const __m256 nz = _mm256_cmp_ps(sum[v], _mm256_setzero_ps(), _CMP_GT_OQ);
    _mm256_storeu_ps(
        rinv + 8 * v,
        _mm256_and_ps(nz, _mm256_div_ps(_mm256_set1_ps(1.0f), sum[v])));
  }
  for (int64_t r = 0; r < t.rows; ++r) {
    const __m256 inv = _mm256_set1_ps(rinv[r]);
    float* z = t.z + r * t.z_rs;
    for (int64_t c = 0; c < dv; c += 8)
      Store(z + c, _mm256_mul_ps(_mm256_load_ps(o + r * vs + c), inv), dv - c);
  }
  if (t.probs != nullptr) {
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t jj = 0; jj < t.nk; ++jj)
        t.probs[r * t.probs_rs + t.j_lo + jj] = st[jj * kB + r] * rinv[r];
  }
}

}  // namespace loom::cpu::avx2
