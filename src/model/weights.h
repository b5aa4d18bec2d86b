// Weight declarations. Each architecture declares its tensors once (HF name,
// role, shape, layout, required/optional/tied); the same table drives loading
// and validation, `loom inspect`, and the planner's weight bytes.
#ifndef LOOM_MODEL_WEIGHTS_H_
#define LOOM_MODEL_WEIGHTS_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "src/core/dtype.h"
#include "src/core/tensor.h"

namespace loom {

enum class WeightRole : uint8_t {
  // Model-level.
  kEmbed,
  kPosEmbed,
  kFinalNorm,
  kFinalNormBias,
  kLmHead,
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
  // Mixture of experts (declared for planning; not run yet).
  kRouter,
  kRouterBias,
  kExpert,
  kSharedExpert,
  kSharedExpertGate,
  kOther,
};
inline constexpr int kNumWeightRoles = static_cast<int>(WeightRole::kOther) + 1;

// Storage layout of a matrix: torch Linear's [out, in], or GPT-2 Conv1D's [in,
// out].
enum class MatrixLayout : uint8_t { kOutIn, kInOut };

struct WeightSpec {
  std::string name;  // HF tensor name
  WeightRole role = WeightRole::kOther;
  int64_t layer = -1;  // -1 = model-level
  Shape shape;
  MatrixLayout layout = MatrixLayout::kOutIn;
  bool required = true;
  // If set and `name` is absent from the checkpoint, this tensor is used
  // instead (tied lm_head -> embed_tokens). Counted once.
  std::string tied_to;
  // Storage dtype fixed by the format (e.g. MXFP4 blocks stored as U8);
  // otherwise the checkpoint's (or --assume-dtype when planning).
  std::optional<DType> storage_dtype;
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
