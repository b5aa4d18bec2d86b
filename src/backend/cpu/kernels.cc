// Entry points of kernels.h: argument checks, OpenMP work splitting, and the
// choice between the AVX-512 and portable per-row kernels (made once).
#include "src/backend/cpu/kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>

#include "src/backend/cpu/isa.h"
#include "src/backend/cpu/kernels_internal.h"
#include "src/base/check.h"
#include "src/base/float16.h"
#include "src/base/units.h"

namespace loom::cpu {
namespace {

// The per-row kernels of one implementation.
struct Table {
  decltype(&portable::RmsNormRow) rms_norm_row;
  decltype(&portable::LayerNormRow) layer_norm_row;
  decltype(&portable::GatedRow) gated_row;
  decltype(&portable::ActivationSpan) activation_span;
  decltype(&portable::SoftcapSpan) softcap_span;
  decltype(&portable::AddSpan) add_span;
  decltype(&portable::ScaleSpan) scale_span;
  decltype(&portable::FromF32Span) from_f32_span;
  decltype(&portable::ToF32Span) to_f32_span;
  decltype(&portable::LogSumExpRow) lse_row;
  decltype(&portable::RopeToken) rope_token;
  decltype(&portable::AttentionTile) attention_tile;
  decltype(&portable::RoundSpan) round_span;
};

#define LOOM_KERNEL_TABLE(ns)                                              \
  Table {                                                                  \
    ns::RmsNormRow, ns::LayerNormRow, ns::GatedRow, ns::ActivationSpan,    \
        ns::SoftcapSpan, ns::AddSpan, ns::ScaleSpan, ns::FromF32Span,      \
        ns::ToF32Span, ns::LogSumExpRow, ns::RopeToken, ns::AttentionTile, \
        ns::RoundSpan                                                      \
  }

// The per-row kernels of the active ISA (ActiveIsa(): AVX-512, AVX2 or
// baseline). LOOM_CPU_KERNELS=portable forces the baseline ones (tests use it
// to cover every version on one machine; LOOM_CPU_ISA caps the GEMMs too).
const Table& Kernels() {
  static const Table table = [] {
    const char* env = std::getenv("LOOM_CPU_KERNELS");
    const bool portable = env != nullptr && std::string_view(env) == "portable";
    if (portable) return LOOM_KERNEL_TABLE(portable);
    switch (ActiveIsa()) {
      case CpuIsa::kAvx512:
      case CpuIsa::kAvx512Bf16:
      case CpuIsa::kAmx:
        return LOOM_KERNEL_TABLE(avx512);
      case CpuIsa::kAvx2:
        return LOOM_KERNEL_TABLE(avx2);
      case CpuIsa::kBaseline:
        break;
    }
    return LOOM_KERNEL_TABLE(portable);
  }();
  return table;
}

// Elements per thread below which elementwise work stays on one thread.
constexpr int64_t kMinParallelElems = 1 << 15;

// Runs fn(begin, end) over [0, n) split into contiguous chunks across threads
// (multiples of 16 elements so that chunks start 64-byte aligned relative to
// the base).
template <typename Fn>
void ParallelSpan(int64_t n, Fn fn) {
  const int nt = omp_get_max_threads();
  if (nt == 1 || n < 2 * kMinParallelElems) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t chunks = std::min<int64_t>(nt, n / kMinParallelElems);
  const int64_t per = ((n + chunks - 1) / chunks + 15) / 16 * 16;
#pragma omp parallel for schedule(static) num_threads(chunks)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * per, e = std::min(n, b + per);
    if (b < e) fn(b, e);
  }
}

}  // namespace

bool HasAvx512() {
  static const bool has = ActiveIsa() >= CpuIsa::kAvx512;
  return has;
}

void RoundToDTypeAsF32(const float* src, float* dst, DType dtype, int64_t n) {
  const auto fn = Kernels().round_span;
  ParallelSpan(
      n, [&](int64_t b, int64_t e) { fn(src + b, dst + b, dtype, e - b); });
}

void ConvertToF32Serial(const void* src, DType dtype, float* dst, int64_t n) {
  Kernels().to_f32_span(src, dtype, dst, n);
}

// ---- Norms ------------------------------------------------------------------

