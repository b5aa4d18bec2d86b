#include "src/backend/backend.h"

#include "src/base/check.h"

namespace loom {

const float* ActivationView::f32() const {
  LOOM_CHECK(host_f32()) << "activation view is " << DTypeName(dtype)
                         << " on device kind " << static_cast<int>(device.kind)
                         << ", not host f32";
  return static_cast<const float*>(data);
}

ActivationFn ToActivationFn(ActKind act) {
  switch (act) {
    case ActKind::kSilu:
      return ActivationFn::kSilu;
    case ActKind::kGeluTanh:
      return ActivationFn::kGeluTanh;
    case ActKind::kGeluExact:
      return ActivationFn::kGeluExact;
    case ActKind::kRelu:
      return ActivationFn::kRelu;
  }
  return ActivationFn::kSilu;
}

WeightOperand MakeWeightOperand(const TensorView& w, MatrixLayout layout) {
  WeightOperand op;
  op.data = w.data;
  op.format.dtype = w.dtype;
  op.format.layout = layout;
  op.n = layout == MatrixLayout::kOutIn ? w.shape[0] : w.shape[1];
  op.k = layout == MatrixLayout::kOutIn ? w.shape[1] : w.shape[0];
  return op;
}

}  // namespace loom
