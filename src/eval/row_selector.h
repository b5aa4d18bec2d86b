// Row selectors of `loom extract`: which token positions of each prompt are
// kept ("last", "first", "mean", "max", "all", "pos:I[,J...]", "span:A:B").
#ifndef LOOM_EVAL_ROW_SELECTOR_H_
#define LOOM_EVAL_ROW_SELECTOR_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"

namespace loom {

// A selector: which token positions of each row are kept.
struct RowSelector {
  enum class Kind { kLast, kFirst, kMean, kMax, kAll, kPos, kSpan };
  Kind kind = Kind::kLast;
  std::vector<int64_t> positions;  // kPos (negative = from the end)
  int64_t span_begin = 0,
          span_end = 0;   // kSpan [begin, end), negative = from the end
  std::string spec;       // as written: "pos:0,-1"
  std::string file_name;  // file-safe: "pos_0_-1"
  bool ragged() const { return kind == Kind::kAll || kind == Kind::kSpan; }
  // mean / max: one row reduced over all positions.
  bool reduced() const { return kind == Kind::kMean || kind == Kind::kMax; }
  // Rows per prompt for fixed-size selectors (pos: the number of positions).
  int64_t rows_per_prompt() const {
    return kind == Kind::kPos ? static_cast<int64_t>(positions.size()) : 1;
  }
};

// "last", "first", "mean", "max", "all", "pos:I[,J...]", "span:A:B".
StatusOr<RowSelector> ParseRowSelector(const std::string& text);

// "last", "first", ..., "pos", "span".
std::string_view SelectorKindName(RowSelector::Kind kind);

// Token positions [begin, end) of a row.
struct SpanRange {
  int64_t begin = 0, end = 0;
};
// The positions `s` (kAll or kSpan) takes from a row of `len` tokens; false
// when a span falls outside the row.
bool ResolveSpan(const RowSelector& s, int64_t len, SpanRange* r);
// A pos selector's position `q` in a row of `len` tokens (negative = from the
// end); may be outside [0, len).
inline int64_t ResolvePosition(int64_t q, int64_t len) {
  return q < 0 ? len + q : q;
}

// Whether `s` can select from some run of at most `most_rows` rows (a
// generation capturing the prompt and each fed token: prompt + max_tokens -
// 1): OutOfRange naming the selector and the bound when no run can, so that
// a request is refused before it generates (pos:40 of a 6-token prompt and
// 4 new tokens).
Status CheckSelectorCanFit(const RowSelector& s, int64_t most_rows);

// A row selector applied to captured rows [n, cols] held in memory (serve's
// and generate's captures): last, first, mean (double sums), max, all,
// pos:..., span:A:B. Returns the selected rows [k, cols] (*out_rows = k);
// no rows, or a position or span outside them, is OutOfRange naming it and
// n.
StatusOr<std::vector<float>> SelectRows(const RowSelector& s, const float* rows,
                                        int64_t n, int64_t cols,
                                        int64_t* out_rows);

}  // namespace loom

#endif  // LOOM_EVAL_ROW_SELECTOR_H_
