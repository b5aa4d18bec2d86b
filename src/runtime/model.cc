#include "src/runtime/model.h"

#include <cpuid.h>

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
  switch (dtype) {
    case DType::kF32:
      return true;
    case DType::kBF16:
      return __builtin_cpu_supports("avx512bf16") ||
             __builtin_cpu_supports("avx512f");
    case DType::kF16: {
      // AVX512-FP16: CPUID.(EAX=7, ECX=0):EDX bit 23 (read directly: not
      // every compiler's __builtin_cpu_supports knows the name), with the
      // OS's AVX-512 state support that avx512f's check implies.
      unsigned a = 0, b = 0, c = 0, d = 0;
      return __builtin_cpu_supports("avx512f") &&
             __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 &&
             (d & (1u << 23)) != 0;
    }
    default:
      return false;
  }
}

StatusOr<DType> ResolvePrecision(Precision requested, DType checkpoint_dtype,
                                 std::string* warning) {
  if (warning) warning->clear();
  switch (requested) {
    case Precision::kF32:
      return DType::kF32;
    case Precision::kBF16:
      if (!CpuSupportsComputeDType(DType::kBF16))
        return FailedPreconditionError(
            "--precision bf16: this CPU has no AVX-512 (needed for bf16 "
            "GEMMs)");
      return DType::kBF16;
    case Precision::kF16:
      if (!CpuSupportsComputeDType(DType::kF16))
        return FailedPreconditionError(
            "--precision f16: this CPU has no AVX512-FP16, so f16 compute is "
            "not available; use --precision bf16 or f32");
      return DType::kF16;
    case Precision::kAuto:
      break;
  }
  if (checkpoint_dtype == DType::kF32) return DType::kF32;
  if (CpuSupportsComputeDType(checkpoint_dtype)) return checkpoint_dtype;
  for (DType d : {DType::kBF16, DType::kF16, DType::kF32}) {
    if (CpuSupportsComputeDType(d)) {
      if (warning)
        *warning = "checkpoint dtype " +
                   std::string(DTypeLongName(checkpoint_dtype)) +
                   " is not computed natively on this CPU; computing in " +
                   std::string(DTypeLongName(d));
      return d;
    }
  }
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

StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& model_dir,
                                             Precision precision,
                                             std::string* warning,
                                             int gpu_capability) {
  auto m = std::unique_ptr<Model>(new Model());
  m->dir_ = model_dir;
  ASSIGN_OR_RETURN(m->config_, LoadModelConfig(model_dir));
  const ArchDef* arch = FindArch(m->config_.model_type);
  if (!arch->runnable)
    return UnimplementedError(model_dir + ": model_type '" +
                              m->config_.model_type +
                              "' can be inspected and planned but not run yet");
  m->decl_ = arch->declare_weights(m->config_);
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