void RmsNorm(const float* x, const void* w, DType w_dtype, float offset,
             float eps, float* y, int64_t rows, int64_t dim) {
  LOOM_CHECK(rows >= 0 && dim > 0) << "rows=" << rows << " dim=" << dim;
  if (w != nullptr) LOOM_CHECK(IsComputeDType(w_dtype));
  const auto fn = Kernels().rms_norm_row;
#pragma omp parallel for schedule( \
    static) if (rows * dim >= kMinParallelElems && rows > 1)
  for (int64_t r = 0; r < rows; ++r)
    fn(x + r * dim, w, w_dtype, offset, eps, y + r * dim, dim);
}

void LayerNorm(const float* x, const void* w, const void* b, DType w_dtype,
               float offset, float eps, float* y, int64_t rows, int64_t dim) {
  LOOM_CHECK(rows >= 0 && dim > 0) << "rows=" << rows << " dim=" << dim;
  if (w != nullptr || b != nullptr) LOOM_CHECK(IsComputeDType(w_dtype));
  const auto fn = Kernels().layer_norm_row;
#pragma omp parallel for schedule( \
    static) if (rows * dim >= kMinParallelElems && rows > 1)
  for (int64_t r = 0; r < rows; ++r)
    fn(x + r * dim, w, b, w_dtype, offset, eps, y + r * dim, dim);
}

// ---- Rotary embeddings
// --------------------------------------------------------

void RopeTables(const int32_t* positions, int64_t tokens, const float* inv_freq,
                int64_t half, float attention_scaling, float* cos, float* sin) {
  LOOM_CHECK(tokens >= 0 && half > 0)
      << "tokens=" << tokens << " half=" << half;
  // Built once per forward; libm's cosf/sinf are correctly rounded in practice,
  // as torch's are to within an ulp.
#pragma omp parallel for schedule(static) if (tokens * half >= \
                                              kMinParallelElems)
  for (int64_t t = 0; t < tokens; ++t) {
    const float pos = static_cast<float>(positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * inv_freq[i];
      cos[t * half + i] = std::cos(angle) * attention_scaling;
      sin[t * half + i] = std::sin(angle) * attention_scaling;
    }
  }
}

void ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
               int64_t row_stride, const float* cos, const float* sin,
               int64_t half) {
  LOOM_CHECK(2 * half <= head_dim)
      << "half=" << half << " head_dim=" << head_dim;
  LOOM_CHECK_GE(row_stride, heads * head_dim);
  const auto fn = Kernels().rope_token;
#pragma omp parallel for schedule( \
    static) if (tokens * heads * half >= kMinParallelElems / 2 && tokens > 1)
  for (int64_t t = 0; t < tokens; ++t)
    fn(x + t * row_stride, heads, head_dim, cos + t * half, sin + t * half,
       half);
}

void ApplyRopePairs(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                    int64_t row_stride, const float* cos, const float* sin,
                    int64_t half) {
  LOOM_CHECK(2 * half <= head_dim)
      << "half=" << half << " head_dim=" << head_dim;
  LOOM_CHECK_GE(row_stride, heads * head_dim);
#pragma omp parallel for schedule( \
    static) if (tokens * heads * half >= kMinParallelElems / 2 && tokens > 1)
  for (int64_t t = 0; t < tokens; ++t) {
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * row_stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = v[2 * i], x1 = v[2 * i + 1];
        // This file targets the baseline ISA (no FMA to contract into):
        // each product rounds to f32, then the sum, as HF's ops.
        v[2 * i] = x0 * c[i] - x1 * s[i];
        v[2 * i + 1] = x1 * c[i] + x0 * s[i];
      }
    }
  }
}

// ---- Attention
// ------------------------------------------------------------------

namespace {
int64_t AttnThreadStrideBytes(int64_t max_seq_len, int64_t width) {
  return AlignUp(AttnTileScratchFloats(max_seq_len, width) * 4, 64);
}

// The tile kernel for q/k heads of head_dim and v/z heads of v_dim. The
// AVX-512 tile has one head width; other widths run the AVX2 tile (every
// AVX-512 CPU has AVX2).
decltype(&portable::AttentionTile) TileFor(int64_t head_dim, int64_t v_dim) {
  const auto fn = Kernels().attention_tile;
  if (v_dim != head_dim && fn == &avx512::AttentionTile)
    return &avx2::AttentionTile;
  return fn;
}

int64_t VDim(const AttentionArgs& a) {
  return a.v_head_dim > 0 ? a.v_head_dim : a.head_dim;
}
}  // namespace

