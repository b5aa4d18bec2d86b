// CPU kernels that edit selected rows of an activation in place (the row
// edits of interventions: steering, directional ablation, zero / mean / head
// ablation, activation patching). Plain arrays, no model knowledge; each has
// a scalar reference in reference/reference_rows.h and a test against it
// (kernels_rows_test.cc).
//
// Every kernel edits rows idx[0..n) of x [rows, cols] (row stride ld). The
// destination indices must be strictly increasing and in [0, rows); a kernel
// checks them before it writes anything and returns the position i of the
// first bad idx[i] (x then unchanged), or -1 when all are good. The work is
// split over the selected rows only and each row is computed the same way
// whatever the thread count, so results are byte-identical for any count.
#ifndef LOOM_BACKEND_CPU_KERNELS_ROWS_H_
#define LOOM_BACKEND_CPU_KERNELS_ROWS_H_

#include <cstdint>

namespace loom::cpu {

// -1 when idx [n] is strictly increasing and inside [0, rows), otherwise the
// first position i that breaks it.
int64_t FirstBadRowIndex(const int32_t* idx, int64_t n, int64_t rows);

// x[idx[i], :] += scale * v[:] (scale * v[j] rounded to f32, then added).
// norm_match: each edited row is then rescaled to its L2 norm before the
// add: with n0 and n1 the row's norms before and after the add (sums of
// squares of the f32 values in double, column order), every value is
// multiplied by f = (float)(n0 / n1) and rounded to f32; a row whose norm
// after the add is 0 is left as it is.
//   x: [rows, cols] row stride ld; idx: [n]; v: [cols]
int64_t AddRowsBroadcast(float* x, int64_t rows, int64_t cols, int64_t ld,
                         const int32_t* idx, int64_t n, const float* v,
                         float scale, bool norm_match = false);

// x[idx[i], :] -= d_i * u[:] with d_i = x[idx[i], :] . u, the dot of the f32
// values accumulated in double in column order and rounded to f32 once; then
// d_i * u[j] is rounded to f32 and subtracted. u is meant to be a unit vector
// (not checked).
//   x: [rows, cols] row stride ld; idx: [n]; u: [cols]
int64_t ProjectOutRows(float* x, int64_t rows, int64_t cols, int64_t ld,
                       const int32_t* idx, int64_t n, const float* u);

// x[idx[i], col_begin + j] = src[s, j] for j < col_end - col_begin, with
// s = i when src_rows == n and s = 0 when src_rows == 1 (one row broadcast to
// every selected row). 0 <= col_begin <= col_end <= cols and src_rows in
// {1, n} are the caller's to check.
//   x: [rows, cols] row stride ld; idx: [n];
//   src: [src_rows, col_end - col_begin] dense
int64_t SetRows(float* x, int64_t rows, int64_t cols, int64_t ld,
                const int32_t* idx, int64_t n, int64_t col_begin,
                int64_t col_end, const float* src, int64_t src_rows);

// x[dst_idx[i], :] = src[src_idx[i], :]. src is another buffer (it must not
// overlap x); src_idx may repeat and come in any order but must lie in
// [0, src_rows): a bad one returns n + i (i its position), x unchanged.
//   x: [rows, cols] row stride ld; dst_idx, src_idx: [n];
//   src: [src_rows, cols] row stride ld_src
int64_t CopyRows(float* x, int64_t rows, int64_t cols, int64_t ld,
                 const int32_t* dst_idx, int64_t n, const float* src,
                 int64_t src_rows, int64_t ld_src, const int32_t* src_idx);

}  // namespace loom::cpu

#endif  // LOOM_BACKEND_CPU_KERNELS_ROWS_H_
