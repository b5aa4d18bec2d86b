#include "src/backend/backend.h"

#include <cstring>

#include "src/base/check.h"

namespace loom {

const float* ActivationView::f32() const {
  LOOM_CHECK(host_f32()) << "activation view is " << DTypeName(dtype)
                         << " on device kind " << static_cast<int>(device.kind)
                         << ", not host f32";
  return static_cast<const float*>(data);
}

int64_t Backend::SaeWorkspaceBytes(const Sae& /*sae*/, int64_t /*rows*/) const {
  return 0;
}

Status Backend::ApplyRopePairs(float* /*x*/, int64_t /*tokens*/,
                               int64_t /*heads*/, int64_t /*head_dim*/,
                               int64_t /*row_stride*/, const float* /*cos*/,
                               const float* /*sin*/, int64_t /*half*/) {
  return UnimplementedError(
      std::string(name()) +
      " backend: ApplyRopePairs (the interleaved rotary of GPT-J and "
      "CodeGen) has no kernel here yet; run on the CPU (--device cpu)");
}

Status Backend::RunSae(const Sae& /*sae*/, const float* /*x*/,
                       const float* /*reference*/, int64_t /*rows*/,
                       void* /*workspace*/, const SaeOutputs& /*out*/) {
  return UnimplementedError(std::string(name()) +
                            " backend: RunSae (SAEs) has no kernel here yet");
}

namespace {
Status NoBackward(const Backend& b, std::string_view op) {
  return UnimplementedError(std::string(b.name()) +
                            " backend: " + std::string(op) +
                            " (the backward) has no kernel here yet; run "
                            "gradients on the CPU (--device cpu)");
}
}  // namespace

int64_t Backend::GemmBackwardWorkspaceBytes(const WeightOperand& /*w*/,
                                            int64_t /*m*/) const {
  return 0;
}
Status Backend::GemmBackwardInput(const GemmBackwardOp& /*op*/) {
  return NoBackward(*this, "GemmBackwardInput");
}
Status Backend::NormBackward(const NormBackwardOp& /*op*/) {
  return NoBackward(*this, "NormBackward");
}
int64_t Backend::AttentionBackwardWorkspaceBytes(
    const AttentionOp& /*op*/) const {
  return 0;
}
Status Backend::AttentionBackward(const AttentionBackwardOp& /*op*/) {
  return NoBackward(*this, "AttentionBackward");
}
Status Backend::ActivationBackward(ActivationFn /*fn*/, const float* /*x*/,
                                   const float* /*dy*/, float* /*dx*/,
                                   int64_t /*n*/) {
  return NoBackward(*this, "ActivationBackward");
}
Status Backend::ClampedSwigluBackward(const float* /*gate_up*/,
                                      int64_t /*gu_rs*/, const float* /*dout*/,
                                      float* /*dgate_up*/, int64_t /*dgu_rs*/,
                                      int64_t /*rows*/, int64_t /*n*/,
                                      float /*alpha*/, float /*limit*/) {
  return NoBackward(*this, "ClampedSwigluBackward");
}
Status Backend::GatedActivationBackward(
    ActivationFn /*fn*/, const float* /*gate*/, int64_t /*gate_rs*/,
    const float* /*up*/, int64_t /*up_rs*/, const float* /*dout*/,
    float* /*dgate*/, int64_t /*dg_rs*/, float* /*dup*/, int64_t /*du_rs*/,
    int64_t /*rows*/, int64_t /*n*/) {
  return NoBackward(*this, "GatedActivationBackward");
}

void Backend::GemmGroup(const GemmGroupOp& op) {
  for (int64_t i = 0; i < op.count; ++i) {
    GemmOp g = op.items[i];
    g.workspace = op.workspace;
    g.reuse_x_workspace = false;
    Gemm(g);
  }
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
    case ActKind::kReluSquared:
      return ActivationFn::kReluSquared;
  }
  return ActivationFn::kSilu;
}

