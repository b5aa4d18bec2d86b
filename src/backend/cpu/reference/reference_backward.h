// Scalar references of the backward kernels (src/backend/cpu/backward_cpu.h):
// each VJP written from its explicit Jacobian or score matrix, in double.
// Used by the kernel tests only.
#ifndef LOOM_BACKEND_CPU_REFERENCE_REFERENCE_BACKWARD_H_
#define LOOM_BACKEND_CPU_REFERENCE_REFERENCE_BACKWARD_H_

#include <cstdint>

#include "src/backend/cpu/kernels.h"

namespace loom::cpu::ref {

// dx [m, k] = dy [m, n] w [n, k] (w dense f32, row-major), in double.
void GemmBackwardInput(const float* w, int64_t n, int64_t k, const float* dy,
                       int64_t m, float* dx);

// dx = J^T dy with J the norm's [dim, dim] Jacobian per row, built entry by
// entry (freeze_scale: the terms through the 1/rms or 1/std factor left out).
// w: [dim] f32 or null.
void NormBackward(const float* x, const float* dy, float* dx, int64_t rows,
                  int64_t dim, const float* w, float offset, float eps,
                  bool layer_norm, bool freeze_scale);

// The full [len, len] probability and score-gradient matrices per (sequence,
// head), in double.
void AttentionBackward(const AttentionArgs& a, const float* dz, float* dq,
                       float* dk, float* dv, bool freeze_pattern);

// gpt-oss's clamped SwiGLU's derivatives with respect to gate and up (away
// from the clamp bounds) by central differences of its double value.
void ClampedSwigluDerivatives(double gate, double up, double alpha,
                              double limit, double* d_gate, double* d_up);

// The activation's derivative by a central difference of its double-precision
// value (h = 1e-5 relative).
double ActivationDerivative(Activation act, double x);

}  // namespace loom::cpu::ref

#endif  // LOOM_BACKEND_CPU_REFERENCE_REFERENCE_BACKWARD_H_