int64_t AttentionWorkspaceBytes(int64_t max_seq_len, int64_t q_heads,
                                int64_t width, int num_threads) {
  LOOM_CHECK(max_seq_len >= 0 && width > 0 && num_threads > 0);
  return static_cast<int64_t>(num_threads) *
         AttnThreadStrideBytes(std::max<int64_t>(max_seq_len, 1), width);
}

int64_t KvAttentionWorkspaceBytes(int64_t context, int64_t q_heads,
                                  int64_t kv_heads, int64_t head_dim,
                                  int64_t v_head_dim, int num_threads) {
  LOOM_CHECK(context >= 0 && kv_heads > 0 && head_dim > 0 && v_head_dim > 0 &&
             num_threads > 0);
  const int64_t panel =
      AlignUp(std::max<int64_t>(context, 1) * kv_heads *
                  (head_dim + v_head_dim) * int64_t{sizeof(float)},
              64);
  return panel + AttentionWorkspaceBytes(context, q_heads,
                                         std::max(head_dim, v_head_dim),
                                         num_threads);
}

namespace {

// Attention over a KV cache (AttentionArgs::k_cache). Keys are read as one
// contiguous run of rows per sequence: from the slot's cache directly when
// it holds every position up to the new ones without wrapping (the new rows
// are stored first), else from a panel in the workspace where the ring's
// rows and the new rows are laid out in position order (the new rows are
// stored into the ring after the attention, so no row a new query needs is
// overwritten before it is read). The tiles are the plain path's, at the new
// queries' positions, so masking and arithmetic are the same. A paged cache
// (kv_page_size > 0) always goes through the panel: the new rows are stored
// into their pages, then the visible rows are gathered from the pages in
// position order (bit-identical to the contiguous layout: same tiles over
// the same values).
void KvAttention(const AttentionArgs& a) {
  LOOM_CHECK(a.v_cache != nullptr && a.kv_slot != nullptr &&
             a.q_pos0 != nullptr && a.kv_capacity > 0);
  LOOM_CHECK(a.probs == nullptr) << "attention probabilities with a KV cache";
  const int64_t group = a.q_heads / a.kv_heads;
  const int64_t d = a.head_dim, dv = VDim(a);
  const int64_t kvd = a.kv_heads * d, kvv = a.kv_heads * dv;  // k, v rows
  const int64_t cap = a.kv_capacity;
  const bool paged = a.kv_page_size > 0;
  LOOM_CHECK(!paged || (a.kv_page_table != nullptr &&
                        a.kv_pages_per_seq * a.kv_page_size >= cap));
  constexpr int64_t B = kAttnBlock;
  const int64_t z_rs = a.q_heads * dv;
  // The panel rows and the longest key run of this call.
  int64_t panel_rows = 0, max_nk = 1;
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const int64_t len = a.seq_start[s + 1] - a.seq_start[s];
    const int64_t p0 = a.q_pos0[s], end = p0 + len;
    LOOM_CHECK(len >= 0 && p0 >= 0);
    const int64_t lo =
        a.window > 0 ? std::max<int64_t>(0, p0 - a.window + 1) : 0;
    if (paged) {
      LOOM_CHECK(end <= cap) << "paged kv cache of " << cap
                             << " positions, sequence ends at " << end;
      panel_rows = std::max(panel_rows, end - lo);
    } else if (end > cap) {
      LOOM_CHECK(a.window > 0 && a.window <= cap)
          << "kv cache of " << cap << " positions, sequence ends at " << end;
      panel_rows = std::max(panel_rows, end - lo);
    }
    max_nk = std::max(max_nk, end - lo);
  }
  float* panel_k = static_cast<float*>(a.workspace);  // [panel_rows, kvd]
  float* panel_v = panel_k + panel_rows * kvd;        // [panel_rows, kvv]
  char* tiles = static_cast<char*>(a.workspace) +
                AlignUp(panel_rows * (kvd + kvv) * int64_t{sizeof(float)}, 64);
  const int64_t stride_bytes = AttnThreadStrideBytes(max_nk, std::max(d, dv));
  int nt = omp_get_max_threads();
  if (a.workspace_bytes > 0) {
    const int64_t fit =
        (a.workspace_bytes - (tiles - static_cast<char*>(a.workspace))) /
        stride_bytes;
    LOOM_CHECK_GE(fit, 1) << "kv attention workspace too small: "
                          << a.workspace_bytes << " bytes";
    nt = static_cast<int>(std::min<int64_t>(nt, fit));
  }
  const auto tile_fn = TileFor(d, dv);
  // rows x width floats from src (row stride src_rs) to dense dst.
  auto copy_rows = [](const float* src, int64_t src_rs, float* dst,
                      int64_t rows, int64_t width) {
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * width, src + r * src_rs, sizeof(float) * width);
  };
  // Tiles of sequence s over keys whose position `base` is row 0 of kbase /
  // vbase (row strides kvd / kvv).
  auto run_tile = [&](int64_t s, int64_t item, const float* kbase,
                      const float* vbase, int64_t base, float* scratch) {
    const int64_t t0 = a.seq_start[s], len = a.seq_start[s + 1] - t0;
    const int64_t nb = (len + B - 1) / B;
    const int64_t qb = nb - 1 - item / a.q_heads;
    const int64_t h = item % a.q_heads;
    const int64_t kvh = h / group;
    AttnTile t;
    t.i0 = a.q_pos0[s] + qb * B;
    t.rows = std::min(B, len - qb * B);
    t.j_lo = a.window > 0 ? std::max<int64_t>(0, t.i0 - a.window + 1) : 0;
    t.nk = t.i0 + t.rows - t.j_lo;
    t.q = a.q + (t0 + qb * B) * a.q_rs + h * d;
    t.k = kbase + (t.j_lo - base) * kvd + kvh * d;
    t.v = vbase + (t.j_lo - base) * kvv + kvh * dv;
    t.z = a.z + (t0 + qb * B) * z_rs + h * dv;
    t.q_rs = a.q_rs;
    t.k_rs = kvd;
    t.v_rs = kvv;
    t.z_rs = z_rs;
    t.head_dim = d;
    t.v_dim = dv;
    t.window = a.window;
    t.scale = a.scale;
    t.softcap = a.softcap;
    t.has_sink = a.sinks != nullptr;
    t.sink = t.has_sink ? LoadScalarAsF32(a.sinks, a.sinks_dtype, h) : 0.0f;
    t.alibi = a.alibi_slopes != nullptr ? a.alibi_slopes[h] : 0.0f;
    t.probs = nullptr;
    t.probs_rs = 0;
    t.scratch = scratch;
    tile_fn(t);
  };
  auto direct = [&](int64_t s) {
    return !paged && a.q_pos0[s] + a.seq_start[s + 1] - a.seq_start[s] <= cap;
  };
  // Row of position p of sequence s in a paged cache.
  auto page_row = [&](int64_t s, int64_t p) {
    const int64_t page =
        a.kv_page_table[s * a.kv_pages_per_seq + p / a.kv_page_size];
    return page * a.kv_page_size + p % a.kv_page_size;
  };
  // Sequences whose positions fit the cache unwrapped: store, then attend.
  bool any_direct = false;
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    if (!direct(s)) continue;
    any_direct = true;
    const int64_t t0 = a.seq_start[s], len = a.seq_start[s + 1] - t0;
    const int64_t row = a.kv_slot[s] * cap + a.q_pos0[s];
    copy_rows(a.k + t0 * a.k_rs, a.k_rs, a.k_cache + row * kvd, len, kvd);
    copy_rows(a.v + t0 * a.v_rs, a.v_rs, a.v_cache + row * kvv, len, kvv);
  }
  if (any_direct) {
#pragma omp parallel num_threads(nt)
    {
      float* scratch =
          reinterpret_cast<float*>(tiles + omp_get_thread_num() * stride_bytes);
      for (int64_t s = 0; s < a.num_seqs; ++s) {
        if (!direct(s)) continue;
        const int64_t len = a.seq_start[s + 1] - a.seq_start[s];
        const int64_t nb = (len + B - 1) / B;
        const float* kc = a.k_cache + a.kv_slot[s] * cap * kvd;
        const float* vc = a.v_cache + a.kv_slot[s] * cap * kvv;
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t item = 0; item < nb * a.q_heads; ++item)
          run_tile(s, item, kc, vc, 0, scratch);
      }
    }
  }
  // Ring and paged sequences, one at a time: unroll into the panel, attend
  // (a ring stores its new rows after that; pages are never overwritten, so
  // a paged sequence stores them first and gathers every visible row from
  // its pages).
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    if (direct(s)) continue;
    const int64_t t0 = a.seq_start[s], len = a.seq_start[s + 1] - t0;
    const int64_t p0 = a.q_pos0[s];
    const int64_t lo =
        a.window > 0 ? std::max<int64_t>(0, p0 - a.window + 1) : 0;
    if (paged) {
      for (int64_t i = 0; i < len; ++i) {
        const int64_t row = page_row(s, p0 + i);
        std::memcpy(a.k_cache + row * kvd, a.k + (t0 + i) * a.k_rs,
                    sizeof(float) * kvd);
        std::memcpy(a.v_cache + row * kvv, a.v + (t0 + i) * a.v_rs,
                    sizeof(float) * kvv);
      }
      // [lo, p0 + len) in position order, a page's run at a time.
      for (int64_t j = lo; j < p0 + len;) {
        const int64_t run =
            std::min(a.kv_page_size - j % a.kv_page_size, p0 + len - j);
        const int64_t row = page_row(s, j);
        std::memcpy(panel_k + (j - lo) * kvd, a.k_cache + row * kvd,
                    sizeof(float) * kvd * run);
        std::memcpy(panel_v + (j - lo) * kvv, a.v_cache + row * kvv,
                    sizeof(float) * kvv * run);
        j += run;
      }
    } else {
      float* kc = a.k_cache + a.kv_slot[s] * cap * kvd;  // [cap, kvd]
      float* vc = a.v_cache + a.kv_slot[s] * cap * kvv;  // [cap, kvv]
      for (int64_t j = lo; j < p0; ++j) {
        std::memcpy(panel_k + (j - lo) * kvd, kc + (j % cap) * kvd,
                    sizeof(float) * kvd);
        std::memcpy(panel_v + (j - lo) * kvv, vc + (j % cap) * kvv,
                    sizeof(float) * kvv);
      }
      copy_rows(a.k + t0 * a.k_rs, a.k_rs, panel_k + (p0 - lo) * kvd, len, kvd);
      copy_rows(a.v + t0 * a.v_rs, a.v_rs, panel_v + (p0 - lo) * kvv, len, kvv);
    }
    const int64_t nb = (len + B - 1) / B;
