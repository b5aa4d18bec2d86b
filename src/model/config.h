// ModelConfig: everything the engine needs to know about an architecture
// instance, normalised from HF's config.json by the architecture's file
// (src/model/arch/<arch>.cc). Field names follow HF's keys where one exists.
#ifndef LOOM_MODEL_CONFIG_H_
#define LOOM_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "src/core/dtype.h"
#include "src/core/format.h"

namespace loom {

enum class NormKind {
  kRms,            // x * rsqrt(mean(x^2) + eps) * (w + norm_offset)
  kLayer,          // LayerNorm with weight and bias
  kLayerNoAffine,  // LayerNorm without parameters (OLMo)
};

// kReluSquared: relu(x)^2 (HF's relu2: Nemotron, Persimmon).
enum class ActKind { kSilu, kGeluTanh, kGeluExact, kRelu, kReluSquared };

enum class MlpKind {
  kGated,       // down(act(gate(x)) * up(x)), separate gate/up weights
  kGatedFused,  // same with one [2I, H] gate_up weight (gate rows first)
  kPlain,       // proj(act(fc(x)))  (GPT-2)
  kMoE,         // mixture of experts (MoEConfig; dense layers per LayerConfig)
};

// How a layer's attention and MLP branches meet the residual stream x.
enum class BlockKind : uint8_t {
  kSequential,  // x += attn(ln1(x)); x += mlp(ln2(x))
  // x += attn(ln1(x)) + mlp(ln2(x)): both norms read the same x, the branch
  // sum is added once (GPT-NeoX use_parallel_residual).
  kParallel,
  // x += attn(ln1(x)) + mlp(ln1(x)): one norm feeds both branches (Phi).
  kParallelSharedNorm,
};

// Column order of a fused q/k/v projection's output.
enum class QkvLayout : uint8_t {
  kConcat,  // [all q | all k | all v] (Phi-3, GPT-2)
  // Per head [q_h | k_h | v_h] (GPT-NeoX query_key_value, heads = kv heads):
  // regrouped to [all q | all k | all v] right after the GEMM.
  kPerHead,
  // CodeGen's qkv_proj (mp_num = qkv_groups): the output is qkv_groups
  // chunks, each [q | v | k] blocks of q_dim / qkv_groups columns (chunk c
  // holds heads c * heads / qkv_groups ...); regrouped to [all q | all k |
  // all v] right after the GEMM.
  kGroupedQvk,
  // Falcon's new decoder architecture: per kv group g, the group's q heads
  // then k_g then v_g (heads / kv_heads + 2 blocks of head_dim); regrouped
  // to [all q | all k | all v] right after the GEMM.
  kPerKvGroup,
};

// Where q and k are normalised before RoPE (the norm is
// ModelConfig::qk_norm_type: RMSNorm, or LayerNorm with an optional bias).
enum class QkNormKind {
  kNone,
  // Over head_dim, one weight [head_dim] shared by the heads (Qwen3's
  // RMSNorm; Persimmon's LayerNorm with bias).
  kPerHead,
  // Over head_dim, each head its own weight [head_dim]: StableLM's
  // q_layernorm.norms.h (a LayerNorm without bias per head), bound per head
  // as WeightSpec::expert = h, or Cohere's q_norm [heads, head_dim] (one
  // tensor, row h for head h).
  kPerHeadOwn,
  kFull,  // RMSNorm over the whole projection, weight [heads*head_dim] (OLMo2)
};

// Rotary embedding parameters, after rope_scaling is applied.
struct RopeConfig {
  enum class Type { kNone, kDefault, kLinear, kDynamic, kLlama3, kYarn };
  Type type = Type::kNone;
  double theta = 10000.0;
  int64_t rotary_dim = 0;  // <= head_dim; partial rotary if smaller
  // kYarn: max_position_embeddings / original_max_position_embeddings when
  // the latter is given (HF overrides rope_scaling.factor with it).
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
  // kYarn: the ramp between the correction dims of beta_fast and beta_slow
  // rotations; truncate floors/ceils them (HF's default true).
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  // Multiplies cos and sin (YaRN's attention_factor; 1 otherwise).
  float attention_scaling = 1.0f;
  // DeepSeek's rope_interleave: adjacent pairs (x[2i], x[2i+1]) rotate with
  // frequency i. Like HF, the rotated part is first de-interleaved (even
  // then odd elements) and then rotated half-split, so it stays in that
  // order in q and k.
  bool interleaved = false;
  // GPT-J / CodeGen (rotate_every_two): the adjacent pairs (x[2i], x[2i+1])
  // of the rotated part rotate in place by frequency i, so q and k keep
  // their order (Backend::ApplyRopePairs).
  bool rotate_pairs = false;
};

// How a layer's attention computes its queries, keys and values.
enum class AttentionKind : uint8_t {
  // q/k/v projections of head_dim per head (kv heads shared by GQA groups).
  kStandard,
  // DeepSeek's multi-head latent attention (MlaConfig): low-rank q and a
  // compressed kv latent; per head q and k = [nope | rope] of qk_head_dim,
  // v of v_head_dim, the rope key one head shared by all heads.
  kMla,
};

// Multi-head latent attention's dimensions (config.json's keys).
struct MlaConfig {
  int64_t q_lora_rank = 0;  // 0 (null): a plain q_proj [heads qk, H]
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// How a router turns logits [T, E] into k (expert, weight) pairs per token.
enum class RouterKind : uint8_t {
  // softmax over all E experts, then the top k probabilities (renormalised
  // to sum 1 when MoEConfig::norm_topk_prob): Mixtral, Qwen-MoE.
  kSoftmaxTopK,
  // the top k logits, then softmax over those k only: gpt-oss.
  kTopKSoftmax,
  // DeepSeek-V3: s = sigmoid(logits), choice c = s + correction bias; the
  // experts split into n_group groups scored by the sum of their top-2 c;
  // the best topk_group groups are kept (the others' c set to 0.0, not
  // -inf); the top k by c; weights = their unbiased s (divided by their sum
  // + 1e-20 when norm_topk_prob) times routed_scaling_factor.
  kSigmoidGroupTopK,
};

// An expert's activation between its gate/up and down projections.
enum class ExpertActKind : uint8_t {
  // act(gate) * up with separate gate and up projections (Mixtral w1/w3,
  // Qwen gate_proj/up_proj), `ModelConfig::act`.
  kGated,
  // gpt-oss: one gate_up projection whose columns interleave gate (even) and
  // up (odd); gate = min(gate, limit), up = clamp(up, -limit, limit),
  // out = (up + 1) * gate * sigmoid(alpha * gate).
  kClampedSwigluInterleaved,
};

// Parsed once by src/model/arch/moe.cc (ParseMoe).
struct MoEConfig {
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  int64_t expert_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;  // 0 = none
  bool shared_expert_gate = false;  // sigmoid gate on the shared expert
  bool norm_topk_prob = false;
  bool router_bias = false;
  RouterKind router = RouterKind::kSoftmaxTopK;
  // kSigmoidGroupTopK: mlp.gate.e_score_correction_bias [E] is declared
  // (added to the choice values only), the experts form n_group groups of
  // which topk_group are kept, and the weights are scaled by
  // routed_scaling_factor (1 for the other kinds).
  bool router_correction_bias = false;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  float routed_scaling_factor = 1.0f;
  ExpertActKind expert_act = ExpertActKind::kGated;
  // kClampedSwigluInterleaved: alpha and limit (HF 4.55 hard-codes 1.702 and
  // 7.0 in the eager experts; config.swiglu_limit is 7.0 in every release).
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
  bool expert_bias = false;  // gate_up / down biases per expert (gpt-oss)
  // kGated experts stored packed, as transformers 5 writes Mixtral, Qwen-MoE
  // and OLMoE: mlp.experts.gate_up_proj [E, 2 Ie, H] (each expert's gate rows,
  // then its up rows) and mlp.experts.down_proj [E, H, Ie] under "mlp."
  // (Mixtral's block_sparse_moe renamed), instead of one tensor per expert
  // and projection. Set from the checkpoint's tensor names (DetectPackedExperts
  // in src/model/arch/moe.h).
  bool packed_experts = false;
  // Qwen-MoE: layer l is sparse when l is not in mlp_only_layers and
  // (l + 1) % decoder_sparse_step == 0; the others have a dense MLP of
  // intermediate_size.
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;

