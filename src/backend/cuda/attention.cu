// Causal self-attention over packed variable-length sequences (see
// AttentionArgs in kernels.h and cpu::AttentionArgs for the semantics).
//
// Two kernels:
//  * AttnF32Kernel (compute F32, or probabilities requested): the CPU
//    backend's arithmetic in f32 FMA. Per (query tile of 16 rows, head), pass 1
//    walks the visible keys once for each row's max and sum of exp (the max
//    covers the sink; sum = exp(sink - max) + sum_j exp(s_j - max)), pass 2
//    recomputes the scores and forms p = exp(s - max) * (1 / sum), exactly the
//    CPU's p, accumulates z = sum_j p_j v_j in key order and writes p to
//    `probs` when asked. Row statistics live in registers: no workspace.
//  * FlashAttnKernel<HD, T> (compute BF16/F16, no probabilities):
//    FlashAttention-2 on tensor cores (mma.sync m16n8k16, f32 accumulation).
//    64 query rows per block (4 warps x 16 rows), key/value tiles of BK keys;
//    q, k, v rounded to T (round to nearest even) when stored to shared
//    memory; online softmax in f32 (running max m, running sum l of the f32
//    p); p rounded to T for the P V product; z = O * (1 / l) in f32. HD is the
//    head dim padded up to 64, 80, 96, 128 or 256 (zero columns contribute
//    exact zeros), so every head_dim <= 256 runs on tensor cores.
//
// Both map blocks to (sequence, query tile) with the device seq_start: grid.x
// = num_seqs * ceil(max_seq_len / tile), heaviest tiles first; a block whose
// tile starts past its sequence's end exits at once. grid.y = q heads.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "src/backend/cuda/kernels.h"