#pragma omp parallel num_threads(nt)
    {
      float* scratch =
          reinterpret_cast<float*>(tiles + omp_get_thread_num() * stride_bytes);
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < nb * a.q_heads; ++item)
        run_tile(s, item, panel_k, panel_v, lo, scratch);
    }
    if (paged) continue;
    // Only the last `cap` new rows survive in the ring.
    float* kc = a.k_cache + a.kv_slot[s] * cap * kvd;  // [cap, kvd]
    float* vc = a.v_cache + a.kv_slot[s] * cap * kvv;  // [cap, kvv]
    for (int64_t i = std::max<int64_t>(0, len - cap); i < len; ++i) {
      const int64_t row = (p0 + i) % cap;
      std::memcpy(kc + row * kvd, a.k + (t0 + i) * a.k_rs, sizeof(float) * kvd);
      std::memcpy(vc + row * kvv, a.v + (t0 + i) * a.v_rs, sizeof(float) * kvv);
    }
  }
}

}  // namespace

void Attention(GemmContext& /*ctx*/, const AttentionArgs& a) {
  LOOM_CHECK(a.q != nullptr && a.k != nullptr && a.v != nullptr &&
             a.z != nullptr && a.seq_start != nullptr);
  LOOM_CHECK(a.q_heads > 0 && a.kv_heads > 0 && a.q_heads % a.kv_heads == 0)
      << "q_heads=" << a.q_heads << " kv_heads=" << a.kv_heads;
  LOOM_CHECK(a.head_dim > 0);
  LOOM_CHECK(a.workspace != nullptr) << "attention needs a workspace";
  LOOM_CHECK(reinterpret_cast<uintptr_t>(a.workspace) % 64 == 0)
      << "workspace not 64-byte aligned";
  if (a.k_cache != nullptr) return KvAttention(a);
  const int64_t group = a.q_heads / a.kv_heads;
  const int64_t d = a.head_dim, dv = VDim(a);
  int64_t max_len = 1;
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const int64_t len = a.seq_start[s + 1] - a.seq_start[s];
    LOOM_CHECK_GE(len, 0);
    max_len = std::max(max_len, len);
  }
  const int64_t stride_bytes = AttnThreadStrideBytes(max_len, std::max(d, dv));
  int nt = omp_get_max_threads();
  if (a.workspace_bytes > 0) {
    const int64_t fit = a.workspace_bytes / stride_bytes;
    LOOM_CHECK_GE(fit, 1) << "attention workspace too small: "
                          << a.workspace_bytes << " bytes, need "
                          << stride_bytes;
    nt = static_cast<int>(std::min<int64_t>(nt, fit));
  }
  float* probs = nullptr;
  int64_t probs_len = 0;
  if (a.probs != nullptr && a.probs_seq >= 0 && a.probs_seq < a.num_seqs) {
    probs = a.probs;
    probs_len = a.seq_start[a.probs_seq + 1] - a.seq_start[a.probs_seq];
    std::memset(probs, 0, sizeof(float) * a.q_heads * probs_len * probs_len);
  }
  const auto tile_fn = TileFor(d, dv);
  constexpr int64_t B = kAttnBlock;
  const int64_t z_rs = a.q_heads * dv;
