#include "src/core/dtype.h"

#include <array>
#include <cstdlib>
#include <utility>

#include "src/base/check.h"

namespace loom {
namespace {

struct DTypeNames {
  DType dtype;
  std::string_view name;
  std::string_view long_name;
};

constexpr std::array<DTypeNames, 14> kNames = {{
    {DType::kF32, "F32", "float32"},
    {DType::kBF16, "BF16", "bfloat16"},
    {DType::kF16, "F16", "float16"},
    {DType::kF64, "F64", "float64"},
    {DType::kF8E4M3, "F8_E4M3", "float8_e4m3fn"},
    {DType::kF8E5M2, "F8_E5M2", "float8_e5m2"},
    {DType::kI8, "I8", "int8"},
    {DType::kU8, "U8", "uint8"},
    {DType::kI16, "I16", "int16"},
    {DType::kI32, "I32", "int32"},
    {DType::kI64, "I64", "int64"},
    {DType::kBool, "BOOL", "bool"},
    {DType::kF8E8M0, "F8_E8M0", "float8_e8m0fnu"},
    {DType::kF4E2M1, "F4", "float4_e2m1fn"},
}};

}  // namespace

void DieSubByteDTypeSize(DType dtype) {
  LOOM_CHECK(false) << "DTypeSize(" << DTypeName(dtype)
                    << "): a sub-byte type has no per-element byte size; "
                       "use DTypeBytes(dtype, numel)";
  std::abort();
}

std::string_view DTypeName(DType dtype) {
  for (const auto& n : kNames)
    if (n.dtype == dtype) return n.name;
  return "?";
}

std::string_view DTypeLongName(DType dtype) {
  for (const auto& n : kNames)
    if (n.dtype == dtype) return n.long_name;
  return "?";
}

std::optional<DType> ParseDType(std::string_view name) {
  for (const auto& n : kNames)
    if (n.name == name || n.long_name == name) return n.dtype;
  if (name == "f32" || name == "float") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  if (name == "f16" || name == "half") return DType::kF16;
  return std::nullopt;
}

}  // namespace loom
