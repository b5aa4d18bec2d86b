#include "src/model/sae.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "src/base/float16.h"
#include "src/core/tensor.h"
#include "src/model/config_reader.h"
#include "src/model/f32_tensors.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

constexpr char kSaeLensWeights[] = "sae_weights.safetensors";
constexpr char kSparsifyWeights[] = "sae.safetensors";
constexpr char kConfig[] = "cfg.json";
constexpr char kGemmaScope2Weights[] = "params.safetensors";
constexpr char kGemmaScopeWeights[] = "params.npz";
constexpr char kGemmaScope2Config[] = "config.json";
constexpr char kLlamaScopeConfig[] = "hyperparams.json";
constexpr char kLlamaScopeWeights[] = "checkpoints/final.safetensors";

// The dtype of an SAE's weights (of W_enc / w_enc / encoder.weight).
DType StoredDType(const F32Tensors& t) {
  for (const char* name : {"W_enc", "w_enc", "encoder.weight"})
    if (const std::optional<DType> d = t.DTypeOf(name)) return *d;
  return DType::kF32;
}

// [rows, cols] -> [cols, rows].
std::vector<float> Transpose(const std::vector<float>& a, int64_t rows,
                             int64_t cols) {
  std::vector<float> t(a.size());
  constexpr int64_t kTile = 64;  // in tiles: both sides stay in cache
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile)
      for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + kTile); ++c)
          t[c * rows + r] = a[r * cols + c];
  return t;
}

// W_enc as stored, [in, n] (x W_enc), as the SAE's encoder: panels when n
// is a multiple of kSaeEncPanel (one streaming pass: row i of panel p is
// W_enc[i, 16p .. 16p + 15]), else transposed rows.
void SetEncoderFromInOut(const std::vector<float>& w, int64_t in, int64_t n,
                         Sae* sae) {
  constexpr int64_t P = kSaeEncPanel;
  if (n % P != 0) {
    sae->w_enc = Transpose(w, in, n);
    return;
  }
  sae->w_enc.resize(w.size());
  for (int64_t p = 0; p < n / P; ++p)
    for (int64_t i = 0; i < in; ++i)
      std::memcpy(&sae->w_enc[(p * in + i) * P], &w[i * n + p * P],
                  P * sizeof(float));
  sae->enc_panels = true;
}

// The feature element j of an encoder matrix holds, in the SAE's layout.
int64_t EncoderFeatureOf(const Sae& sae, int64_t j) {
  if (!sae.enc_panels) return j / sae.d_in;
  return j / (kSaeEncPanel * sae.d_in) * kSaeEncPanel + j % kSaeEncPanel;
}

StatusOr<int64_t> PositiveInt(const ConfigReader& cfg, const std::string& key) {
  ASSIGN_OR_RETURN(const int64_t v, cfg.Int(key));
  if (v <= 0 || v > (int64_t{1} << 24))
    return InvalidArgumentError(cfg.source() + ": " + key + " is " +
                                std::to_string(v) + ", expected 1.." +
                                std::to_string(int64_t{1} << 24));
  return v;
}

// SAELens' architecture names (6.x `architecture`).
StatusOr<SaeArchitecture> ParseArchitecture(const std::string& source,
                                            const std::string& name) {
  static constexpr std::pair<std::string_view, SaeArchitecture> kNames[] = {
      {"standard", SaeArchitecture::kStandard},
      {"jumprelu", SaeArchitecture::kJumpRelu},
      {"topk", SaeArchitecture::kTopK},
      {"gated", SaeArchitecture::kGated},
      {"transcoder", SaeArchitecture::kTranscoder},
      {"skip_transcoder", SaeArchitecture::kSkipTranscoder},
      {"jumprelu_transcoder", SaeArchitecture::kJumpReluTranscoder},
      {"jumprelu_skip_transcoder", SaeArchitecture::kJumpReluSkipTranscoder},
  };
  for (const auto& [n, a] : kNames)
    if (n == name) return a;
  return InvalidArgumentError(
      source + ": architecture '" + name +
      "' is not one Loom runs (standard, jumprelu, topk, gated, transcoder, "
      "skip_transcoder, jumprelu_transcoder, jumprelu_skip_transcoder)");
}

StatusOr<SaeNormalization> ParseNormalization(const ConfigReader& cfg) {
  const auto it = cfg.json().find("normalize_activations");
  if (it == cfg.json().end() || it->is_null()) return SaeNormalization::kNone;
  // SAELens <= 5: a boolean (true: expected_average_only_in).
  if (it->is_boolean()) return SaeNormalization::kNone;
  if (!it->is_string())
    return InvalidArgumentError(cfg.source() + ": normalize_activations is " +
                                std::string(it->type_name()) +
                                ", expected a string");
  const std::string n = it->get<std::string>();
  if (n == "none" || n == "expected_average_only_in")
    return SaeNormalization::kNone;
  if (n == "constant_norm_rescale")
    return SaeNormalization::kConstantNormRescale;
  if (n == "layer_norm") return SaeNormalization::kLayerNorm;
  return InvalidArgumentError(
      cfg.source() + ": normalize_activations '" + n +
      "' is not one Loom runs (none, expected_average_only_in, "
      "constant_norm_rescale, layer_norm)");
}

