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

// NormKind::kLayer with epsilon config.json's `key` (default 1e-5, > 0).
Status ParseLayerNorm(const ConfigReader& r, const char* key, ModelConfig* c);

// Partial rotary: c->rope.rotary_dim = int(head_dim * factor), the factor
// from `key` (default `default_factor`, in (0, 1]); the result must be even
// and positive.
Status ParsePartialRotary(const ConfigReader& r, const char* key,
                          double default_factor, ModelConfig* c);

// Checks dimensions are positive and consistent (heads divisible by kv heads).
Status ValidateDims(const std::string& source, const ModelConfig& c);

// GPT-style configs (GPT-J, GPT-Neo, CodeGen, GPTBigCode, OPT, Falcon) name
// their sizes their own way: vocab, hidden, layers and heads under `keys`;
// hidden must be a multiple of heads (head_dim = hidden / heads, kv heads =
// heads until the architecture says otherwise).
struct SizeKeys {
  const char* hidden;
  const char* layers;
  const char* heads;
};
Status ParseSizes(const ConfigReader& r, const SizeKeys& keys, ModelConfig* c);

// The GPT-2 family's LayerNorm (layer_norm_epsilon, default 1e-5, with
// bias) and plain MLP (activation_function, default `act_default`).
Status ParseGptNormAndMlp(const ConfigReader& r, const char* act_default,
                          ModelConfig* c);

// What every GPT-style Parse ends with: bos/eos ids, torch_dtype, global
// attention on every layer unless c->sliding_window is set, ValidateDims.
Status FinishParse(const ConfigReader& r, ModelConfig* c);

// Appends the specs of a declaration.
class SpecList {
 public:
  explicit SpecList(ArchWeights* w) : w_(w) {}
  // `linear`: a projection (quantizable, WeightSpec::linear).
  void Add(std::string name, WeightRole role, int64_t layer, Shape shape,
           bool linear = false);
  // `name`.weight and `name`.bias [dim] of a LayerNorm.
  void AddLayerNorm(const std::string& name, WeightRole weight, WeightRole bias,
                    int64_t layer, int64_t dim);
  // A plain MLP's `up`.weight [I, H] and `down`.weight [H, I] (Linear), and
  // their biases [I] / [H] when `bias`.
  void AddPlainMlp(const std::string& up, const std::string& down,
                   int64_t layer, int64_t H, int64_t I, bool bias);
  // lm_head.weight [vocab, hidden], tied to `embed` (optional in the
  // checkpoint) when c.tie_word_embeddings.
  void AddLmHead(const ModelConfig& c, const std::string& embed);

 private:
  ArchWeights* w_;
};

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
// GPT-J / CodeGen (gptj.cc): the block (one shared LayerNorm, parallel,
// interleaved rotary on min(rotary_dim, rotary_cap > 0 ? rotary_cap : any)
// dims, gelu_new fc_in/fc_out, lm_head bias), and its weights (one fused
// qkv_proj when c.fused_qkv, else q/k/v_proj).
Status ParseGptjBlock(const ConfigReader& r, int64_t rotary_cap,
                      ModelConfig* c);
ArchWeights DeclareGptjWeights(const ModelConfig& c);
// Granite (granite.cc): attention_bias and the embedding, residual,
// attention and logits multipliers (GraniteMoE shares them).
Status ParseGraniteMultipliers(const ConfigReader& r, ModelConfig* c);
// Gemma 2/3 (gemma2.cc): query_pre_attn_scalar -> attn_scale.
Status ParseQueryPreAttnScalar(const ConfigReader& r, ModelConfig* c);
// Gemma 2/3 (gemma2.cc): pre/post attention and feed-forward norm names.
DecoderNames Gemma2Names();

}  // namespace loom::arch

#endif  // LOOM_MODEL_ARCH_COMMON_H_