namespace loom::cuda {
namespace {

constexpr float kNegInf = -__builtin_huge_valf();

__host__ __device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}
__host__ __device__ __forceinline__ int64_t Max64(int64_t a, int64_t b) {
  return a > b ? a : b;
}

__device__ __forceinline__ float LoadSink(const void* sinks, DType dt,
                                          int64_t h) {
  switch (dt) {
    case DType::kBF16:
      return __uint_as_float(
          static_cast<uint32_t>(static_cast<const uint16_t*>(sinks)[h]) << 16);
    case DType::kF16:
      return __half2float(static_cast<const __half*>(sinks)[h]);
    default:
      return static_cast<const float*>(sinks)[h];
  }
}

// Score of one (query, key) pair as the CPU forms it: dot * scale, then the
// softcap, then the mask (-inf where key j is not visible to query i; i and j
// are positions within the sequence of length len).
__device__ __forceinline__ float FinishScore(float dot, float scale,
                                             float softcap, int64_t i,
                                             int64_t j, int64_t len,
                                             int64_t window) {
  const bool visible =
      j <= i && j < len && i < len && (window <= 0 || i - j < window);
  if (!visible) return kNegInf;
  float s = dot * scale;
  if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
  return s;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The query tile this block handles: sequence `seq`, rows [i0, i0 + tile) of
// it (clipped to len), or false when the tile starts past the sequence's end.
__device__ __forceinline__ bool BlockTile(const int64_t* seq_start,
                                          int64_t n_tiles, int64_t tile,
                                          int64_t* t0, int64_t* len,
                                          int64_t* i0) {
  const int64_t seq = static_cast<int64_t>(blockIdx.x) / n_tiles;
  const int64_t qt = n_tiles - 1 - static_cast<int64_t>(blockIdx.x) % n_tiles;
  *t0 = seq_start[seq];
  *len = seq_start[seq + 1] - *t0;
  *i0 = qt * tile;
  return *i0 < *len;
}

// ---- f32 path
// -----------------------------------------------------------------

constexpr int kF32Rows = 16;       // query rows per block
constexpr int kF32Keys = 32;       // keys per tile (one per lane)
constexpr int kF32Threads = 256;   // 8 warps: warp w scores rows w and w + 8
constexpr int kF32MaxChunks = 16;  // head_dim <= 16 * 16 = 256

struct F32Params {
  const float* q;            // [T, q_heads, hd], row stride q_rs
  const float* k;            // [T, kv_heads, hd], row stride k_rs
  const float* v;            // [T, kv_heads, hd], row stride v_rs
  float* z;                  // [T, q_heads * hd] dense
  float* probs;              // [q_heads, L, L] of the single sequence, or null
  const int64_t* seq_start;  // [num_seqs + 1], device
  const void* sinks;         // [q_heads] in sinks_dtype, or null
  int64_t q_rs, k_rs, v_rs;
  int64_t n_tiles, group, window;
  int hd, ks;  // head dim; K tile row stride in shared memory (odd)
  float scale, softcap;
  DType sinks_dtype;
  int q_heads;
};

// Shared floats: Q [16, hd], K [32, ks], V [32, hd], P [16, 33].
int64_t F32SmemBytes(int hd) {
  const int ks = hd | 1;
  return 4 * (static_cast<int64_t>(kF32Rows) * hd + kF32Keys * ks +
              kF32Keys * hd + kF32Rows * (kF32Keys + 1));
}

__global__ void __launch_bounds__(kF32Threads)
    AttnF32Kernel(const F32Params p) {
  int64_t t0, len, i0;
  if (!BlockTile(p.seq_start, p.n_tiles, kF32Rows, &t0, &len, &i0)) return;
  const int h = blockIdx.y;
  const int64_t kvh = h / p.group;
  const int hd = p.hd, ks = p.ks;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  extern __shared__ float smem[];
  float* qs = smem;                // [16, hd]
  float* kt = qs + kF32Rows * hd;  // [32, ks]
  float* vt = kt + kF32Keys * ks;  // [32, hd]
  float* ps = vt + kF32Keys * hd;  // [16, 33]
  const int rows = static_cast<int>(Min64(kF32Rows, len - i0));
  const int64_t z_rs = static_cast<int64_t>(p.q_heads) * hd;

  for (int e = tid; e < kF32Rows * hd; e += kF32Threads) {
    const int r = e / hd, c = e - r * hd;
    qs[e] = r < rows ? p.q[(t0 + i0 + r) * p.q_rs + h * hd + c] : 0.0f;
  }
  // Keys visible to some row of the tile: [j_lo, j_hi).
  const int64_t j_lo = p.window > 0 ? Max64(0, i0 - p.window + 1) : 0;
  const int64_t j_hi = i0 + rows;
  const bool has_sink = p.sinks != nullptr;
  const float sink = has_sink ? LoadSink(p.sinks, p.sinks_dtype, h) : 0.0f;

  // Score of this thread's key (lane) for tile row r (the K tile is in kt).
  auto score = [&](int r, int64_t j0) {
    const float* qr = qs + r * hd;
    const float* kr = kt + lane * ks;
    float dot = 0.0f;
    for (int d = 0; d < hd; ++d) dot = fmaf(qr[d], kr[d], dot);
    return FinishScore(dot, p.scale, p.softcap, i0 + r, j0 + lane, len,
                       p.window);
  };
  auto load_k = [&](int64_t j0) {
    for (int e = tid; e < kF32Keys * hd; e += kF32Threads) {
      const int r = e / hd, c = e - r * hd;
      const int64_t j = j0 + r;
      kt[r * ks + c] = j < j_hi ? p.k[(t0 + j) * p.k_rs + kvh * hd + c] : 0.0f;
    }
  };

  // Pass 1: row max (covering the sink) and sum of exp, online. Warp `warp`
  // owns rows warp and warp + 8; every lane holds the same statistics.
  float m[2], l[2];
#pragma unroll
  for (int a = 0; a < 2; ++a) {
    m[a] = has_sink ? sink : kNegInf;
    l[a] = has_sink ? 1.0f : 0.0f;  // exp(sink - sink)
  }
  __syncthreads();
  for (int64_t j0 = j_lo; j0 < j_hi; j0 += kF32Keys) {
    load_k(j0);
    __syncthreads();
#pragma unroll
    for (int a = 0; a < 2; ++a) {
      const int r = warp + 8 * a;
      const float s = score(r, j0);
      const float m_new = fmaxf(m[a], WarpMax(s));
      // All masked so far (no sink): keep everything at zero.
      const float m_use = m_new == kNegInf ? 0.0f : m_new;
      l[a] = l[a] * expf(m[a] - m_use) + WarpSum(expf(s - m_use));
      m[a] = m_new;
    }
    __syncthreads();
  }
  float inv[2];
#pragma unroll
  for (int a = 0; a < 2; ++a) inv[a] = l[a] > 0.0f ? 1.0f / l[a] : 0.0f;

  // Pass 2: p = exp(s - max) * inv (the CPU's probabilities), z += p v.
  // Accumulator mapping: thread tid owns row tid / 16, columns
  // (tid % 16) + 16 c.
  const int pr = tid >> 4, pc = tid & 15;
  float acc[kF32MaxChunks];
#pragma unroll
  for (int c = 0; c < kF32MaxChunks; ++c) acc[c] = 0.0f;
  for (int64_t j0 = j_lo; j0 < j_hi; j0 += kF32Keys) {
    load_k(j0);
    for (int e = tid; e < kF32Keys * hd; e += kF32Threads) {
      const int r = e / hd, c = e - r * hd;
      const int64_t j = j0 + r;
      vt[e] = j < j_hi ? p.v[(t0 + j) * p.v_rs + kvh * hd + c] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int a = 0; a < 2; ++a) {
      const int r = warp + 8 * a;
      const float s = score(r, j0);
      const float pv = s == kNegInf ? 0.0f : expf(s - m[a]) * inv[a];
      ps[r * (kF32Keys + 1) + lane] = pv;
      const int64_t j = j0 + lane;
      if (p.probs != nullptr && r < rows && j < j_hi)
        p.probs[(static_cast<int64_t>(h) * len + i0 + r) * len + j] = pv;
    }
    __syncthreads();
    const int nk = static_cast<int>(Min64(kF32Keys, j_hi - j0));
    const float* prow = ps + pr * (kF32Keys + 1);
    for (int jj = 0; jj < nk; ++jj) {
      const float pj = prow[jj];
      const float* vr = vt + jj * hd + pc;
#pragma unroll
      for (int c = 0; c < kF32MaxChunks; ++c)
        if (pc + 16 * c < hd) acc[c] = fmaf(pj, vr[16 * c], acc[c]);
    }
    __syncthreads();
  }
  if (pr < rows) {
    float* zr = p.z + (t0 + i0 + pr) * z_rs + static_cast<int64_t>(h) * hd;
#pragma unroll
    for (int c = 0; c < kF32MaxChunks; ++c)
      if (pc + 16 * c < hd) zr[pc + 16 * c] = acc[c];
  }
}

// ---- tensor-core path
// ---------------------------------------------------------

constexpr int kFaRows = 64;  // query rows per block: 4 warps x 16
constexpr int kFaThreads = 128;

template <typename T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t PackPair<__nv_bfloat16>(float lo,
                                                            float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo (low)
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t PackPair<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// d[0..3] += A (16x16, row) * B (16x8, col); fragments as in the PTX ISA.
template <typename T>
__device__ __forceinline__ void Mma(float* d, const uint32_t* a,
                                    const uint32_t* b);
template <>
__device__ __forceinline__ void Mma<__nv_bfloat16>(float* d, const uint32_t* a,
                                                   const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
      "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void Mma<__half>(float* d, const uint32_t* a,
                                            const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
      "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four transposed 8x8 b16 matrices: lane l supplies the address of row l % 8
// of matrix l / 8; r[i] is matrix i's fragment (rows 2 (lane % 4) + {0, 1},
// column lane / 4).
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t* r, const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(a));
}

struct FaParams {
  const float* q;            // [T, q_heads, hd], row stride q_rs
  const float* k;            // [T, kv_heads, hd], row stride k_rs
  const float* v;            // [T, kv_heads, hd], row stride v_rs
  float* z;                  // [T, q_heads * hd] dense
  const int64_t* seq_start;  // [num_seqs + 1], device
  const void* sinks;         // [q_heads] in sinks_dtype, or null
  int64_t q_rs, k_rs, v_rs;
  int64_t n_tiles, group, window;
  int hd;
  float scale, softcap;
  DType sinks_dtype;
  int q_heads;
};

template <int HD>
constexpr int FaKeys() {
  return HD > 128 ? 32 : 64;
}
// Shared row stride in elements: HD + 8 keeps the 32-bit fragment loads and
// ldmatrix rows on distinct banks (row starts 16 bytes apart mod 128).
template <int HD>
constexpr int FaLd() {
  return HD + 8;
}
template <int HD>
int64_t FaSmemBytes() {
  return 2 * static_cast<int64_t>(kFaRows + 2 * FaKeys<HD>()) * FaLd<HD>();
}

// Stores rows [r0, r0 + nrows) of a [T, heads, hd] f32 tensor (positions j0 +
// r of sequence t0.., column offset col0) to dst [nrows, LD] in T, rounded to
// nearest even; rows at or past `limit` and columns >= hd are zero.
template <int HD, typename T>
__device__ __forceinline__ void LoadTile(T* dst, int nrows, const float* src,
                                         int64_t rs, int64_t t0, int64_t j0,
                                         int64_t limit, int64_t col0, int hd) {
  constexpr int kPairs = HD / 2;
  constexpr int kLd = FaLd<HD>();
  for (int e = threadIdx.x; e < nrows * kPairs; e += kFaThreads) {
    const int r = e / kPairs, d = 2 * (e - r * kPairs);
    const int64_t j = j0 + r;
    float lo = 0.0f, hi = 0.0f;
    if (j < limit) {
      const float* row = src + (t0 + j) * rs + col0;
      if (d < hd) lo = row[d];
      if (d + 1 < hd) hi = row[d + 1];
    }
    *reinterpret_cast<uint32_t*>(dst + r * kLd + d) = PackPair<T>(lo, hi);
  }
}

template <int HD, typename T>
__global__ void __launch_bounds__(kFaThreads)
    FlashAttnKernel(const FaParams p) {
  constexpr int kBK = FaKeys<HD>();
  constexpr int kLd = FaLd<HD>();
  constexpr int kNT = kBK / 8;  // score n-tiles (8 keys each)
  constexpr int kDT = HD / 8;   // output n-tiles (8 columns each)
  int64_t t0, len, i0;
  if (!BlockTile(p.seq_start, p.n_tiles, kFaRows, &t0, &len, &i0)) return;
  const int h = blockIdx.y;
  const int64_t kvh = h / p.group;
  const int hd = p.hd;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tig = lane & 3;
  extern __shared__ __align__(16) unsigned char fa_smem[];
  T* qs = reinterpret_cast<T*>(fa_smem);  // [64, kLd]
  T* ks = qs + kFaRows * kLd;             // [kBK, kLd]
  T* vs = ks + kBK * kLd;                 // [kBK, kLd]

  const int64_t j_hi = Min64(len, i0 + kFaRows);
  const int64_t j_lo = p.window > 0 ? Max64(0, i0 - p.window + 1) : 0;
  LoadTile<HD, T>(qs, kFaRows, p.q, p.q_rs, t0, i0, len,
                  static_cast<int64_t>(h) * hd, hd);

  // This thread's rows (tile rows 16 warp + g and + 8) and their statistics.
  const int64_t wi0 = i0 + 16 * warp;  // first query position of the warp
  int64_t qi[2] = {wi0 + g, wi0 + g + 8};
  const bool has_sink = p.sinks != nullptr;
  const float sink = has_sink ? LoadSink(p.sinks, p.sinks_dtype, h) : 0.0f;
  float m[2], l[2];
#pragma unroll
  for (int a = 0; a < 2; ++a) {
    m[a] = has_sink ? sink : kNegInf;
    l[a] = has_sink ? 1.0f : 0.0f;
  }
  float o[kDT][4];
#pragma unroll
  for (int n = 0; n < kDT; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) o[n][c] = 0.0f;

  for (int64_t j0 = j_lo; j0 < j_hi; j0 += kBK) {
    __syncthreads();  // previous tile fully consumed (and Q stored)
    LoadTile<HD, T>(ks, kBK, p.k, p.k_rs, t0, j0, j_hi, kvh * hd, hd);
    LoadTile<HD, T>(vs, kBK, p.v, p.v_rs, t0, j0, j_hi, kvh * hd, hd);
    __syncthreads();
    // Skip the tile for this warp when it is masked for all 16 rows (keys
    // after the last row, or before the first row's window).
    const bool skip = wi0 >= len || j0 > wi0 + 15 ||
                      (p.window > 0 && j0 + kBK - 1 < wi0 - p.window + 1);
    if (skip) continue;

    // S = Q K^T.
    float s[kNT][4];
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) s[n][c] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < HD / 16; ++kc) {
      const T* qa = qs + (16 * warp + g) * kLd + 16 * kc + 2 * tig;
      uint32_t a[4];
      a[0] = *reinterpret_cast<const uint32_t*>(qa);
      a[1] = *reinterpret_cast<const uint32_t*>(qa + 8 * kLd);
      a[2] = *reinterpret_cast<const uint32_t*>(qa + 8);
      a[3] = *reinterpret_cast<const uint32_t*>(qa + 8 * kLd + 8);
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
        const T* kb = ks + (8 * n + g) * kLd + 16 * kc + 2 * tig;
        uint32_t b[2];
        b[0] = *reinterpret_cast<const uint32_t*>(kb);
        b[1] = *reinterpret_cast<const uint32_t*>(kb + 8);
        Mma<T>(s[n], a, b);
      }
    }
    // Scale, softcap, mask; online softmax per row.
    float tmax[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int a = c >> 1;
        const int64_t j = j0 + 8 * n + 2 * tig + (c & 1);
        s[n][c] =
            FinishScore(s[n][c], p.scale, p.softcap, qi[a], j, len, p.window);
        tmax[a] = fmaxf(tmax[a], s[n][c]);
      }
    float alpha[2], m_use[2], tsum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int a = 0; a < 2; ++a) {
      tmax[a] = fmaxf(tmax[a], __shfl_xor_sync(0xffffffffu, tmax[a], 1));
      tmax[a] = fmaxf(tmax[a], __shfl_xor_sync(0xffffffffu, tmax[a], 2));
      const float m_new = fmaxf(m[a], tmax[a]);
      m_use[a] = m_new == kNegInf ? 0.0f : m_new;  // all masked so far
      alpha[a] = expf(m[a] - m_use[a]);
      m[a] = m_new;
    }
    uint32_t pa[kNT][2];  // P rounded to T: rows g, g + 8 of each n-tile
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        s[n][c] = expf(s[n][c] - m_use[c >> 1]);  // exp(-inf) = 0
        tsum[c >> 1] += s[n][c];
      }
      pa[n][0] = PackPair<T>(s[n][0], s[n][1]);
      pa[n][1] = PackPair<T>(s[n][2], s[n][3]);
    }
