#include "src/tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/casemap.h>
#include <unicode/edits.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>

#include "src/tokenizer/regex.h"
#include "src/tokenizer/utf8.h"

namespace loom::tok {

AlignedString AlignedString::Identity(std::string_view s, uint32_t base) {
  AlignedString out;
  out.text.assign(s);
  out.align.resize(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    out.align[i] = {base + static_cast<uint32_t>(i),
                    base + static_cast<uint32_t>(i) + 1};
  }
  return out;
}

void AlignedString::Append(std::string_view bytes, Span32 src) {
  text.append(bytes);
  align.insert(align.end(), bytes.size(), src);
}

void AlignedString::AppendSlice(const AlignedString& o, size_t b, size_t e) {
  text.append(o.text, b, e - b);
  align.insert(align.end(), o.align.begin() + b, o.align.begin() + e);
}

Span32 AlignedString::Range(size_t b, size_t e) const {
  if (e > b) return {align[b].start, align[e - 1].end};
  if (b < align.size()) return {align[b].start, align[b].start};
  if (!align.empty()) return {align.back().end, align.back().end};
  return {0, 0};
}

bool IsUnicodeWhitespace(char32_t c) {
  return u_isUWhiteSpace(static_cast<UChar32>(c));
}

bool IsAlphanumericOrUnderscore(char32_t c) {
  if (c == '_') return true;
  if (u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_ALPHABETIC))
    return true;
  const int8_t t = u_charType(static_cast<UChar32>(c));
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER ||
         t == U_OTHER_NUMBER;
}

namespace {

// Rebuilds `s` from `out` (the rewritten text) and ICU's edit record.
Status ApplyEdits(const icu::Edits& edits, std::string out, AlignedString* s) {
  UErrorCode err = U_ZERO_ERROR;
  AlignedString result;
  result.text = std::move(out);
  result.align.resize(result.text.size());
  icu::Edits::Iterator it = edits.getCoarseIterator();
  while (it.next(err)) {
    const size_t src = static_cast<size_t>(it.sourceIndex());
    const size_t dst = static_cast<size_t>(it.destinationIndex());
    const size_t old_len = static_cast<size_t>(it.oldLength());
    const size_t new_len = static_cast<size_t>(it.newLength());
    if (!it.hasChange()) {
      for (size_t k = 0; k < new_len; ++k)
        result.align[dst + k] = s->align[src + k];
    } else {
      const Span32 r = s->Range(src, src + old_len);
      for (size_t k = 0; k < new_len; ++k) result.align[dst + k] = r;
    }
  }
  if (U_FAILURE(err))
    return InternalError(std::string("ICU edits: ") + u_errorName(err));
  *s = std::move(result);
  return Status::Ok();
}

class UnicodeNormalizer : public Normalizer {
 public:
  enum Form { kNfc, kNfd, kNfkc, kNfkd };
  explicit UnicodeNormalizer(Form form) : form_(form) {}
  Status Normalize(AlignedString* s) const override {
    UErrorCode err = U_ZERO_ERROR;
    const icu::Normalizer2* n = nullptr;
    switch (form_) {
      case kNfc:
        n = icu::Normalizer2::getNFCInstance(err);
        break;
      case kNfd:
        n = icu::Normalizer2::getNFDInstance(err);
        break;
      case kNfkc:
        n = icu::Normalizer2::getNFKCInstance(err);
        break;
      case kNfkd:
        n = icu::Normalizer2::getNFKDInstance(err);
        break;
    }
    if (U_FAILURE(err))
      return InternalError(std::string("ICU normalizer: ") + u_errorName(err));
    const icu::StringPiece sp(s->text.data(),
                              static_cast<int32_t>(s->text.size()));
    if (n->isNormalizedUTF8(sp, err) && U_SUCCESS(err)) return Status::Ok();
    err = U_ZERO_ERROR;
    std::string out;
    icu::StringByteSink<std::string> sink(&out);
    icu::Edits edits;
    n->normalizeUTF8(0, sp, sink, &edits, err);
    if (U_FAILURE(err))
      return InternalError(std::string("ICU normalize: ") + u_errorName(err));
    return ApplyEdits(edits, std::move(out), s);
  }