std::vector<WeightStorage> StandardWeightFormats() {
  std::vector<WeightStorage> f;
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16})
    for (MatrixLayout l : {MatrixLayout::kOutIn, MatrixLayout::kInOut})
      f.push_back(WeightStorage{FormatKind::kDense, d, l});
  f.push_back(WeightStorage{FormatKind::kFp8PerTensor, DType::kF8E4M3,
                            MatrixLayout::kOutIn});
  f.push_back(WeightStorage{FormatKind::kFp8Block, DType::kF8E4M3,
                            MatrixLayout::kOutIn});
  for (FormatKind k : {FormatKind::kMxfp4, FormatKind::kNvfp4ModelOpt,
                       FormatKind::kNvfp4CompressedTensors})
    f.push_back(WeightStorage{k, DType::kF4E2M1, MatrixLayout::kOutIn});
  return f;
}

QuantMatrix QuantMatrixOf(const WeightOperand& w) {
  QuantMatrix q;
  q.kind = w.format.kind;
  q.values = w.data;
  q.scales = w.scales;
  q.scale_dtype = w.scales_dtype;
  q.n = w.n;
  q.k = w.k;
  q.block_out = w.block_out;
  q.block_in = w.block_in;
  q.global_scale = w.global_scale;
  q.divide_global = w.divide_global;
  return q;
}

WeightOperand MakeWeightOperand(const TensorView& w, MatrixLayout layout) {
  WeightOperand op;
  op.data = w.data;
  op.format.dtype = w.dtype;
  op.format.layout = layout;
  op.n = IsOutIn(layout) ? w.shape[0] : w.shape[1];
  op.k = IsOutIn(layout) ? w.shape[1] : w.shape[0];
  return op;
}

namespace {

// Slice `e` of a stacked [E, ...] view (a view of one expert's [...]).
TensorView ExpertSlice(const TensorView& v, int64_t e) {
  LOOM_CHECK(v.shape.rank() >= 2 && e >= 0 && e < v.shape[0])
      << "expert " << e << " of a stacked tensor of shape "
      << v.shape.ToString();
  std::vector<int64_t> dims(v.shape.dims().begin() + 1, v.shape.dims().end());
  TensorView s{nullptr, v.dtype, Shape(std::move(dims))};
  s.data = static_cast<uint8_t*>(v.data) + e * s.bytes();
  return s;
}

// The operand of a quantized weight, or of expert `expert` of a stacked one
// (kNoExpert: the whole tensor is one matrix).
WeightOperand QuantizedOperand(const BoundWeights::Quantized& q, int64_t expert,
                               DType compute) {
  const bool stacked = expert != kNoExpert;
  LOOM_CHECK(q.logical.rank() == (stacked ? 3 : 2))
      << "quantized weight of logical shape " << q.logical.ToString()
      << (stacked ? " sliced per expert" : " used as one matrix");
  WeightOperand op;
  op.format.kind = q.format.kind;
  op.format.dtype = GetFormatInfo(q.format.kind).value_element;
  op.format.layout = MatrixLayout::kOutIn;
  op.n = q.logical.dim(-2);
  op.k = q.logical.dim(-1);
  op.data = stacked ? ExpertSlice(q.values, expert).data : q.values.data;
  if (q.scales.data != nullptr)
    op.scales = stacked ? ExpertSlice(q.scales, expert).data : q.scales.data;
  op.scales_dtype = q.scales_element;
  op.block_out = q.block_out;
  op.block_in = q.block_in;
  if (q.global.data != nullptr) {
    // [] / [1] per tensor, [E] / [E, 1] per stacked expert (f32, checked at
    // bind).
    const int64_t i = stacked && q.global.numel() > 1 ? expert : 0;
    LOOM_CHECK(i < q.global.numel())
        << "expert " << i << " of a global scale of shape "
        << q.global.shape.ToString();
    std::memcpy(&op.global_scale,
                static_cast<const uint8_t*>(q.global.data) + 4 * i, 4);
  }
  op.divide_global = q.format.kind == FormatKind::kNvfp4CompressedTensors;
  op.decode_dtype = compute;
  return op;
}

// Rows [row0, row0 + rows) of a dense [out, in] view.
TensorView RowSlice(const TensorView& v, int64_t row0, int64_t rows) {
  LOOM_CHECK(v.shape.rank() == 2 && row0 >= 0 && rows > 0 &&
             row0 + rows <= v.shape[0])
      << "rows [" << row0 << ", " << row0 + rows << ") of a matrix of shape "
      << v.shape.ToString();
  TensorView s{nullptr, v.dtype, Shape({rows, v.shape[1]})};
  s.data =
      static_cast<uint8_t*>(v.data) + row0 * v.shape[1] * DTypeSize(v.dtype);
  return s;
}

}  // namespace

