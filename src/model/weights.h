// Weight declarations. Each architecture declares its LOGICAL weights once
// (HF name, role, layer, expert, shape, layout, required/optional/tied, and
// whether it is a Linear weight a quantization scheme may store in another
// format). The one checkpoint matcher (src/model/match.h) resolves each
// weight's storage format (src/core/format.h), expands it to its physical
// tensors (values, scales, global scales) and matches them; the same result
// drives loading, `loom inspect` and the planner's weight bytes.
#ifndef LOOM_MODEL_WEIGHTS_H_
#define LOOM_MODEL_WEIGHTS_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/dtype.h"
#include "src/core/format.h"
#include "src/core/tensor.h"

namespace loom {

enum class WeightRole : uint8_t {
  // Model-level.
  kEmbed,
  kPosEmbed,
  kFinalNorm,
  kFinalNormBias,
  kEmbedNorm,  // a norm of the embeddings (BLOOM's word_embeddings_layernorm)
  kEmbedNormBias,
  kLmHead,
  kLmHeadBias,  // Phi
  // Per layer.
  kAttnNorm,
  kAttnNormBias,
  kQ,
  kK,
  kV,
  kQkv,  // fused [q; k; v] rows
  kQBias,
  kKBias,
  kVBias,
  kQkvBias,
  kO,
  kOBias,
  kQNorm,
  kKNorm,
  kQNormBias,  // LayerNorm q/k norms with a bias (Persimmon)
  kKNormBias,
  kPostAttnNorm,
  kMlpNorm,
  kMlpNormBias,
  kGate,
  kUp,
  kGateUp,  // fused [gate; up] rows
  kDown,
  kGateBias,
  kUpBias,
  kDownBias,
  kPostMlpNorm,
  kAttnSinks,  // per-head sink logit (gpt-oss)
  // Mixture of experts. Expert weights
  // carry WeightSpec::expert.
  kRouter,
  kRouterBias,
  // DeepSeek-V3's e_score_correction_bias [E]: added to the routing choice
  // values only (RouterKind::kSigmoidGroupTopK).
  kRouterCorrectionBias,
  kExpertGate,
  kExpertUp,
  kExpertDown,
  kExpertGateUp,  // fused gate/up rows (gpt-oss: interleaved)
  kExpertGateUpBias,
  kExpertDownBias,
  kSharedExpertGateProj,  // the shared expert's gate/up/down projections
  kSharedExpertUp,
  kSharedExpertDown,
  kSharedExpertGate,  // the shared expert's sigmoid gate [1, H] (Qwen2-MoE)
  // Multi-head latent attention (DeepSeek-V3, AttentionKind::kMla).
  kQA,       // q_a_proj [q_lora, H]
  kQANorm,   // q_a_layernorm [q_lora] (RMSNorm)
  kQB,       // q_b_proj [heads (nope + rope), q_lora]
  kKvA,      // kv_a_proj_with_mqa [kv_lora + rope, H]
  kKvANorm,  // kv_a_layernorm [kv_lora] (RMSNorm)
  kKvB,      // kv_b_proj [heads (nope + v), kv_lora]
  kOther,
};
inline constexpr int kNumWeightRoles = static_cast<int>(WeightRole::kOther) + 1;

// "q", "expert_gate_up", ... (for messages and `loom inspect`).
std::string_view WeightRoleName(WeightRole role);

// A model-level weight of the embedding side (the device running layer 0:
// the token and position embeddings and the embedding norm); every other
// model-level weight belongs to the head side.
inline bool IsEmbeddingSide(WeightRole r) {
  return r == WeightRole::kEmbed || r == WeightRole::kPosEmbed ||
         r == WeightRole::kEmbedNorm || r == WeightRole::kEmbedNormBias;
}

// WeightSpec::expert values besides an expert index.
inline constexpr int64_t kNoExpert = -1;
inline constexpr int64_t kAllExperts = -2;  // one stacked [E, ...] tensor

// Storage layout of a matrix: torch Linear's [out, in], or GPT-2 Conv1D's [in,
// out]; or an [out, in] matrix a backend repacked for its kernels
// (BoundWeights::Repack), every 16 rows over their own byte range, so a
// slice of rows at a multiple of 16 is still a slice: kStrips (the CPU's
// bf16 GEMMs at the avx512bf16 and amx levels: in / 2 pairs of 16) or
// kPanels (its fma GEMMs: [in][16]).
enum class MatrixLayout : uint8_t { kOutIn, kInOut, kStrips, kPanels };
// [out, in] (kOutIn or repacked): n = rows, k = columns.
inline bool IsOutIn(MatrixLayout l) { return l != MatrixLayout::kInOut; }

// One logical weight.
struct WeightSpec {
  // HF name of the weight as a dense tensor ("...q_proj.weight", gpt-oss's
  // "...experts.gate_up_proj"); a quantized format derives its tensors' names
  // from it (src/core/format.h).
  std::string name;
  WeightRole role = WeightRole::kOther;
  int64_t layer = -1;  // -1 = model-level
  // Expert index, or kAllExperts (stacked); a head's index for weights
  // held per head (QkNormKind::kPerHeadOwn).
  int64_t expert = kNoExpert;
  Shape shape;  // dense stored shape (in `layout`)
  MatrixLayout layout = MatrixLayout::kOutIn;
  bool required = true;
  // If set and `name` is absent from the checkpoint, this tensor is used
  // instead (tied lm_head -> embed_tokens). Counted once.
  std::string tied_to;
  // A Linear weight: the model's quantization scheme (ModelConfig::quant)
  // stores it in its format unless the scheme excludes the module.
  bool linear = false;
  // A format fixed by the architecture, overriding the scheme.
  std::optional<WeightFormat> format;
};

struct ArchWeights {
  std::vector<WeightSpec> specs;
  // Checkpoint tensors that are legitimately present but unused (e.g. GPT-2's
  // causal-mask buffers "attn.bias"): matched as name suffixes.
  std::vector<std::string> ignored_suffixes;
  // Prefixes a checkpoint may omit (GPT-2 checkpoints exist with and without
  // "transformer."): a declared name starting with one also matches without it.
  std::vector<std::string> optional_prefixes;
};

}  // namespace loom

#endif  // LOOM_MODEL_WEIGHTS_H_
