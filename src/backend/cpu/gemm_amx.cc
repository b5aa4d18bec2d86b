// The GEMM's amx family (gemm_internal.h): a 32 x 32 block of C in four AMX
// tiles, accumulated by tdpbf16ps over 32-k blocks of bf16 A rows and B
// strips. Compiled with -mamx-tile -mamx-bf16 and the AVX-512 flags; called
// only at the amx level, once the kernel granted the tile state (isa.cc).
//
// Tiles (palette 1, every tile 16 rows x 64 bytes):
//   tmm0 C rows 0-15 cols 0-15   tmm1 C rows 0-15 cols 16-31
//   tmm2 C rows 16-31 cols 0-15  tmm3 C rows 16-31 cols 16-31
//   tmm4 A rows 0-15             tmm5 A rows 16-31
//   tmm6 B strip 0               tmm7 B strip 1
// A row of C is the same chain of tdpbf16ps steps whichever of the 16 tile
// rows it sits in and whatever the other rows hold (measured: a row alone in
// a tile gives the bytes it gives among 15 others), so C rows past `rows`
// (the x copy's padding, or the next GEMM's rows of a group) are computed
// and dropped.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "src/backend/cpu/gemm_internal.h"

namespace loom::cpu::gemm {
namespace {

struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

constexpr TileConfig MakeConfig() {
  TileConfig c{};
  c.palette = 1;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  return c;
}
// A global (not a local): GCC 12 does not see the memory _tile_loadconfig
// reads and may drop the stores of a local configuration.
alignas(64) const TileConfig kConfig = MakeConfig();

constexpr int64_t kCBytes = 16 * 16 * 4;  // one C tile

// A partial C tile (vr valid rows, vc valid columns) through `scratch`: its
// valid part copied in (the rest zero) before a load, out after a store.
void ToScratch(const float* c, int64_t ldc, int64_t vr, int64_t vc,
               float* scratch) {
  std::memset(scratch, 0, kCBytes);
  for (int64_t i = 0; i < vr; ++i)
    std::memcpy(scratch + i * 16, c + i * ldc, static_cast<size_t>(vc) * 4);
}
void FromScratch(const float* scratch, int64_t vr, int64_t vc, float* c,
                 int64_t ldc) {
  for (int64_t i = 0; i < vr; ++i)
    std::memcpy(c + i * ldc, scratch + i * 16, static_cast<size_t>(vc) * 4);
}

// Tile T of C with vr valid rows and vc valid columns, loaded from / stored
// to c when whole, else through the scratch. (The tile intrinsics take the
// register number as a literal.)
#define LOOM_AMX_LOAD_C(T, c, ldc, vr, vc)            \
  do {                                                \
    if ((vr) == 16 && (vc) == 16) {                   \
      _tile_loadd(T, (c), (ldc) * 4);                 \
    } else {                                          \
      ToScratch((c), (ldc), (vr), (vc), scratch);     \
      _tile_loadd(T, scratch, 64);                    \
    }                                                 \
  } while (0)
#define LOOM_AMX_STORE_C(T, c, ldc, vr, vc)           \
  do {                                                \
    if ((vr) == 16 && (vc) == 16) {                   \
      _tile_stored(T, (c), (ldc) * 4);                \
    } else {                                          \
      _tile_stored(T, scratch, 64);                   \
      FromScratch(scratch, (vr), (vc), (c), (ldc));   \
    }                                                 \
  } while (0)

// The four C tiles' valid rows and columns.
struct Valid {
  int64_t r0, r1, c0, c1;  // rows of tiles 0/1 and 2/3; cols of 0/2 and 1/3
};

template <bool kTwoRowTiles, bool kTwoStrips>
void Block(const uint16_t* a, int64_t ldx, BTile b, int64_t kcp, float* c,
           int64_t ldc, const Valid& v, bool load_c, float* scratch) {
  float* c2 = c + 16 * ldc;
  if (load_c) {
    LOOM_AMX_LOAD_C(0, c, ldc, v.r0, v.c0);
    if (kTwoStrips) LOOM_AMX_LOAD_C(1, c + 16, ldc, v.r0, v.c1);
    if (kTwoRowTiles) LOOM_AMX_LOAD_C(2, c2, ldc, v.r1, v.c0);
    if (kTwoRowTiles && kTwoStrips) LOOM_AMX_LOAD_C(3, c2 + 16, ldc, v.r1, v.c1);
  } else {
    _tile_zero(0);
    if (kTwoStrips) _tile_zero(1);
    if (kTwoRowTiles) _tile_zero(2);
    if (kTwoRowTiles && kTwoStrips) _tile_zero(3);
  }
  const int64_t a_stride = ldx * 2;
  const uint16_t* a1 = a + 16 * ldx;
  const uint16_t* b1 = b.b + b.strip_stride;
  for (int64_t k = 0; k < kcp; k += kTileK) {
    _tile_loadd(4, a + k, a_stride);
    _tile_loadd(6, b.b + k * kStripCols, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (kTwoStrips) {
      _tile_loadd(7, b1 + k * kStripCols, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (kTwoRowTiles) {
      _tile_loadd(5, a1 + k, a_stride);
      _tile_dpbf16ps(2, 5, 6);
      if (kTwoStrips) _tile_dpbf16ps(3, 5, 7);
    }
  }
  LOOM_AMX_STORE_C(0, c, ldc, v.r0, v.c0);
  if (kTwoStrips) LOOM_AMX_STORE_C(1, c + 16, ldc, v.r0, v.c1);
  if (kTwoRowTiles) LOOM_AMX_STORE_C(2, c2, ldc, v.r1, v.c0);
  if (kTwoRowTiles && kTwoStrips) LOOM_AMX_STORE_C(3, c2 + 16, ldc, v.r1, v.c1);
}

}  // namespace

void AmxTile(const uint16_t* a, int64_t ldx, int64_t rows, BTile b,
             int64_t kcp, float* c, int64_t ldc, int64_t cols, bool load_c,
             float* scratch) {
  const Valid v{std::min<int64_t>(rows, 16), std::max<int64_t>(rows - 16, 0),
                std::min<int64_t>(cols, 16), std::max<int64_t>(cols - 16, 0)};
  const bool two_rows = rows > 16, two_strips = cols > 16;
  if (two_rows && two_strips)
    Block<true, true>(a, ldx, b, kcp, c, ldc, v, load_c, scratch);
  else if (two_rows)
    Block<true, false>(a, ldx, b, kcp, c, ldc, v, load_c, scratch);
  else if (two_strips)
    Block<false, true>(a, ldx, b, kcp, c, ldc, v, load_c, scratch);
  else
    Block<false, false>(a, ldx, b, kcp, c, ldc, v, load_c, scratch);
}

void AmxBegin() { _tile_loadconfig(&kConfig); }
void AmxEnd() { _tile_release(); }

}  // namespace loom::cpu::gemm