#pragma omp parallel num_threads(nt)
  {
    float* scratch = reinterpret_cast<float*>(
        static_cast<char*>(a.workspace) + omp_get_thread_num() * stride_bytes);
    for (int64_t s = 0; s < a.num_seqs; ++s) {
      const int64_t t0 = a.seq_start[s];
      const int64_t len = a.seq_start[s + 1] - t0;
      const int64_t nb = (len + B - 1) / B;
      // Heaviest (last) query blocks first for better balance.
#pragma omp for schedule(dynamic, 1) nowait
      for (int64_t item = 0; item < nb * a.q_heads; ++item) {
        const int64_t qb = nb - 1 - item / a.q_heads;
        const int64_t h = item % a.q_heads;
        const int64_t kvh = h / group;
        AttnTile t;
        t.i0 = qb * B;
        t.rows = std::min(B, len - t.i0);
        t.j_lo = a.window > 0 ? std::max<int64_t>(0, t.i0 - a.window + 1) : 0;
        t.nk = t.i0 + t.rows - t.j_lo;
        t.q = a.q + (t0 + t.i0) * a.q_rs + h * d;
        t.k = a.k + (t0 + t.j_lo) * a.k_rs + kvh * d;
        t.v = a.v + (t0 + t.j_lo) * a.v_rs + kvh * dv;
        t.z = a.z + (t0 + t.i0) * z_rs + h * dv;
        t.q_rs = a.q_rs;
        t.k_rs = a.k_rs;
        t.v_rs = a.v_rs;
        t.z_rs = z_rs;
        t.head_dim = d;
        t.v_dim = dv;
        t.window = a.window;
        t.scale = a.scale;
        t.softcap = a.softcap;
        t.has_sink = a.sinks != nullptr;
        t.sink = t.has_sink ? LoadScalarAsF32(a.sinks, a.sinks_dtype, h) : 0.0f;
        t.alibi = a.alibi_slopes != nullptr ? a.alibi_slopes[h] : 0.0f;
        t.probs = (probs != nullptr && s == a.probs_seq)
                      ? probs + (h * len + t.i0) * len
                      : nullptr;
        t.probs_rs = len;
        t.scratch = scratch;
        tile_fn(t);
      }
    }
  }
}

