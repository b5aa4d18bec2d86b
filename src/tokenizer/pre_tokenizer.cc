#include "src/tokenizer/pre_tokenizer.h"

#include <algorithm>

#include "src/tokenizer/utf8.h"

namespace loom::tok {
namespace {

constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Splits each piece at the matches of `re` with the given behaviour.
void SplitByRegex(const Regex& re, SplitBehavior behavior, bool invert,
                  PreTokenized* pt) {
  std::vector<ByteRange> out;
  out.reserve(pt->pieces.size() * 2);
  std::vector<ByteRange> matches;
  struct Part {
    uint32_t b, e;
    bool is_match;
  };
  std::vector<Part> parts;
  for (const auto& [pb, pe] : pt->pieces) {
    matches.clear();
    re.FindAll(std::string_view(pt->s.text).substr(pb, pe - pb), &matches);
    parts.clear();
    uint32_t pos = 0;
    for (const auto& [mb, me] : matches) {
      if (mb > pos) parts.push_back({pos, mb, invert});
      parts.push_back({mb, me, !invert});
      pos = me;
    }
    if (pos < pe - pb) parts.push_back({pos, pe - pb, invert});
    const size_t first = out.size();
    switch (behavior) {
      case SplitBehavior::kRemoved:
        for (const Part& p : parts) {
          if (!p.is_match) out.emplace_back(p.b, p.e);
        }
        break;
      case SplitBehavior::kIsolated:
        for (const Part& p : parts) out.emplace_back(p.b, p.e);
        break;
      case SplitBehavior::kMergedWithPrevious: {
        bool previous_match = false;
        for (const Part& p : parts) {
          if (p.is_match && !previous_match && out.size() > first) {
            out.back().second = p.e;
          } else {
            out.emplace_back(p.b, p.e);
          }
          previous_match = p.is_match;
        }
        break;
      }
      case SplitBehavior::kMergedWithNext: {
        bool previous_match = false;  // whether the part to the right matched
        for (size_t k = parts.size(); k-- > 0;) {
          const Part& p = parts[k];
          if (p.is_match && !previous_match && out.size() > first) {
            out.back().first = p.b;
          } else {
            out.emplace_back(p.b, p.e);
          }
          previous_match = p.is_match;
        }
        std::reverse(out.begin() + first, out.end());
        break;
      }
      case SplitBehavior::kContiguous: {
        bool previous_match = false;
        for (const Part& p : parts) {
          if (p.is_match == previous_match && out.size() > first) {
            out.back().second = p.e;
          } else {
            out.emplace_back(p.b, p.e);
          }
          previous_match = p.is_match;
        }
        break;
      }
    }
    for (size_t k = first; k < out.size(); ++k) {
      out[k].first += pb;
      out[k].second += pb;
    }
  }
  // Drop empty pieces.
  size_t w = 0;
  for (const auto& r : out) {
    if (r.second > r.first) out[w++] = r;
  }
  out.resize(w);
  pt->pieces = std::move(out);
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> re, SplitBehavior behavior,
                    bool invert)
      : re_(std::move(re)), behavior_(behavior), invert_(invert) {}
  void PreTokenize(PreTokenized* pt) const override {
    SplitByRegex(*re_, behavior_, invert_, pt);
  }

