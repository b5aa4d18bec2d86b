// Rotary-embedding inverse frequencies, as HF computes them for each
// rope_scaling type.
#ifndef LOOM_MODEL_ROPE_H_
#define LOOM_MODEL_ROPE_H_

#include <cstdint>
#include <vector>

#include "src/model/config.h"

namespace loom {

// Fills inv_freq[rotary_dim / 2] for a sequence of `seq_len` tokens (only
// dynamic NTK scaling depends on it: it rescales the base when seq_len
// exceeds max_position_embeddings, per sequence).
void ComputeInvFreq(const RopeConfig& rope, int64_t max_position_embeddings,
                    int64_t seq_len, float* inv_freq);

// YaRN's ramp bounds (HF's find_correction_range): the correction dim of r
// rotations is rotary_dim * ln(original_max / (2 pi r)) / (2 ln theta);
// low = corr(beta_fast), high = corr(beta_slow), floored / ceiled when
// truncate, then clamped to [0, rotary_dim - 1].
struct YarnRange {
  double low = 0.0, high = 0.0;
};
YarnRange ComputeYarnRange(const RopeConfig& rope);

// YaRN's attention_factor (HF's get_mscale): 0.1 * m * ln(factor) + 1 for
// factor > 1, else 1; m = 1, or mscale / mscale_all_dim when both are
// non-zero (then the ratio of the two).
double YarnAttentionFactor(double factor, double mscale, double mscale_all_dim);

// ALiBi's per-head slopes (BLOOM's build_alibi_tensor): for the largest power
// of two n <= heads, base^1..base^n with base = 2^(-8 / n); the remaining
// heads take the odd powers 1, 3, 5, ... of 2^(-4 / n). The powers of the
// f32 base are taken in double and rounded to f32 (within an ulp of
// torch.pow's f32 result).
std::vector<float> AlibiSlopes(int64_t heads);

}  // namespace loom

#endif  // LOOM_MODEL_ROPE_H_
