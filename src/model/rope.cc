#include "src/model/rope.h"

#include <algorithm>
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
  if (rope.type == RopeConfig::Type::kYarn) {
    // f32 tensor arithmetic in HF's order: pos_freqs = base ** (2i / d);
    // interpolation 1 / (factor * pos_freqs), extrapolation 1 / pos_freqs;
    // ramp = clamp((i - low) / (high - low), 0, 1) (python scalars cast to
    // f32); extrapolation factor 1 - ramp; the blend below. Each product and
    // sum is rounded on its own, as torch's elementwise ops do (this file is
    // compiled without FMA contraction).
    const YarnRange r = ComputeYarnRange(rope);
    double high = r.high;
    if (r.low == high) high += 0.001;  // HF: prevent a zero-width ramp
    const float flow = static_cast<float>(r.low);
    const float fwidth = static_cast<float>(high - r.low);
    const float factor = static_cast<float>(rope.factor);
    for (int64_t i = 0; i < half; ++i) {
      const float e = static_cast<float>(2 * i) / static_cast<float>(dim);
      const float pos_freq = std::pow(fbase, e);
      const float scaled = factor * pos_freq;
      const float interp = 1.0f / scaled;
      const float extrap = 1.0f / pos_freq;
      const float ramp =
          std::clamp((static_cast<float>(i) - flow) / fwidth, 0.0f, 1.0f);
      const float ext_factor = 1.0f - ramp;
      const float a = interp * (1.0f - ext_factor);
      const float b = extrap * ext_factor;
      inv_freq[i] = a + b;
    }
    return;
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

YarnRange ComputeYarnRange(const RopeConfig& rope) {
  const double d = static_cast<double>(rope.rotary_dim);
  const double omax =
      static_cast<double>(rope.original_max_position_embeddings);
  auto corr = [&](double rotations) {
    return d * std::log(omax / (rotations * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(rope.theta));
  };
  YarnRange r{corr(rope.beta_fast), corr(rope.beta_slow)};
  if (rope.truncate) {
    r.low = std::floor(r.low);
    r.high = std::ceil(r.high);
  }
  r.low = std::max(r.low, 0.0);
  r.high = std::min(r.high, d - 1.0);
  return r;
}

double YarnAttentionFactor(double factor, double mscale,
                           double mscale_all_dim) {
  auto get_mscale = [&](double m) {
    return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
  };
  if (mscale != 0.0 && mscale_all_dim != 0.0)
    return get_mscale(mscale) / get_mscale(mscale_all_dim);
  return get_mscale(1.0);
}

std::vector<float> AlibiSlopes(int64_t heads) {
  std::vector<float> out;
  if (heads <= 0) return out;
  int64_t n = 1;
  while (n * 2 <= heads) n *= 2;
  const double log2n = std::log2(static_cast<double>(n));
  const float base = static_cast<float>(std::exp2(-std::exp2(-(log2n - 3))));
  for (int64_t p = 1; p <= n; ++p)
    out.push_back(static_cast<float>(std::pow(double{base}, double(p))));
  if (n == heads) return out;
  const float extra =
      static_cast<float>(std::exp2(-std::exp2(-(log2n + 1 - 3))));
  for (int64_t i = 0; i < std::min(n, heads - n); ++i)
    out.push_back(static_cast<float>(std::pow(double{extra}, 2.0 * i + 1)));
  return out;
}

}  // namespace loom
