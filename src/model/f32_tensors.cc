#include "src/model/f32_tensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "src/base/float16.h"
#include "src/core/tensor.h"
#include "src/io/npz.h"
#include "src/io/torch_pickle.h"

namespace loom {

std::string ShapeText(const std::vector<int64_t>& dims) {
  return Shape(dims).ToString();
}

StatusOr<F32Tensors> F32Tensors::Open(const std::string& path) {
  F32Tensors t;
  t.path_ = path;
  ASSIGN_OR_RETURN(t.file_, SafetensorsFile::Open(path));
  return t;
}

StatusOr<F32Tensors> F32Tensors::OpenNpz(const std::string& path) {
  F32Tensors t;
  t.path_ = path;
  ASSIGN_OR_RETURN(const std::unique_ptr<NpzFile> npz, NpzFile::Open(path));
  for (const std::string& name : npz->names()) {
    ASSIGN_OR_RETURN(NpyArray a, npz->Read(name));
    if (a.header.fortran_order)
      return InvalidArgumentError(path + ": array '" + name +
                                  "' is in Fortran order");
    t.npz_.emplace(name, std::move(a));
  }
  return t;
}

StatusOr<F32Tensors> F32Tensors::OpenTorch(const std::string& path) {
  F32Tensors t;
  t.path_ = path;
  ASSIGN_OR_RETURN(auto tensors, ReadTorchStateDict(path));
  for (auto& [name, tensor] : tensors) {
    NpyArray a;
    a.header.dtype = tensor.dtype;
    a.header.shape = tensor.shape;
    a.data = std::move(tensor.data);
    t.npz_.emplace(name, std::move(a));
  }
  return t;
}

StatusOr<std::vector<int64_t>> F32Tensors::Dims(const std::string& name) const {
  const std::optional<Raw> r = Find(name);
  if (!r) return InvalidArgumentError(path() + ": no tensor '" + name + "'");
  return r->dims;
}

std::optional<DType> F32Tensors::DTypeOf(const std::string& name) const {
  if (const std::optional<Raw> r = Find(name)) return r->dtype;
  return std::nullopt;
}

StatusOr<std::vector<float>> F32Tensors::Read(
    const std::string& name, const std::vector<int64_t>& dims) const {
  const std::optional<Raw> r = Find(name);
  if (!r)
    return InvalidArgumentError(path() + ": no tensor '" + name +
                                "' (expected " + ShapeText(dims) + ")");
  if (r->dims != dims)
    return InvalidArgumentError(path() + ": tensor '" + name + "' is " +
                                ShapeText(r->dims) + ", expected " +
                                ShapeText(dims) + " from the config");
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  std::vector<float> out(n);
  // Through memcpy: a safetensors tensor may start at any byte offset (no
  // alignment is promised).
  const auto* bytes = static_cast<const uint8_t*>(r->data);
  switch (r->dtype) {
    case DType::kF32:
      if (n > 0) std::memcpy(out.data(), bytes, static_cast<size_t>(4 * n));
      break;
    case DType::kF64:
      for (int64_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, bytes + 8 * i, 8);
        out[i] = static_cast<float>(v);
      }
      break;
    case DType::kBF16:
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        out[i] = r->dtype == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h);
      }
      break;
    default:
      return InvalidArgumentError(path() + ": tensor '" + name + "' is " +
                                  std::string(DTypeName(r->dtype)) +
                                  ", expected F32, F64, BF16 or F16");
  }
  const auto bad = std::find_if(out.begin(), out.end(),
                                [](float v) { return !std::isfinite(v); });
  if (bad != out.end())
    return InvalidArgumentError(path() + ": tensor '" + name + "' holds " +
                                std::to_string(*bad) + " at element " +
                                std::to_string(bad - out.begin()));
  return out;
}

std::optional<F32Tensors::Raw> F32Tensors::Find(const std::string& name) const {
  if (file_ != nullptr) {
    const TensorInfo* info = file_->Find(name);
    if (info == nullptr) return std::nullopt;
    return Raw{info->dtype, info->shape.dims(), file_->View(*info).data};
  }
  const auto it = npz_.find(name);
  if (it == npz_.end()) return std::nullopt;
  return Raw{it->second.header.dtype, it->second.header.shape,
             it->second.data.data()};
}

}  // namespace loom