// Whether a SAELens cfg.json is 6.x (sae_lens_version >= 6, top level or in
// metadata): SAELens' handle_config_defaulting.
bool IsSaeLens6(const nlohmann::json& j) {
  for (const nlohmann::json* o :
       {&j, j.contains("metadata") ? &j["metadata"] : nullptr}) {
    if (o == nullptr || !o->is_object()) continue;
    const auto v = o->find("sae_lens_version");
    if (v == o->end() || !v->is_string()) continue;
    const std::string s = v->get<std::string>();
    return std::strtol(s.c_str(), nullptr, 10) >= 6;
  }
  return false;
}

// The hook a SAELens config names (6.x: metadata.hook_name; legacy:
// hook_name or hook_point), or "".
std::string ConfigHook(const nlohmann::json& j, const char* key) {
  for (const nlohmann::json* o :
       {&j, j.contains("metadata") ? &j["metadata"] : nullptr}) {
    if (o == nullptr || !o->is_object()) continue;
    const auto v = o->find(key);
    if (v != o->end() && v->is_string()) return v->get<std::string>();
  }
  return "";
}

// Reads the weights of `sae` (architecture and dims set) from a SAELens
// weights file.
Status ReadSaeLensWeights(const F32Tensors& t, Sae* sae) {
  const int64_t in = sae->d_in, n = sae->d_sae, out = sae->d_out;
  ASSIGN_OR_RETURN(const std::vector<float> w_enc, t.Read("W_enc", {in, n}));
  ASSIGN_OR_RETURN(sae->w_dec, t.Read("W_dec", {n, out}));
  ASSIGN_OR_RETURN(sae->b_dec, t.Read("b_dec", {out}));
  SetEncoderFromInOut(w_enc, in, n, sae);
  if (sae->architecture == SaeArchitecture::kGated) {
    ASSIGN_OR_RETURN(sae->b_gate, t.Read("b_gate", {n}));
    ASSIGN_OR_RETURN(sae->b_enc, t.Read("b_mag", {n}));
    ASSIGN_OR_RETURN(std::vector<float> scale, t.Read("r_mag", {n}));
    // SAELens: sae_in @ (W_enc * exp(r_mag)), the product in f32.
    for (float& r : scale) r = std::exp(r);
    sae->w_mag = sae->w_enc;
    for (size_t j = 0; j < sae->w_mag.size(); ++j)
      sae->w_mag[j] *= scale[EncoderFeatureOf(*sae, static_cast<int64_t>(j))];
  } else {
    ASSIGN_OR_RETURN(sae->b_enc, t.Read("b_enc", {n}));
  }
  if (sae->architecture == SaeArchitecture::kJumpRelu ||
      sae->architecture == SaeArchitecture::kJumpReluTranscoder) {
    ASSIGN_OR_RETURN(sae->threshold, t.Read("threshold", {n}));
  }
  if (HasSkip(sae->architecture)) {
    ASSIGN_OR_RETURN(sae->w_skip, t.Read("W_skip", {out, in}));
  }
  return Status();
}

StatusOr<Sae> LoadSaeLens(const fs::path& dir) {
  ASSIGN_OR_RETURN(const ConfigReader cfg,
                   ConfigReader::FromFile((dir / kConfig).string()));
  Sae sae;
  sae.path = dir.string();
  const bool v6 = IsSaeLens6(cfg.json());
  sae.format = v6 ? SaeFormat::kSaeLens : SaeFormat::kSaeLensLegacy;
  ASSIGN_OR_RETURN(const std::string arch,
                   cfg.String("architecture", "standard"));
  ASSIGN_OR_RETURN(sae.architecture, ParseArchitecture(cfg.source(), arch));
  ASSIGN_OR_RETURN(sae.d_in, PositiveInt(cfg, "d_in"));
  ASSIGN_OR_RETURN(sae.d_sae, PositiveInt(cfg, "d_sae"));
  sae.d_out = sae.d_in;
  if (IsTranscoder(sae.architecture)) {
    ASSIGN_OR_RETURN(sae.d_out, PositiveInt(cfg, "d_out"));
    sae.hook_out = ConfigHook(cfg.json(), "hook_name_out");
  }
  // <= 5.x: apply_b_dec_to_input defaults to true, "activation_fn": "topk"
  // with activation_fn_kwargs.k makes a TopK SAE.
  ASSIGN_OR_RETURN(sae.apply_b_dec_to_input,
                   cfg.Bool("apply_b_dec_to_input", !v6));
  ASSIGN_OR_RETURN(sae.normalization, ParseNormalization(cfg));
  if (!v6) {
    std::string fn = ConfigHook(cfg.json(), "activation_fn_str");
    if (fn.empty()) fn = ConfigHook(cfg.json(), "activation_fn");
    const nlohmann::json& kw =
        cfg.json().value("activation_fn_kwargs", nlohmann::json::object());
    if (fn == "topk" && kw.is_object() && kw.contains("k")) {
      sae.architecture = SaeArchitecture::kTopK;
      ConfigReader kwr(cfg.source() + ": activation_fn_kwargs", kw);
      ASSIGN_OR_RETURN(sae.k, PositiveInt(kwr, "k"));
    }
  }
  if (sae.architecture == SaeArchitecture::kTopK && sae.k == 0) {
    ASSIGN_OR_RETURN(sae.k, PositiveInt(cfg, "k"));
    ASSIGN_OR_RETURN(sae.rescale_acts_by_decoder_norm,
                     cfg.Bool("rescale_acts_by_decoder_norm", false));
  }
  if (sae.k > sae.d_sae)
    return InvalidArgumentError(cfg.source() + ": k " + std::to_string(sae.k) +
                                " exceeds d_sae " + std::to_string(sae.d_sae));
  if (IsTranscoder(sae.architecture) && sae.apply_b_dec_to_input)
    return InvalidArgumentError(
        cfg.source() +
        ": apply_b_dec_to_input is true for a transcoder (its b_dec has "
        "d_out entries; SAELens' TranscoderConfig refuses it too)");
  sae.hook = ConfigHook(cfg.json(), "hook_name");
  if (sae.hook.empty()) sae.hook = ConfigHook(cfg.json(), "hook_point");
  ASSIGN_OR_RETURN(const F32Tensors t,
                   F32Tensors::Open((dir / kSaeLensWeights).string()));
  sae.stored_dtype = StoredDType(t);
  RETURN_IF_ERROR(ReadSaeLensWeights(t, &sae));
  return sae;
}

