#include "src/core/format.h"

namespace loom {
namespace {

using CK = ComponentKind;
using CS = ComponentShape;

// The format table (see the header for the layouts).
const std::vector<FormatInfo>& Table() {
  static const std::vector<FormatInfo>* const kTable =
      new std::vector<FormatInfo>{
          {FormatKind::kDense,
           "dense",
           0,
           DType::kF32,
           0,
           {{CK::kValues, "", false, DType::kF32, DType::kF32, CS::kSame}}},
          {FormatKind::kFp8PerTensor,
           "fp8-per-tensor",
           8,
           DType::kF8E4M3,
           0,
           {{CK::kValues, "", false, DType::kF8E4M3, DType::kF8E4M3, CS::kSame},
            {CK::kGlobalScale, "_scale", false, DType::kF32, DType::kF32,
             CS::kScalar},
            {CK::kInputScale, "input_scale", true, DType::kF32, DType::kF32,
             CS::kScalar}}},
          {FormatKind::kFp8Block,
           "fp8-block",
           8,
           DType::kF8E4M3,
           -1,
           {{CK::kValues, "", false, DType::kF8E4M3, DType::kF8E4M3, CS::kSame},
            {CK::kBlockScales, "_scale_inv", false, DType::kF32, DType::kF32,
             CS::kPerBlock2d, /*stored_varies=*/true}}},
          {FormatKind::kMxfp4,
           "mxfp4",
           4,
           DType::kF4E2M1,
           32,
           {{CK::kValues, "_blocks", false, DType::kU8, DType::kF4E2M1,
             CS::kMxBlocks},
            {CK::kBlockScales, "_scales", false, DType::kU8, DType::kF8E8M0,
             CS::kPerBlockIn}}},
          {FormatKind::kNvfp4ModelOpt,
           "nvfp4-modelopt",
           4,
           DType::kF4E2M1,
           16,
           {{CK::kValues, "", false, DType::kU8, DType::kF4E2M1, CS::kPacked},
            {CK::kBlockScales, "_scale", false, DType::kF8E4M3, DType::kF8E4M3,
             CS::kPerBlockIn},
            {CK::kGlobalScale, "_scale_2", false, DType::kF32, DType::kF32,
             CS::kScalar},
            {CK::kInputScale, "input_scale", true, DType::kF32, DType::kF32,
             CS::kScalar}}},
          {FormatKind::kNvfp4CompressedTensors,
           "nvfp4-compressed-tensors",
           4,
           DType::kF4E2M1,
           16,
           {{CK::kValues, "_packed", false, DType::kU8, DType::kF4E2M1,
             CS::kPacked},
            {CK::kBlockScales, "_scale", false, DType::kF8E4M3, DType::kF8E4M3,
             CS::kPerBlockIn},
            {CK::kGlobalScale, "_global_scale", false, DType::kF32, DType::kF32,
             CS::kOne},
            {CK::kInputScale, "input_global_scale", true, DType::kF32,
             DType::kF32, CS::kOne}}},
      };
  return *kTable;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::string_view ComponentName(ComponentKind k) {
  switch (k) {
    case ComponentKind::kValues:
      return "values";
    case ComponentKind::kBlockScales:
      return "block scales";
    case ComponentKind::kGlobalScale:
      return "global scale";
    case ComponentKind::kInputScale:
      return "input scale";
    case ComponentKind::kKvCacheScale:
      return "kv-cache scale";
  }
  return "?";
}

const std::vector<FormatInfo>& AllFormats() { return Table(); }

const FormatInfo& GetFormatInfo(FormatKind kind) {
  return Table()[static_cast<size_t>(kind)];
}

std::string_view FormatName(FormatKind kind) {
  return GetFormatInfo(kind).name;
}

std::string WeightFormat::ToString() const {
  if (kind == FormatKind::kDense)
    return dtype ? std::string(DTypeName(*dtype)) : "dense";
  std::string s(FormatName(kind));
  if (kind == FormatKind::kFp8Block)
    s += "[" + std::to_string(block_out) + "x" + std::to_string(block_in) + "]";
  return s;
}

StatusOr<std::vector<PhysicalTensor>> ExpandWeight(const WeightFormat& format,
                                                   const std::string& name,
                                                   const Shape& shape) {
  const FormatInfo& info = GetFormatInfo(format.kind);
  if (format.kind == FormatKind::kDense) {
    if (!format.dtype)
      return InvalidArgumentError("weight " + name +
                                  ": dense format without a dtype");
    PhysicalTensor t;
    t.name = name;
    t.shape = shape;
    t.dtype = t.element = *format.dtype;
    t.bytes = DTypeBytes(t.dtype, shape.numel());
    return std::vector<PhysicalTensor>{t};
  }
  if (shape.rank() < 2)
    return InvalidArgumentError("weight " + name + ": shape " +
                                shape.ToString() + " cannot be stored as " +
                                format.ToString() + " (needs [..., out, in])");
  const int64_t out = shape.dim(-2), in = shape.dim(-1);
  std::vector<int64_t> prefix(shape.dims().begin(), shape.dims().end() - 2);
  int64_t block_in = info.block_in, block_out = 1;
  if (block_in < 0) {
    block_in = format.block_in;
    block_out = format.block_out;
    if (block_in <= 0 || block_out <= 0)
      return InvalidArgumentError(
          "weight " + name + ": " + std::string(info.name) + " block [" +
          std::to_string(block_out) + ", " + std::to_string(block_in) +
          "], expected positive sizes");
  } else if (block_in > 0 && in % block_in != 0) {
    return InvalidArgumentError(
        "weight " + name + ": in = " + std::to_string(in) + " (shape " +
        shape.ToString() + ") is not a multiple of the " +
        std::string(info.name) + " block " + std::to_string(block_in));
  }
  if (info.value_bits < 8 && (in * info.value_bits) % 8 != 0)
    return InvalidArgumentError("weight " + name +
                                ": in = " + std::to_string(in) +
                                " does not pack into " + "whole bytes at " +
                                std::to_string(info.value_bits) + " bits");
  const size_t dot = name.rfind('.');
  const std::string module =
      dot == std::string::npos ? std::string() : name.substr(0, dot + 1);
  std::vector<PhysicalTensor> out_tensors;
  for (const FormatComponent& c : info.components) {
    PhysicalTensor t;
    t.component = c.kind;
    t.name =
        c.sibling ? module + std::string(c.name) : name + std::string(c.name);
    t.dtype = c.stored_varies ? format.scale_dtype : c.stored;
    t.element = c.stored_varies ? t.dtype : c.element;
    t.dtype_varies = c.stored_varies;
    std::vector<int64_t> d = prefix;
    switch (c.shape) {
      case CS::kSame:
        d.insert(d.end(), {out, in});
        break;
      case CS::kPacked:
        d.insert(d.end(), {out, in * info.value_bits / 8});
        break;
      case CS::kMxBlocks:
        d.insert(d.end(), {out, in / block_in, block_in * info.value_bits / 8});
        break;
      case CS::kPerBlockIn:
        d.insert(d.end(), {out, in / block_in});
        break;
      case CS::kPerBlock2d:
        d.insert(d.end(), {CeilDiv(out, block_out), CeilDiv(in, block_in)});
        break;
      case CS::kScalar:
        break;
      case CS::kOne:
        d.push_back(1);
        break;
    }
    t.shape = Shape(std::move(d));
    t.bytes = DTypeBytes(t.dtype, t.shape.numel());
    out_tensors.push_back(std::move(t));
  }
  return out_tensors;
}

StatusOr<int64_t> StorageBytes(const WeightFormat& format, const Shape& shape) {
  ASSIGN_OR_RETURN(std::vector<PhysicalTensor> tensors,
                   ExpandWeight(format, "w", shape));
  int64_t bytes = 0;
  for (const PhysicalTensor& t : tensors) bytes += t.bytes;
  return bytes;
}

}  // namespace loom
