// Shape and TensorView: metadata and a non-owning typed view of memory.
// Shapes are outermost-first (PyTorch / safetensors order). A TensorView is
// always dense row-major; it never owns memory (arenas and mmaps do).
#ifndef LOOM_CORE_TENSOR_H_
#define LOOM_CORE_TENSOR_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "src/base/check.h"
#include "src/core/dtype.h"

namespace loom {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t dim(int i) const {
    return i < 0 ? dims_[dims_.size() + i] : dims_[i];
  }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : dims_) n *= d;
    return n;
  }
  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }
  // "[11008, 4096]"
  std::string ToString() const;

 private:
  std::vector<int64_t> dims_;
};

// Dense, row-major, non-owning.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;

  int64_t numel() const { return shape.numel(); }
  int64_t bytes() const { return DTypeBytes(dtype, numel()); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  const float* f32() const {
    LOOM_CHECK(dtype == DType::kF32) << DTypeName(dtype);
    return static_cast<const float*>(data);
  }
};

}  // namespace loom

#endif  // LOOM_CORE_TENSOR_H_