#pragma unroll
    for (int a = 0; a < 2; ++a) {
      tsum[a] += __shfl_xor_sync(0xffffffffu, tsum[a], 1);
      tsum[a] += __shfl_xor_sync(0xffffffffu, tsum[a], 2);
      l[a] = l[a] * alpha[a] + tsum[a];
    }
#pragma unroll
    for (int n = 0; n < kDT; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    // O += P V: A = P (16 rows x 16 keys), B = V rows of those keys.
#pragma unroll
    for (int kc = 0; kc < kBK / 16; ++kc) {
      const uint32_t a[4] = {pa[2 * kc][0], pa[2 * kc][1], pa[2 * kc + 1][0],
                             pa[2 * kc + 1][1]};
      const T* vrow = vs + (16 * kc + (lane & 15)) * kLd + 8 * (lane >> 4);
#pragma unroll
      for (int dp = 0; dp < HD / 16; ++dp) {
        uint32_t b[4];
        LdMatrixX4Trans(b, vrow + 16 * dp);
        Mma<T>(o[2 * dp], a, b);
        Mma<T>(o[2 * dp + 1], a, b + 2);
      }
    }
  }

  // z = O * (1 / l).
  const int64_t z_rs = static_cast<int64_t>(p.q_heads) * hd;
#pragma unroll
  for (int a = 0; a < 2; ++a) {
    if (qi[a] >= len) continue;
    const float inv = l[a] > 0.0f ? 1.0f / l[a] : 0.0f;
    float* zr = p.z + (t0 + qi[a]) * z_rs + static_cast<int64_t>(h) * hd;
#pragma unroll
    for (int n = 0; n < kDT; ++n) {
      const int d = 8 * n + 2 * tig;
      if (d < hd) zr[d] = o[n][2 * a] * inv;
      if (d + 1 < hd) zr[d + 1] = o[n][2 * a + 1] * inv;
    }
  }
}