// ---- Elementwise
// ----------------------------------------------------------------

void GatedActivation(Activation act, const float* gate, int64_t gate_rs,
                     const float* up, int64_t up_rs, float* out, int64_t rows,
                     int64_t n) {
  LOOM_CHECK(rows >= 0 && n >= 0);
  const auto fn = Kernels().gated_row;
#pragma omp parallel for schedule(static) if (rows * n >= kMinParallelElems && \
                                              rows > 1)
  for (int64_t r = 0; r < rows; ++r)
    fn(act, gate + r * gate_rs, up + r * up_rs, out + r * n, n);
}

void ApplyActivation(Activation act, float* x, int64_t n) {
  const auto fn = Kernels().activation_span;
  ParallelSpan(n, [&](int64_t b, int64_t e) { fn(act, x + b, e - b); });
}

void Softcap(float* x, int64_t n, float cap) {
  LOOM_CHECK(cap > 0.0f) << "cap=" << cap;
  const auto fn = Kernels().softcap_span;
  ParallelSpan(n, [&](int64_t b, int64_t e) { fn(x + b, e - b, cap); });
}

void Add(const float* x, float* y, int64_t n) {
  const auto fn = Kernels().add_span;
  ParallelSpan(n, [&](int64_t b, int64_t e) { fn(x + b, y + b, e - b); });
}

