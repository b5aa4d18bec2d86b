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
// and dropped. C lives in the task's contiguous scratch in tile order (1 KB
// per tile): rows of y at a large power-of-two stride (n = 2048 f32 is 8 KB)
// share a few L1 sets, and tiles read at such strides were measured slower.
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

template <bool kTwoRowTiles, bool kTwoStrips>
void Block(const uint16_t* a, ATile al, BTile b, int64_t kcp, float* c,
           int64_t c_second, bool load_c, float* out, int64_t ldo) {
  // C tiles: 1 KB each, (row tile, col tile) (0,0) at c, (0,1) at c + 256,
  // (1,0) at c + c_second, (1,1) at c + c_second + 256.
  float* c2 = c + c_second;
  if (load_c) {
    _tile_loadd(0, c, 64);
    if (kTwoStrips) _tile_loadd(1, c + 256, 64);
    if (kTwoRowTiles) _tile_loadd(2, c2, 64);
    if (kTwoRowTiles && kTwoStrips) _tile_loadd(3, c2 + 256, 64);
  } else {
    _tile_zero(0);
    if (kTwoStrips) _tile_zero(1);
    if (kTwoRowTiles) _tile_zero(2);
    if (kTwoRowTiles && kTwoStrips) _tile_zero(3);
  }
  const int64_t a_stride = al.row_bytes;
  const uint16_t* a1 = a + al.second;
  const uint16_t* b1 = b.b + b.strip_stride;
  for (int64_t k = 0, ka = 0; k < kcp; k += kTileK, ka += al.kstep) {
    _tile_loadd(4, a + ka, a_stride);
    _tile_loadd(6, b.b + k * kStripCols, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (kTwoStrips) {
      _tile_loadd(7, b1 + k * kStripCols, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (kTwoRowTiles) {
      _tile_loadd(5, a1 + ka, a_stride);
      _tile_dpbf16ps(2, 5, 6);
      if (kTwoStrips) _tile_dpbf16ps(3, 5, 7);
    }
  }
  if (out != nullptr) {  // the final K block of whole tiles: into y
    const int64_t stride = ldo * 4;
    float* out2 = out + 16 * ldo;
    _tile_stored(0, out, stride);
    if (kTwoStrips) _tile_stored(1, out + 16, stride);
    if (kTwoRowTiles) _tile_stored(2, out2, stride);
    if (kTwoRowTiles && kTwoStrips) _tile_stored(3, out2 + 16, stride);
    return;
  }
  _tile_stored(0, c, 64);
  if (kTwoStrips) _tile_stored(1, c + 256, 64);
  if (kTwoRowTiles) _tile_stored(2, c2, 64);
  if (kTwoRowTiles && kTwoStrips) _tile_stored(3, c2 + 256, 64);
}

}  // namespace

void AmxTile(const uint16_t* a, ATile al, int64_t rows, BTile b, int64_t kcp,
             float* c, int64_t c_second, int64_t cols, bool load_c,
             float* out, int64_t ldo) {
  const bool two_rows = rows > 16, two_strips = cols > 16;
  if (two_rows && two_strips)
    Block<true, true>(a, al, b, kcp, c, c_second, load_c, out, ldo);
  else if (two_rows)
    Block<true, false>(a, al, b, kcp, c, c_second, load_c, out, ldo);
  else if (two_strips)
    Block<false, true>(a, al, b, kcp, c, c_second, load_c, out, ldo);
  else
    Block<false, false>(a, al, b, kcp, c, c_second, load_c, out, ldo);
}

void AmxLoadC(const float* y, int64_t ldy, int64_t rows, int64_t cols,
              float* c, int64_t col_tiles, int64_t row_tiles) {
  for (int64_t r = 0; r < row_tiles * 16; ++r)
    for (int64_t t = 0; t < col_tiles; ++t) {
      const int64_t n = std::clamp<int64_t>(cols - t * 16, 0, 16);
      const __mmask16 m = r < rows ? static_cast<__mmask16>((1u << n) - 1) : 0;
      _mm512_storeu_ps(c + ((r / 16) * col_tiles + t) * 256 + (r % 16) * 16,
                       _mm512_maskz_loadu_ps(m, y + r * ldy + t * 16));
    }
}

void AmxStoreC(const float* c, int64_t col_tiles, int64_t r0, int64_t r1,
               int64_t c0, int64_t c1, float* y, int64_t ldy,
               const float* bias) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t t = c0 / 16; t * 16 < c1; ++t) {
      const int64_t n = std::min<int64_t>(c1 - t * 16, 16);
      const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
      __m512 v =
          _mm512_loadu_ps(c + ((r / 16) * col_tiles + t) * 256 + (r % 16) * 16);
      if (bias != nullptr)
        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + t * 16));
      _mm512_mask_storeu_ps(y + r * ldy + t * 16, m, v);
    }
}

void AmxBegin() { _tile_loadconfig(&kConfig); }
void AmxEnd() { _tile_release(); }

}  // namespace loom::cpu::gemm
