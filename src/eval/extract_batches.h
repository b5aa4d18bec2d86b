// Batch packing for `loom extract`: the runnable rows of one commit window,
// longest first (stable, so ties keep input order), packed greedily into
// batches of at most `batch_tokens` tokens. A window always packs the same
// way, which is what makes a resumed job byte-identical.
#ifndef LOOM_EVAL_EXTRACT_BATCHES_H_
#define LOOM_EVAL_EXTRACT_BATCHES_H_

#include <cstdint>
#include <vector>

#include "src/eval/extract_rows.h"

namespace loom {

// One batch: the concatenated ids, the sequence starts and the window slot
// each sequence fills.
struct PackedBatch {
  std::vector<int32_t> ids;     // [sum of lengths]
  std::vector<int64_t> starts;  // [num_seqs + 1], starts[0] = 0
  std::vector<int64_t> slots;   // [num_seqs]: index into the window
};

class BatchPacker {
 public:
  // Borrows `window` (rows longer than `batch_tokens` must be skipped rows).
  BatchPacker(const std::vector<PreparedRow>& window, int64_t batch_tokens);
  // Fills the next batch (reusing its buffers); false when all rows ran.
  bool Next(PackedBatch* batch);

 private:
  const std::vector<PreparedRow>& window_;
  int64_t batch_tokens_;
  std::vector<int64_t> order_;  // ok rows, longest first
  size_t next_ = 0;
};

}  // namespace loom

#endif  // LOOM_EVAL_EXTRACT_BATCHES_H_