void Scale(float* x, int64_t n, float s) {
  const auto fn = Kernels().scale_span;
  ParallelSpan(n, [&](int64_t b, int64_t e) { fn(x + b, e - b, s); });
}

void Gather(const void* table, DType table_dtype, const int32_t* ids,
            int64_t tokens, int64_t dim, float* out) {
  LOOM_CHECK(IsComputeDType(table_dtype));
  const auto fn = Kernels().to_f32_span;
  const int64_t esize = DTypeSize(table_dtype);
#pragma omp parallel for schedule( \
    static) if (tokens * dim >= kMinParallelElems && tokens > 1)
  for (int64_t t = 0; t < tokens; ++t) {
    fn(static_cast<const char*>(table) +
           static_cast<int64_t>(ids[t]) * dim * esize,
       table_dtype, out + t * dim, dim);
  }
}

void ConvertFromF32(const float* src, void* dst, DType dtype, int64_t n) {
  LOOM_CHECK(IsComputeDType(dtype));
  const auto fn = Kernels().from_f32_span;
  const int64_t esize = DTypeSize(dtype);
  ParallelSpan(n, [&](int64_t b, int64_t e) {
    fn(src + b, static_cast<char*>(dst) + b * esize, dtype, e - b);
  });
}

void ConvertToF32(const void* src, DType dtype, float* dst, int64_t n) {
  LOOM_CHECK(IsComputeDType(dtype));
  const auto fn = Kernels().to_f32_span;
  const int64_t esize = DTypeSize(dtype);
  ParallelSpan(n, [&](int64_t b, int64_t e) {
    fn(static_cast<const char*>(src) + b * esize, dtype, dst + b, e - b);
  });
}

// ---- Log-softmax
// ------------------------------------------------------------------

void LogSumExp(const float* logits, int64_t rows, int64_t vocab, double* lse) {
  LOOM_CHECK(rows >= 0 && vocab > 0);
  const auto fn = Kernels().lse_row;
#pragma omp parallel for schedule( \
    static) if (rows * vocab >= kMinParallelElems && rows > 1)
  for (int64_t r = 0; r < rows; ++r) lse[r] = fn(logits + r * vocab, vocab);
}

// ---- Capture ---------------------------------------------------------------

void GatherRowsConvert(const float* src, int64_t ld, const int32_t* index,
                       int64_t n, int64_t cols, void* dst, DType dtype) {
  const int64_t ds = DTypeSize(dtype);
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i)
    ConvertFromF32(src + index[i] * ld, out + i * cols * ds, dtype, cols);
}

void SegmentReduce(const float* src, int64_t ld, const int32_t* begin,
                   const int32_t* end, int64_t segments, int64_t cols, bool max,
                   bool accumulate, double* out) {
  for (int64_t g = 0; g < segments; ++g) {
    double* o = out + g * cols;
    if (!accumulate)
      std::fill(o, o + cols,
                max ? -std::numeric_limits<double>::infinity() : 0.0);
    for (int64_t r = begin[g]; r < end[g]; ++r) {
      const float* x = src + r * ld;
      if (max) {
        for (int64_t j = 0; j < cols; ++j)
          o[j] = std::max(o[j], static_cast<double>(x[j]));
      } else {
        for (int64_t j = 0; j < cols; ++j) o[j] += x[j];
      }
    }
  }
}

// ---- Row operations (bf16 emulation, clamps, expert gather/scatter) -------

void RmsNormBf16(const float* x, const void* w, float eps, float* y,
                 int64_t rows, int64_t dim) {
  LOOM_CHECK(w != nullptr);
  RmsNorm(x, nullptr, DType::kBF16, 0.0f, eps, y, rows, dim);
  const uint16_t* g = static_cast<const uint16_t*>(w);
#pragma omp parallel for schedule(static) if (rows * dim > 16384)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < dim; ++j)
      y[r * dim + j] = RoundBf16(Bf16ToF32(g[j]) * RoundBf16(y[r * dim + j]));
}