StatusOr<Sae> LoadSparsify(const fs::path& dir) {
  ASSIGN_OR_RETURN(const ConfigReader cfg,
                   ConfigReader::FromFile((dir / kConfig).string()));
  Sae sae;
  sae.path = dir.string();
  sae.format = SaeFormat::kSparsify;
  sae.architecture = SaeArchitecture::kTopK;
  ASSIGN_OR_RETURN(const std::string act, cfg.String("activation", "topk"));
  if (act != "topk")
    return InvalidArgumentError(cfg.source() + ": activation '" + act +
                                "' is not one Loom runs (topk)");
  ASSIGN_OR_RETURN(const bool transcode, cfg.Bool("transcode", false));
  ASSIGN_OR_RETURN(const bool skip, cfg.Bool("skip_connection", false));
  if (transcode || skip)
    return InvalidArgumentError(
        cfg.source() +
        ": sparsify transcoders and skip connections are not read yet "
        "(transcode/skip_connection true)");
  ASSIGN_OR_RETURN(sae.d_in, PositiveInt(cfg, "d_in"));
  ASSIGN_OR_RETURN(int64_t latents, cfg.Int("num_latents", 0));
  if (latents == 0) {
    ASSIGN_OR_RETURN(const int64_t e, PositiveInt(cfg, "expansion_factor"));
    latents = sae.d_in * e;
  }
  if (latents < 0 || latents > (int64_t{1} << 24))
    return InvalidArgumentError(cfg.source() + ": num_latents is " +
                                std::to_string(latents));
  sae.d_sae = latents;
  sae.d_out = sae.d_in;
  ASSIGN_OR_RETURN(sae.k, cfg.Int("k", 32));
  if (sae.k <= 0 || sae.k > sae.d_sae)
    return InvalidArgumentError(cfg.source() + ": k is " +
                                std::to_string(sae.k) + ", expected 1.." +
                                std::to_string(sae.d_sae));
  // sparsify always subtracts b_dec from the input (sparse_coder.py encode).
  sae.apply_b_dec_to_input = true;
  // The hook is the folder's name (layers.N), sparsify's hookpoint.
  sae.hook = dir.filename().string();
  ASSIGN_OR_RETURN(const F32Tensors t,
                   F32Tensors::Open((dir / kSparsifyWeights).string()));
  sae.stored_dtype = StoredDType(t);
  const int64_t in = sae.d_in, n = sae.d_sae;
  ASSIGN_OR_RETURN(sae.w_enc, t.Read("encoder.weight", {n, in}));
  ASSIGN_OR_RETURN(sae.b_enc, t.Read("encoder.bias", {n}));
  ASSIGN_OR_RETURN(sae.w_dec, t.Read("W_dec", {n, in}));
  ASSIGN_OR_RETURN(sae.b_dec, t.Read("b_dec", {in}));
  return sae;
}

// Gemma Scope (1)'s hook from its path (the Hub's repo and folder names,
// as SAELens' gemma_2 loader reads them): layer_N in a ...-res repo ->
// blocks.N.hook_resid_post, -att -> attn.hook_z, -mlp -> the post-MLP norm's
// output (TransformerLens' Gemma hook_mlp_out, what is added to the
// residual: Loom's ln2_post.hook_normalized); an `embedding` folder ->
// hook_embed. "" when the path does not say.
std::string GemmaScopeHookFromPath(const fs::path& dir) {
  const std::string p = dir.string();
  if (p.find("embedding") != std::string::npos) return "hook_embed";
  const size_t at = p.rfind("layer_");
  if (at == std::string::npos) return "";
  const size_t end = p.find_first_not_of("0123456789", at + 6);
  const std::string layer = p.substr(at + 6, end - (at + 6));
  if (layer.empty()) return "";
  const std::string b = "blocks." + layer + ".";
  if (p.find("-res") != std::string::npos) return b + "hook_resid_post";
  if (p.find("-att") != std::string::npos) return b + "attn.hook_z";
  if (p.find("-mlp") != std::string::npos)
    return b + "ln2_post.hook_normalized";
  return "";
}

