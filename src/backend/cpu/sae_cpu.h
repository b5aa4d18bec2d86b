// An SAE or transcoder (src/model/sae.h) run on rows of activations in f32:
//   sae_in       = norm_in(x) - b_dec * apply_b_dec_to_input
//   hidden_pre   = sae_in W_enc + b_enc           (GEMM; gated: + the gate)
//   feature_acts = the architecture's activation of hidden_pre
//   recons       = sum over active f, ascending, of acts[f] W_dec[f] + b_dec
//   reconstruction = norm_out(recons) (+ x W_skip^T for skip transcoders)
//   error        = reference - reconstruction     (reference: x for an SAE,
//                                                  the estimated hook's value
//                                                  for a transcoder)
// Each row is computed alone (a GEMM row is one FMA chain, the rest is per
// row), so a row's bytes depend neither on the other rows of the call nor on
// the thread count. The scalar reference is src/backend/cpu/reference/
// reference_sae.h.
#ifndef LOOM_BACKEND_CPU_SAE_CPU_H_
#define LOOM_BACKEND_CPU_SAE_CPU_H_

#include <cstdint>
#include <vector>

#include "src/model/sae.h"

namespace loom::cpu {

// Bytes of Run's workspace for up to `rows` rows at the current thread count.
int64_t SaeWorkspaceBytes(const Sae& sae, int64_t rows);

// x [rows, d_in]; reference [rows, d_out] (null: no error output);
// workspace: SaeWorkspaceBytes(sae, rows) bytes, 64-byte aligned.
void RunSae(const Sae& sae, const float* x, const float* reference,
            int64_t rows, void* workspace, const SaeOutputs& out);

}  // namespace loom::cpu

#endif  // LOOM_BACKEND_CPU_SAE_CPU_H_