void RmsNormRows(float* x, int64_t tokens, int64_t ld, int64_t groups,
                 int64_t dim, const void* w, DType w_dtype, float offset,
                 float eps) {
  LOOM_CHECK(tokens >= 0 && groups >= 1 && dim >= 1 && ld >= groups * dim);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t)
    RmsNorm(x + t * ld, w, w_dtype, offset, eps, x + t * ld, groups, dim);
}

void LayerNormRows(float* x, int64_t tokens, int64_t ld, int64_t groups,
                   int64_t dim, const void* w, const void* b, DType w_dtype,
                   float eps) {
  LOOM_CHECK(tokens >= 0 && groups >= 1 && dim >= 1 && ld >= groups * dim);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t)
    LayerNorm(x + t * ld, w, b, w_dtype, 0.0f, eps, x + t * ld, groups, dim);
}

void Clamp(float* x, int64_t rows, int64_t cols, int64_t ld, float lo,
           float hi) {
#pragma omp parallel for schedule(static) if (rows * cols > 16384)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j)
      x[r * ld + j] = std::clamp(x[r * ld + j], lo, hi);
}

void RoundToBf16(float* x, int64_t rows, int64_t cols, int64_t ld) {
#pragma omp parallel for schedule(static) if (rows * cols > 16384)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) x[r * ld + j] = RoundBf16(x[r * ld + j]);
}

void DeinterleaveBlocks(const float* x, int64_t ldx, int64_t rows,
                        int64_t groups, int64_t parts, int64_t width, float* y,
                        int64_t ldy) {
  const int64_t cols = groups * parts * width;
  LOOM_CHECK(rows >= 0 && groups >= 1 && parts >= 1 && width >= 1 &&
             ldx >= cols && ldy >= cols)
      << "rows=" << rows << " groups=" << groups << " parts=" << parts
      << " width=" << width << " ldx=" << ldx << " ldy=" << ldy;
#pragma omp parallel for schedule(static) if (rows * cols > 16384)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t p = 0; p < parts; ++p)
        std::memcpy(y + r * ldy + (p * groups + g) * width,
                    x + r * ldx + (g * parts + p) * width,
                    sizeof(float) * static_cast<size_t>(width));
}

void StridedCopy(const float* x, int64_t ldx, int64_t gsx, int64_t isx,
                 float* y, int64_t ldy, int64_t gsy, int64_t isy, int64_t rows,
                 int64_t groups, int64_t n) {
  LOOM_CHECK(rows >= 0 && groups >= 0 && n >= 0 && ldx >= 0 && gsx >= 0 &&
             isx >= 0 && ldy >= 0 && gsy >= 0 && isy >= 0)
      << "rows=" << rows << " groups=" << groups << " n=" << n;
#pragma omp parallel for schedule(static) if (rows * groups * n > 16384)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const float* xs = x + r * ldx + g * gsx;
      float* ys = y + r * ldy + g * gsy;
      if (isx == 1 && isy == 1) {
        std::memcpy(ys, xs, sizeof(float) * static_cast<size_t>(n));
      } else {
        for (int64_t i = 0; i < n; ++i) ys[i * isy] = xs[i * isx];
      }
    }
}

void GatherRows(const float* x, int64_t ldx, const int32_t* rows, int64_t n,
                int64_t cols, float* out) {
#pragma omp parallel for schedule(static) if (n * cols > 16384)
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(out + i * cols, x + static_cast<int64_t>(rows[i]) * ldx,
                sizeof(float) * static_cast<size_t>(cols));
}

void ScatterAddRows(const float* x, const int32_t* rows, const float* w,
                    int64_t n, int64_t cols, float* y, int64_t ldy) {
#pragma omp parallel for schedule(static) if (n * cols > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const float s = w ? w[i] : 1.0f;
    float* dst = y + static_cast<int64_t>(rows[i]) * ldy;
    for (int64_t j = 0; j < cols; ++j) dst[j] += s * x[i * cols + j];
  }
}

// ---- Threads
// ----------------------------------------------------------------------

int SetNumThreads(int n) {
  if (n <= 0) n = omp_get_num_procs();
  omp_set_num_threads(n);
  return n;
}

int NumThreads() { return omp_get_max_threads(); }

}  // namespace loom::cpu
