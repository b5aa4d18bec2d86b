// DType: element types with stable names (the safetensors spelling).
#ifndef LOOM_CORE_DTYPE_H_
#define LOOM_CORE_DTYPE_H_

#include <cstdint>
#include <optional>
#include <string_view>

namespace loom {

enum class DType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kF64,
  kF8E4M3,
  kF8E5M2,
  kI8,
  kU8,
  kI16,
  kI32,
  kI64,
  kBool,
};

// "F32", "BF16", ... as written in safetensors headers.
std::string_view DTypeName(DType dtype);
// "float32", "bfloat16", ... as numpy / torch / config.json's torch_dtype say
// it.
std::string_view DTypeLongName(DType dtype);
// Parses a safetensors name ("BF16") or a torch/HF name ("bfloat16",
// "float16").
std::optional<DType> ParseDType(std::string_view name);

constexpr int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
    case DType::kI16:
      return 2;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  return 0;
}

// Types the CPU backend computes with (others are recognised, not computed).
constexpr bool IsComputeDType(DType d) {
  return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16;
}

}  // namespace loom

#endif  // LOOM_CORE_DTYPE_H_