template <int HD, typename T>
void LaunchFlash(const FaParams& fp, int64_t num_seqs, int64_t q_heads,
                 cudaStream_t s) {
  const int64_t bytes = FaSmemBytes<HD>();
  cudaFuncSetAttribute(FlashAttnKernel<HD, T>,
                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(bytes));
  const dim3 grid(static_cast<unsigned>(num_seqs * fp.n_tiles),
                  static_cast<unsigned>(q_heads));
  FlashAttnKernel<HD, T><<<grid, kFaThreads, bytes, s>>>(fp);
}

template <typename T>
void LaunchFlashDim(const FaParams& fp, int64_t num_seqs, int64_t q_heads,
                    cudaStream_t s) {
  if (fp.hd <= 64)
    LaunchFlash<64, T>(fp, num_seqs, q_heads, s);
  else if (fp.hd <= 80)
    LaunchFlash<80, T>(fp, num_seqs, q_heads, s);
  else if (fp.hd <= 96)
    LaunchFlash<96, T>(fp, num_seqs, q_heads, s);
  else if (fp.hd <= 128)
    LaunchFlash<128, T>(fp, num_seqs, q_heads, s);
  else
    LaunchFlash<256, T>(fp, num_seqs, q_heads, s);
}

}  // namespace

// The f32 kernel takes any head_dim <= 256; the tensor-core kernel pads the
// head dim up to 64, 80, 96, 128 or 256, so it too takes every head_dim <=
// 256 (no 16-bit request needs the f32 fallback).
bool AttentionSupportsHeadDim(int64_t head_dim) {
  return head_dim >= 1 && head_dim <= 256;
}

