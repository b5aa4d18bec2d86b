// Sparse autoencoders (SAEs) and transcoders as researchers download them,
// read straight from their published layouts (docs/saes.md):
//   SAELens 6.x      DIR/cfg.json (metadata.sae_lens_version >= 6) +
//                    DIR/sae_weights.safetensors
//   SAELens <= 5.x   the same files, a flat cfg.json (converted as SAELens'
//                    handle_pre_6_0_config does)
//   sparsify         DIR/cfg.json + DIR/sae.safetensors (EleutherAI; TopK,
//                    encoder.weight [d_sae, d_in], W_dec rows = features)
//   Gemma Scope 2    DIR/params.safetensors (lowercase w_enc [d_in, d_sae],
//                    w_dec, b_enc, b_dec, threshold; affine_skip_connection)
//                    + DIR/config.json (hf_hook_point_in/out,
//                    affine_connection)
//   Llama Scope      DIR/hyperparams.json + DIR/checkpoints/final.safetensors
//                    (OpenMOSS lm_saes; its dataset-wise norms and decoder
//                    norms folded into a JumpReLU SAE on the raw rows)
// An Sae holds its weights widened to f32 in the layouts the CPU kernels take
// (y = x W^T): W_enc as [d_sae, d_in] rows, or as panels of kSaeEncPanel
// features (SaeEncoderPanels: read by the GEMM in place, never repacked per
// call), W_dec as stored [d_sae, d_out] (a row
// per feature: decoding sums the active features' rows; steering by feature f
// adds c * row f). Loading checks every tensor's presence, dtype, shape and
// values (no NaN or infinity) and names the file and tensor that fails.
#ifndef LOOM_MODEL_SAE_H_
#define LOOM_MODEL_SAE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"

namespace loom {

enum class SaeArchitecture : uint8_t {
  kStandard,                // relu(pre)
  kJumpRelu,                // relu(pre) * (pre > threshold)
  kTopK,                    // the k largest pre, relu'd; zeros elsewhere
  kGated,                   // (gate_pre > 0) * relu(magnitude pre)
  kTranscoder,              // relu; reads one hook, estimates another
  kSkipTranscoder,          // transcoder + x W_skip^T
  kJumpReluTranscoder,      // transcoder with JumpReLU
  kJumpReluSkipTranscoder,  // JumpReLU transcoder + x W_skip^T (Gemma Scope 2's
                            // affine transcoders)
};
std::string_view SaeArchitectureName(SaeArchitecture a);
bool IsTranscoder(SaeArchitecture a);
bool HasThreshold(SaeArchitecture a);  // JumpReLU: a `threshold` [d_sae]
bool HasSkip(SaeArchitecture a);       // a `W_skip` [d_out, d_in]

// SAELens' normalize_activations as it runs from a file on disk.
enum class SaeNormalization : uint8_t {
  kNone,                 // "none" and "expected_average_only_in"
  kConstantNormRescale,  // x * sqrt(d_in) / ||x||; the output divided back
  kLayerNorm,            // (x - mean) / (std_{N-1} + 1e-5); y * std + mean
};
std::string_view SaeNormalizationName(SaeNormalization n);

enum class SaeFormat : uint8_t {
  kSaeLens,
  kSaeLensLegacy,
  kSparsify,
  kGemmaScope2,
  kGemmaScope,
  kLlamaScope,
};
std::string_view SaeFormatName(SaeFormat f);

struct Sae {
  std::string path;  // the directory (or file) loaded, for messages
  SaeFormat format = SaeFormat::kSaeLens;
  SaeArchitecture architecture = SaeArchitecture::kStandard;
  // Loom's hook names: the one read and, for transcoders, the one estimated.
  std::string hook;
  std::string hook_out;
  int64_t d_in = 0, d_sae = 0, d_out = 0;
  int64_t k = 0;  // kTopK: features kept per token
  bool apply_b_dec_to_input = false;
  SaeNormalization normalization = SaeNormalization::kNone;
  bool rescale_acts_by_decoder_norm = false;  // kTopK
  DType stored_dtype = DType::kF32;           // of the weights file

