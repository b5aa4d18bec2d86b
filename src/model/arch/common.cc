#include "src/model/arch/common.h"

#include <cmath>

#include "src/core/json_int.h"
#include "src/model/rope.h"

namespace loom::arch {

StatusOr<ActKind> ParseActivation(const ConfigReader& r, const std::string& key,
                                  const std::string& value) {
  if (value == "silu" || value == "swish") return ActKind::kSilu;
  if (value == "gelu_pytorch_tanh" || value == "gelu_new" ||
      value == "gelu_fast" || value == "gelu_python_tanh")
    return ActKind::kGeluTanh;
  if (value == "gelu" || value == "gelu_python") return ActKind::kGeluExact;
  if (value == "relu") return ActKind::kRelu;
  if (value == "relu2") return ActKind::kReluSquared;
  return UnimplementedError(
      r.source() + ": key '" + key + "' = '" + value +
      "' is not a supported activation (silu, gelu, gelu_pytorch_tanh, "
      "gelu_new, relu, relu2)");
}

namespace {

// YaRN as HF 4.55's _compute_yarn_parameters reads it: `factor` is required
// but replaced by max_position_embeddings / original_max_position_embeddings
// when the latter is given; attention_factor defaults to get_mscale (with the
// mscale / mscale_all_dim ratio when both are non-zero); beta_fast / beta_slow
// default to 32 / 1 when absent or 0; truncate defaults to true.
Status ParseYarn(const ConfigReader& s, int64_t max_pos, RopeConfig* rope) {
  rope->type = RopeConfig::Type::kYarn;
  rope->original_max_position_embeddings = max_pos;
  if (s.Has("original_max_position_embeddings")) {
    ASSIGN_OR_RETURN(rope->original_max_position_embeddings,
                     s.Int("original_max_position_embeddings"));
    if (rope->original_max_position_embeddings <= 0)
      return InvalidArgumentError(
          s.source() + ": original_max_position_embeddings = " +
          std::to_string(rope->original_max_position_embeddings) +
          ", expected > 0");
    rope->factor = static_cast<double>(max_pos) /
                   static_cast<double>(rope->original_max_position_embeddings);
  }
  ASSIGN_OR_RETURN(double beta_fast, s.Float("beta_fast", 0.0));
  ASSIGN_OR_RETURN(double beta_slow, s.Float("beta_slow", 0.0));
  rope->beta_fast = beta_fast != 0.0 ? beta_fast : 32.0;
  rope->beta_slow = beta_slow != 0.0 ? beta_slow : 1.0;
  if (!(rope->beta_fast > 0 && rope->beta_slow > 0))
    return InvalidArgumentError(
        s.source() + ": beta_fast = " + std::to_string(rope->beta_fast) +
        ", beta_slow = " + std::to_string(rope->beta_slow) + ", expected > 0");
  ASSIGN_OR_RETURN(rope->truncate, s.Bool("truncate", true));
  double attention_factor = 0.0;
  if (s.Has("attention_factor")) {
    ASSIGN_OR_RETURN(attention_factor, s.Float("attention_factor"));
  } else {
    ASSIGN_OR_RETURN(double mscale, s.Float("mscale", 0.0));
    ASSIGN_OR_RETURN(double mscale_all_dim, s.Float("mscale_all_dim", 0.0));
    attention_factor =
        YarnAttentionFactor(rope->factor, mscale, mscale_all_dim);
  }
  if (!(attention_factor > 0))
    return InvalidArgumentError(s.source() + ": yarn attention_factor = " +
                                std::to_string(attention_factor) +
                                ", expected > 0");
  rope->attention_scaling = static_cast<float>(attention_factor);
  return Status();
}

}  // namespace

Status ParseLayerNorm(const ConfigReader& r, const char* key, ModelConfig* c) {
  c->norm = NormKind::kLayer;
  ASSIGN_OR_RETURN(const double eps, r.Float(key, 1e-5));
  if (!(eps > 0))
    return InvalidArgumentError(r.source() + ": " + key + " = " +
                                std::to_string(eps) + ", expected > 0");
  c->norm_eps = static_cast<float>(eps);
  return Status();
}

Status ParsePartialRotary(const ConfigReader& r, const char* key,
                          double default_factor, ModelConfig* c) {
  ASSIGN_OR_RETURN(const double factor, r.Float(key, default_factor));
  if (!(factor > 0 && factor <= 1))
    return InvalidArgumentError(r.source() + ": " + key + " = " +
                                std::to_string(factor) +
                                ", expected in (0, 1]");
  c->rope.rotary_dim =
      static_cast<int64_t>(static_cast<double>(c->head_dim) * factor);
  if (c->rope.rotary_dim % 2 != 0 || c->rope.rotary_dim == 0)
    return InvalidArgumentError(r.source() + ": rotary dimension " +
                                std::to_string(c->rope.rotary_dim) +
                                " (head_dim " + std::to_string(c->head_dim) +
                                " x " + key + " " + std::to_string(factor) +
                                ") must be even and positive");
  return Status();
}

Status ParseRope(const ConfigReader& r, ModelConfig* c) {
  RopeConfig& rope = c->rope;
  rope.type = RopeConfig::Type::kDefault;
  ASSIGN_OR_RETURN(rope.theta, r.Float("rope_theta", 10000.0));
  RETURN_IF_ERROR(ParsePartialRotary(r, "partial_rotary_factor", 1.0, c));
  ASSIGN_OR_RETURN(std::optional<ConfigReader> scaling,
                   r.Object("rope_scaling"));
  if (!scaling) return Status();
  std::string type;
  if (scaling->Has("rope_type")) {
    ASSIGN_OR_RETURN(type, scaling->String("rope_type"));
  } else {
    ASSIGN_OR_RETURN(type, scaling->String("type", "default"));
  }
  if (type == "default") return Status();
  if (type == "linear" || type == "dynamic" || type == "llama3" ||
      type == "yarn") {
    ASSIGN_OR_RETURN(rope.factor, scaling->Float("factor"));
    if (!(rope.factor > 0))
      return InvalidArgumentError(scaling->source() +
                                  ": factor = " + std::to_string(rope.factor) +
                                  ", expected > 0");
  }
  if (type == "linear") {
    rope.type = RopeConfig::Type::kLinear;
  } else if (type == "dynamic") {
    rope.type = RopeConfig::Type::kDynamic;
    rope.original_max_position_embeddings = c->max_position_embeddings;
  } else if (type == "llama3") {
    rope.type = RopeConfig::Type::kLlama3;
    ASSIGN_OR_RETURN(rope.low_freq_factor, scaling->Float("low_freq_factor"));
    ASSIGN_OR_RETURN(rope.high_freq_factor, scaling->Float("high_freq_factor"));
    ASSIGN_OR_RETURN(rope.original_max_position_embeddings,
                     scaling->Int("original_max_position_embeddings"));
    if (!(rope.high_freq_factor > rope.low_freq_factor))
      return InvalidArgumentError(scaling->source() + ": high_freq_factor " +
                                  std::to_string(rope.high_freq_factor) +
                                  " must exceed low_freq_factor " +
                                  std::to_string(rope.low_freq_factor));
  } else if (type == "yarn") {
    RETURN_IF_ERROR(ParseYarn(*scaling, c->max_position_embeddings, &rope));
  } else {
    return UnimplementedError(
        r.source() + ": rope_scaling type '" + type +
        "' is not supported (default, linear, dynamic, llama3, yarn)");
  }
  return Status();
}

Status ParseUniformSlidingWindow(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(int64_t window, r.Int("sliding_window", 0));
  if (window < 0)
    return InvalidArgumentError(r.source() +
                                ": sliding_window = " + std::to_string(window) +
                                ", expected >= 0 or null");
  c->sliding_window.assign(c->num_layers, window);
  return Status();
}

StatusOr<bool> ParseLayerTypes(const ConfigReader& r, int64_t window,
                               ModelConfig* c) {
  if (!r.Has("layer_types")) return false;
  const nlohmann::json& types = r.json().at("layer_types");
  if (!types.is_array() || static_cast<int64_t>(types.size()) != c->num_layers)
    return InvalidArgumentError(
        r.source() + ": layer_types must be an array of num_hidden_layers = " +
        std::to_string(c->num_layers) + " strings, is " +
        types.dump().substr(0, 80));
  for (int64_t i = 0; i < c->num_layers; ++i) {
    const nlohmann::json& t = types[i];
    if (t == "sliding_attention") {
      c->sliding_window[i] = window;
    } else if (t == "full_attention") {
      c->sliding_window[i] = 0;
    } else {
      return InvalidArgumentError(
          r.source() + ": layer_types[" + std::to_string(i) + "] = " +
          t.dump() + ", expected \"sliding_attention\" or \"full_attention\"");
    }
  }
  return true;
}

namespace {

// A size of config.json in [1, max]: far above any model's (hidden 16k,
// intermediate 53k, 10M positions) and low enough that the products the
// declarations and the plan form (heads x head_dim, vocab x hidden, 4 x
// hidden, ...) stay well inside int64.
Status CheckSize(const std::string& source, const std::string& key, int64_t v) {
  const int64_t max = key == "vocab_size" ? int64_t{1} << 31 : int64_t{1} << 24;
  if (v <= 0 || v > max)
    return InvalidArgumentError(source + ": " + key + " = " +
                                std::to_string(v) + ", expected in [1, " +
                                std::to_string(max) + "]");
  return Status();
}

}  // namespace

Status ValidateDims(const std::string& source, const ModelConfig& c) {
  auto positive = [&](const char* key, int64_t v) {
    return CheckSize(source, key, v);
  };
  RETURN_IF_ERROR(positive("vocab_size", c.vocab_size));
  RETURN_IF_ERROR(positive("hidden_size", c.hidden_size));
  RETURN_IF_ERROR(positive("num_hidden_layers", c.num_layers));
  RETURN_IF_ERROR(positive("num_attention_heads", c.num_heads));
  RETURN_IF_ERROR(positive("num_key_value_heads", c.num_kv_heads));
  RETURN_IF_ERROR(positive("head_dim", c.head_dim));
  RETURN_IF_ERROR(positive("intermediate_size", c.intermediate_size));
  RETURN_IF_ERROR(
      positive("max_position_embeddings", c.max_position_embeddings));
  if (c.num_heads % c.num_kv_heads != 0)
    return InvalidArgumentError(
        source + ": num_attention_heads = " + std::to_string(c.num_heads) +
        " is not a multiple of num_key_value_heads = " +
        std::to_string(c.num_kv_heads));
  return Status();
}

Status ParseDecoderBase(const ConfigReader& r, bool tie_default,
                        ModelConfig* c) {
  ASSIGN_OR_RETURN(c->vocab_size, r.Int("vocab_size"));
  ASSIGN_OR_RETURN(c->hidden_size, r.Int("hidden_size"));
  ASSIGN_OR_RETURN(c->num_layers, r.Int("num_hidden_layers"));
  ASSIGN_OR_RETURN(c->num_heads, r.Int("num_attention_heads"));
  ASSIGN_OR_RETURN(c->num_kv_heads, r.Int("num_key_value_heads", c->num_heads));
  if (c->num_heads <= 0)
    return InvalidArgumentError(
        r.source() + ": num_attention_heads = " + std::to_string(c->num_heads) +
        ", expected > 0");
  ASSIGN_OR_RETURN(c->head_dim,
                   r.Int("head_dim", c->hidden_size / c->num_heads));
  ASSIGN_OR_RETURN(c->intermediate_size, r.Int("intermediate_size"));
  ASSIGN_OR_RETURN(c->max_position_embeddings,
                   r.Int("max_position_embeddings"));
  ASSIGN_OR_RETURN(double eps, r.Float("rms_norm_eps", 1e-6));
  c->norm_eps = static_cast<float>(eps);
  ASSIGN_OR_RETURN(std::string act, r.String("hidden_act", "silu"));
  ASSIGN_OR_RETURN(c->act, ParseActivation(r, "hidden_act", act));
  ASSIGN_OR_RETURN(c->tie_word_embeddings,
                   r.Bool("tie_word_embeddings", tie_default));
  // Optional, and a list in some configs: only an int64 counts.
  if (r.Has("bos_token_id")) {
    if (auto id = JsonInt64(r.json().at("bos_token_id"))) c->bos_token_id = *id;
  }
  if (r.Has("eos_token_id")) {
    if (auto id = JsonInt64(r.json().at("eos_token_id"))) c->eos_token_id = *id;
  }
  ASSIGN_OR_RETURN(std::string dtype, r.String("torch_dtype", "float32"));
  if (auto d = ParseDType(dtype)) c->torch_dtype = *d;
  RETURN_IF_ERROR(ValidateDims(r.source(), *c));
  RETURN_IF_ERROR(ParseRope(r, c));
  c->sliding_window.assign(c->num_layers, 0);
  c->attn_scale = 1.0f / std::sqrt(static_cast<float>(c->head_dim));
  return Status();
}

void AddSpec(std::vector<WeightSpec>* specs, std::string name, WeightRole role,
             int64_t layer, Shape shape) {
  WeightSpec s;
  s.name = std::move(name);
  s.role = role;
  s.layer = layer;
  s.shape = std::move(shape);
  specs->push_back(std::move(s));
}

Status ParseSizes(const ConfigReader& r, const SizeKeys& keys, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->vocab_size, r.Int("vocab_size"));
  ASSIGN_OR_RETURN(c->hidden_size, r.Int(keys.hidden));
  ASSIGN_OR_RETURN(c->num_layers, r.Int(keys.layers));
  ASSIGN_OR_RETURN(c->num_heads, r.Int(keys.heads));
  // Checked before the architecture multiplies them (4 x hidden, ...).
  RETURN_IF_ERROR(CheckSize(r.source(), "vocab_size", c->vocab_size));
  RETURN_IF_ERROR(CheckSize(r.source(), keys.hidden, c->hidden_size));
  RETURN_IF_ERROR(CheckSize(r.source(), keys.layers, c->num_layers));
  RETURN_IF_ERROR(CheckSize(r.source(), keys.heads, c->num_heads));
  if (c->num_heads <= 0 || c->hidden_size % c->num_heads != 0)
    return InvalidArgumentError(r.source() + ": " + keys.hidden + " = " +
                                std::to_string(c->hidden_size) +
                                " is not a multiple of " + keys.heads + " = " +
                                std::to_string(c->num_heads));
  c->num_kv_heads = c->num_heads;
  c->head_dim = c->hidden_size / c->num_heads;
  return Status();
}

