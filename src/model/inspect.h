// Inspection of a model directory: architecture, dimensions, parameter count,
// bytes per storage dtype, weights per storage format, the stored bytes per
// weight group (role family x format; tied tensors once), and every problem
// the checkpoint matcher (src/model/match.h) finds. Backs `loom inspect`.
#ifndef LOOM_MODEL_INSPECT_H_
#define LOOM_MODEL_INSPECT_H_

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/model/config.h"
#include "src/model/weights.h"

namespace loom {

// The family `loom inspect` groups a role under ("embeddings", "norms",
// "attention q/k/v/o", "experts gate/up", "lm_head", ...).
std::string_view WeightFamilyName(WeightRole role);

// Logical weights of one family stored in one format, as matched.
struct WeightGroup {
  std::string family;   // WeightFamilyName, or "unused" (ignored tensors)
  std::string format;   // WeightFormat::ToString(): "bf16", "mxfp4", ...
  int64_t weights = 0;  // logical weights (a tied one is not counted)
  int64_t tensors = 0;  // physical tensors: values, scales, global scales
  int64_t bytes = 0;    // exact stored bytes of those tensors
  // Declared shapes and an assumed dtype (config.json only): not read.
  bool dtype_assumed = false;
};

struct InspectReport {
  ModelConfig config;
  bool runnable = false;
  bool weights_present =
      false;  // safetensors found (else: declared shapes only)
  std::vector<std::string> files;                 // safetensors files read
  int64_t num_parameters = 0;                     // tied tensors counted once
  std::map<std::string, int64_t> bytes_by_dtype;  // "BF16" -> bytes
  // Logical weights per storage format ("BF16", "mxfp4", ...), tied ones once.
  std::map<std::string, int64_t> weights_by_format;
  // In family order, then format. With weights present, the bytes add up to
  // the sum of bytes_by_dtype (tensors the architecture ignores, such as
  // GPT-2's "attn.bias" buffers, form the "unused" group).
  std::vector<WeightGroup> groups;
  std::vector<std::string> problems;  // empty = checkpoint is consistent

  nlohmann::json ToJson() const;
  std::string ToText() const;
};

// Fails only when config.json itself cannot be used (missing, malformed,
// unknown model_type); checkpoint problems are collected in the report.
StatusOr<InspectReport> InspectModel(const std::string& model_dir);

}  // namespace loom

#endif  // LOOM_MODEL_INSPECT_H_
