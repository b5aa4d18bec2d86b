#include "src/eval/extract_rows.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "src/core/json_error.h"
#include "src/tokenizer/utf8.h"

namespace loom {
namespace {

using Json = nlohmann::json;

// Prepends `bos` unless the ids already start with it (--add-bos yes).
void EnsureBos(int64_t bos, std::vector<int32_t>* ids) {
  if (bos < 0) return;
  if (ids->empty() || (*ids)[0] != bos)
    ids->insert(ids->begin(), static_cast<int32_t>(bos));
}

// The "tokens" array of a JSONL row, or the reason it is bad.
std::string ParseTokens(const Json& tokens, std::vector<int32_t>* out) {
  if (!tokens.is_array()) return "'tokens' is not an array";
  for (const auto& t : tokens) {
    if (!t.is_number_integer())
      return "'tokens' holds " +
             t.dump(-1, ' ', false, Json::error_handler_t::replace) +
             ", expected integers";
    const int64_t v = t.get<int64_t>();
    if (v < 0 || v > std::numeric_limits<int32_t>::max())
      return "token id " + std::to_string(v) + " is out of range";
    out->push_back(static_cast<int32_t>(v));
  }
  return "";
}

}  // namespace

// ---- InputReader ------------------------------------------------------------

StatusOr<std::unique_ptr<InputReader>> InputReader::Open(
    const std::string& path, int64_t offset, int64_t first_index) {
  auto r = std::unique_ptr<InputReader>(new InputReader());
  r->path_ = path;
  r->file_ = std::fopen(path.c_str(), "rb");
  if (!r->file_)
    return NotFoundError("--input " + path +
                         ": cannot open: " + std::strerror(errno));
  const std::string ext = std::filesystem::path(path).extension().string();
  r->jsonl_ = ext == ".jsonl" || ext == ".json";
  if (!r->jsonl_) {
    int c;
    while ((c = std::fgetc(r->file_)) != EOF && std::isspace(c)) {
    }
    r->jsonl_ = c == '{';
  }
  if (::fseeko(r->file_, offset, SEEK_SET) != 0)
    return IoError(path + ": seek failed");
  r->offset_ = offset;
  r->next_index_ = first_index;
  return r;
}

InputReader::~InputReader() {
  if (file_) std::fclose(file_);
  std::free(line_);
}

StatusOr<bool> InputReader::NextLine(std::string_view* out) {
  for (;;) {
    const ssize_t n = ::getline(&line_, &cap_, file_);
    if (n < 0) {
      if (std::ferror(file_))
        return IoError(path_ + ": read error: " + std::strerror(errno));
      return false;
    }
    offset_ += n;
    std::string_view line(line_, static_cast<size_t>(n));
    if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (jsonl_ && line.find_first_not_of(" \t") == std::string_view::npos)
      continue;  // blank JSONL line
    *out = line;
    return true;
  }
}

StatusOr<int64_t> InputReader::Skip(int64_t n) {
  int64_t skipped = 0;
  std::string_view line;
  while (skipped < n) {
    ASSIGN_OR_RETURN(bool got, NextLine(&line));
    if (!got) break;
    ++skipped;
    ++next_index_;
  }
  return skipped;
}

StatusOr<bool> InputReader::Next(InputRow* row, bool replace_invalid_utf8) {
  std::string_view line;
  ASSIGN_OR_RETURN(bool got, NextLine(&line));
  if (!got) return false;
  *row = InputRow();
  row->index = next_index_++;
  row->id = row->index;
  const size_t bad = tok::FindInvalidUtf8(line);
  if (bad != std::string_view::npos && (jsonl_ || !replace_invalid_utf8)) {
    row->error =
        "invalid UTF-8 at byte " + std::to_string(bad) + " of the line";
  } else if (!jsonl_) {
    row->text = std::string(line);
  } else {
    ParseJsonRow(line, row);
  }
  return true;
}

void InputReader::ParseJsonRow(std::string_view line, InputRow* row) const {
  const Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    const JsonParseError e = LocateJsonError(line);
    row->error = "malformed JSON at byte " + std::to_string(e.offset) +
                 " of the line (" + std::to_string(line.size()) +
                 " bytes): " + e.what;
    return;
  }
  if (!j.is_object()) {
    row->error = std::string("not a JSON object (a JSON ") + j.type_name() +
                 "); rows are {\"text\": ...} or {\"tokens\": [...]}";
    return;
  }
  if (const auto id = j.find("id"); id != j.end() && !id->is_null())
    row->id = *id;
  if (j.contains("tokens") && j.contains("text")) {
    row->error =
        "the row has both 'text' and 'tokens'; give one (tokens are used "
        "as they are, text goes through the tokenizer)";
    return;
  }
  if (const auto tokens = j.find("tokens"); tokens != j.end()) {
    row->has_tokens = true;
    row->error = ParseTokens(*tokens, &row->tokens);
  } else if (const auto text = j.find("text");
             text != j.end() && text->is_string()) {
    row->text = text->get<std::string>();
  } else {
    row->error = "the row has neither a 'text' string nor a 'tokens' array";
  }
}

