// Shared building blocks for architecture files: parsing the fields most
// decoder configs share, and declaring the Llama-style weight layout with
// per-architecture names for the norms.
#ifndef LOOM_MODEL_ARCH_COMMON_H_
#define LOOM_MODEL_ARCH_COMMON_H_

#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/model/config.h"
#include "src/model/config_reader.h"
#include "src/model/weights.h"

namespace loom::arch {

// Parses vocab_size, hidden_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads, head_dim, intermediate_size, max_position_embeddings,
// rms_norm_eps, hidden_act, tie_word_embeddings (default `tie_default`),
// bos/eos ids, torch_dtype and RoPE (rope_theta, rope_scaling,
// partial_rotary_factor); sets global attention on every layer.
Status ParseDecoderBase(const ConfigReader& r, bool tie_default,
                        ModelConfig* c);

// Parses rope_theta / rope_scaling / partial_rotary_factor into c->rope.
Status ParseRope(const ConfigReader& r, ModelConfig* c);

// "silu", "gelu_pytorch_tanh", ... -> ActKind.
StatusOr<ActKind> ParseActivation(const ConfigReader& r, const std::string& key,
                                  const std::string& value);

// sliding_window (null/absent = none) on every layer (Mistral, Phi-3).
Status ParseUniformSlidingWindow(const ConfigReader& r, ModelConfig* c);

// layer_types (gpt-oss, Gemma 3): `window` on the layers marked
// "sliding_attention", global on "full_attention"; anything else, or a list
// whose length is not num_hidden_layers, is an error. False when absent.
StatusOr<bool> ParseLayerTypes(const ConfigReader& r, int64_t window,
                               ModelConfig* c);

// Checks dimensions are positive and consistent (heads divisible by kv heads).
Status ValidateDims(const std::string& source, const ModelConfig& c);

// Names of the norm tensors inside a layer ("" = absent in this architecture).
struct DecoderNames {
  std::string attn_norm = "input_layernorm";
  std::string post_attn_norm;
  std::string mlp_norm = "post_attention_layernorm";
  std::string post_mlp_norm;
  // The MLP's up and down projections inside "mlp." (a plain MLP's fc and
  // proj: Starcoder2's c_fc / c_proj).
  std::string up = "up_proj";
  std::string down = "down_proj";
};

// Biases, fused projections, q/k norms and the MLP kind (gated, fused gated
// or plain) follow the config's flags; LayerNorms (NormKind::kLayer) have a
// bias beside every pre-norm and the final norm's weight.
// Declares model.embed_tokens, model.layers.{i}.{norms, self_attn.*, mlp.*},
// model.norm and lm_head (tied to the embedding when c.tie_word_embeddings).
// Projections (q/k/v/o, gate/up/down, lm_head) are marked Linear (quantizable).
ArchWeights DeclareDecoderWeights(const ModelConfig& c,
                                  const DecoderNames& names);

// Appends one logical weight (model-level when layer = -1) to a declaration.
void AddSpec(std::vector<WeightSpec>* specs, std::string name, WeightRole role,
             int64_t layer, Shape shape);

// Family helpers, defined in the family's first file.
// Qwen2/Qwen3 (qwen2.cc): with use_sliding_window, the window applies to
// layers >= max_window_layers.
Status ParseQwenSlidingWindow(const ConfigReader& r, ModelConfig* c);
// Qwen3 attention (qwen3.cc): attention_bias (q/k/v/o), per-head q/k RMSNorm,
// the Qwen sliding window.
Status ParseQwen3Attention(const ConfigReader& r, ModelConfig* c);
// Gemma (gemma.cc): what every Gemma generation shares (gelu, (1 + w) norms,
// embeddings scaled by sqrt(hidden_size), tied head).
Status ParseGemmaCommon(const ConfigReader& r, ModelConfig* c);
// Gemma 2/3 (gemma2.cc): query_pre_attn_scalar -> attn_scale.
Status ParseQueryPreAttnScalar(const ConfigReader& r, ModelConfig* c);
// Gemma 2/3 (gemma2.cc): pre/post attention and feed-forward norm names.
DecoderNames Gemma2Names();

}  // namespace loom::arch

#endif  // LOOM_MODEL_ARCH_COMMON_H_
