#include "src/runtime/model.h"

#include <map>

namespace loom {

StatusOr<Precision> ParsePrecision(std::string_view text) {
  if (text == "auto") return Precision::kAuto;
  if (text == "f32" || text == "float32") return Precision::kF32;
  if (text == "bf16" || text == "bfloat16") return Precision::kBF16;
  if (text == "f16" || text == "float16") return Precision::kF16;
  return InvalidArgumentError("--precision '" + std::string(text) +
                              "': expected auto, f32, bf16 or f16");
}

bool CpuSupportsComputeDType(DType dtype) {
  // Every x86-64 CPU: 16-bit weights stay stored and are multiplied natively
  // where the ISA has it, else widened to f32 per panel (the CPU backend
  // decides, src/backend/cpu/isa.h); the rounding of activations is the
  // same either way.
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

StatusOr<DType> ResolvePrecision(Precision requested, DType checkpoint_dtype,
                                 std::string* warning) {
  if (warning) warning->clear();
  switch (requested) {
    case Precision::kF32:
      return DType::kF32;
    case Precision::kBF16:
      return DType::kBF16;
    case Precision::kF16:
      return DType::kF16;
    case Precision::kAuto:
      break;
  }
  // The checkpoint's own dtype: its weights are used as stored.
  if (CpuSupportsComputeDType(checkpoint_dtype)) return checkpoint_dtype;
  return DType::kF32;
}

DType GpuAutoPrecision(int capability, DType checkpoint_dtype) {
  if (checkpoint_dtype == DType::kF32) return DType::kF32;
  if (checkpoint_dtype == DType::kF16) return DType::kF16;
  return capability >= 80 ? DType::kBF16 : DType::kF16;
}

StatusOr<DType> ResolvePrecisionOn(Precision requested, DType checkpoint_dtype,
                                   int gpu_capability, std::string* warning) {
  if (gpu_capability <= 0)
    return ResolvePrecision(requested, checkpoint_dtype, warning);
  if (warning) warning->clear();
  const std::string cap = std::to_string(gpu_capability / 10) + "." +
                          std::to_string(gpu_capability % 10);
  switch (requested) {
    case Precision::kF32:
      return DType::kF32;
    case Precision::kBF16:
      if (gpu_capability < 80)
        return FailedPreconditionError(
            "--precision bf16: a GPU of compute capability " + cap +
            " has no bf16 tensor cores (8.0 and later do); use f16 or f32");
      return DType::kBF16;
    case Precision::kF16:
      return DType::kF16;
    case Precision::kAuto:
      break;
  }
  const DType pick = GpuAutoPrecision(gpu_capability, checkpoint_dtype);
  if (warning && pick != checkpoint_dtype && IsComputeDType(checkpoint_dtype))
    *warning = "checkpoint dtype " +
               std::string(DTypeLongName(checkpoint_dtype)) +
               " is not computed natively on a GPU of capability " + cap +
               "; computing in " + std::string(DTypeLongName(pick));
  return pick;
}

DType CheckpointDType(const Checkpoint& ckpt) {
  std::map<DType, int64_t> bytes;
  for (const auto& e : ckpt.entries())
    if (IsComputeDType(e.info.dtype)) bytes[e.info.dtype] += e.info.bytes();
  DType best = DType::kF32;
  int64_t most = -1;
  for (const auto& [d, b] : bytes)
    if (b > most) best = d, most = b;
  return best;
}

Status CheckRunnable(const std::string& model_dir, const ModelConfig& config) {
  if (!FindArch(config.model_type)->runnable)
    return UnimplementedError(model_dir + ": model_type '" + config.model_type +
                              "' can be inspected and planned but not run yet");
  return Status();
}

StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& model_dir,
                                             Precision precision,
                                             std::string* warning,
                                             int gpu_capability) {
  auto m = std::unique_ptr<Model>(new Model());
  m->dir_ = model_dir;
  ASSIGN_OR_RETURN(m->config_, LoadModelConfig(model_dir));
  RETURN_IF_ERROR(CheckRunnable(model_dir, m->config_));
  m->decl_ = FindArch(m->config_.model_type)->declare_weights(m->config_);
  ASSIGN_OR_RETURN(m->checkpoint_, Checkpoint::Open(model_dir));
  ASSIGN_OR_RETURN(
      m->compute_dtype_,
      ResolvePrecisionOn(precision, CheckpointDType(*m->checkpoint_),
                         gpu_capability, warning));
  ASSIGN_OR_RETURN(m->weights_,
                   BoundWeights::Bind(m->config_, m->decl_, *m->checkpoint_,
                                      m->compute_dtype_));
  return m;
}

}  // namespace loom