  // f32 weights (widened from stored_dtype).
  // w_enc and w_mag: [d_sae, d_in] rows, or with enc_panels [d_sae /
  // kSaeEncPanel][d_in][kSaeEncPanel] (SaeEncoderWeight reads either).
  bool enc_panels = false;
  std::vector<float> w_enc;      // [d_sae, d_in]: W_enc^T (encoder.weight)
  std::vector<float> b_enc;      // [d_sae] (kGated: b_mag)
  std::vector<float> w_mag;      // kGated [d_sae, d_in]: (W_enc*exp(r_mag))^T
  std::vector<float> b_gate;     // kGated [d_sae]
  std::vector<float> threshold;  // JumpReLU [d_sae]
  std::vector<float> w_dec;      // [d_sae, d_out]: row f = feature f
  std::vector<float> b_dec;      // [d_out]
  std::vector<float> w_skip;     // HasSkip [d_out, d_in]
  std::vector<float> dec_norm;   // rescale_acts_by_decoder_norm [d_sae]
};

// Features per encoder panel: the CPU GEMM's f32 panel width
// (src/backend/cpu/gemm_internal.h, kPanelCols; checked there).
inline constexpr int64_t kSaeEncPanel = 16;

// Element (feature f, input i) of an encoder matrix (sae.w_enc or w_mag) in
// the SAE's layout.
inline float SaeEncoderWeight(const Sae& sae, const std::vector<float>& w,
                              int64_t f, int64_t i) {
  if (!sae.enc_panels) return w[f * sae.d_in + i];
  return w[((f / kSaeEncPanel) * sae.d_in + i) * kSaeEncPanel +
           f % kSaeEncPanel];
}

// Rewrites w_enc and w_mag from [d_sae, d_in] rows into panels (enc_panels)
// when d_sae is a multiple of kSaeEncPanel; LoadSae does it last. No-op on
// panels already.
void SaeEncoderPanels(Sae* sae);

// Where running an SAE writes (Backend::RunSae); a null pointer is an
// output not wanted.
struct SaeOutputs {
  float* hidden_pre = nullptr;      // [rows, d_sae]  hook_sae_acts_pre
  float* feature_acts = nullptr;    // [rows, d_sae]  hook_sae_acts_post
  float* recons = nullptr;          // [rows, d_out]  hook_sae_recons
  float* reconstruction = nullptr;  // [rows, d_out]  hook_sae_output - error
  float* error = nullptr;           // [rows, d_out]  hook_sae_error
  // The `topk` largest feature activations per row, descending, ties broken
  // by the lower index: [rows, topk] each.
  int64_t topk = 0;
  int32_t* topk_indices = nullptr;
  float* topk_values = nullptr;
  // [rows] norm_in's factor of each row (constant_norm_rescale: sqrt(d_in)
  // / ||x||; layer_norm: the std; 1 without normalization).
  float* norm_scale = nullptr;
};

// What reconstruction(f + d e_feature) - reconstruction(f) is, per unit of
// d, as a multiple of W_dec[feature]: norm_out's factor (1 / norm_scale for
// constant_norm_rescale, norm_scale for layer_norm, else 1) over the TopK
// decoder norm when rescale_acts_by_decoder_norm. Transcoders' skip term
// does not depend on f.
float SaeDecodedScale(const Sae& sae, int64_t feature, float norm_scale);

// Loads the SAE or transcoder at `path`: a directory in one of the formats
// above, or a file inside one (its cfg.json or weights file). `hook`, when
// not empty, is the hook it reads (Loom's name or the format's own:
// blocks.1.hook_resid_post, layers.1); it must agree with the hook the file
// names, if any. A file that names none and no `hook` given is an error.
StatusOr<Sae> LoadSae(const std::string& path, std::string_view hook = "");

// A format's hook name as Loom's: TransformerLens names stay as they are
// (blocks.L.hook_resid_post, blocks.L.ln2.hook_normalized); HF module names
// (sparsify's layers.N, Gemma Scope 2's model.layers.N.<module>.output)
// map to what the module outputs or reads: layers.N / layers.N.output ->
// blocks.N.hook_resid_post, .mlp -> hook_mlp_out, .self_attn ->
// hook_attn_out, .self_attn.o_proj.input -> attn.hook_z,
// .input_layernorm.output -> ln1.hook_normalized,
// .pre_feedforward_layernorm.output -> ln2.hook_normalized,
// .post_feedforward_layernorm.output -> ln2_post.hook_normalized. A name it
// does not know (post_attention_layernorm: ln2 in Llama, ln1_post in Gemma)
// is returned as it is, for the hook check to refuse.
std::string SaeHookToLoom(std::string_view name);

}  // namespace loom

#endif  // LOOM_MODEL_SAE_H_