// Gemma Scope (1): params.npz of W_enc [d_in, d_sae], W_dec, b_enc, b_dec
// and a per-feature threshold (w_ spelt W_ as SAELens maps it); JumpReLU,
// no b_dec subtraction, no normalization; embedding SAEs get W_enc /
// sqrt(d_in) and W_dec * sqrt(d_in) (SAELens' gemma_2 loader).
StatusOr<Sae> LoadGemmaScope(const fs::path& dir) {
  Sae sae;
  sae.path = dir.string();
  sae.format = SaeFormat::kGemmaScope;
  sae.architecture = SaeArchitecture::kJumpRelu;
  ASSIGN_OR_RETURN(const F32Tensors t,
                   F32Tensors::OpenNpz((dir / kGemmaScopeWeights).string()));
  sae.stored_dtype = StoredDType(t);
  const auto name = [&](const char* upper) {
    std::string lower(upper);
    lower[0] = 'w';
    return upper[0] == 'W' && !t.Has(upper) && t.Has(lower)
               ? lower
               : std::string(upper);
  };
  ASSIGN_OR_RETURN(const std::vector<int64_t> enc, t.Dims(name("W_enc")));
  if (enc.size() != 2 || enc[0] <= 0 || enc[1] <= 0)
    return InvalidArgumentError(t.path() + ": W_enc is " + ShapeText(enc) +
                                ", expected [d_in, d_sae]");
  sae.d_in = sae.d_out = enc[0];
  sae.d_sae = enc[1];
  const int64_t d = sae.d_in, n = sae.d_sae;
  ASSIGN_OR_RETURN(const std::vector<float> w_enc,
                   t.Read(name("W_enc"), {d, n}));
  SetEncoderFromInOut(w_enc, d, n, &sae);
  ASSIGN_OR_RETURN(sae.w_dec, t.Read(name("W_dec"), {n, d}));
  ASSIGN_OR_RETURN(sae.b_enc, t.Read("b_enc", {n}));
  ASSIGN_OR_RETURN(sae.b_dec, t.Read("b_dec", {d}));
  ASSIGN_OR_RETURN(sae.threshold, t.Read("threshold", {n}));
  if (t.Has("scaling_factor")) {
    ASSIGN_OR_RETURN(const std::vector<float> sf,
                     t.Read("scaling_factor", {n}));
    for (int64_t f = 0; f < n; ++f)
      if (sf[f] != 1.0f)
        return InvalidArgumentError(
            t.path() + ": scaling_factor[" + std::to_string(f) + "] is " +
            std::to_string(sf[f]) +
            " (a finetuning scaling factor, which Loom does not apply)");
  }
  sae.hook = GemmaScopeHookFromPath(dir);
  if (sae.hook == "hook_embed") {
    const float s = std::sqrt(static_cast<float>(d));
    for (float& w : sae.w_enc) w /= s;
    for (float& w : sae.w_dec) w *= s;
  }
  return sae;
}

// Gemma Scope 2's hook from its folder names when it has no config.json:
// layer_N under a resid_post / attn_out / mlp_out / transcoder folder.
void GemmaScope2HooksFromPath(const fs::path& dir, Sae* sae) {
  const std::string p = dir.string();
  const size_t at = p.rfind("layer_");
  if (at == std::string::npos) return;
  const size_t end = p.find_first_not_of("0123456789", at + 6);
  const std::string layer = p.substr(at + 6, end - (at + 6));
  if (layer.empty()) return;
  const std::string b = "blocks." + layer + ".";
  if (p.find("transcoder") != std::string::npos) {
    sae->hook = b + "ln2.hook_normalized";
    sae->hook_out = b + "ln2_post.hook_normalized";
  } else if (p.find("resid_post") != std::string::npos) {
    sae->hook = b + "hook_resid_post";
  } else if (p.find("attn_out") != std::string::npos) {
    sae->hook = b + "attn.hook_z";
  } else if (p.find("mlp_out") != std::string::npos) {
    sae->hook = b + "ln2_post.hook_normalized";
  }
}

