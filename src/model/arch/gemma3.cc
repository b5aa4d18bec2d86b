// Gemma 3: the Gemma 2 block layout (four (1 + w) RMSNorms) with per-head
// (1 + w) q/k RMSNorm, a sliding window on the layers `layer_types` (or
// sliding_window_pattern) marks sliding, those layers rotating with their own
// base (rope_local_base_freq, never scaled: ModelConfig::rope_local) and the
// global ones with rope_theta and rope_scaling; final_logit_softcapping when
// set; attn_logit_softcapping is ignored, as transformers does.
// `gemma3_text` is the text-only checkpoint (Gemma 3 1B, 270M), run.
// `gemma3` is the multimodal checkpoint: the language model's tensors sit
// under "language_model." and a SigLIP vision tower plus a projector come
// along; it is declared for planning and inspection only.
#include <cmath>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {

namespace {

Status ParseText(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseGemmaCommon(r, c));
  c->qk_norm = QkNormKind::kPerHead;
  c->post_attn_norm = true;
  c->post_mlp_norm = true;
  RETURN_IF_ERROR(ParseQueryPreAttnScalar(r, c));
  ASSIGN_OR_RETURN(const double final_softcap,
                   r.Float("final_logit_softcapping", 0.0));
  if (!(final_softcap >= 0))
    return InvalidArgumentError(r.source() + ": final_logit_softcapping = " +
                                std::to_string(final_softcap) +
                                ", expected > 0 or null");
  c->final_softcap = static_cast<float>(final_softcap);
  c->rope_local = c->rope;
  c->rope_local.type = RopeConfig::Type::kDefault;
  c->rope_local.factor = 1.0;
  c->rope_local.attention_scaling = 1.0f;
  ASSIGN_OR_RETURN(c->rope_local.theta, r.Float("rope_local_base_freq", 1e4));
  if (!(c->rope_local.theta > 0))
    return InvalidArgumentError(r.source() + ": rope_local_base_freq = " +
                                std::to_string(c->rope_local.theta) +
                                ", expected > 0");
  ASSIGN_OR_RETURN(int64_t window, r.Int("sliding_window", 4096));
  ASSIGN_OR_RETURN(bool typed, ParseLayerTypes(r, window, c));
  if (!typed) {
    ASSIGN_OR_RETURN(int64_t pattern, r.Int("sliding_window_pattern", 6));
    for (int64_t i = 0; i < c->num_layers; ++i)
      c->sliding_window[i] = (i + 1) % pattern != 0 ? window : 0;
  }
  return Status();
}

Status ParseMultimodal(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(std::optional<ConfigReader> text, r.Object("text_config"));
  if (!text)
    return NotFoundError(r.source() + ": missing required key 'text_config'");
  RETURN_IF_ERROR(ParseText(*text, c));
  if (!text->Has("torch_dtype") && r.Has("torch_dtype")) {
    ASSIGN_OR_RETURN(std::string dtype, r.String("torch_dtype"));
    if (auto d = ParseDType(dtype)) c->torch_dtype = *d;
  }
  c->text_prefix = "language_model.";
  ASSIGN_OR_RETURN(std::optional<ConfigReader> vision,
                   r.Object("vision_config"));
  if (!vision)
    return NotFoundError(r.source() + ": missing required key 'vision_config'");
  VisionConfig& v = c->vision;
  ASSIGN_OR_RETURN(v.hidden_size, vision->Int("hidden_size"));
  ASSIGN_OR_RETURN(v.intermediate_size, vision->Int("intermediate_size"));
  ASSIGN_OR_RETURN(v.num_layers, vision->Int("num_hidden_layers"));
  ASSIGN_OR_RETURN(v.patch_size, vision->Int("patch_size"));
  ASSIGN_OR_RETURN(v.image_size, vision->Int("image_size"));
  ASSIGN_OR_RETURN(v.num_channels, vision->Int("num_channels", 3));
  if (v.patch_size <= 0 || v.image_size % v.patch_size != 0)
    return InvalidArgumentError(
        vision->source() + ": image_size " + std::to_string(v.image_size) +
        " is not a multiple of patch_size " + std::to_string(v.patch_size));
  return Status();
}

ArchWeights DeclareText(const ModelConfig& c) {
  DecoderNames n = Gemma2Names();
  ArchWeights w = DeclareDecoderWeights(c, n);
  if (c.text_prefix.empty()) return w;
  for (WeightSpec& s : w.specs) {
    s.name = c.text_prefix + s.name;
    if (!s.tied_to.empty()) s.tied_to = c.text_prefix + s.tied_to;
  }
  return w;
}

ArchWeights DeclareMultimodal(const ModelConfig& c) {
  ArchWeights w = DeclareText(c);
  const VisionConfig& v = c.vision;
  const int64_t hv = v.hidden_size, iv = v.intermediate_size;
  auto add = [&](std::string name, Shape shape) {
    WeightSpec s;
    s.name = std::move(name);
    s.role = WeightRole::kOther;
    s.shape = std::move(shape);
    w.specs.push_back(std::move(s));
  };
  const std::string p = "vision_tower.vision_model.";
  add(p + "embeddings.patch_embedding.weight",
      {hv, v.num_channels, v.patch_size, v.patch_size});
  add(p + "embeddings.patch_embedding.bias", {hv});
  const int64_t patches =
      (v.image_size / v.patch_size) * (v.image_size / v.patch_size);
  add(p + "embeddings.position_embedding.weight", {patches, hv});
  for (int64_t i = 0; i < v.num_layers; ++i) {
    const std::string l = p + "encoder.layers." + std::to_string(i) + ".";
    for (const char* norm : {"layer_norm1", "layer_norm2"}) {
      add(l + norm + ".weight", {hv});
      add(l + norm + ".bias", {hv});
    }
    add(l + "mlp.fc1.weight", {iv, hv});
    add(l + "mlp.fc1.bias", {iv});
    add(l + "mlp.fc2.weight", {hv, iv});
    add(l + "mlp.fc2.bias", {hv});
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      add(l + "self_attn." + proj + ".weight", {hv, hv});
      add(l + "self_attn." + proj + ".bias", {hv});
    }
  }
  add(p + "post_layernorm.weight", {hv});
  add(p + "post_layernorm.bias", {hv});
  add("multi_modal_projector.mm_input_projection_weight", {hv, c.hidden_size});
  add("multi_modal_projector.mm_soft_emb_norm.weight", {hv});
  return w;
}

}  // namespace

const ArchDef kGemma3 = {"gemma3", ParseMultimodal, DeclareMultimodal,
                         /*runnable=*/false};
const ArchDef kGemma3Text = {"gemma3_text", ParseText, DeclareText,
                             /*runnable=*/true};

}  // namespace loom::arch
