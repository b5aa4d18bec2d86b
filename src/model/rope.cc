#include "src/model/rope.h"

#include <cmath>
#include <numbers>

namespace loom {

void ComputeInvFreq(const RopeConfig& rope, int64_t max_pos, int64_t seq_len,
                    float* inv_freq) {
  const int64_t dim = rope.rotary_dim;
  const int64_t half = dim / 2;
  double base = rope.theta;
  if (rope.type == RopeConfig::Type::kDynamic && seq_len > max_pos) {
    const double f = rope.factor;
    base = base *
           std::pow(
               f * static_cast<double>(seq_len) / static_cast<double>(max_pos) -
                   (f - 1.0),
               static_cast<double>(dim) / static_cast<double>(dim - 2));
  }
  // f32 arithmetic in the order torch uses: 1 / base ** (float(2i) / dim).
  const float fbase = static_cast<float>(base);
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv_freq[i] = 1.0f / std::pow(fbase, e);
  }
  if (rope.type == RopeConfig::Type::kLinear) {
    for (int64_t i = 0; i < half; ++i)
      inv_freq[i] /= static_cast<float>(rope.factor);
  } else if (rope.type == RopeConfig::Type::kLlama3) {
    const float factor = static_cast<float>(rope.factor);
    const float low = static_cast<float>(rope.low_freq_factor),
                high = static_cast<float>(rope.high_freq_factor);
    const float old_ctx =
        static_cast<float>(rope.original_max_position_embeddings);
    const float low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
    for (int64_t i = 0; i < half; ++i) {
      const float wavelen = 2.0f * std::numbers::pi_v<float> / inv_freq[i];
      if (wavelen > low_wavelen) {
        inv_freq[i] = inv_freq[i] / factor;
      } else if (wavelen >=
                 high_wavelen) {  // medium band: smooth interpolation
        const float smooth = (old_ctx / wavelen - low) / (high - low);
        inv_freq[i] =
            (1.0f - smooth) * inv_freq[i] / factor + smooth * inv_freq[i];
      }
    }
  }
}

}  // namespace loom