// Gemma Scope 2 (SAELens' gemma_3 loader): JumpReLU SAEs and transcoders,
// lowercase tensor names kept as stored (w_enc [d_in, d_sae], w_dec [d_sae,
// d_out]; the affine skip [d_out, d_in]), the dims from w_enc and w_dec.
StatusOr<Sae> LoadGemmaScope2(const fs::path& dir) {
  Sae sae;
  sae.path = dir.string();
  sae.format = SaeFormat::kGemmaScope2;
  sae.architecture = SaeArchitecture::kJumpRelu;
  bool affine = false;
  std::error_code ec;
  if (fs::exists(dir / kGemmaScope2Config, ec)) {
    ASSIGN_OR_RETURN(
        const ConfigReader cfg,
        ConfigReader::FromFile((dir / kGemmaScope2Config).string()));
    ASSIGN_OR_RETURN(const std::string arch,
                     cfg.String("architecture", "jump_relu"));
    if (arch != "jump_relu")
      return InvalidArgumentError(cfg.source() + ": architecture '" + arch +
                                  "' is not one Gemma Scope 2 publishes "
                                  "(jump_relu)");
    ASSIGN_OR_RETURN(sae.hook, cfg.String("hf_hook_point_in", ""));
    ASSIGN_OR_RETURN(sae.hook_out, cfg.String("hf_hook_point_out", ""));
    if (sae.hook_out == sae.hook) sae.hook_out.clear();
    ASSIGN_OR_RETURN(affine, cfg.Bool("affine_connection", false));
  } else {
    GemmaScope2HooksFromPath(dir, &sae);
    affine = sae.path.find("affine") != std::string::npos;
  }
  ASSIGN_OR_RETURN(const F32Tensors t,
                   F32Tensors::Open((dir / kGemmaScope2Weights).string()));
  sae.stored_dtype = StoredDType(t);
  ASSIGN_OR_RETURN(const std::vector<int64_t> enc, t.Dims("w_enc"));
  ASSIGN_OR_RETURN(const std::vector<int64_t> dec, t.Dims("w_dec"));
  if (enc.size() != 2 || dec.size() != 2 || dec[0] != enc[1] || enc[0] <= 0 ||
      enc[1] <= 0 || dec[1] <= 0)
    return InvalidArgumentError(t.path() + ": w_enc " + ShapeText(enc) +
                                " and w_dec " + ShapeText(dec) +
                                " are not [d_in, d_sae] and [d_sae, d_out]");
  sae.d_in = enc[0];
  sae.d_sae = enc[1];
  sae.d_out = dec[1];
  if (!sae.hook_out.empty() || sae.d_out != sae.d_in || affine)
    sae.architecture = affine ? SaeArchitecture::kJumpReluSkipTranscoder
                              : SaeArchitecture::kJumpReluTranscoder;
  const int64_t in = sae.d_in, n = sae.d_sae, out = sae.d_out;
  ASSIGN_OR_RETURN(const std::vector<float> w_enc, t.Read("w_enc", {in, n}));
  SetEncoderFromInOut(w_enc, in, n, &sae);
  ASSIGN_OR_RETURN(sae.w_dec, t.Read("w_dec", {n, out}));
  ASSIGN_OR_RETURN(sae.b_enc, t.Read("b_enc", {n}));
  ASSIGN_OR_RETURN(sae.b_dec, t.Read("b_dec", {out}));
  ASSIGN_OR_RETURN(sae.threshold, t.Read("threshold", {n}));
  if (HasSkip(sae.architecture)) {
    ASSIGN_OR_RETURN(sae.w_skip, t.Read("affine_skip_connection", {out, in}));
  }
  return sae;
}