  bool IsSparseLayer(int64_t layer) const;
};

// The checkpoint's quantization scheme, from config.json's
// quantization_config or hf_quant_config.json (src/model/quant.h).
struct QuantConfig {
  std::string method;   // quant_method / quant_algo as written; "" = none
  std::string source;   // the file and key it came from
  WeightFormat format;  // what Linear weights are stored as (kDense = none)
  // Modules kept unquantized: exact names or prefixes at a '.', with '*'
  // matching any run of characters; "re:" introduces a regular expression.
  std::vector<std::string> excluded;
  // ModelOpt FP8 KV cache: k_proj.k_scale / v_proj.v_scale F32 [] stored.
  bool kv_cache_scales = false;

  bool quantized() const { return format.quantized(); }
  // True when `module` ("model.layers.0.mlp.gate") is kept unquantized.
  bool Excludes(const std::string& module) const;
};

// A vision tower bundled with a language model (Gemma 3's SigLIP): declared
// for planning; not run.
struct VisionConfig {
  int64_t hidden_size = 0;  // 0 = no vision tower
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t patch_size = 0;
  int64_t image_size = 0;
  int64_t num_channels = 3;
};

struct ModelConfig {
  std::string model_type;
  std::string architecture;  // config.json architectures[0], if present
  DType torch_dtype = DType::kF32;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  int64_t max_position_embeddings = 0;