void Attention(const AttentionArgs& a, cudaStream_t s) {
  if (a.num_seqs <= 0 || a.max_seq_len <= 0 || a.total_tokens <= 0) return;
  if (a.q_heads <= 0 || a.kv_heads <= 0 || a.q_heads % a.kv_heads != 0 ||
      a.q_heads > 65535 || !AttentionSupportsHeadDim(a.head_dim))
    return;  // the backend validates these first
  const int64_t group = a.q_heads / a.kv_heads;
  const bool tensor_cores = a.probs == nullptr && (a.compute == DType::kBF16 ||
                                                   a.compute == DType::kF16);
  if (tensor_cores) {
    FaParams fp;
    fp.q = a.q;
    fp.k = a.k;
    fp.v = a.v;
    fp.z = a.z;
    fp.seq_start = a.seq_start;
    fp.sinks = a.sinks;
    fp.q_rs = a.q_rs;
    fp.k_rs = a.k_rs;
    fp.v_rs = a.v_rs;
    fp.n_tiles = (a.max_seq_len + kFaRows - 1) / kFaRows;
    fp.group = group;
    fp.window = a.window;
    fp.hd = static_cast<int>(a.head_dim);
    fp.scale = a.scale;
    fp.softcap = a.softcap;
    fp.sinks_dtype = a.sinks_dtype;
    fp.q_heads = static_cast<int>(a.q_heads);
    if (a.compute == DType::kBF16)
      LaunchFlashDim<__nv_bfloat16>(fp, a.num_seqs, a.q_heads, s);
    else
      LaunchFlashDim<__half>(fp, a.num_seqs, a.q_heads, s);
    return;
  }
  if (a.probs != nullptr) {
    // Masked entries stay zero; the kernel writes the visible band. With
    // probs there is one sequence, of total_tokens tokens.
    cudaMemsetAsync(a.probs, 0,
                    sizeof(float) * a.q_heads * a.total_tokens * a.total_tokens,
                    s);
  }
  F32Params fp;
  fp.q = a.q;
  fp.k = a.k;
  fp.v = a.v;
  fp.z = a.z;
  fp.probs = a.num_seqs == 1 ? a.probs : nullptr;
  fp.seq_start = a.seq_start;
  fp.sinks = a.sinks;
  fp.q_rs = a.q_rs;
  fp.k_rs = a.k_rs;
  fp.v_rs = a.v_rs;
  fp.n_tiles = (a.max_seq_len + kF32Rows - 1) / kF32Rows;
  fp.group = group;
  fp.window = a.window;
  fp.hd = static_cast<int>(a.head_dim);
  fp.ks = fp.hd | 1;
  fp.scale = a.scale;
  fp.softcap = a.softcap;
  fp.sinks_dtype = a.sinks_dtype;
  fp.q_heads = static_cast<int>(a.q_heads);
  const int64_t bytes = F32SmemBytes(fp.hd);
  cudaFuncSetAttribute(AttnF32Kernel,
                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(bytes));
  const dim3 grid(static_cast<unsigned>(a.num_seqs * fp.n_tiles),
                  static_cast<unsigned>(a.q_heads));
  AttnF32Kernel<<<grid, kF32Threads, bytes, s>>>(fp);
}

}  // namespace loom::cuda
