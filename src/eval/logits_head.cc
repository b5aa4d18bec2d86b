#include "src/eval/logits_head.h"

#include "src/base/check.h"

namespace loom::eval {

LogitsHead::LogitsHead(const Model& model, int64_t chunk_rows)
    : model_(model),
      chunk_rows_(chunk_rows),
      vocab_(model.config().vocab_size),
      hidden_(model.config().hidden_size) {}

StatusOr<std::unique_ptr<LogitsHead>> LogitsHead::Create(const Model& model,
                                                         int64_t chunk_rows) {
  if (chunk_rows <= 0)
    return InvalidArgumentError("logits chunk rows must be > 0, got " +
                                std::to_string(chunk_rows));
  auto head = std::unique_ptr<LogitsHead>(new LogitsHead(model, chunk_rows));
  const TensorView& w = model.weights().Require(WeightRole::kLmHead);
  ArenaLayout layout;
  head->logits_ =
      layout.Add("eval logits chunk [C, V]",
                 chunk_rows * head->vocab_ * int64_t{sizeof(float)});
  head->workspace_ =
      layout.Add("eval lm_head input copy",
                 cpu::GemmWorkspaceBytes(chunk_rows, head->hidden_, w.dtype));
  ASSIGN_OR_RETURN(head->arena_, Arena::Allocate(layout));
  return head;
}

const float* LogitsHead::Compute(const float* hidden, int64_t rows) {
  LOOM_CHECK(rows > 0 && rows <= chunk_rows_)
      << "rows=" << rows << " chunk_rows=" << chunk_rows_;
  const TensorView& w = model_.weights().Require(WeightRole::kLmHead);
  const bool out_in =
      model_.weights().Layout(WeightRole::kLmHead) == MatrixLayout::kOutIn;
  float* logits = arena_.as<float>(logits_);
  cpu::GemmArgs a;
  a.x = hidden;
  a.w = w.data;
  a.w_dtype = w.dtype;
  a.layout = out_in ? cpu::WeightLayout::kOutIn : cpu::WeightLayout::kInOut;
  a.n = out_in ? w.shape[0] : w.shape[1];
  a.k = out_in ? w.shape[1] : w.shape[0];
  LOOM_CHECK(a.n == vocab_ && a.k == hidden_)
      << "lm_head shape " << a.n << "x" << a.k;
  a.m = rows;
  a.y = logits;
  a.ldy = vocab_;
  a.workspace = arena_.region(workspace_);
  gemm_.Gemm(a);
  const float cap = model_.config().final_softcap;
  if (cap > 0) cpu::Softcap(logits, rows * vocab_, cap);
  return logits;
}

void LogitsHead::LogSumExp(int64_t rows, double* lse) const {
  cpu::LogSumExp(arena_.as<float>(logits_), rows, vocab_, lse);
}

int64_t ArgMax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace loom::eval
