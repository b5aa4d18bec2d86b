// llama.cpp control vectors (GGUF files written by llama.cpp's
// cvector-generator and by repeng) as Loom interventions
// (docs/interventions.md, "Control vectors").
//
// A control-vector file holds one-dimensional tensors `direction.N` of the
// model's hidden size; llama.cpp adds `direction.N` to the output of layer N
// (0-based), which is Loom's `blocks.N.hook_resid_post`; layer 0 never gets
// one. Several files are summed, each times its scale, into one vector per
// layer, as llama.cpp's loader does (in f32, file by file, in the order
// given).
#ifndef LOOM_MODEL_CONTROL_VECTORS_H_
#define LOOM_MODEL_CONTROL_VECTORS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/model/config.h"
#include "src/model/interventions.h"

namespace loom {

// --control-vector FILE (scale 1) or --control-vector-scaled FILE SCALE.
struct ControlVectorFile {
  std::string path;
  float scale = 1.0f;
};

// --control-vector-layer-range A B: only layers A..B (inclusive) get their
// vector. As in llama.cpp, A <= 0 means 1 and B <= 0 means the last layer.
struct ControlVectorLayerRange {
  int64_t first = 0;
  int64_t last = 0;
};

// One intervention per layer that has a vector (in layer order): mode add at
// blocks.N.hook_resid_post, scale 1 (the files' scales are in the vector),
// every position, prompt and generated tokens, every row. Empty when `files`
// is empty. Errors name the file and tensor: InvalidArgument for a tensor
// not named direction.N, direction.0, a layer N outside the model, a tensor
// that is not one-dimensional, a width other than hidden_size (both values),
// a non-finite value or scale, a file without direction tensors, or a layer
// range whose start is after its end; a file that cannot be read keeps the
// GGUF reader's code (NotFound, DataLoss, Unimplemented for a quantized
// tensor).
StatusOr<std::vector<Intervention>> ControlVectorInterventions(
    const std::vector<ControlVectorFile>& files,
    const std::optional<ControlVectorLayerRange>& range,
    const ModelConfig& config);

}  // namespace loom

#endif  // LOOM_MODEL_CONTROL_VECTORS_H_