// ---- RowPreparer ------------------------------------------------------------

PreparedRow RowPreparer::Prepare(InputRow row) const {
  PreparedRow p;
  p.index = row.index;
  p.id = std::move(row.id);
  p.reason = std::move(row.error);
  if (!p.ok()) return p;
  if (row.has_tokens) {
    p.ids = std::move(row.tokens);
    if (o_.add_bos == eval::AddBos::kYes) EnsureBos(o_.config_bos_id, &p.ids);
  } else {
    p.reason = Encode(row.text, &p.ids);
  }
  if (p.ok()) p.reason = Validate(p.ids);
  if (p.ok() && o_.interventions != nullptr)
    p.reason = CheckInterventionsFit(*o_.interventions, p.index, p.size());
  return p;
}

std::string RowPreparer::Encode(const std::string& text,
                                std::vector<int32_t>* ids) const {
  if (text.empty()) return "empty text";
  if (!tokenizer_) return "no tokenizer: " + tokenizer_error_;
  std::string prompt = text;
  if (!o_.template_text.empty()) {
    prompt = o_.template_text;
    prompt.replace(prompt.find("{text}"), 6, text);
  }
  tok::EncodeOptions eo;
  eo.add_special_tokens = o_.add_bos != eval::AddBos::kNo;
  eo.invalid_utf8 = o_.replace_invalid_utf8 ? tok::InvalidUtf8Policy::kReplace
                                            : tok::InvalidUtf8Policy::kError;
  StatusOr<tok::Encoding> enc = tokenizer_->Encode(prompt, eo);
  if (!enc.ok()) return enc.status().message();
  *ids = std::move(enc->ids);
  if (o_.add_bos == eval::AddBos::kYes) EnsureBos(tokenizer_->bos_id(), ids);
  return "";
}

std::string RowPreparer::Validate(const std::vector<int32_t>& ids) const {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n == 0) return "empty: no tokens";
  if (n > o_.max_positions)
    return "too long for the model: " + std::to_string(n) +
           " tokens > max_position_embeddings " +
           std::to_string(o_.max_positions);
  if (n > o_.batch_tokens && o_.max_row_tokens == 0)
    return std::to_string(n) + " tokens > --batch-tokens " +
           std::to_string(o_.batch_tokens) +
           " (raise --batch-tokens, or stream long rows exactly with "
           "--streaming-chunk-size)";
  if (n > o_.batch_tokens && n > o_.max_row_tokens)
    return "too long to stream: " + std::to_string(n) +
           " tokens > --max-row-tokens " + std::to_string(o_.max_row_tokens) +
           " (raise --max-row-tokens, at most max_position_embeddings " +
           std::to_string(o_.max_positions) + "; it sizes the KV cache)";
  for (int32_t id : ids)
    if (id >= o_.vocab_size)
      return "token id " + std::to_string(id) + " outside the vocabulary [0, " +
             std::to_string(o_.vocab_size) + ")";
  return CheckSelectors(n);
}

std::string RowPreparer::CheckSelectors(int64_t n) const {
  for (const RowSelector& sel : *selectors_) {
    std::string reason;
    if (sel.kind == RowSelector::Kind::kPos) {
      for (int64_t q : sel.positions) {  // the last bad position is named
        const int64_t at = ResolvePosition(q, n);
        if (at < 0 || at >= n)
          reason = "selector " + sel.spec + ": position " + std::to_string(q) +
                   " outside a row of " + std::to_string(n) + " tokens";
      }
    } else if (sel.kind == RowSelector::Kind::kSpan) {
      SpanRange r;
      if (!ResolveSpan(sel, n, &r))
        reason = "selector " + sel.spec + ": span outside a row of " +
                 std::to_string(n) + " tokens";
    }
    if (!reason.empty()) return reason;
  }
  return "";
}

// ---- ReadWindow -------------------------------------------------------------

StatusOr<std::vector<PreparedRow>> ReadWindow(
    InputReader& reader, const RowPreparer& preparer, int64_t max_rows,
    bool replace_invalid_utf8, OnError on_error, int64_t committed_rows,
    bool* eof) {
  std::vector<PreparedRow> window;
  while (static_cast<int64_t>(window.size()) < max_rows) {
    InputRow row;
    ASSIGN_OR_RETURN(bool got, reader.Next(&row, replace_invalid_utf8));
    if (!got) {
      *eof = true;
      break;
    }
    PreparedRow p = preparer.Prepare(std::move(row));
    if (!p.ok() && on_error == OnError::kFail)
      return InvalidArgumentError(
          "input row " + std::to_string(p.index) + " (id " +
          p.id.dump(-1, ' ', false, Json::error_handler_t::replace) +
          "): " + p.reason + "; " +
          (committed_rows == 0
               ? std::string("no row was committed before it (rerun with "
                             "--on-error skip to record and skip bad rows)")
               : std::to_string(committed_rows) +
                     " rows committed before it are kept (rerun with "
                     "--resume --on-error skip to continue after them, "
                     "recording and skipping bad rows)"));
    window.push_back(std::move(p));
  }
  return window;
}

}  // namespace loom
