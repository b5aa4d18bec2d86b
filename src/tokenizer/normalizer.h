// Text with an alignment to the original input, and the tokenizer.json
// normalizers that rewrite it (NFC/NFD/NFKC/NFKD through ICU, Lowercase,
// Strip, Prepend, Replace, Sequence).
//
// Alignment: every byte of `text` carries the byte range [start, end) of the
// original input it came from. Bytes of a rewritten span all carry the range
// of the whole source span; inserted bytes (Prepend) carry an empty range at
// the insertion point. A token's offsets are (align[first].start,
// align[last].end).
#ifndef LOOM_SRC_TOKENIZER_NORMALIZER_H_
#define LOOM_SRC_TOKENIZER_NORMALIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/tokenizer/json_util.h"

namespace loom::tok {

struct Span32 {
  uint32_t start = 0;
  uint32_t end = 0;
};

struct AlignedString {
  std::string text;
  std::vector<Span32> align;  // align.size() == text.size()

  // `s` as-is; byte i is aligned to [base + i, base + i + 1).
  static AlignedString Identity(std::string_view s, uint32_t base);
  // Appends `bytes`, each aligned to `src`.
  void Append(std::string_view bytes, Span32 src);
  // Appends o.text[b, e) with its alignment.
  void AppendSlice(const AlignedString& o, size_t b, size_t e);
  // Original range covered by text[b, e) (b < e); empty range at the
  // position of byte b when e == b.
  Span32 Range(size_t b, size_t e) const;
  void Clear() {
    text.clear();
    align.clear();
  }
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual Status Normalize(AlignedString* s) const = 0;
};

// Parses a tokenizer.json "normalizer" value (null yields nullptr).
StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const Json& j,
                                                      const JsonPath& at);

// Unicode helpers backed by ICU.
bool IsUnicodeWhitespace(char32_t c);
bool IsAlphanumericOrUnderscore(char32_t c);

}  // namespace loom::tok

#endif  // LOOM_SRC_TOKENIZER_NORMALIZER_H_