WeightOperand WeightOperandOf(const BoundWeights& w, WeightRole role,
                              int64_t layer, int64_t expert) {
  if (const BoundWeights::Quantized* q = w.GetQuantized(role, layer, expert))
    return QuantizedOperand(*q, kNoExpert, w.compute_dtype());
  const bool gate_or_up =
      role == WeightRole::kExpertGate || role == WeightRole::kExpertUp;
  if (gate_or_up && expert != kNoExpert &&
      w.Get(role, layer, expert) == nullptr &&
      w.Get(role, layer, kAllExperts) == nullptr) {
    // Packed [E, 2I, H] gate_up (MoEConfig::packed_experts, dense only):
    // expert e's gate is rows [0, I) of its slice, its up rows [I, 2I).
    LOOM_CHECK(w.GetQuantized(WeightRole::kExpertGateUp, layer, kAllExperts) ==
               nullptr)
        << "layer " << layer << ": packed quantized experts";
    const MatrixLayout layout =
        w.Layout(WeightRole::kExpertGateUp, layer, kAllExperts);
    LOOM_CHECK(IsOutIn(layout))
        << "layer " << layer << ": packed experts stored [in, out]";
    const TensorView gate_up = ExpertSlice(
        w.Require(WeightRole::kExpertGateUp, layer, kAllExperts), expert);
    const int64_t I = gate_up.shape[0] / 2;
    // Blocks of 16 rows: the up half starts on one (Repack only repacks a
    // matrix whose halves are whole blocks).
    LOOM_CHECK(layout == MatrixLayout::kOutIn || I % 16 == 0)
        << "layer " << layer << ": gate/up halves of " << I
        << " rows inside a strip";
    return MakeWeightOperand(
        RowSlice(gate_up, role == WeightRole::kExpertGate ? 0 : I, I), layout);
  }
  if (expert != kNoExpert && w.Get(role, layer, expert) == nullptr) {
    // Stacked experts.
    if (const BoundWeights::Quantized* q =
            w.GetQuantized(role, layer, kAllExperts))
      return QuantizedOperand(*q, expert, w.compute_dtype());
    const TensorView& all = w.Require(role, layer, kAllExperts);
    return MakeWeightOperand(ExpertSlice(all, expert),
                             w.Layout(role, layer, kAllExperts));
  }
  return MakeWeightOperand(w.Require(role, layer, expert),
                           w.Layout(role, layer, expert));
}

Status CheckRouteOp(const RouteOp& op, int64_t experts, int64_t k) {
  if (k <= 0 || k > experts)
    return InvalidArgumentError("TopKRoute: k = " + std::to_string(k) +
                                ", experts = " + std::to_string(experts) +
                                ", expected 0 < k <= experts");
  if (op.kind != RouterKind::kSigmoidGroupTopK) return Status();
  const int64_t g = op.groups, keep = op.keep_groups;
  if (g <= 0 || experts % g != 0 || experts / g < 2 || keep <= 0 || keep > g)
    return InvalidArgumentError(
        "TopKRoute (sigmoid group top-k): experts = " +
        std::to_string(experts) + ", groups = " + std::to_string(g) +
        ", keep_groups = " + std::to_string(keep) +
        ", expected groups dividing the experts into groups of >= 2 and 0 < "
        "keep_groups <= groups");
  return Status();
}

BiasOperand BiasOf(const BoundWeights& w, WeightRole role, int64_t layer,
                   int64_t expert) {
  const TensorView* b = w.Get(role, layer, expert);
  if (b == nullptr && expert != kNoExpert) {
    if (const TensorView* all = w.Get(role, layer, kAllExperts)) {
      const TensorView s = ExpertSlice(*all, expert);
      return {s.data, s.dtype};
    }
  }
  if (b == nullptr) return {};
  return {b->data, b->dtype};
}

}  // namespace loom
