#include "src/backend/cpu/reference/reference_sae.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace loom::cpu::ref {

SaeRow RunSaeRow(const Sae& sae, const float* x) {
  const int64_t d = sae.d_in, n = sae.d_sae, o = sae.d_out;
  // norm_in, then the b_dec subtraction.
  std::vector<double> in(x, x + d);
  double scale = 1, mean = 0;
  if (sae.normalization == SaeNormalization::kConstantNormRescale) {
    double ss = 0;
    for (double v : in) ss += v * v;
    scale = std::sqrt(static_cast<double>(d)) / std::sqrt(ss);
    for (double& v : in) v *= scale;
  } else if (sae.normalization == SaeNormalization::kLayerNorm) {
    mean = std::accumulate(in.begin(), in.end(), 0.0) / d;
    double var = 0;
    for (double v : in) var += (v - mean) * (v - mean);
    scale = std::sqrt(var / std::max<int64_t>(d - 1, 1));
    for (double& v : in) v = (v - mean) / (scale + 1e-5);
  }
  if (sae.apply_b_dec_to_input)
    for (int64_t i = 0; i < d; ++i) in[i] -= sae.b_dec[i];
  SaeRow r;
  r.hidden_pre.assign(n, 0);
  r.feature_acts.assign(n, 0);
  std::vector<double> gate(n, 0);
  const bool gated = sae.architecture == SaeArchitecture::kGated;
  for (int64_t f = 0; f < n; ++f) {
    const std::vector<float>& w = gated ? sae.w_mag : sae.w_enc;
    double h = sae.b_enc[f], g = gated ? sae.b_gate[f] : 0;
    for (int64_t i = 0; i < d; ++i) {
      h += in[i] * SaeEncoderWeight(sae, w, f, i);
      if (gated) g += in[i] * SaeEncoderWeight(sae, sae.w_enc, f, i);
    }
    r.hidden_pre[f] = h;
    gate[f] = g;
  }
  const bool rescale = sae.rescale_acts_by_decoder_norm;
  std::vector<double> act(n);
  for (int64_t f = 0; f < n; ++f) {
    const double h = r.hidden_pre[f];
    switch (sae.architecture) {
      case SaeArchitecture::kJumpRelu:
      case SaeArchitecture::kJumpReluTranscoder:
      case SaeArchitecture::kJumpReluSkipTranscoder:
        act[f] = h > sae.threshold[f] && h > 0 ? h : 0;
        break;
      case SaeArchitecture::kGated:
        act[f] = gate[f] > 0 && h > 0 ? h : 0;
        break;
      case SaeArchitecture::kTopK:
        act[f] = rescale ? h * sae.dec_norm[f] : h;
        break;
      default:
        act[f] = h > 0 ? h : 0;
    }
  }
  if (sae.architecture == SaeArchitecture::kTopK) {
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return act[a] > act[b]; });
    std::vector<double> kept(n, 0);
    for (int64_t i = 0; i < sae.k; ++i)
      kept[order[i]] = std::max(act[order[i]], 0.0);
    act = kept;
  }
  r.feature_acts = act;
  r.recons.assign(sae.b_dec.begin(), sae.b_dec.end());
  for (int64_t f = 0; f < n; ++f) {
    const double a = rescale && act[f] != 0 ? act[f] / sae.dec_norm[f] : act[f];
    for (int64_t j = 0; j < o; ++j) r.recons[j] += a * sae.w_dec[f * o + j];
  }
  r.reconstruction = r.recons;
  for (int64_t j = 0; j < o; ++j) {
    if (sae.normalization == SaeNormalization::kConstantNormRescale)
      r.reconstruction[j] /= scale;
    else if (sae.normalization == SaeNormalization::kLayerNorm)
      r.reconstruction[j] = r.reconstruction[j] * scale + mean;
    if (HasSkip(sae.architecture))
      for (int64_t i = 0; i < d; ++i)
        r.reconstruction[j] += double{x[i]} * sae.w_skip[j * d + i];
  }
  return r;
}

}  // namespace loom::cpu::ref