 private:
  Form form_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  Status Normalize(AlignedString* s) const override {
    UErrorCode err = U_ZERO_ERROR;
    std::string out;
    icu::StringByteSink<std::string> sink(&out);
    icu::Edits edits;
    icu::CaseMap::utf8ToLower("", 0,
                              icu::StringPiece(s->text.data(), s->text.size()),
                              sink, &edits, err);
    if (U_FAILURE(err))
      return InternalError(std::string("ICU lowercase: ") + u_errorName(err));
    return ApplyEdits(edits, std::move(out), s);
  }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  Status Normalize(AlignedString* s) const override {
    size_t b = 0;
    size_t e = s->text.size();
    char32_t c = 0;
    if (left_) {
      while (b < e) {
        const int n = DecodeUtf8(s->text, b, &c);
        if (n == 0 || !IsUnicodeWhitespace(c)) break;
        b += n;
      }
    }
    if (right_) {
      while (e > b) {
        size_t p = e - 1;
        while (p > b && (static_cast<unsigned char>(s->text[p]) & 0xC0) == 0x80)
          --p;
        const int n = DecodeUtf8(s->text, p, &c);
        if (n == 0 || !IsUnicodeWhitespace(c)) break;
        e = p;
      }
    }
    if (b == 0 && e == s->text.size()) return Status::Ok();
    AlignedString out;
    out.AppendSlice(*s, b, e);
    *s = std::move(out);
    return Status::Ok();
  }

 private:
  bool left_, right_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  Status Normalize(AlignedString* s) const override {
    if (s->text.empty()) return Status::Ok();
    AlignedString out;
    const uint32_t at = s->align[0].start;
    out.Append(prefix_, {at, at});
    out.AppendSlice(*s, 0, s->text.size());
    *s = std::move(out);
    return Status::Ok();
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Regex> re, std::string content)
      : re_(std::move(re)), content_(std::move(content)) {}
  Status Normalize(AlignedString* s) const override {
    std::vector<std::pair<uint32_t, uint32_t>> matches;
    re_->FindAll(s->text, &matches);
    if (matches.empty()) return Status::Ok();
    AlignedString out;
    out.text.reserve(s->text.size() + matches.size() * content_.size());
    out.align.reserve(out.text.capacity());
    size_t pos = 0;
    for (const auto& [b, e] : matches) {
      out.AppendSlice(*s, pos, b);
      out.Append(content_, s->Range(b, e));
      pos = e;
    }
    out.AppendSlice(*s, pos, s->text.size());
    *s = std::move(out);
    return Status::Ok();
  }

 private:
  std::unique_ptr<Regex> re_;
  std::string content_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  Status Normalize(AlignedString* s) const override {
    for (const auto& n : steps_) RETURN_IF_ERROR(n->Normalize(s));
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const Json& j,
                                                      const JsonPath& at) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  ASSIGN_OR_RETURN(std::string type, GetString(j, "type", at));
  if (type == "NFC")
    return std::unique_ptr<Normalizer>(
        new UnicodeNormalizer(UnicodeNormalizer::kNfc));
  if (type == "NFD")
    return std::unique_ptr<Normalizer>(
        new UnicodeNormalizer(UnicodeNormalizer::kNfd));
  if (type == "NFKC")
    return std::unique_ptr<Normalizer>(
        new UnicodeNormalizer(UnicodeNormalizer::kNfkc));
  if (type == "NFKD")
    return std::unique_ptr<Normalizer>(
        new UnicodeNormalizer(UnicodeNormalizer::kNfkd));
  if (type == "Lowercase")
    return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (type == "Strip") {
    ASSIGN_OR_RETURN(bool left, OptBool(j, "strip_left", at, true));
    ASSIGN_OR_RETURN(bool right, OptBool(j, "strip_right", at, true));
    return std::unique_ptr<Normalizer>(new StripNormalizer(left, right));
  }
  if (type == "Prepend") {
    ASSIGN_OR_RETURN(std::string prefix, GetString(j, "prepend", at));
    return std::unique_ptr<Normalizer>(
        new PrependNormalizer(std::move(prefix)));
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(Pattern pattern, GetPattern(j, "pattern", at));
    ASSIGN_OR_RETURN(std::string content, GetString(j, "content", at));
    auto re = Regex::Compile(pattern.text, !pattern.is_regex);
    if (!re.ok()) return JsonError(at.Child("pattern"), re.status().message());
    return std::unique_ptr<Normalizer>(
        new ReplaceNormalizer(std::move(*re), std::move(content)));
  }
  if (type == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) {
      return JsonError(at.Child("normalizers"), "expected an array");
    }
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < it->size(); ++i) {
      ASSIGN_OR_RETURN(
          auto n, ParseNormalizer((*it)[i], at.Child("normalizers").Index(i)));
      if (n) steps.push_back(std::move(n));
    }
    return std::unique_ptr<Normalizer>(
        new SequenceNormalizer(std::move(steps)));
  }
  return UnimplementedError(at.Child("type").ToString() +
                            ": unsupported normalizer type \"" + type + "\"");
}

}  // namespace loom::tok
