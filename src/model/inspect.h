// Inspection of a model directory: architecture, dimensions, parameter count,
// bytes per storage dtype and weights per storage format (tied tensors once),
// and every problem the checkpoint matcher (src/model/match.h) finds. Backs
// `loom inspect`.
#ifndef LOOM_MODEL_INSPECT_H_
#define LOOM_MODEL_INSPECT_H_

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/model/config.h"

namespace loom {

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
  std::vector<std::string> problems;  // empty = checkpoint is consistent

  nlohmann::json ToJson() const;
  std::string ToText() const;
};

// Fails only when config.json itself cannot be used (missing, malformed,
// unknown model_type); checkpoint problems are collected in the report.
StatusOr<InspectReport> InspectModel(const std::string& model_dir);

}  // namespace loom

#endif  // LOOM_MODEL_INSPECT_H_