// Llama Scope (OpenMOSS lm_saes, as released: hyperparams.json +
// checkpoints/final.safetensors with encoder.weight [d_sae, d_model],
// encoder.bias, decoder.weight [d_model, d_sae], decoder.bias). lm_saes'
// inference, from the raw activation x (s_in = sqrt(d_model) / a_in, s_out
// = sqrt(d_model) / a_out for norm_activation "dataset-wise", a_* the
// dataset_average_activation_norm; 1 for "inference"):
//   h = E (s_in x) + b_E,  u_i = c_i h_i,  f_i = u_i [u_i > theta],
//   x_hat = (D (h [u > theta]) + b_D) / s_out,
// with c_i = ||D[:, i]|| / s_out when sparsity_include_decoder_norm (its
// unit-decoder-norm transform; else c_i = 1 / s_in). Folded here into a
// JumpReLU SAE on x (f64 products, rounded once to f32): W_enc row i =
// E_i s_in c_i, b_enc_i = b_E_i c_i, W_dec row i = D[:, i] / (s_out c_i)
// (zero for a zero column: that feature never fires), b_dec = b_D / s_out,
// threshold_i = theta. docs/saes.md names the source and where SAELens'
// loader differs.
StatusOr<Sae> LoadLlamaScope(const fs::path& dir) {
  ASSIGN_OR_RETURN(const ConfigReader cfg,
                   ConfigReader::FromFile((dir / kLlamaScopeConfig).string()));
  const std::string& src = cfg.source();
  Sae sae;
  sae.path = dir.string();
  sae.format = SaeFormat::kLlamaScope;
  sae.architecture = SaeArchitecture::kJumpRelu;
  ASSIGN_OR_RETURN(const std::string act, cfg.String("act_fn", "jumprelu"));
  if (act != "jumprelu")
    return InvalidArgumentError(src + ": act_fn '" + act +
                                "' is not one Llama Scope publishes "
                                "(jumprelu)");
  ASSIGN_OR_RETURN(const double theta, cfg.Float("jump_relu_threshold"));
  if (!std::isfinite(theta) || theta < 0)
    return InvalidArgumentError(
        src + ": jump_relu_threshold is " + std::to_string(theta) +
        ", expected a finite value >= 0 (lm_saes keeps negative "
        "pre-activations above a negative threshold; Loom's JumpReLU does "
        "not)");
  ASSIGN_OR_RETURN(sae.d_in, PositiveInt(cfg, "d_model"));
  ASSIGN_OR_RETURN(int64_t d_sae, cfg.Int("d_sae", 0));
  if (d_sae == 0) {
    ASSIGN_OR_RETURN(const int64_t e, PositiveInt(cfg, "expansion_factor"));
    d_sae = sae.d_in * e;
  }
  if (d_sae <= 0 || d_sae > (int64_t{1} << 24))
    return InvalidArgumentError(src + ": d_sae is " + std::to_string(d_sae));
  sae.d_sae = d_sae;
  sae.d_out = sae.d_in;
  ASSIGN_OR_RETURN(const bool pre_bias,
                   cfg.Bool("apply_decoder_bias_to_pre_encoder", false));
  if (pre_bias)
    return InvalidArgumentError(
        src +
        ": apply_decoder_bias_to_pre_encoder is true, which no "
        "released Llama Scope SAE uses; not read");
  ASSIGN_OR_RETURN(const bool use_bias, cfg.Bool("use_decoder_bias", true));
  ASSIGN_OR_RETURN(const bool dec_norm,
                   cfg.Bool("sparsity_include_decoder_norm", true));
  ASSIGN_OR_RETURN(const std::string norm,
                   cfg.String("norm_activation", "dataset-wise"));
  double s_in = 1, s_out = 1;
  if (norm == "dataset-wise") {
    ASSIGN_OR_RETURN(const std::optional<ConfigReader> avg,
                     cfg.Object("dataset_average_activation_norm"));
    if (!avg)
      return InvalidArgumentError(src +
                                  ": norm_activation is dataset-wise but "
                                  "dataset_average_activation_norm is missing");
    ASSIGN_OR_RETURN(const double a_in, avg->Float("in"));
    ASSIGN_OR_RETURN(const double a_out, avg->Float("out", a_in));
    for (const auto& [name, a] : {std::pair("in", a_in), {"out", a_out}})
      if (!std::isfinite(a) || a <= 0)
        return InvalidArgumentError(src + ": dataset_average_activation_norm." +
                                    name + " is " + std::to_string(a) +
                                    ", expected a finite value > 0");
    s_in = std::sqrt(static_cast<double>(sae.d_in)) / a_in;
    s_out = std::sqrt(static_cast<double>(sae.d_in)) / a_out;
  } else if (norm != "inference") {
    return InvalidArgumentError(src + ": norm_activation '" + norm +
                                "' is not read (dataset-wise or inference)");
  }
  ASSIGN_OR_RETURN(sae.hook, cfg.String("hook_point_in", ""));
  ASSIGN_OR_RETURN(sae.hook_out, cfg.String("hook_point_out", ""));
  if (sae.hook_out == sae.hook) sae.hook_out.clear();
  if (!sae.hook_out.empty())
    sae.architecture = SaeArchitecture::kJumpReluTranscoder;

  ASSIGN_OR_RETURN(const F32Tensors t,
                   F32Tensors::Open((dir / kLlamaScopeWeights).string()));
  sae.stored_dtype = StoredDType(t);
  const int64_t d = sae.d_in, n = sae.d_sae;
  ASSIGN_OR_RETURN(const std::vector<float> e,
                   t.Read("encoder.weight", {n, d}));
  ASSIGN_OR_RETURN(const std::vector<float> b_e, t.Read("encoder.bias", {n}));
  ASSIGN_OR_RETURN(const std::vector<float> dw,
                   t.Read("decoder.weight", {d, n}));
  std::vector<float> b_d(static_cast<size_t>(d), 0.0f);
  if (use_bias) {
    ASSIGN_OR_RETURN(b_d, t.Read("decoder.bias", {d}));
  }
  sae.w_enc.resize(static_cast<size_t>(n * d));
  sae.b_enc.resize(static_cast<size_t>(n));
  sae.w_dec.assign(static_cast<size_t>(n * d), 0.0f);
  sae.threshold.assign(static_cast<size_t>(n), static_cast<float>(theta));
  for (int64_t i = 0; i < n; ++i) {
    double norm_i = 0;
    for (int64_t j = 0; j < d; ++j)
      norm_i += double{dw[j * n + i]} * dw[j * n + i];
    const double c = dec_norm ? std::sqrt(norm_i) / s_out : 1.0 / s_in;
    for (int64_t j = 0; j < d; ++j)
      sae.w_enc[i * d + j] = static_cast<float>(e[i * d + j] * s_in * c);
    sae.b_enc[i] = static_cast<float>(b_e[i] * c);
    if (c == 0) continue;
    for (int64_t j = 0; j < d; ++j)
      sae.w_dec[i * d + j] = static_cast<float>(dw[j * n + i] / (s_out * c));
  }
  sae.b_dec.resize(static_cast<size_t>(d));
  for (int64_t j = 0; j < d; ++j)
    sae.b_dec[j] = static_cast<float>(b_d[j] / s_out);
  // Finite stored values can still overflow f32 once scaled.
  for (const auto& [name, v] :
       {std::pair<const char*, const std::vector<float>*>{"encoder.weight",
                                                          &sae.w_enc},
        {"encoder.bias", &sae.b_enc},
        {"decoder.weight", &sae.w_dec},
        {"decoder.bias", &sae.b_dec}})
    for (size_t i = 0; i < v->size(); ++i)
      if (!std::isfinite((*v)[i]))
        return InvalidArgumentError(
            t.path() + ": tensor '" + name +
            "' overflows float32 once the dataset-wise scales and decoder "
            "norms are folded in (element " +
            std::to_string(i) + " of the folded " + name + ")");
  return sae;
}

