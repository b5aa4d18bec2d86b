// Rotary-embedding inverse frequencies, as HF computes them for each
// rope_scaling type.
#ifndef LOOM_MODEL_ROPE_H_
#define LOOM_MODEL_ROPE_H_

#include <cstdint>

#include "src/model/config.h"

namespace loom {

// Fills inv_freq[rotary_dim / 2] for a sequence of `seq_len` tokens (only
// dynamic NTK scaling depends on it: it rescales the base when seq_len
// exceeds max_position_embeddings, per sequence).
void ComputeInvFreq(const RopeConfig& rope, int64_t max_position_embeddings,
                    int64_t seq_len, float* inv_freq);

}  // namespace loom

#endif  // LOOM_MODEL_ROPE_H_
