#include "src/eval/logits_head.h"

#include "src/backend/registry.h"
#include "src/base/check.h"
#include "src/base/units.h"

namespace loom::eval {

LogitsHead::LogitsHead(const Model& model, int64_t chunk_rows)
    : model_(model),
      chunk_rows_(chunk_rows),
      vocab_(model.config().vocab_size),
      hidden_(model.config().hidden_size) {}

StatusOr<std::unique_ptr<LogitsHead>> LogitsHead::Create(
    const Model& model, int64_t chunk_rows, Backend* backend,
    const BoundWeights* weights) {
  if (chunk_rows <= 0)
    return InvalidArgumentError("logits chunk rows must be > 0, got " +
                                std::to_string(chunk_rows));
  auto head = std::unique_ptr<LogitsHead>(new LogitsHead(model, chunk_rows));
  if (backend == nullptr) {
    ASSIGN_OR_RETURN(head->owned_backend_, CreateBackend("cpu"));
    backend = head->owned_backend_.get();
  }
  head->backend_ = backend;
  head->weights_ = weights != nullptr ? weights : &model.weights();
  const KernelCosts costs = backend->Costs();
  // A quantized lm_head computes in the model's compute dtype.
  const WeightOperand w =
      WeightOperandOf(*head->weights_, WeightRole::kLmHead, -1);
  const DType w_dtype = w.gemm_dtype();
  ArenaPlan plan;
  plan.Append(BufferId::kLogitsChunk, "eval logits chunk [C, V]",
              chunk_rows * head->vocab_ * int64_t{sizeof(float)});
  plan.Append(BufferId::kGemmInputCopy, "eval lm_head input copy",
              costs.gemm_workspace
                  ? costs.gemm_workspace(chunk_rows, head->hidden_, w_dtype)
                  : 0);
  const bool k_major = w.format.layout == MatrixLayout::kInOut;
  const int64_t scratch =
      costs.gemm_scratchpad
          ? costs.gemm_scratchpad(chunk_rows, head->vocab_, head->hidden_,
                                  w_dtype, k_major)
          : 0;
  plan.Append(BufferId::kGemmScratchpad, "eval lm_head scratchpad", scratch);
  const int64_t decode =
      w.quantized() && costs.weight_decode_workspace
          ? costs.weight_decode_workspace(w.n, w.k, w.format.kind, w_dtype)
          : 0;
  if (decode > 0)
    plan.Append(BufferId::kWeightDecode, "eval lm_head decode", decode);
  ASSIGN_OR_RETURN(head->arena_, Arena::Allocate(plan, *backend));
  head->scratchpad_bytes_ = scratch;
  if (scratch > 0)
    backend->SetGemmScratchpad(head->arena_.region(BufferId::kGemmScratchpad),
                               scratch);
  if (decode > 0)
    backend->SetWeightDecodeWorkspace(
        head->arena_.region(BufferId::kWeightDecode), decode);
  return head;
}

const float* LogitsHead::Compute(const float* hidden, int64_t rows) {
  LOOM_CHECK(rows > 0 && rows <= chunk_rows_)
      << "rows=" << rows << " chunk_rows=" << chunk_rows_;
  float* logits = arena_.as<float>(BufferId::kLogitsChunk);
  ComputeLogits(model_.config(), *weights_, *backend_, hidden, rows, logits,
                arena_.region(BufferId::kGemmInputCopy));
  return logits;
}

void LogitsHead::LogSumExp(int64_t rows, double* lse) const {
  backend_->LogSumExp(arena_.as<float>(BufferId::kLogitsChunk), rows, vocab_,
                      lse);
}

void LogitsHead::TargetLogProbs(int64_t rows, const int32_t* targets,
                                double* logprob) const {
  backend_->TargetLogProbs(arena_.as<float>(BufferId::kLogitsChunk), rows,
                           vocab_, targets, logprob);
}

int64_t ArgMax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace loom::eval
