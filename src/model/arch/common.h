// Shared building blocks for architecture files: parsing the fields most
// decoder configs share, and declaring the Llama-style weight layout with
// per-architecture names for the norms.
#ifndef LOOM_MODEL_ARCH_COMMON_H_
#define LOOM_MODEL_ARCH_COMMON_H_

#include <string>

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

// Checks dimensions are positive and consistent (heads divisible by kv heads).
Status ValidateDims(const std::string& source, const ModelConfig& c);

// Names of the norm tensors inside a layer ("" = absent in this architecture).
struct DecoderNames {
  std::string attn_norm = "input_layernorm";
  std::string post_attn_norm;
  std::string mlp_norm = "post_attention_layernorm";
  std::string post_mlp_norm;
};

// Biases, fused projections and q/k norms follow the config's flags.
// Declares model.embed_tokens, model.layers.{i}.{norms, self_attn.*, mlp.*},
// model.norm and lm_head (tied to the embedding when c.tie_word_embeddings).
ArchWeights DeclareDecoderWeights(const ModelConfig& c,
                                  const DecoderNames& names);

}  // namespace loom::arch

#endif  // LOOM_MODEL_ARCH_COMMON_H_
