// Reading a checkpoint's quantization scheme (QuantConfig, src/model/config.h)
// from its own metadata: config.json's `quantization_config` (transformers'
// quant_method "fp8", "mxfp4", "modelopt", "compressed-tensors") or, when it
// has none, ModelOpt's hf_quant_config.json beside it.
#ifndef LOOM_MODEL_QUANT_H_
#define LOOM_MODEL_QUANT_H_

#include <string>

#include "src/base/status.h"
#include "src/model/config.h"
#include "src/model/config_reader.h"

namespace loom {

// Parses config.json's quantization_config, if any, into `config->quant`.
// A scheme Loom cannot declare is Unimplemented, naming the key and value.
Status ParseQuantizationConfig(const ConfigReader& config_json,
                               ModelConfig* config);

// When config->quant is still unset, reads `model_dir`/hf_quant_config.json if
// present.
Status ReadHfQuantConfig(const std::string& model_dir, ModelConfig* config);

}  // namespace loom

#endif  // LOOM_MODEL_QUANT_H_
