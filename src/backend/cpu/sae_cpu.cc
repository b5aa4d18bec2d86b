#include "src/backend/cpu/sae_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "src/backend/cpu/gemm_internal.h"
#include "src/backend/cpu/kernels.h"
#include "src/base/check.h"
#include "src/base/units.h"
#include "src/core/topk.h"

namespace loom::cpu {
namespace {

constexpr int64_t kAlign = 64;

// The workspace's parts, carved in this order.
struct Parts {
  float* sae_in;  // [rows, d_in]
  float* hidden;  // [rows, d_sae] (hidden_pre when not asked for)
  float* gate;    // [rows, d_sae] gated only
  float* acts;    // [rows, d_sae] (feature_acts when not asked for)
  float* recons;  // [rows, d_out]
  float* scale;   // [rows] norm_in's scale (layer_norm: std)
  float* mean;    // [rows] layer_norm's mean
  void* gemm;     // the GEMMs' workspace
};

int64_t PartBytes(const Sae& sae, int64_t rows, Parts* p, char* base) {
  const bool gated = sae.architecture == SaeArchitecture::kGated;
  const int64_t sizes[] = {rows * sae.d_in,
                           rows * sae.d_sae,
                           gated ? rows * sae.d_sae : 0,
                           rows * sae.d_sae,
                           rows * sae.d_out,
                           rows,
                           rows};
  float** slots[] = {&p->sae_in, &p->hidden, &p->gate, &p->acts,
                     &p->recons, &p->scale,  &p->mean};
  int64_t off = 0;
  for (int i = 0; i < 7; ++i) {
    *slots[i] = base ? reinterpret_cast<float*>(base + off) : nullptr;
    off += AlignUp(sizes[i] * static_cast<int64_t>(sizeof(float)), kAlign);
  }
  p->gemm = base ? base + off : nullptr;
  return off + GemmWorkspaceBytes(rows, sae.d_in, DType::kF32);
}

// norm_in and the b_dec subtraction of one row.
void PrepareRow(const Sae& sae, const float* x, float* in, float* scale,
                float* mean) {
  const int64_t d = sae.d_in;
  *scale = 1;
  *mean = 0;
  switch (sae.normalization) {
    case SaeNormalization::kNone:
      std::copy(x, x + d, in);
      break;
    case SaeNormalization::kConstantNormRescale: {
      float ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += x[i] * x[i];
      *scale = std::sqrt(static_cast<float>(d)) / std::sqrt(ss);
      for (int64_t i = 0; i < d; ++i) in[i] = x[i] * *scale;
      break;
    }
    case SaeNormalization::kLayerNorm: {
      float s = 0;
      for (int64_t i = 0; i < d; ++i) s += x[i];
      *mean = s / static_cast<float>(d);
      float v = 0;
      for (int64_t i = 0; i < d; ++i) v += (x[i] - *mean) * (x[i] - *mean);
      *scale = std::sqrt(v / static_cast<float>(std::max<int64_t>(d - 1, 1)));
      for (int64_t i = 0; i < d; ++i) in[i] = (x[i] - *mean) / (*scale + 1e-5f);
      break;
    }
  }
  if (sae.apply_b_dec_to_input)
    for (int64_t i = 0; i < d; ++i) in[i] -= sae.b_dec[i];
}

// feature_acts of one row from hidden_pre (and the gate).
void ActivateRow(const Sae& sae, const float* h, const float* gate, float* acts,
                 std::vector<int32_t>* order, std::vector<float>* kept) {
  const int64_t n = sae.d_sae;
  switch (sae.architecture) {
    case SaeArchitecture::kStandard:
    case SaeArchitecture::kTranscoder:
    case SaeArchitecture::kSkipTranscoder:
      for (int64_t f = 0; f < n; ++f) acts[f] = h[f] > 0 ? h[f] : 0;
      return;
    case SaeArchitecture::kJumpRelu:
    case SaeArchitecture::kJumpReluTranscoder:
    case SaeArchitecture::kJumpReluSkipTranscoder:
      for (int64_t f = 0; f < n; ++f)
        acts[f] = h[f] > sae.threshold[f] && h[f] > 0 ? h[f] : 0;
      return;
    case SaeArchitecture::kGated:
      for (int64_t f = 0; f < n; ++f)
        acts[f] = gate[f] > 0 && h[f] > 0 ? h[f] : 0;
      return;
    case SaeArchitecture::kTopK: {
      // The k largest pre-activations (times ||W_dec[f]|| when rescaled),
      // relu'd; zeros elsewhere.
      const bool rescale = sae.rescale_acts_by_decoder_norm;
      for (int64_t f = 0; f < n; ++f)
        acts[f] = rescale ? h[f] * sae.dec_norm[f] : h[f];
      order->resize(n);
      std::iota(order->begin(), order->end(), 0);
      const auto before = [&](int32_t a, int32_t b) {
        return RanksBefore(acts, a, b);
      };
      std::nth_element(order->begin(), order->begin() + (sae.k - 1),
                       order->end(), before);
      kept->resize(sae.k);
      for (int64_t i = 0; i < sae.k; ++i) (*kept)[i] = acts[(*order)[i]];
      std::fill(acts, acts + n, 0.0f);
      for (int64_t i = 0; i < sae.k; ++i)
        acts[(*order)[i]] = (*kept)[i] > 0 ? (*kept)[i] : 0;
      return;
    }
  }
}

// recons = sum of the active features' decoder rows (ascending) + b_dec.
void DecodeRow(const Sae& sae, const float* acts, float* recons) {
  const int64_t d = sae.d_out;
  std::fill(recons, recons + d, 0.0f);
  const bool rescale = sae.rescale_acts_by_decoder_norm;
  for (int64_t f = 0; f < sae.d_sae; ++f) {
    if (acts[f] == 0) continue;
    const float a = rescale ? acts[f] / sae.dec_norm[f] : acts[f];
    const float* w = sae.w_dec.data() + f * d;
    for (int64_t i = 0; i < d; ++i) recons[i] += a * w[i];
  }
  for (int64_t i = 0; i < d; ++i) recons[i] += sae.b_dec[i];
}

// norm_out of one row into `out`.
void FinishRow(const Sae& sae, const float* recons, float scale, float mean,
               float* out) {
  const int64_t d = sae.d_out;
  for (int64_t i = 0; i < d; ++i) {
    switch (sae.normalization) {
      case SaeNormalization::kNone:
        out[i] = recons[i];
        break;
      case SaeNormalization::kConstantNormRescale:
        out[i] = recons[i] / scale;
        break;
      case SaeNormalization::kLayerNorm:
        out[i] = recons[i] * scale + mean;
        break;
    }
  }
}

void Encode(const Sae& sae, const Parts& p, int64_t rows) {
  GemmContext ctx;
  GemmArgs g;
  g.x = p.sae_in;
  g.w_dtype = DType::kF32;
  // Panels are read in place (no per-call packing of the encoder).
  static_assert(kSaeEncPanel == gemm::kPanelCols);
  g.layout = sae.enc_panels ? WeightLayout::kPanels : WeightLayout::kOutIn;
  g.m = rows;
  g.n = sae.d_sae;
  g.k = sae.d_in;
  g.workspace = p.gemm;
  if (sae.architecture == SaeArchitecture::kGated) {
    g.w = sae.w_enc.data();
    g.bias = sae.b_gate.data();
    g.y = p.gate;
    ctx.Gemm(g);
    g.reuse_x_workspace = true;
    g.w = sae.w_mag.data();
  } else {
    g.w = sae.w_enc.data();
  }
  g.bias = sae.b_enc.data();
  g.y = p.hidden;
  ctx.Gemm(g);
}

}  // namespace

int64_t SaeWorkspaceBytes(const Sae& sae, int64_t rows) {
  Parts p;
  return PartBytes(sae, rows, &p, nullptr);
}

void RunSae(const Sae& sae, const float* x, const float* reference,
            int64_t rows, void* workspace, const SaeOutputs& out) {
  LOOM_CHECK(out.topk >= 0 && out.topk <= sae.d_sae) << out.topk;
  if (rows == 0) return;
  Parts p;
  PartBytes(sae, rows, &p, static_cast<char*>(workspace));
  if (out.hidden_pre != nullptr) p.hidden = out.hidden_pre;
  if (out.feature_acts != nullptr) p.acts = out.feature_acts;
  if (out.recons != nullptr) p.recons = out.recons;
  for (int64_t r = 0; r < rows; ++r)
    PrepareRow(sae, x + r * sae.d_in, p.sae_in + r * sae.d_in, &p.scale[r],
               &p.mean[r]);
  if (out.norm_scale != nullptr) std::copy_n(p.scale, rows, out.norm_scale);
  Encode(sae, p, rows);
  const int64_t ns = sae.d_sae, no = sae.d_out;
#pragma omp parallel
  {
    std::vector<int32_t> order;
    std::vector<float> kept, row_out(no);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* acts = p.acts + r * ns;
      ActivateRow(sae, p.hidden + r * ns, p.gate ? p.gate + r * ns : nullptr,
                  acts, &order, &kept);
      float* recons = p.recons + r * no;
      DecodeRow(sae, acts, recons);
      float* rec =
          out.reconstruction ? out.reconstruction + r * no : row_out.data();
      FinishRow(sae, recons, p.scale[r], p.mean[r], rec);
      if (HasSkip(sae.architecture)) {
        const float* xr = x + r * sae.d_in;
        for (int64_t o = 0; o < no; ++o) {
          const float* w = sae.w_skip.data() + o * sae.d_in;
          float s = 0;
          for (int64_t i = 0; i < sae.d_in; ++i) s += xr[i] * w[i];
          rec[o] += s;
        }
      }
      if (out.error != nullptr && reference != nullptr)
        for (int64_t o = 0; o < no; ++o)
          out.error[r * no + o] = reference[r * no + o] - rec[o];
      if (out.topk > 0)
        TopKDescending(acts, ns, out.topk, out.topk_indices + r * out.topk,
                       out.topk_values + r * out.topk, &order);
    }
  }
}

}  // namespace loom::cpu
