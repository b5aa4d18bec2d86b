#include "src/eval/extract_batches.h"

#include <algorithm>

namespace loom {

BatchPacker::BatchPacker(const std::vector<PreparedRow>& window,
                         int64_t batch_tokens)
    : window_(window), batch_tokens_(batch_tokens) {
  for (int64_t s = 0; s < static_cast<int64_t>(window.size()); ++s)
    if (window[s].ok() && window[s].size() <= batch_tokens) order_.push_back(s);
  std::stable_sort(order_.begin(), order_.end(), [&](int64_t a, int64_t b) {
    return window[a].ids.size() > window[b].ids.size();
  });
}

bool BatchPacker::Next(PackedBatch* b) {
  if (next_ >= order_.size()) return false;
  b->ids.clear();
  b->starts.assign(1, 0);
  b->slots.clear();
  while (next_ < order_.size() &&
         static_cast<int64_t>(b->ids.size()) + window_[order_[next_]].size() <=
             batch_tokens_) {
    const PreparedRow& p = window_[order_[next_]];
    b->ids.insert(b->ids.end(), p.ids.begin(), p.ids.end());
    b->starts.push_back(static_cast<int64_t>(b->ids.size()));
    b->slots.push_back(order_[next_]);
    ++next_;
  }
  // Rows are validated to fit a batch; an empty batch would never advance.
  LOOM_CHECK(!b->slots.empty()) << "a row exceeds --batch-tokens";
  return true;
}

std::vector<int64_t> StreamedRows(const std::vector<PreparedRow>& window,
                                  int64_t batch_tokens) {
  std::vector<int64_t> slots;
  for (int64_t s = 0; s < static_cast<int64_t>(window.size()); ++s)
    if (window[s].ok() && window[s].size() > batch_tokens) slots.push_back(s);
  return slots;
}

}  // namespace loom