  NormKind norm = NormKind::kRms;
  bool norm_bias = true;  // kLayer: a bias beside each gain (Cohere: none)
  float norm_eps = 1e-5f;
  // The gain is (w + norm_offset): 1 for Gemma's RMSNorm (1 + w) and
  // Nemotron's LayerNorm1P.
  float norm_offset = 0.0f;
  ActKind act = ActKind::kSilu;
  MlpKind mlp = MlpKind::kGated;
  QkNormKind qk_norm = QkNormKind::kNone;
  NormKind qk_norm_type = NormKind::kRms;  // kRms or kLayer
  bool qk_norm_bias = false;               // kLayer: a bias beside the gain
  AttentionKind attention = AttentionKind::kStandard;
  MlaConfig mla;  // kMla only

  bool tie_word_embeddings = false;
  bool learned_positions = false;  // GPT-2 wpe
  // ALiBi (BLOOM): no rotary; every head's scores get slope_h * key position
  // (AlibiSlopes in src/model/rope.h).
  bool alibi = false;
  // A norm of the token embeddings before the first layer (BLOOM's
  // word_embeddings_layernorm, of the model's norm kind): weight roles
  // kEmbedNorm / kEmbedNormBias.
  bool embed_norm = false;
  // Learned positions: position p reads row p + position_offset of the
  // table (OPT's 2; the table holds max_position_embeddings + offset rows).
  int64_t position_offset = 0;
  // Multiplies the token embeddings: Gemma sqrt(hidden_size), Granite
  // embedding_multiplier.
  float embedding_scale = 1.0f;
  // Granite: every residual add is x + residual_multiplier * sublayer(x).
  float residual_multiplier = 1.0f;
  // Granite: logits = lm_head(norm(x)) / logits_scaling.
  float logits_scaling = 1.0f;
  RopeConfig rope;
  // Type kNone, or the rotary embedding of the layers with a sliding window
  // when they rotate with their own base (Gemma 3's rope_local_base_freq,
  // never scaled); those layers read the second of the forward's two RoPE
  // tables (LayerConfig::rope_table).
  RopeConfig rope_local;

  bool qkv_bias = false;   // q/k/v projection biases
  bool o_bias = false;     // output projection bias
  bool mlp_bias = false;   // gate/up/down biases
  bool fused_qkv = false;  // one [q; k; v] projection (Phi-3, GPT-2)
  QkvLayout qkv_layout = QkvLayout::kConcat;  // of the fused projection
  int64_t qkv_groups = 0;  // kGroupedQvk: the chunks (CodeGen's mp_num)
  BlockKind block = BlockKind::kSequential;

  bool pre_attn_norm = true;    // input_layernorm / ln_1 (absent in OLMo2)
  bool post_attn_norm = false;  // Gemma2 / OLMo2
  bool pre_mlp_norm =
      true;  // post_attention_layernorm / pre_feedforward / ln_2
  bool post_mlp_norm = false;  // Gemma2 / OLMo2

  float attn_scale = 0.0f;  // multiplier of q.k; default 1/sqrt(head_dim)
  bool attn_scale_by_inverse_layer = false;  // GPT-2 option: also / (layer + 1)
  float attn_softcap = 0.0f;                 // 0 = none
  float final_softcap = 0.0f;                // 0 = none
  float clip_qkv = 0.0f;                     // 0 = none (OLMo)
  std::vector<int64_t> sliding_window;       // per layer; 0 = global

  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;

  MoEConfig moe;
  QuantConfig quant;
  VisionConfig vision;
  // Prefix of the language model's tensor names inside a multimodal
  // checkpoint ("language_model."); empty for text-only checkpoints.
  std::string text_prefix;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // v (and z) head width: MLA's v_head_dim, else head_dim.
  int64_t v_head_dim() const {
    return attention == AttentionKind::kMla ? mla.v_head_dim : head_dim;
  }
  int64_t kv_v_dim() const { return num_kv_heads * v_head_dim(); }  // v row
  // The RoPE tables a forward computes (cos / sin [tables, T, rotary/2]):
  // 2 when rope_local is set, else 1.
  int64_t rope_tables() const {
    return rope_local.type == RopeConfig::Type::kNone ? 1 : 2;
  }
};

}  // namespace loom

#endif  // LOOM_MODEL_CONFIG_H_