// The SAE directory of `path` and its format.
StatusOr<std::pair<fs::path, SaeFormat>> Locate(const std::string& path) {
  std::error_code ec;
  fs::path dir(path);
  if (!fs::exists(dir, ec))
    return NotFoundError("SAE " + path + ": no such file or directory");
  if (!fs::is_directory(dir, ec)) dir = dir.parent_path();
  if (dir.empty()) dir = ".";
  // Llama Scope: DIR/checkpoints/final.safetensors given as the path.
  if (dir.filename() == "checkpoints" &&
      fs::exists(dir.parent_path() / kLlamaScopeConfig, ec))
    dir = dir.parent_path();
  if (fs::exists(dir / kLlamaScopeConfig, ec))
    return std::pair(dir, SaeFormat::kLlamaScope);
  const bool cfg = fs::exists(dir / kConfig, ec);
  if (cfg && fs::exists(dir / kSaeLensWeights, ec))
    return std::pair(dir, SaeFormat::kSaeLens);
  if (cfg && fs::exists(dir / kSparsifyWeights, ec))
    return std::pair(dir, SaeFormat::kSparsify);
  if (fs::exists(dir / kGemmaScope2Weights, ec))
    return std::pair(dir, SaeFormat::kGemmaScope2);
  if (fs::exists(dir / kGemmaScopeWeights, ec))
    return std::pair(dir, SaeFormat::kGemmaScope);
  return InvalidArgumentError(
      "SAE " + path +
      ": not a format Loom reads (expected cfg.json with "
      "sae_weights.safetensors (SAELens) or sae.safetensors (sparsify), or "
      "params.safetensors (Gemma Scope 2), params.npz (Gemma Scope), or "
      "hyperparams.json with checkpoints/final.safetensors (Llama Scope))");
}

}  // namespace

std::string_view SaeArchitectureName(SaeArchitecture a) {
  switch (a) {
    case SaeArchitecture::kStandard:
      return "standard";
    case SaeArchitecture::kJumpRelu:
      return "jumprelu";
    case SaeArchitecture::kTopK:
      return "topk";
    case SaeArchitecture::kGated:
      return "gated";
    case SaeArchitecture::kTranscoder:
      return "transcoder";
    case SaeArchitecture::kSkipTranscoder:
      return "skip_transcoder";
    case SaeArchitecture::kJumpReluTranscoder:
      return "jumprelu_transcoder";
    case SaeArchitecture::kJumpReluSkipTranscoder:
      return "jumprelu_skip_transcoder";
  }
  return "?";
}

bool IsTranscoder(SaeArchitecture a) {
  return a == SaeArchitecture::kTranscoder ||
         a == SaeArchitecture::kSkipTranscoder ||
         a == SaeArchitecture::kJumpReluTranscoder ||
         a == SaeArchitecture::kJumpReluSkipTranscoder;
}

bool HasThreshold(SaeArchitecture a) {
  return a == SaeArchitecture::kJumpRelu ||
         a == SaeArchitecture::kJumpReluTranscoder ||
         a == SaeArchitecture::kJumpReluSkipTranscoder;
}

bool HasSkip(SaeArchitecture a) {
  return a == SaeArchitecture::kSkipTranscoder ||
         a == SaeArchitecture::kJumpReluSkipTranscoder;
}

std::string_view SaeNormalizationName(SaeNormalization n) {
  switch (n) {
    case SaeNormalization::kNone:
      return "none";
    case SaeNormalization::kConstantNormRescale:
      return "constant_norm_rescale";
    case SaeNormalization::kLayerNorm:
      return "layer_norm";
  }
  return "?";
}

std::string_view SaeFormatName(SaeFormat f) {
  switch (f) {
    case SaeFormat::kSaeLens:
      return "saelens";
    case SaeFormat::kSaeLensLegacy:
      return "saelens-legacy";
    case SaeFormat::kSparsify:
      return "sparsify";
    case SaeFormat::kGemmaScope2:
      return "gemma-scope-2";
    case SaeFormat::kGemmaScope:
      return "gemma-scope";
    case SaeFormat::kLlamaScope:
      return "llama-scope";
  }
  return "?";
}