Status ParseGptNormAndMlp(const ConfigReader& r, const char* act_default,
                          ModelConfig* c) {
  ASSIGN_OR_RETURN(const double eps, r.Float("layer_norm_epsilon", 1e-5));
  c->norm_eps = static_cast<float>(eps);
  c->norm = NormKind::kLayer;
  ASSIGN_OR_RETURN(const std::string act,
                   r.String("activation_function", act_default));
  ASSIGN_OR_RETURN(c->act, ParseActivation(r, "activation_function", act));
  c->mlp = MlpKind::kPlain;
  return Status();
}

Status FinishParse(const ConfigReader& r, ModelConfig* c) {
  if (c->sliding_window.empty()) c->sliding_window.assign(c->num_layers, 0);
  ASSIGN_OR_RETURN(c->bos_token_id, r.Int("bos_token_id", -1));
  ASSIGN_OR_RETURN(c->eos_token_id, r.Int("eos_token_id", -1));
  ASSIGN_OR_RETURN(std::string dtype, r.String("torch_dtype", "float32"));
  if (auto d = ParseDType(dtype)) c->torch_dtype = *d;
  return ValidateDims(r.source(), *c);
}

void SpecList::Add(std::string name, WeightRole role, int64_t layer,
                   Shape shape, bool linear) {
  AddSpec(&w_->specs, std::move(name), role, layer, std::move(shape));
  w_->specs.back().linear = linear;
}

