// Scalar references of the row-edit kernels (src/backend/cpu/kernels_rows.h):
// the plainest version, one row and one column at a time, single-threaded,
// with the same roundings (so kernel and reference agree bit for bit). They
// assume valid indices (the tests check the kernels' index checks
// separately). Tests only.
#ifndef LOOM_BACKEND_CPU_REFERENCE_REFERENCE_ROWS_H_
#define LOOM_BACKEND_CPU_REFERENCE_REFERENCE_ROWS_H_

#include <cstdint>

namespace loom::cpu::ref {

// x: [rows, cols] row stride ld; idx: [n]; v: [cols]
void AddRowsBroadcast(float* x, int64_t ld, int64_t cols, const int32_t* idx,
                      int64_t n, const float* v, float scale,
                      bool norm_match = false);
// x: [rows, cols] row stride ld; idx: [n]; u: [cols]
void ProjectOutRows(float* x, int64_t ld, int64_t cols, const int32_t* idx,
                    int64_t n, const float* u);
// x: [rows, cols] row stride ld; idx: [n];
// src: [src_rows, col_end - col_begin] dense
void SetRows(float* x, int64_t ld, const int32_t* idx, int64_t n,
             int64_t col_begin, int64_t col_end, const float* src,
             int64_t src_rows);
// x: [rows, cols] row stride ld; dst_idx, src_idx: [n];
// src: [src_rows, cols] row stride ld_src
void CopyRows(float* x, int64_t ld, int64_t cols, const int32_t* dst_idx,
              int64_t n, const float* src, int64_t ld_src,
              const int32_t* src_idx);

}  // namespace loom::cpu::ref

#endif  // LOOM_BACKEND_CPU_REFERENCE_REFERENCE_ROWS_H_
