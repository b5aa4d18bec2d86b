// Row preparation for `loom extract`: reading input rows (JSONL objects with
// "text" or "tokens", or plain text lines) from a byte offset, and turning
// each into the token ids the forward runs, or a reason it is skipped.
#ifndef LOOM_EVAL_EXTRACT_ROWS_H_
#define LOOM_EVAL_EXTRACT_ROWS_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/eval/extract_settings.h"
#include "src/eval/input.h"
#include "src/eval/row_selector.h"
#include "src/model/config.h"
#include "src/tokenizer/tokenizer.h"

namespace loom {

// One input row as read.
struct InputRow {
  int64_t index = 0;  // 0-based row number in the input
  nlohmann::json id;  // the row's "id", else its index
  std::string text;
  bool has_tokens = false;
  std::vector<int32_t> tokens;
  std::string error;  // non-empty: the row is bad
};

// Reads rows sequentially from a byte offset. JSONL when the extension is
// .jsonl/.json or the first non-blank byte is '{'; otherwise one prompt per
// line. Not thread-safe.
class InputReader {
 public:
  // NotFound if the file cannot be opened; `first_index` numbers the row at
  // `offset`.
  static StatusOr<std::unique_ptr<InputReader>> Open(const std::string& path,
                                                     int64_t offset,
                                                     int64_t first_index);
  ~InputReader();
  InputReader(const InputReader&) = delete;
  InputReader& operator=(const InputReader&) = delete;

  // Reads the next row; false at end of input. Bad rows are returned with
  // `error` set (IoError only for read failures).
  StatusOr<bool> Next(InputRow* row, bool replace_invalid_utf8);
  // Passes over up to `n` rows without parsing them (another shard's);
  // returns how many there were (fewer than `n`: the input ended).
  StatusOr<int64_t> Skip(int64_t n);
  // Byte offset of the next row, and its index.
  int64_t offset() const { return offset_; }
  int64_t next_index() const { return next_index_; }

 private:
  InputReader() = default;
  void ParseJsonRow(std::string_view line, InputRow* row) const;
  // The next row's line (blank JSONL lines passed over), without its line
  // end; false at end of input.
  StatusOr<bool> NextLine(std::string_view* line);

  std::string path_;
  FILE* file_ = nullptr;
  char* line_ = nullptr;
  size_t cap_ = 0;
  bool jsonl_ = false;
  int64_t offset_ = 0;
  int64_t next_index_ = 0;
};

// A row of the current commit window, ready to run (or skipped).
struct PreparedRow {
  int64_t index = 0;
  nlohmann::json id;
  std::vector<int32_t> ids;  // token ids, BOS included
  std::string reason;        // non-empty: skipped
  bool ok() const { return reason.empty(); }
  int64_t size() const { return static_cast<int64_t>(ids.size()); }
};

// Tokenizes and validates rows: template, BOS rule, length limits (the
// model's positions; --batch-tokens, or --max-row-tokens when long rows are
// streamed), the vocabulary, and that every selector fits the row.
class RowPreparer {
 public:
  struct Options {
    std::string template_text;  // "{text}" placeholder; empty = none
    eval::AddBos add_bos = eval::AddBos::kAuto;
    bool replace_invalid_utf8 = false;
    int64_t batch_tokens = 0;
    // Rows of batch_tokens < n <= max_row_tokens are streamed (0 = off:
    // longer than batch_tokens is a row error).
    int64_t max_row_tokens = 0;
    int64_t max_positions = 0;
    int64_t vocab_size = 0;
    int64_t config_bos_id = -1;  // for token rows
    // The job's interventions (borrowed; null = none): a row whose positions
    // they do not fit is a row error.
    const std::vector<Intervention>* interventions = nullptr;
  };
  // `tokenizer` may be null (token-id rows work without one; text rows are
  // then skipped with `tokenizer_error`). Borrowed: tokenizer and selectors.
  RowPreparer(Options options, const tok::Tokenizer* tokenizer,
              std::string tokenizer_error,
              const std::vector<RowSelector>* selectors)
      : o_(std::move(options)),
        tokenizer_(tokenizer),
        tokenizer_error_(std::move(tokenizer_error)),
        selectors_(selectors) {}

  PreparedRow Prepare(InputRow row) const;

 private:
  // Token ids of a text row, or the reason it cannot be encoded.
  std::string Encode(const std::string& text, std::vector<int32_t>* ids) const;
  // Why a row of these ids cannot run ("" if it can).
  std::string Validate(const std::vector<int32_t>& ids) const;
  // Why a selector does not fit a row of `n` tokens ("" if all fit).
  std::string CheckSelectors(int64_t n) const;

  Options o_;
  const tok::Tokenizer* tokenizer_;
  std::string tokenizer_error_;
  const std::vector<RowSelector>* selectors_;
};

// Reads up to `max_rows` rows and prepares them. With OnError::kFail the
// first bad row is an InvalidArgument naming it (`committed_rows` are kept).
// `*eof` is set when the input ends.
StatusOr<std::vector<PreparedRow>> ReadWindow(
    InputReader& reader, const RowPreparer& preparer, int64_t max_rows,
    bool replace_invalid_utf8, OnError on_error, int64_t committed_rows,
    bool* eof);

}  // namespace loom

#endif  // LOOM_EVAL_EXTRACT_ROWS_H_