 private:
  std::unique_ptr<Regex> re_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> re)
      : add_prefix_space_(add_prefix_space), re_(std::move(re)) {}
  bool SetAddPrefixSpace(bool value) override {
    add_prefix_space_ = value;
    return true;
  }
  void PreTokenize(PreTokenized* pt) const override {
    if (add_prefix_space_) {
      PreTokenized next;
      next.s.text.reserve(pt->s.text.size() + pt->pieces.size());
      next.s.align.reserve(next.s.text.capacity());
      for (const auto& [b, e] : pt->pieces) {
        const uint32_t nb = static_cast<uint32_t>(next.s.text.size());
        if (pt->s.text[b] != ' ') next.s.Append(" ", pt->s.Range(b, b));
        next.s.AppendSlice(pt->s, b, e);
        next.pieces.emplace_back(nb, static_cast<uint32_t>(next.s.text.size()));
      }
      *pt = std::move(next);
    }
    if (re_) SplitByRegex(*re_, SplitBehavior::kIsolated, false, pt);
    // Map every byte to its printable code point.
    const auto& alphabet = ByteLevelAlphabet();
    PreTokenized next;
    next.s.text.reserve(pt->s.text.size() * 2);
    next.s.align.reserve(pt->s.text.size() * 2);
    next.pieces.reserve(pt->pieces.size());
    for (const auto& [b, e] : pt->pieces) {
      const uint32_t nb = static_cast<uint32_t>(next.s.text.size());
      for (uint32_t i = b; i < e; ++i) {
        next.s.Append(alphabet[static_cast<unsigned char>(pt->s.text[i])],
                      pt->s.align[i]);
      }
      next.pieces.emplace_back(nb, static_cast<uint32_t>(next.s.text.size()));
    }
    *pt = std::move(next);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> re_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme,
                        bool split, std::unique_ptr<Regex> split_re)
      : replacement_(std::move(replacement)),
        scheme_(scheme),
        split_(split),
        split_re_(std::move(split_re)) {}
  void PreTokenize(PreTokenized* pt) const override {
    PreTokenized next;
    next.s.text.reserve(pt->s.text.size() * 2);
    next.s.align.reserve(pt->s.text.size() * 2);
    for (const auto& [b, e] : pt->pieces) {
      const uint32_t nb = static_cast<uint32_t>(next.s.text.size());
      const bool starts_with_space =
          pt->s.text[b] == ' ' ||
          std::string_view(pt->s.text).substr(b).starts_with(replacement_);
      bool prepend = false;
      if (!starts_with_space) {
        prepend =
            scheme_ == PrependScheme::kAlways ||
            (scheme_ == PrependScheme::kFirst && pt->s.align[b].start == 0);
      }
      if (prepend) next.s.Append(replacement_, pt->s.Range(b, b));
      for (uint32_t i = b; i < e; ++i) {
        if (pt->s.text[i] == ' ') {
          next.s.Append(replacement_, pt->s.align[i]);
        } else {
          next.s.text.push_back(pt->s.text[i]);
          next.s.align.push_back(pt->s.align[i]);
        }
      }
      next.pieces.emplace_back(nb, static_cast<uint32_t>(next.s.text.size()));
    }
    *pt = std::move(next);
    if (split_)
      SplitByRegex(*split_re_, SplitBehavior::kMergedWithNext, false, pt);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
  std::unique_ptr<Regex> split_re_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(
      std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void PreTokenize(PreTokenized* pt) const override {
    for (const auto& s : steps_) s->PreTokenize(pt);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

StatusOr<SplitBehavior> ParseBehavior(const Json& j, const JsonPath& at,
                                      SplitBehavior fallback) {
  ASSIGN_OR_RETURN(std::string b, OptString(j, "behavior", at, ""));
  if (b.empty()) return fallback;
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return JsonError(at.Child("behavior"),
                   "unknown split behavior \"" + b + "\"");
}

StatusOr<std::unique_ptr<Regex>> CompileAt(const std::string& pattern,
                                           bool literal, const JsonPath& at) {
  auto re = Regex::Compile(pattern, literal);
  if (!re.ok()) return JsonError(at, re.status().message());
  return std::move(*re);
}

std::unique_ptr<PreTokenizer> MakeSplit(std::unique_ptr<Regex> re,
                                        SplitBehavior b, bool invert) {
  return std::make_unique<SplitPreTokenizer>(std::move(re), b, invert);
}

}  // namespace

StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const Json& j,
                                                          const JsonPath& at) {
  if (j.is_null()) return std::unique_ptr<PreTokenizer>();
  ASSIGN_OR_RETURN(std::string type, GetString(j, "type", at));
  if (type == "ByteLevel") {
    ASSIGN_OR_RETURN(bool add_prefix_space,
                     OptBool(j, "add_prefix_space", at, true));
    ASSIGN_OR_RETURN(bool use_regex, OptBool(j, "use_regex", at, true));
    std::unique_ptr<Regex> re;
    if (use_regex) {
      ASSIGN_OR_RETURN(re, CompileAt(kGpt2Pattern, false, at));
    }
    return std::unique_ptr<PreTokenizer>(
        new ByteLevelPreTokenizer(add_prefix_space, std::move(re)));
  }
  if (type == "Split") {
    ASSIGN_OR_RETURN(Pattern pattern, GetPattern(j, "pattern", at));
    ASSIGN_OR_RETURN(SplitBehavior behavior,
                     ParseBehavior(j, at, SplitBehavior::kRemoved));
    ASSIGN_OR_RETURN(bool invert, OptBool(j, "invert", at, false));
    ASSIGN_OR_RETURN(auto re, CompileAt(pattern.text, !pattern.is_regex,
                                        at.Child("pattern")));
    return MakeSplit(std::move(re), behavior, invert);
  }
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(std::string replacement,
                     OptString(j, "replacement", at, "\xE2\x96\x81"));
    char32_t cp = 0;
    if (replacement.empty() || DecodeUtf8(replacement, 0, &cp) !=
                                   static_cast<int>(replacement.size())) {
      return JsonError(at.Child("replacement"),
                       "expected exactly one character");
    }
    PrependScheme scheme = PrependScheme::kAlways;
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
      ASSIGN_OR_RETURN(std::string s, GetString(j, "prepend_scheme", at));
      if (s == "always") {
        scheme = PrependScheme::kAlways;
      } else if (s == "first") {
        scheme = PrependScheme::kFirst;
      } else if (s == "never") {
        scheme = PrependScheme::kNever;
      } else {
        return JsonError(at.Child("prepend_scheme"),
                         "unknown prepend_scheme \"" + s + "\"");
      }
    } else {
      ASSIGN_OR_RETURN(bool add_prefix_space,
                       OptBool(j, "add_prefix_space", at, true));
      scheme =
          add_prefix_space ? PrependScheme::kAlways : PrependScheme::kNever;
    }
    ASSIGN_OR_RETURN(bool split, OptBool(j, "split", at, true));
    ASSIGN_OR_RETURN(auto re,
                     CompileAt(replacement, true, at.Child("replacement")));
    return std::unique_ptr<PreTokenizer>(
        new MetaspacePreTokenizer(replacement, scheme, split, std::move(re)));
  }
  if (type == "Digits") {
    ASSIGN_OR_RETURN(bool individual,
                     OptBool(j, "individual_digits", at, false));
    ASSIGN_OR_RETURN(auto re, CompileAt("[0-9]", false, at));
    return MakeSplit(
        std::move(re),
        individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous,
        false);
  }
  if (type == "Punctuation") {
    ASSIGN_OR_RETURN(SplitBehavior behavior,
                     ParseBehavior(j, at, SplitBehavior::kIsolated));
    ASSIGN_OR_RETURN(auto re, CompileAt(R"([\p{P}!-/:-@\[-`{-~])", false, at));
    return MakeSplit(std::move(re), behavior, false);
  }
  if (type == "Whitespace") {
    ASSIGN_OR_RETURN(auto re, CompileAt(R"(\w+|[^\w\s]+)", false, at));
    return MakeSplit(std::move(re), SplitBehavior::kRemoved, true);
  }
  if (type == "WhitespaceSplit") {
    ASSIGN_OR_RETURN(auto re, CompileAt(R"(\s+)", false, at));
    return MakeSplit(std::move(re), SplitBehavior::kRemoved, false);
  }
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    ASSIGN_OR_RETURN(auto ws, CompileAt(R"(\s+)", false, at));
    ASSIGN_OR_RETURN(auto punct,
                     CompileAt(R"([\p{P}!-/:-@\[-`{-~])", false, at));
    steps.push_back(MakeSplit(std::move(ws), SplitBehavior::kRemoved, false));
    steps.push_back(
        MakeSplit(std::move(punct), SplitBehavior::kIsolated, false));
    return std::unique_ptr<PreTokenizer>(
        new SequencePreTokenizer(std::move(steps)));
  }
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) {
      return JsonError(at.Child("pretokenizers"), "expected an array");
    }
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < it->size(); ++i) {
      ASSIGN_OR_RETURN(
          auto p,
          ParsePreTokenizer((*it)[i], at.Child("pretokenizers").Index(i)));
      if (p) steps.push_back(std::move(p));
    }
    return std::unique_ptr<PreTokenizer>(
        new SequencePreTokenizer(std::move(steps)));
  }
  return UnimplementedError(at.Child("type").ToString() +
                            ": unsupported pre-tokenizer type \"" + type +
                            "\"");
}

}  // namespace loom::tok
