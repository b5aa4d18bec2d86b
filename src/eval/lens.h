// Lens: the logit lens or a tuned lens (src/model/lens.h) run on rows of a
// residual stream of a loaded model, chunk by chunk:
//   x       = resid rows [C, H]          (tuned: x + (x W_i^T + b_i))
//   normed  = the model's final norm of x (the executor's ComputeFinalNorm)
//   logits  = the model's head of normed (lm_head, logit scaling, softcap:
//             ComputeLogits, through LogitsHead)
//   top-k   = the k largest logits per row, descending, ties to the lower
//             token id (src/core/topk.h)
// Only one chunk of [C, V] logits exists at a time. Every step is per row,
// so a row's outputs depend on that row alone (not on the other rows of the
// call, the chunk size or the thread count), and the logit lens of the last
// layer's hook_resid_post is the model's own logits bit for bit.
#ifndef LOOM_EVAL_LENS_H_
#define LOOM_EVAL_LENS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "src/backend/backend.h"
#include "src/base/status.h"
#include "src/eval/logits_head.h"
#include "src/model/lens.h"
#include "src/runtime/arena.h"
#include "src/runtime/model.h"

namespace loom::eval {

// Where Run writes: logits and translated may be null (not kept); with
// topk > 0, topk_ids and topk_logits are both given.
struct LensOutputs {
  int64_t topk = 0;
  int32_t* topk_ids = nullptr;   // [rows, topk]
  float* topk_logits = nullptr;  // [rows, topk]
  float* logits = nullptr;       // [rows, V]
  float* translated = nullptr;   // [rows, H] the tuned lens's x (else resid)
};

// The one check of a lens's top-k: `k` in [min_k, vocab] (a grid cell
// shows at least one token: min_k 1); InvalidArgument "<what>: k is outside
// [min_k, vocab] (the vocabulary)" otherwise.
Status CheckLensTopK(int64_t k, int64_t vocab, int64_t min_k,
                     const std::string& what);

class Lens {
 public:
  // `tuned`: the translators (null: the logit lens), which must outlive the
  // lens and match the model (d_model = hidden size, one per layer; an error
  // names both otherwise). `backend`: a host backend not shared with another
  // consumer (null: a CPU backend owned by the lens).
  static StatusOr<std::unique_ptr<Lens>> Create(const Model& model,
                                                const TunedLens* tuned,
                                                int64_t chunk_rows,
                                                Backend* backend = nullptr);

  // The lens of resid [rows, H] (host memory, row stride H) read at `hook`,
  // a residual hook of the model (IsLensSite; a tuned lens: one with a
  // translator, TunedLensTranslator). topk in [0, V].
  Status Run(const HookPoint& hook, const float* resid, int64_t rows,
             const LensOutputs& out);

  int64_t chunk_rows() const { return head_->chunk_rows(); }
  int64_t vocab() const { return head_->vocab(); }
  // The bytes it holds besides the model: its arena and the head's.
  int64_t bytes() const { return arena_.bytes() + head_->bytes(); }

 private:
  Lens(const Model& model, const TunedLens* tuned)
      : model_(model), tuned_(tuned) {}
  // One chunk of rows <= chunk_rows(), the translator `t` (-1: none).
  void RunChunk(int64_t t, const float* resid, int64_t rows, int64_t row0,
                const LensOutputs& out);
  const Model& model_;
  const TunedLens* tuned_;
  std::unique_ptr<Backend> owned_backend_;
  Backend* backend_ = nullptr;
  std::unique_ptr<LogitsHead> head_;
  Arena arena_;
  std::vector<int32_t> order_;  // top-k scratch, [V]
};

}  // namespace loom::eval

#endif  // LOOM_EVAL_LENS_H_
