#include "src/eval/lens.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "src/backend/registry.h"
#include "src/base/check.h"
#include "src/core/topk.h"
#include "src/runtime/executor.h"

namespace loom::eval {
namespace {

// A translator [d, d] (out x in, f32) as a GEMM weight.
WeightOperand TranslatorOperand(const TunedLens& lens, int64_t i) {
  WeightOperand w;
  w.data = lens.W(i);
  w.format = {FormatKind::kDense, DType::kF32, MatrixLayout::kOutIn};
  w.n = w.k = lens.d_model;
  return w;
}

}  // namespace

Status CheckLensTopK(int64_t k, int64_t vocab, int64_t min_k,
                     const std::string& what) {
  if (k < min_k || k > vocab)
    return InvalidArgumentError(what + ": " + std::to_string(k) +
                                " is outside [" + std::to_string(min_k) +
                                ", " + std::to_string(vocab) +
                                "] (the vocabulary)");
  return Status();
}

StatusOr<std::unique_ptr<Lens>> Lens::Create(const Model& model,
                                             const TunedLens* tuned,
                                             int64_t chunk_rows,
                                             Backend* backend) {
  const ModelConfig& c = model.config();
  if (tuned != nullptr) {
    if (tuned->d_model != c.hidden_size)
      return InvalidArgumentError(
          tuned->path + ": the tuned lens is for d_model " +
          std::to_string(tuned->d_model) + ", the model's hidden size is " +
          std::to_string(c.hidden_size));
    if (tuned->num_layers != c.num_layers)
      return InvalidArgumentError(
          tuned->path + ": the tuned lens has " +
          std::to_string(tuned->num_layers) + " translators, the model " +
          std::to_string(c.num_layers) + " layers (one translator each)");
  }
  auto lens = std::unique_ptr<Lens>(new Lens(model, tuned));
  if (backend == nullptr) {
    ASSIGN_OR_RETURN(lens->owned_backend_, CreateBackend("cpu"));
    backend = lens->owned_backend_.get();
  }
  lens->backend_ = backend;
  ASSIGN_OR_RETURN(lens->head_, LogitsHead::Create(model, chunk_rows, backend));
  const int64_t H = c.hidden_size;
  const KernelCosts costs = backend->Costs();
  ArenaPlan plan;
  const int64_t rows_bytes = chunk_rows * H * int64_t{sizeof(float)};
  plan.Append(BufferId::kResidual, "lens input rows [C, H]", rows_bytes);
  plan.Append(BufferId::kFinalNorm, "lens final norm [C, H]", rows_bytes);
  int64_t scratch = 0;
  if (tuned != nullptr) {
    plan.Append(BufferId::kGemmInputCopy, "lens translator input copy",
                costs.gemm_workspace
                    ? costs.gemm_workspace(chunk_rows, H, DType::kF32)
                    : 0);
    // The head's scratchpad serves the translators too when large enough.
    const int64_t need =
        costs.gemm_scratchpad
            ? costs.gemm_scratchpad(chunk_rows, H, H, DType::kF32, false)
            : 0;
    if (need > lens->head_->scratchpad_bytes()) scratch = need;
    plan.Append(BufferId::kGemmScratchpad, "lens GEMM scratchpad", scratch);
  }
  ASSIGN_OR_RETURN(lens->arena_, Arena::Allocate(plan, *backend));
  if (scratch > 0)
    backend->SetGemmScratchpad(lens->arena_.region(BufferId::kGemmScratchpad),
                               scratch);
  lens->order_.resize(static_cast<size_t>(c.vocab_size));
  return lens;
}

Status Lens::Run(const HookPoint& hook, const float* resid, int64_t rows,
                 const LensOutputs& out) {
  const ModelConfig& c = model_.config();
  ASSIGN_OR_RETURN(const int64_t t, CheckLensHook(hook, c, tuned_));
  RETURN_IF_ERROR(CheckLensTopK(out.topk, c.vocab_size, 0, "lens top-k"));
  LOOM_CHECK(out.topk == 0 ||
             (out.topk_ids != nullptr && out.topk_logits != nullptr));
  const int64_t H = c.hidden_size;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows()) {
    const int64_t n = std::min(chunk_rows(), rows - r0);
    RunChunk(t, resid + r0 * H, n, r0, out);
  }
  return Status();
}

void Lens::RunChunk(int64_t t, const float* resid, int64_t rows, int64_t row0,
                    const LensOutputs& out) {
  const ModelConfig& c = model_.config();
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const float* x = resid;
  if (t >= 0) {
    // x' = x + (x W_t^T + b_t), tuned-lens's order of operations.
    float* moved = arena_.as<float>(BufferId::kResidual);
    GemmOp op;
    op.x = resid;
    op.m = rows;
    op.w = TranslatorOperand(*tuned_, t);
    op.bias = tuned_->b(t);
    op.y = moved;
    op.workspace = arena_.region(BufferId::kGemmInputCopy);
    backend_->Gemm(op);
    for (int64_t i = 0; i < rows * H; ++i) moved[i] += resid[i];
    x = moved;
  }
  if (out.translated != nullptr)
    std::memcpy(out.translated + row0 * H, x, sizeof(float) * rows * H);
  float* normed = arena_.as<float>(BufferId::kFinalNorm);
  ComputeFinalNorm(c, model_.weights(), *backend_, false, x, normed, rows);
  const float* logits = head_->Compute(normed, rows);
  if (out.logits != nullptr)
    std::memcpy(out.logits + row0 * V, logits, sizeof(float) * rows * V);
  if (out.topk == 0) return;
  const int64_t k = out.topk;
  if (k * 8 <= V) {
    // The one-pass top-k allocates nothing: rows in parallel, each alone.
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      TopKDescending(logits + r * V, V, k, out.topk_ids + (row0 + r) * k,
                     out.topk_logits + (row0 + r) * k);
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    TopKDescending(logits + r * V, V, k, out.topk_ids + (row0 + r) * k,
                   out.topk_logits + (row0 + r) * k, &order_);
}

}  // namespace loom::eval
