#include "src/model/lens.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <utility>

#include "src/model/config_reader.h"
#include "src/model/f32_tensors.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

constexpr char kTunedLensWeights[] = "params.safetensors";
constexpr char kTunedLensPickle[] = "params.pt";
constexpr char kTunedLensConfig[] = "config.json";

// "layer_translators.<i>.<what>" when the file has translator 0 under that
// name, else "<i>.<what>" (params.pt's keys).
std::string TranslatorName(bool prefixed, int64_t i, const char* what) {
  return (prefixed ? "layer_translators." : "") + std::to_string(i) + "." +
         what;
}

// What config.json says, checked against the tensors.
struct LensConfig {
  std::optional<int64_t> d_model, num_layers;
  std::optional<bool> bias;
};

StatusOr<LensConfig> ReadLensConfig(const std::string& path) {
  LensConfig c;
  ASSIGN_OR_RETURN(const ConfigReader r, ConfigReader::FromFile(path));
  ASSIGN_OR_RETURN(const std::string type,
                   r.String("lens_type", "linear_tuned_lens"));
  if (type != "linear_tuned_lens")
    return InvalidArgumentError(path + ": lens_type is '" + type +
                                "', expected linear_tuned_lens (the tuned "
                                "lens Loom reads)");
  if (r.Has("d_model")) {
    ASSIGN_OR_RETURN(c.d_model, r.Int("d_model"));
  }
  if (r.Has("num_hidden_layers")) {
    ASSIGN_OR_RETURN(c.num_layers, r.Int("num_hidden_layers"));
  }
  if (r.Has("bias")) {
    ASSIGN_OR_RETURN(c.bias, r.Bool("bias"));
  }
  return c;
}

Status CheckAgrees(const std::string& config, const char* field,
                   std::optional<int64_t> said, int64_t found,
                   const std::string& what) {
  if (said && *said != found)
    return InvalidArgumentError(config + ": " + field + " is " +
                                std::to_string(*said) + ", but the weights " +
                                what + " " + std::to_string(found));
  return Status();
}

}  // namespace

StatusOr<TunedLens> LoadTunedLens(const std::string& path) {
  std::error_code ec;
  std::string weights = path;
  std::optional<LensConfig> config;
  std::string config_path;
  bool pickle = false;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    weights = (dir / kTunedLensWeights).string();
    if (!fs::exists(weights, ec)) {
      weights = (dir / kTunedLensPickle).string();
      pickle = true;
      if (!fs::exists(weights, ec))
        return NotFoundError(path + ": no " + kTunedLensWeights + " or " +
                             kTunedLensPickle +
                             " (a tuned lens folder holds config.json and "
                             "the translators)");
    }
    config_path = (dir / kTunedLensConfig).string();
    if (fs::exists(config_path, ec)) {
      ASSIGN_OR_RETURN(config, ReadLensConfig(config_path));
    }
  } else if (!fs::exists(path, ec)) {
    return NotFoundError(path + ": no such tuned lens (a folder with " +
                         kTunedLensWeights + " or " + kTunedLensPickle +
                         ", or one of those files)");
  } else {
    pickle = fs::path(path).extension() == ".pt";
  }
  ASSIGN_OR_RETURN(const F32Tensors t, pickle ? F32Tensors::OpenTorch(weights)
                                              : F32Tensors::Open(weights));
  const bool prefixed = t.Has("layer_translators.0.weight");
  if (!prefixed && !t.Has("0.weight"))
    return InvalidArgumentError(
        weights +
        ": no tensor 'layer_translators.0.weight' (or '0.weight'): "
        "not a tuned lens's translators");
  TunedLens lens;
  lens.path = weights;
  ASSIGN_OR_RETURN(const std::vector<int64_t> w0,
                   t.Dims(TranslatorName(prefixed, 0, "weight")));
  if (w0.size() != 2 || w0[0] != w0[1] || w0[0] <= 0)
    return InvalidArgumentError(
        weights + ": tensor '" + TranslatorName(prefixed, 0, "weight") +
        "' is " + ShapeText(w0) + ", expected [d_model, d_model]");
  const int64_t d = w0[0];
  int64_t n = 0;
  while (t.Has(TranslatorName(prefixed, n, "weight"))) ++n;
  const bool has_bias = t.Has(TranslatorName(prefixed, 0, "bias"));
  if (config) {
    RETURN_IF_ERROR(
        CheckAgrees(config_path, "d_model", config->d_model, d, "are d_model"));
    RETURN_IF_ERROR(CheckAgrees(config_path, "num_hidden_layers",
                                config->num_layers, n, "hold translators for"));
    if (config->bias && *config->bias != has_bias)
      return InvalidArgumentError(
          config_path + ": bias is " + (*config->bias ? "true" : "false") +
          ", but " + weights + (has_bias ? " has" : " has no") + " tensor '" +
          TranslatorName(prefixed, 0, "bias") + "'");
  }
  lens.d_model = d;
  lens.num_layers = n;
  lens.weight.reserve(static_cast<size_t>(n * d * d));
  lens.bias.assign(static_cast<size_t>(n * d), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(const std::vector<float> w,
                     t.Read(TranslatorName(prefixed, i, "weight"), {d, d}));
    lens.weight.insert(lens.weight.end(), w.begin(), w.end());
    const std::string bias = TranslatorName(prefixed, i, "bias");
    if (t.Has(bias) != has_bias)
      return InvalidArgumentError(
          weights + ": translator " + std::to_string(i) +
          (has_bias ? " has no tensor '" + bias + "'"
                    : " has a tensor '" + bias + "' that translator 0 lacks"));
    if (!has_bias) continue;
    ASSIGN_OR_RETURN(const std::vector<float> b, t.Read(bias, {d}));
    std::copy(b.begin(), b.end(), lens.bias.begin() + i * d);
  }
  return lens;
}

bool IsLensSite(HookSite site) {
  return site == HookSite::kResidPre || site == HookSite::kResidMid ||
         site == HookSite::kResidPost;
}

StatusOr<int64_t> TunedLensTranslator(const HookPoint& hook,
                                      int64_t num_layers) {
  if (hook.site == HookSite::kResidPre) return hook.layer;
  if (hook.site == HookSite::kResidPost)
    return hook.layer + 1 < num_layers ? hook.layer + 1 : -1;
  return InvalidArgumentError(
      HookName(hook) +
      ": a tuned lens has translators for blocks.i.hook_resid_pre and "
      "blocks.i.hook_resid_post only");
}

StatusOr<int64_t> CheckLensHook(const HookPoint& hook, const ModelConfig& c,
                                const TunedLens* tuned) {
  if (!IsLensSite(hook.site))
    return InvalidArgumentError(
        HookName(hook) +
        ": a lens reads a residual stream (blocks.i.hook_resid_pre, "
        "hook_resid_mid or hook_resid_post)");
  RETURN_IF_ERROR(CheckHookExists(hook, c));
  if (tuned == nullptr) return int64_t{-1};
  return TunedLensTranslator(hook, c.num_layers);
}

}  // namespace loom
