#include "src/tokenizer/added_tokens.h"

#include <algorithm>

#include "src/tokenizer/normalizer.h"
#include "src/tokenizer/utf8.h"

namespace loom::tok {
namespace {

// The code point that ends at byte `end` (exclusive) of `s`.
char32_t CharBefore(std::string_view s, size_t end, size_t* start) {
  size_t p = end - 1;
  while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
  char32_t c = 0;
  DecodeUtf8(s, p, &c);
  *start = p;
  return c;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) {
  for (auto& t : tokens) {
    if (!t.content.empty()) tokens_.push_back(std::move(t));
  }
  for (uint32_t i = 0; i < tokens_.size(); ++i) {
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(
        i);
  }
  for (auto& v : by_first_byte_) {
    std::stable_sort(v.begin(), v.end(), [&](uint32_t a, uint32_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

void AddedTokenMatcher::FindAll(std::string_view text,
                                std::vector<Match>* out) const {
  if (tokens_.empty()) return;
  uint32_t prev_end = 0;
  size_t i = 0;
  while (i < text.size()) {
    const auto& cands = by_first_byte_[static_cast<unsigned char>(text[i])];
    const AddedToken* hit = nullptr;
    for (uint32_t c : cands) {
      const std::string& content = tokens_[c].content;
      if (text.substr(i).starts_with(content)) {
        hit = &tokens_[c];
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    size_t begin = i;
    size_t end = i + hit->content.size();
    if (hit->single_word) {
      bool ok = true;
      size_t p = 0;
      char32_t c = 0;
      if (begin > 0 && IsAlphanumericOrUnderscore(CharBefore(text, begin, &p)))
        ok = false;
      if (end < text.size() && DecodeUtf8(text, end, &c) > 0 &&
          IsAlphanumericOrUnderscore(c)) {
        ok = false;
      }
      if (!ok) {
        ++i;
        continue;
      }
    }
    if (hit->lstrip) {
      while (begin > prev_end) {
        size_t p = 0;
        const char32_t c = CharBefore(text, begin, &p);
        if (!IsUnicodeWhitespace(c) || p < prev_end) break;
        begin = p;
      }
    }
    if (hit->rstrip) {
      while (end < text.size()) {
        char32_t c = 0;
        const int n = DecodeUtf8(text, end, &c);
        if (n == 0 || !IsUnicodeWhitespace(c)) break;
        end += n;
      }
    }
    out->push_back(
        {static_cast<uint32_t>(begin), static_cast<uint32_t>(end), hit->id});
    prev_end = static_cast<uint32_t>(end);
    i = end;
  }
}

}  // namespace loom::tok
