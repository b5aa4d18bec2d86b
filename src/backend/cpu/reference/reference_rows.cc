#include "src/backend/cpu/reference/reference_rows.h"

#include <cmath>

namespace loom::cpu::ref {

void AddRowsBroadcast(float* x, int64_t ld, int64_t cols, const int32_t* idx,
                      int64_t n, const float* v, float scale, bool norm_match) {
  for (int64_t i = 0; i < n; ++i) {
    float* row = &x[idx[i] * ld];
    double before = 0.0;
    for (int64_t j = 0; j < cols; ++j)
      before = before + double{row[j]} * double{row[j]};
    for (int64_t j = 0; j < cols; ++j) {
      const float product = scale * v[j];
      row[j] = row[j] + product;
    }
    if (!norm_match) continue;
    double after = 0.0;
    for (int64_t j = 0; j < cols; ++j)
      after = after + double{row[j]} * double{row[j]};
    if (after == 0.0) continue;
    const float factor =
        static_cast<float>(std::sqrt(before) / std::sqrt(after));
    for (int64_t j = 0; j < cols; ++j) row[j] = row[j] * factor;
  }
}

void ProjectOutRows(float* x, int64_t ld, int64_t cols, const int32_t* idx,
                    int64_t n, const float* u) {
  for (int64_t i = 0; i < n; ++i) {
    double dot = 0.0;
    for (int64_t j = 0; j < cols; ++j)
      dot = dot + double{x[idx[i] * ld + j]} * double{u[j]};
    const float d = static_cast<float>(dot);
    for (int64_t j = 0; j < cols; ++j) {
      const float product = d * u[j];
      x[idx[i] * ld + j] = x[idx[i] * ld + j] - product;
    }
  }
}

void SetRows(float* x, int64_t ld, const int32_t* idx, int64_t n,
             int64_t col_begin, int64_t col_end, const float* src,
             int64_t src_rows) {
  const int64_t width = col_end - col_begin;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = src_rows == 1 ? 0 : i;
    for (int64_t j = 0; j < width; ++j)
      x[idx[i] * ld + col_begin + j] = src[s * width + j];
  }
}

void CopyRows(float* x, int64_t ld, int64_t cols, const int32_t* dst_idx,
              int64_t n, const float* src, int64_t ld_src,
              const int32_t* src_idx) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < cols; ++j)
      x[dst_idx[i] * ld + j] = src[src_idx[i] * ld_src + j];
}

}  // namespace loom::cpu::ref
