// Batch packing for `loom extract`: the runnable rows of one commit window
// that fit a batch, longest first (stable, so ties keep input order), packed
// greedily into batches of at most `batch_tokens` tokens. A window always
// packs the same way, which is what makes a resumed job byte-identical. Rows
// longer than a batch (--streaming-chunk-size) are left to StreamedRows.

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
  // Borrows `window`; its ok rows longer than `batch_tokens` are left out.
  BatchPacker(const std::vector<PreparedRow>& window, int64_t batch_tokens);
  // Fills the next batch (reusing its buffers); false when all rows ran.
  bool Next(PackedBatch* batch);

 private:
  const std::vector<PreparedRow>& window_;
  int64_t batch_tokens_;
  std::vector<int64_t> order_;  // ok rows, longest first
  size_t next_ = 0;
};

// The window slots of the ok rows longer than `batch_tokens` (streamed one
// at a time, in window order).
std::vector<int64_t> StreamedRows(const std::vector<PreparedRow>& window,
                                  int64_t batch_tokens);

}  // namespace loom

#endif  // LOOM_EVAL_EXTRACT_BATCHES_H_