void SpecList::AddLayerNorm(const std::string& name, WeightRole weight,
                            WeightRole bias, int64_t layer, int64_t dim) {
  Add(name + ".weight", weight, layer, {dim});
  Add(name + ".bias", bias, layer, {dim});
}

void SpecList::AddPlainMlp(const std::string& up, const std::string& down,
                           int64_t layer, int64_t H, int64_t I, bool bias) {
  Add(up + ".weight", WeightRole::kUp, layer, {I, H}, /*linear=*/true);
  if (bias) Add(up + ".bias", WeightRole::kUpBias, layer, {I});
  Add(down + ".weight", WeightRole::kDown, layer, {H, I}, /*linear=*/true);
  if (bias) Add(down + ".bias", WeightRole::kDownBias, layer, {H});
}

void SpecList::AddLmHead(const ModelConfig& c, const std::string& embed) {
  Add("lm_head.weight", WeightRole::kLmHead, -1, {c.vocab_size, c.hidden_size},
      /*linear=*/true);
  if (!c.tie_word_embeddings) return;
  w_->specs.back().required = false;
  w_->specs.back().tied_to = embed;
}

ArchWeights DeclareDecoderWeights(const ModelConfig& c, const DecoderNames& n) {
  ArchWeights w;
  auto add = [&](std::string name, WeightRole role, int64_t layer,
                 Shape shape) {
    static constexpr WeightRole kLinear[] = {
        WeightRole::kQ,     WeightRole::kK,      WeightRole::kV,
        WeightRole::kQkv,   WeightRole::kO,      WeightRole::kGate,
        WeightRole::kUp,    WeightRole::kGateUp, WeightRole::kDown,
        WeightRole::kLmHead};
    AddSpec(&w.specs, std::move(name), role, layer, std::move(shape));
    for (WeightRole r : kLinear) w.specs.back().linear |= r == role;
  };
  const int64_t H = c.hidden_size, I = c.intermediate_size, Q = c.q_dim(),
                KV = c.kv_dim();
  // A norm's weight [H], and its bias [H] when it is a LayerNorm.
  auto add_norm = [&](const std::string& name, WeightRole role,
                      WeightRole bias_role, int64_t layer) {
    add(name + ".weight", role, layer, {H});
    if (c.norm == NormKind::kLayer && c.norm_bias)
      add(name + ".bias", bias_role, layer, {H});
  };
  add("model.embed_tokens.weight", WeightRole::kEmbed, -1, {c.vocab_size, H});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    if (!n.attn_norm.empty())
      add_norm(p + n.attn_norm, WeightRole::kAttnNorm,
               WeightRole::kAttnNormBias, i);
    if (c.fused_qkv) {
      add(p + "self_attn.qkv_proj.weight", WeightRole::kQkv, i,
          {Q + 2 * KV, H});
    } else {
      add(p + "self_attn.q_proj.weight", WeightRole::kQ, i, {Q, H});
      add(p + "self_attn.k_proj.weight", WeightRole::kK, i, {KV, H});
      add(p + "self_attn.v_proj.weight", WeightRole::kV, i, {KV, H});
    }
    if (c.qkv_bias) {
      add(p + "self_attn.q_proj.bias", WeightRole::kQBias, i, {Q});
      add(p + "self_attn.k_proj.bias", WeightRole::kKBias, i, {KV});
      add(p + "self_attn.v_proj.bias", WeightRole::kVBias, i, {KV});
    }
    add(p + "self_attn.o_proj.weight", WeightRole::kO, i, {H, Q});
    if (c.o_bias) add(p + "self_attn.o_proj.bias", WeightRole::kOBias, i, {H});
    if (c.qk_norm == QkNormKind::kPerHead) {
      add(p + "self_attn.q_norm.weight", WeightRole::kQNorm, i, {c.head_dim});
      add(p + "self_attn.k_norm.weight", WeightRole::kKNorm, i, {c.head_dim});
    } else if (c.qk_norm == QkNormKind::kPerHeadOwn) {
      // One [heads, head_dim] tensor (Cohere); StableLM declares its own.
      add(p + "self_attn.q_norm.weight", WeightRole::kQNorm, i,
          {c.num_heads, c.head_dim});
      add(p + "self_attn.k_norm.weight", WeightRole::kKNorm, i,
          {c.num_kv_heads, c.head_dim});
    } else if (c.qk_norm == QkNormKind::kFull) {
      add(p + "self_attn.q_norm.weight", WeightRole::kQNorm, i, {Q});
      add(p + "self_attn.k_norm.weight", WeightRole::kKNorm, i, {KV});
    }
    if (!n.post_attn_norm.empty())
      add(p + n.post_attn_norm + ".weight", WeightRole::kPostAttnNorm, i, {H});
    if (!n.mlp_norm.empty())
      add_norm(p + n.mlp_norm, WeightRole::kMlpNorm, WeightRole::kMlpNormBias,
               i);
    const std::string up = p + "mlp." + n.up, down = p + "mlp." + n.down;
    if (c.mlp == MlpKind::kGatedFused) {
      add(p + "mlp.gate_up_proj.weight", WeightRole::kGateUp, i, {2 * I, H});
    } else if (c.mlp != MlpKind::kPlain) {
      add(p + "mlp.gate_proj.weight", WeightRole::kGate, i, {I, H});
    }
    if (c.mlp != MlpKind::kGatedFused)
      add(up + ".weight", WeightRole::kUp, i, {I, H});
    add(down + ".weight", WeightRole::kDown, i, {H, I});
    if (c.mlp_bias) {
      if (c.mlp != MlpKind::kPlain)
        add(p + "mlp.gate_proj.bias", WeightRole::kGateBias, i, {I});
      add(up + ".bias", WeightRole::kUpBias, i, {I});
      add(down + ".bias", WeightRole::kDownBias, i, {H});
    }
    if (!n.post_mlp_norm.empty())
      add(p + n.post_mlp_norm + ".weight", WeightRole::kPostMlpNorm, i, {H});
  }
  if (c.norm != NormKind::kLayerNoAffine)
    add_norm("model.norm", WeightRole::kFinalNorm, WeightRole::kFinalNormBias,
             -1);
  add("lm_head.weight", WeightRole::kLmHead, -1, {c.vocab_size, H});
  if (c.tie_word_embeddings) {
    w.specs.back().required = false;
    w.specs.back().tied_to = "model.embed_tokens.weight";
  }
  w.ignored_suffixes = {"rotary_emb.inv_freq"};
  return w;
}

}  // namespace loom::arch
