// LogitsHead: the model's lm_head (and final logit softcap) applied to a chunk
// of final-norm rows, into a preallocated [chunk, vocab] buffer. Evaluation
// captures ln_final.hook_normalized ([T, hidden], cheap) and computes logits
// only for the rows it scores, chunk by chunk, so logits memory stays
// O(chunk x vocab) and two models' logits for the same rows can be held at
// once (compare). Mirrors the executor's lm_head step exactly (same
// ComputeLogits through the Backend interface).
#ifndef LOOM_EVAL_LOGITS_HEAD_H_
#define LOOM_EVAL_LOGITS_HEAD_H_

#include <cstdint>
#include <memory>

#include "src/backend/backend.h"
#include "src/base/status.h"
#include "src/runtime/arena.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"

namespace loom::eval {

class LogitsHead {
 public:
  // `backend` (not owned; one not shared with another consumer) runs the
  // head; null = a CPU backend owned by the head. `weights`: the lm_head to
  // use (a device's copy, e.g. Executor::Device::weights); null = the
  // model's.
  static StatusOr<std::unique_ptr<LogitsHead>> Create(
      const Model& model, int64_t chunk_rows, Backend* backend = nullptr,
      const BoundWeights* weights = nullptr);

  // logits [rows, vocab] (row stride vocab) of hidden [rows, hidden_size]
  // (row stride hidden_size), rows <= chunk_rows(). Valid until the next call.
  const float* Compute(const float* hidden, int64_t rows);

  // lse[r] = logsumexp(logits[r, :]) of the last Compute, in double.
  void LogSumExp(int64_t rows, double* lse) const;
  // logprob[r] = logits[r, targets[r]] - lse[r] of the last Compute, in
  // double (targets, logprob: host memory).
  void TargetLogProbs(int64_t rows, const int32_t* targets,
                      double* logprob) const;
  Backend& backend() const { return *backend_; }

  int64_t chunk_rows() const { return chunk_rows_; }
  int64_t vocab() const { return vocab_; }
  int64_t hidden() const { return hidden_; }
  int64_t bytes() const { return arena_.bytes(); }
  // The GEMM scratchpad it gave its backend (bytes; 0: none).
  int64_t scratchpad_bytes() const { return scratchpad_bytes_; }

 private:
  LogitsHead(const Model& model, int64_t chunk_rows);
  const Model& model_;
  int64_t chunk_rows_, vocab_, hidden_;
  std::unique_ptr<Backend> owned_backend_;
  Backend* backend_ = nullptr;
  const BoundWeights* weights_ = nullptr;
  Arena arena_;
  int64_t scratchpad_bytes_ = 0;
};

// Index of the first maximum of x[0, n).
int64_t ArgMax(const float* x, int64_t n);

}  // namespace loom::eval

#endif  // LOOM_EVAL_LOGITS_HEAD_H_
