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
  ArenaPlan plan;
  auto add = [&](const char* name, int64_t bytes) {
    PlannedRegion r;
    r.name = name;
    r.bytes = bytes;
    r.offset = plan.total_bytes;
    plan.total_bytes +=
        (bytes + ArenaPlan::kAlign - 1) / ArenaPlan::kAlign * ArenaPlan::kAlign;
    plan.regions.push_back(r);
  };
  add("eval logits chunk [C, V]",
      chunk_rows * head->vocab_ * int64_t{sizeof(float)});
  add("eval lm_head input copy",
      cpu::GemmWorkspaceBytes(chunk_rows, head->hidden_, w.dtype));
  const bool out_in =
      model.weights().Layout(WeightRole::kLmHead) == MatrixLayout::kOutIn;
  const int64_t scratch = cpu::GemmScratchpadBytes(
      chunk_rows, head->vocab_, head->hidden_, w.dtype,
      out_in ? cpu::WeightLayout::kOutIn : cpu::WeightLayout::kInOut);
  add("eval lm_head scratchpad", scratch);
  plan.naive_bytes = plan.total_bytes;
  ASSIGN_OR_RETURN(head->arena_, Arena::Allocate(plan));
  if (scratch > 0)
    head->gemm_.SetScratchpad(head->arena_.region("eval lm_head scratchpad"),
                              scratch);
  return head;
}

const float* LogitsHead::Compute(const float* hidden, int64_t rows) {
  LOOM_CHECK(rows > 0 && rows <= chunk_rows_)
      << "rows=" << rows << " chunk_rows=" << chunk_rows_;
  float* logits = arena_.as<float>("eval logits chunk [C, V]");
  ComputeLogits(model_, gemm_, hidden, rows, logits,
                arena_.region("eval lm_head input copy"));
  return logits;
}

void LogitsHead::LogSumExp(int64_t rows, double* lse) const {
  cpu::LogSumExp(arena_.as<float>("eval logits chunk [C, V]"), rows, vocab_,
                 lse);
}

int64_t ArgMax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace loom::eval
