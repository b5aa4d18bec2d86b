// Model: a loaded checkpoint ready to run on the CPU backend — config, weight
// declaration, the mmap'd checkpoint and the bound (possibly converted)
// weights, at a resolved compute precision.
//
// Immutable after Load; safe to share between executors on one thread group.
#ifndef LOOM_RUNTIME_MODEL_H_
#define LOOM_RUNTIME_MODEL_H_

#include <memory>
#include <string>
#include <string_view>

#include "src/base/status.h"
#include "src/io/safetensors.h"
#include "src/model/bind.h"
#include "src/model/config.h"
#include "src/model/registry.h"
#include "src/model/weights.h"

namespace loom {

// --precision auto|f32|bf16|f16.
enum class Precision { kAuto, kF32, kBF16, kF16 };
StatusOr<Precision> ParsePrecision(std::string_view text);

// Resolves the compute dtype on the CPU. auto = the checkpoint's dtype (f32,
// bf16 or f16: its weights are used as stored on every x86-64 CPU, multiplied
// natively where the ISA has it, else widened to f32 panel by panel), f32 for
// anything else; `warning` is cleared (kept for the GPU rules' signature).
StatusOr<DType> ResolvePrecision(Precision requested, DType checkpoint_dtype,
                                 std::string* warning);

// The precision `auto` picks on a GPU of compute capability `capability`
// (major * 10 + minor) for a checkpoint stored in `checkpoint_dtype`: f32
// checkpoints stay f32; otherwise bf16 on capability >= 8.0 (Ampere and
// later), f16 below.
DType GpuAutoPrecision(int capability, DType checkpoint_dtype);

// ResolvePrecision for a job whose layers run on GPUs of the lowest compute
// capability `gpu_capability` (0 = on the host: ResolvePrecision). Explicit
// requests a GPU cannot run (bf16 below 8.0) are errors naming the
// capability; auto follows GpuAutoPrecision, with `warning` saying when the
// checkpoint's dtype was not kept.
StatusOr<DType> ResolvePrecisionOn(Precision requested, DType checkpoint_dtype,
                                   int gpu_capability, std::string* warning);

// Whether the CPU backend computes with `dtype` (f32, bf16, f16: on every
// x86-64 CPU; the CPU backend's `loom devices` line says how).
bool CpuSupportsComputeDType(DType dtype);

// Unimplemented, naming the directory and model_type, for an architecture
// that can be inspected and planned but not run.
Status CheckRunnable(const std::string& model_dir, const ModelConfig& config);

// The dominant floating storage dtype of a checkpoint (by bytes).
DType CheckpointDType(const Checkpoint& checkpoint);

class Model {
 public:
  // Loads `model_dir` (config.json + safetensors) at the given precision.
  // `warning` (may be null) receives a precision fallback message.
  // `gpu_capability`: the lowest compute capability of the GPUs the job's
  // layers run on (0 = the host), for the precision rules
  // (ResolvePrecisionOn).
  static StatusOr<std::unique_ptr<Model>> Load(const std::string& model_dir,
                                               Precision precision,
                                               std::string* warning = nullptr,
                                               int gpu_capability = 0);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const ArchWeights& declaration() const { return decl_; }
  const Checkpoint& checkpoint() const { return *checkpoint_; }
  const BoundWeights& weights() const { return weights_; }
  DType compute_dtype() const { return compute_dtype_; }

 private:
  Model() = default;
  std::string dir_;
  ModelConfig config_;
  ArchWeights decl_;
  std::unique_ptr<Checkpoint> checkpoint_;
  BoundWeights weights_;
  DType compute_dtype_ = DType::kF32;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_MODEL_H_
