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
  // Scale and sub-byte element types of the quantized weight formats
  // (src/core/format.h). Checkpoints usually store them inside U8 tensors.
  kF8E8M0,  // MX shared exponent: 2^(b - 127), 255 = NaN
  kF4E2M1,  // FP4 s.ee.m, 4 bits: two values per byte
};

// "F32", "BF16", ... as written in safetensors headers.
std::string_view DTypeName(DType dtype);
// "float32", "bfloat16", ... as numpy / torch / config.json's torch_dtype say
// it.
std::string_view DTypeLongName(DType dtype);
// Parses a safetensors name ("BF16") or a torch/HF name ("bfloat16",
// "float16").
std::optional<DType> ParseDType(std::string_view name);

// Bits of one element: 4 for kF4E2M1, 8 x bytes otherwise.
constexpr int DTypeBits(DType dtype);

// Aborts: a byte size was asked of a sub-byte type (use DTypeBytes).
[[noreturn]] void DieSubByteDTypeSize(DType dtype);

// Bytes of ONE element of a whole-byte type. Aborts for sub-byte types
// (kF4E2M1), which have no per-element byte size: use DTypeBytes(dtype, n).
constexpr int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF4E2M1:
      DieSubByteDTypeSize(dtype);
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
    case DType::kF8E8M0:
      return 1;
  }
  return 0;
}

constexpr int DTypeBits(DType dtype) {
  return dtype == DType::kF4E2M1 ? 4 : static_cast<int>(8 * DTypeSize(dtype));
}

// Exact bytes of `numel` densely packed elements: ceil(numel x bits / 8).
constexpr int64_t DTypeBytes(DType dtype, int64_t numel) {
  return (numel * DTypeBits(dtype) + 7) / 8;
}

// Types the CPU backend computes with (others are recognised, not computed).
constexpr bool IsComputeDType(DType d) {
  return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16;
}

}  // namespace loom

#endif  // LOOM_CORE_DTYPE_H_
