// The tensors of a small published weights file (an SAE's, a tuned lens's):
// a .safetensors or a numpy .npz, each tensor read by name as f32 with its
// shape checked. Errors name the file, the tensor and both shapes/values.
#ifndef LOOM_MODEL_F32_TENSORS_H_
#define LOOM_MODEL_F32_TENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"
#include "src/io/npy.h"
#include "src/io/safetensors.h"

namespace loom {

// "[64, 512]" (Shape::ToString).
std::string ShapeText(const std::vector<int64_t>& dims);

class F32Tensors {
 public:
  // A .safetensors file (mapped; tensors read on demand).
  static StatusOr<F32Tensors> Open(const std::string& path);
  // Every array of an .npz read into memory (C order only).
  static StatusOr<F32Tensors> OpenNpz(const std::string& path);
  // Every tensor of a torch.save'd state dict read into memory
  // (src/io/torch_pickle.h: never unpickled by Python's rules).
  static StatusOr<F32Tensors> OpenTorch(const std::string& path);

  const std::string& path() const { return path_; }
  bool Has(const std::string& name) const { return Find(name).has_value(); }
  // The shape of tensor `name`, or an error naming it when absent.
  StatusOr<std::vector<int64_t>> Dims(const std::string& name) const;
  // The stored dtype of tensor `name`, when present.
  std::optional<DType> DTypeOf(const std::string& name) const;
  // Tensor `name` of shape `dims` as f32; an absent tensor, another shape, a
  // dtype other than f32/bf16/f16/f64 or a non-finite value is an error
  // naming the file and the tensor.
  StatusOr<std::vector<float>> Read(const std::string& name,
                                    const std::vector<int64_t>& dims) const;

 private:
  struct Raw {
    DType dtype;
    std::vector<int64_t> dims;
    const void* data;
  };
  std::optional<Raw> Find(const std::string& name) const;
  std::string path_;
  std::unique_ptr<SafetensorsFile> file_;
  std::map<std::string, NpyArray> npz_;
};

}  // namespace loom

#endif  // LOOM_MODEL_F32_TENSORS_H_
