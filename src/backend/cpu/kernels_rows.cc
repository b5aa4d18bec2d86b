#include "src/backend/cpu/kernels_rows.h"

#include <cmath>
#include <cstring>

namespace loom::cpu {

int64_t FirstBadRowIndex(const int32_t* idx, int64_t n, int64_t rows) {
  int64_t prev = -1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = idx[i];
    if (r <= prev || r >= rows) return i;
    prev = r;
  }
  return -1;
}

namespace {

// sqrt of the sum of squares of row [cols], in double, in column order.
double RowNorm(const float* row, int64_t cols) {
  double s = 0.0;
  for (int64_t j = 0; j < cols; ++j)
    s += static_cast<double>(row[j]) * static_cast<double>(row[j]);
  return std::sqrt(s);
}

}  // namespace

int64_t AddRowsBroadcast(float* x, int64_t rows, int64_t cols, int64_t ld,
                         const int32_t* idx, int64_t n, const float* v,
                         float scale, bool norm_match) {
  const int64_t bad = FirstBadRowIndex(idx, n, rows);
  if (bad >= 0) return bad;
#pragma omp parallel for schedule(static) if (n * cols > 16384)
  for (int64_t i = 0; i < n; ++i) {
    float* row = x + static_cast<int64_t>(idx[i]) * ld;
    const double before = norm_match ? RowNorm(row, cols) : 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const float t = scale * v[j];
      row[j] += t;
    }
    if (!norm_match) continue;
    const double after = RowNorm(row, cols);
    if (after == 0.0) continue;
    const float f = static_cast<float>(before / after);
    for (int64_t j = 0; j < cols; ++j) row[j] *= f;
  }
  return -1;
}

int64_t ProjectOutRows(float* x, int64_t rows, int64_t cols, int64_t ld,
                       const int32_t* idx, int64_t n, const float* u) {
  const int64_t bad = FirstBadRowIndex(idx, n, rows);
  if (bad >= 0) return bad;
#pragma omp parallel for schedule(static) if (n * cols > 16384)
  for (int64_t i = 0; i < n; ++i) {
    float* row = x + static_cast<int64_t>(idx[i]) * ld;
    double dot = 0.0;
    for (int64_t j = 0; j < cols; ++j)
      dot += static_cast<double>(row[j]) * static_cast<double>(u[j]);
    const float d = static_cast<float>(dot);
    for (int64_t j = 0; j < cols; ++j) {
      const float t = d * u[j];
      row[j] -= t;
    }
  }
  return -1;
}

int64_t SetRows(float* x, int64_t rows, int64_t cols, int64_t ld,
                const int32_t* idx, int64_t n, int64_t col_begin,
                int64_t col_end, const float* src, int64_t src_rows) {
  (void)cols;
  const int64_t bad = FirstBadRowIndex(idx, n, rows);
  if (bad >= 0) return bad;
  const int64_t width = col_end - col_begin;
  if (n == 0 || width <= 0) return -1;  // nothing to write (src may be null)
  const size_t bytes = sizeof(float) * static_cast<size_t>(width);
#pragma omp parallel for schedule(static) if (n * width > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const float* s = src + (src_rows == 1 ? 0 : i) * width;
    std::memcpy(x + static_cast<int64_t>(idx[i]) * ld + col_begin, s, bytes);
  }
  return -1;
}

int64_t CopyRows(float* x, int64_t rows, int64_t cols, int64_t ld,
                 const int32_t* dst_idx, int64_t n, const float* src,
                 int64_t src_rows, int64_t ld_src, const int32_t* src_idx) {
  const int64_t bad = FirstBadRowIndex(dst_idx, n, rows);
  if (bad >= 0) return bad;
  for (int64_t i = 0; i < n; ++i)
    if (src_idx[i] < 0 || src_idx[i] >= src_rows) return n + i;
  if (n == 0 || cols <= 0) return -1;  // nothing to copy (src may be null)
  const size_t bytes = sizeof(float) * static_cast<size_t>(cols);
#pragma omp parallel for schedule(static) if (n * cols > 16384)
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(x + static_cast<int64_t>(dst_idx[i]) * ld,
                src + static_cast<int64_t>(src_idx[i]) * ld_src, bytes);
  return -1;
}

}  // namespace loom::cpu