std::string SaeHookToLoom(std::string_view name) {
  std::string s(name);
  if (s.rfind("model.layers.", 0) == 0) s.erase(0, 6);
  if (s.rfind("layers.", 0) != 0) return std::string(name);
  const size_t dot = s.find('.', 7);
  const std::string layer =
      s.substr(7, dot == std::string::npos ? std::string::npos : dot - 7);
  if (layer.empty() ||
      layer.find_first_not_of("0123456789") != std::string::npos)
    return std::string(name);
  const std::string rest = dot == std::string::npos ? "" : s.substr(dot + 1);
  static constexpr std::pair<std::string_view, std::string_view> kModules[] = {
      {"", "hook_resid_post"},
      {"output", "hook_resid_post"},
      {"mlp", "hook_mlp_out"},
      {"mlp.output", "hook_mlp_out"},
      {"self_attn", "hook_attn_out"},
      {"self_attn.output", "hook_attn_out"},
      {"self_attn.o_proj.input", "attn.hook_z"},
      {"input_layernorm.output", "ln1.hook_normalized"},
      {"pre_feedforward_layernorm.output", "ln2.hook_normalized"},
      {"post_feedforward_layernorm.output", "ln2_post.hook_normalized"},
  };
  for (const auto& [module, hook] : kModules)
    if (rest == module) return "blocks." + layer + "." + std::string(hook);
  return std::string(name);
}

void SaeEncoderPanels(Sae* sae) {
  const int64_t n = sae->d_sae, d = sae->d_in, P = kSaeEncPanel;
  if (sae->enc_panels || n % P != 0 || d <= 0) return;
  for (std::vector<float>* w : {&sae->w_enc, &sae->w_mag}) {
    if (w->empty()) continue;
    std::vector<float> panels(w->size());
    // Panel p: its 16 rows, one 16-wide column of the output per input i.
    for (int64_t p = 0; p < n / P; ++p) {
      const float* rows = w->data() + p * P * d;
      float* out = panels.data() + p * P * d;
      for (int64_t i0 = 0; i0 < d; i0 += 64)  // 16 x 64 blocks stay in L1
        for (int64_t c = 0; c < P; ++c)
          for (int64_t i = i0; i < std::min(d, i0 + 64); ++i)
            out[i * P + c] = rows[c * d + i];
    }
    *w = std::move(panels);
  }
  sae->enc_panels = true;
}

StatusOr<Sae> LoadSae(const std::string& path, std::string_view hook) {
  ASSIGN_OR_RETURN(const auto located, Locate(path));
  const auto& [dir, format] = located;
  StatusOr<Sae> sae = format == SaeFormat::kSparsify      ? LoadSparsify(dir)
                      : format == SaeFormat::kGemmaScope2 ? LoadGemmaScope2(dir)
                      : format == SaeFormat::kGemmaScope  ? LoadGemmaScope(dir)
                      : format == SaeFormat::kLlamaScope  ? LoadLlamaScope(dir)
                                                          : LoadSaeLens(dir);
  if (!sae.ok()) return sae.status();
  sae->hook = SaeHookToLoom(sae->hook);
  sae->hook_out = SaeHookToLoom(sae->hook_out);
  // The hook a config names is checked against @HOOK; sparsify's folder
  // name and Gemma Scope 2's folder names without a config.json give way.
  std::error_code ec;
  const bool named_by_config =
      format == SaeFormat::kSaeLens ||
      (format == SaeFormat::kLlamaScope && !sae->hook.empty()) ||
      (format == SaeFormat::kGemmaScope2 &&
       fs::exists(dir / kGemmaScope2Config, ec));
  if (!hook.empty()) {
    const std::string given = SaeHookToLoom(hook);
    if (!sae->hook.empty() && sae->hook != given && named_by_config)
      return InvalidArgumentError("SAE " + sae->path + ": @" +
                                  std::string(hook) + " names hook " + given +
                                  ", but its config reads " + sae->hook);
    sae->hook = given;
  }
  if (sae->hook.empty())
    return InvalidArgumentError("SAE " + sae->path +
                                ": its files name no hook; give one as "
                                "PATH@HOOK (e.g. @blocks.12.hook_resid_post)");
  if (sae->rescale_acts_by_decoder_norm) {
    sae->dec_norm.resize(sae->d_sae);
    for (int64_t f = 0; f < sae->d_sae; ++f) {
      double s = 0;
      for (int64_t i = 0; i < sae->d_out; ++i)
        s += double{sae->w_dec[f * sae->d_out + i]} *
             sae->w_dec[f * sae->d_out + i];
      sae->dec_norm[f] = static_cast<float>(std::sqrt(s));
    }
  }
  SaeEncoderPanels(&*sae);
  return sae;
}

float SaeDecodedScale(const Sae& sae, int64_t feature, float norm_scale) {
  float f = 1.0f;
  if (sae.normalization == SaeNormalization::kConstantNormRescale)
    f = 1.0f / norm_scale;
  else if (sae.normalization == SaeNormalization::kLayerNorm)
    f = norm_scale;
  if (sae.rescale_acts_by_decoder_norm) f /= sae.dec_norm[feature];
  return f;
}

}  // namespace loom
