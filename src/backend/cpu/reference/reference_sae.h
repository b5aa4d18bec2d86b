// Scalar reference of RunSae (src/backend/cpu/sae_cpu.h): the formulas of
// golden/sae/README.md one row and one feature at a time, in double, the
// encoder as a plain dot product (no GEMM). The kernel agrees to float
// rounding, not bit for bit. Tests only.
#ifndef LOOM_BACKEND_CPU_REFERENCE_REFERENCE_SAE_H_
#define LOOM_BACKEND_CPU_REFERENCE_REFERENCE_SAE_H_

#include <cstdint>
#include <vector>

#include "src/model/sae.h"

namespace loom::cpu::ref {

struct SaeRow {
  std::vector<double> hidden_pre;      // [d_sae]
  std::vector<double> feature_acts;    // [d_sae]
  std::vector<double> recons;          // [d_out]
  std::vector<double> reconstruction;  // [d_out]
};

// One row x [d_in].
SaeRow RunSaeRow(const Sae& sae, const float* x);

}  // namespace loom::cpu::ref

#endif  // LOOM_BACKEND_CPU_REFERENCE_REFERENCE_SAE_H_
