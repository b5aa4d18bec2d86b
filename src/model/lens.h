// Lenses: reading an intermediate residual stream as next-token logits.
// The logit lens applies the model's own final norm and unembedding (and
// final softcap / logit scaling) to a residual hook; the tuned lens first
// moves the residual of layer i by a learned affine translator,
//   h' = h + (h W_i^T + b_i)                 (tuned-lens's transform_hidden)
// (docs/saes.md, "Lenses"). This file reads the translators and maps hooks
// to them; src/eval/lens.h runs a lens on a model.
#ifndef LOOM_MODEL_LENS_H_
#define LOOM_MODEL_LENS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/model/config.h"
#include "src/model/hooks.h"

namespace loom {

// A tuned lens's translators, one per layer: translator i acts on
// blocks.i.hook_resid_pre (= HF hidden_states[i]); the last layer's output
// has none (tuned-lens reads the model's own logits there).
struct TunedLens {
  std::string path;  // the file read
  int64_t d_model = 0;
  int64_t num_layers = 0;     // translators
  std::vector<float> weight;  // [num_layers, d, d]: out x in
  std::vector<float> bias;    // [num_layers, d] (zeros without a bias)
  const float* W(int64_t i) const {
    return weight.data() + i * d_model * d_model;
  }
  const float* b(int64_t i) const { return bias.data() + i * d_model; }
};

// Reads a tuned lens from `path`: the folder tuned-lens saves (config.json +
// params.pt; a params.safetensors beside them is preferred), or one of those
// files. params.pt is read as a zip of tensors by the restricted unpickler
// of src/io/torch_pickle.h (nothing in it is executed). Tensor names:
// layer_translators.<i>.weight [d, d] and .bias [d] (or without the prefix,
// as params.pt keys them), i = 0..n-1. config.json, when present, must say
// lens_type linear_tuned_lens and agree with the tensors (d_model,
// num_hidden_layers, bias). Errors name the file and the tensor or field.
StatusOr<TunedLens> LoadTunedLens(const std::string& path);

// Whether a lens reads `hook`: a residual stream (blocks.i.hook_resid_pre /
// hook_resid_mid / hook_resid_post).
bool IsLensSite(HookSite site);

// The translator of a tuned lens for `hook` of a model with `num_layers`
// layers: i for blocks.i.hook_resid_pre, i + 1 for
// blocks.i.hook_resid_post, -1 (none: the logit lens, which there is the
// model's own logits) for the last layer's hook_resid_post. InvalidArgument
// naming the hook for any other (hook_resid_mid has no translator).
StatusOr<int64_t> TunedLensTranslator(const HookPoint& hook,
                                      int64_t num_layers);

// Whether a lens (tuned: with these translators; null: the logit lens) can
// read `hook` of the model `c`: it exists, is a residual stream and, for a
// tuned lens, has a translator. InvalidArgument naming the hook otherwise.
// The lens's returned translator index: TunedLensTranslator's (-1 for the
// logit lens).
StatusOr<int64_t> CheckLensHook(const HookPoint& hook, const ModelConfig& c,
                                const TunedLens* tuned);

}  // namespace loom

#endif  // LOOM_MODEL_LENS_H_
