// Mixture-of-experts kernels of the CUDA backend (see kernels.h).
//
// TopKRoute: one warp per token, the CPU kernel's arithmetic
// (src/backend/cpu/kernels_moe.cc): the max in f32, p = expf(x - max) in f32,
// their f32 sum in column order (one lane, as the CPU's loop), p / sum; the
// k picks in the CPU's selection order (descending score, equal scores to
// the lower expert), each pick a warp-wide arg-max over the columns that come
// after the previous pick; weights and renormalisation in slot order.
//
// GroupByExpert: one block, deterministic counting sort. The pairs are split
// into one contiguous segment per warp; each warp counts its segment's
// experts into its own row of a shared [warps, experts] table (shared atomics
// only add, so the counts are order-free), one thread turns the totals into
// offsets, the table becomes each warp's first output row per expert, and
// each warp then walks its segment in order, 32 pairs at a time, ranking
// equal experts among its lanes with __match_any_sync. The result is the
// CPU's stable order exactly.
#include <cstdint>

#include "src/backend/cuda/kernels.h"

namespace loom::cuda {
namespace {

constexpr int kRouteWarps = 4;          // tokens per block
constexpr int kMaxRouteExperts = 1024;  // CudaBackend's max_route_experts

// Whether (v, j) comes after (pv, pj) in the selection order.
__device__ __forceinline__ bool After(float v, int j, float pv, int pj) {
  return v < pv || (v == pv && j > pj);
}

// logits [tokens, experts] (row stride ld) -> ids / weights [tokens, k].
__global__ void TopKRouteKernel(const float* logits, int64_t tokens,
                                int experts, int64_t ld, int k,
                                bool softmax_first, bool renormalize,
                                int32_t* ids, float* weights) {
  __shared__ float scores[kRouteWarps][kMaxRouteExperts];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = blockIdx.x * int64_t{kRouteWarps} + warp;
  if (t >= tokens) return;  // whole warps only; no block barrier below
  const float* x = logits + t * ld;
  float* s = scores[warp];
  int32_t* id = ids + t * k;
  float* w = weights + t * k;
  if (softmax_first) {
    float m = -INFINITY;
    for (int j = lane; j < experts; j += 32) m = fmaxf(m, x[j]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    for (int j = lane; j < experts; j += 32) s[j] = expf(__fsub_rn(x[j], m));
    __syncwarp();
    float sum = 0.0f;
    if (lane == 0)
      for (int j = 0; j < experts; ++j) sum = __fadd_rn(sum, s[j]);
    sum = __shfl_sync(0xffffffffu, sum, 0);
    __syncwarp();
    for (int j = lane; j < experts; j += 32) s[j] = __fdiv_rn(s[j], sum);
  } else {
    for (int j = lane; j < experts; j += 32) s[j] = x[j];
  }
  __syncwarp();
  // The k picks: each the first of the columns after the previous pick.
  float pv = 0.0f;
  int pj = -1;
  for (int slot = 0; slot < k; ++slot) {
    float bv = 0.0f;
    int bj = -1;
    for (int j = lane; j < experts; j += 32) {
      const float v = s[j];
      if (pj >= 0 && !After(v, j, pv, pj)) continue;
      if (bj < 0 || v > bv) {  // lanes scan ascending j: ties keep the lower
        bv = v;
        bj = j;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oj = __shfl_xor_sync(0xffffffffu, bj, o);
      if (oj >= 0 && (bj < 0 || ov > bv || (ov == bv && oj < bj))) {
        bv = ov;
        bj = oj;
      }
    }
    if (lane == 0) id[slot] = bj;
    pv = bv;
    pj = bj;
  }
  __syncwarp();
  if (lane != 0) return;
  if (softmax_first) {
    float ksum = 0.0f;
    for (int i = 0; i < k; ++i) {
      w[i] = s[id[i]];
      ksum = __fadd_rn(ksum, w[i]);
    }
    if (renormalize)
      for (int i = 0; i < k; ++i) w[i] = __fdiv_rn(w[i], ksum);
  } else {
    const float m = s[id[0]];
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) {
      w[i] = expf(__fsub_rn(s[id[i]], m));
      sum = __fadd_rn(sum, w[i]);
    }
    for (int i = 0; i < k; ++i) w[i] = __fdiv_rn(w[i], sum);
  }
}

// Shared memory of GroupByExpert's table: warps * experts counters.
constexpr int kGroupSharedBytes = 47 * 1024;  // + statics <= 48 KiB
constexpr int kGroupMaxWarps = 32;

// ids / weights [n = tokens * k] -> offsets [experts + 1], rows [n],
// row_weights [n]; *bad = 1 + the lowest flat index of an id outside
// [0, experts). One block of `warps` warps; table [warps, experts] dynamic
// shared memory.
__global__ void GroupByExpertKernel(const int32_t* ids, const float* weights,
                                    int64_t n, int64_t k, int experts,
                                    int32_t* offsets, int32_t* rows,
                                    float* row_weights, int32_t* bad) {
  extern __shared__ int32_t table[];  // [warps, experts]
  __shared__ long long first_bad;
  const int warps = blockDim.x / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < warps * experts; i += blockDim.x) table[i] = 0;
  if (threadIdx.x == 0) first_bad = n;
  __syncthreads();
  const int64_t seg = (n + warps - 1) / warps;
  const int64_t lo = warp * seg < n ? warp * seg : n;
  const int64_t hi = lo + seg < n ? lo + seg : n;
  int32_t* mine = table + warp * experts;
  for (int64_t i = lo + lane; i < hi; i += 32) {
    const int32_t e = ids[i];
    if (e < 0 || e >= experts)
      atomicMin(&first_bad, static_cast<long long>(i));
    else
      atomicAdd(&mine[e], 1);
  }
  __syncthreads();
  if (first_bad < n) {
    if (threadIdx.x == 0) *bad = static_cast<int32_t>(first_bad + 1);
    return;  // uniform: every thread read the same value
  }
  // Totals -> offsets (one thread; experts <= 1024), then table[w][e] = the
  // first output row of warp w's pairs of expert e.
  if (threadIdx.x == 0) {
    int32_t run = 0;
    for (int e = 0; e < experts; ++e) {
      offsets[e] = run;
      for (int w = 0; w < warps; ++w) run += table[w * experts + e];
    }
    offsets[experts] = run;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int32_t run = offsets[e];
    for (int w = 0; w < warps; ++w) {
      const int32_t c = table[w * experts + e];
      table[w * experts + e] = run;
      run += c;
    }
  }
  __syncthreads();
  // Each warp scatters its segment in order, 32 pairs per step.
  const unsigned lt = (1u << lane) - 1u;
  for (int64_t base = lo; base < hi; base += 32) {
    const int64_t i = base + lane;
    const bool active = i < hi;
    const int32_t e = active ? ids[i] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    int32_t dst = 0;
    if (active) dst = mine[e] + __popc(peers & lt);
    __syncwarp();
    // The last lane of each group moves its expert's cursor past the group.
    if (active && (peers >> lane) == 1u) mine[e] = dst + 1;
    __syncwarp();
    if (active) {
      rows[dst] = static_cast<int32_t>(i / k);
      row_weights[dst] = weights[i];
    }
  }
}

}  // namespace

void TopKRoute(const float* logits, int64_t tokens, int64_t experts, int64_t ld,
               int64_t k, Route kind, bool renormalize, int32_t* ids,
               float* weights, cudaStream_t s) {
  if (tokens <= 0 || experts <= 0 || experts > kMaxRouteExperts || k <= 0 ||
      k > experts)
    return;
  const int64_t blocks = (tokens + kRouteWarps - 1) / kRouteWarps;
  TopKRouteKernel<<<static_cast<unsigned>(blocks), kRouteWarps * 32, 0, s>>>(
      logits, tokens, static_cast<int>(experts), ld, static_cast<int>(k),
      kind == Route::kSoftmaxTopK, renormalize, ids, weights);
}

void GroupByExpert(const int32_t* ids, const float* weights, int64_t tokens,
                   int64_t k, int64_t experts, int32_t* offsets, int32_t* rows,
                   float* row_weights, int32_t* bad, cudaStream_t s) {
  if (experts <= 0 || k <= 0 || tokens < 0) return;
  const int64_t per_warp = experts * int64_t{sizeof(int32_t)};
  int64_t warps = kGroupSharedBytes / per_warp;
  if (warps > kGroupMaxWarps) warps = kGroupMaxWarps;
  if (warps < 1) return;  // more experts than the table holds (> 12032)
  GroupByExpertKernel<<<1, static_cast<unsigned>(warps * 32),
                        static_cast<size_t>(warps * per_warp), s>>>(
      ids, weights, tokens * k, k, static_cast<int>(experts), offsets, rows,
      row_weights, bad);
}

}  // namespace loom::cuda
