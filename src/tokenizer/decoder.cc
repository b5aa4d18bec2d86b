#include "src/tokenizer/decoder.h"

#include "src/tokenizer/utf8.h"

namespace loom::tok {
namespace {

void ReplaceAll(std::string* s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t hit = s->find(from, pos);
    if (hit == std::string::npos) break;
    out.append(*s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  if (pos == 0) return;
  out.append(*s, pos, std::string::npos);
  *s = std::move(out);
}

class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const std::string& t : *tokens) {
      const size_t mark = bytes.size();
      bool ok = true;
      size_t i = 0;
      while (i < t.size()) {
        char32_t cp = 0;
        const int n = DecodeUtf8(t, i, &cp);
        const int b = n > 0 ? ByteLevelCharToByte(cp) : -1;
        if (b < 0) {
          ok = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
        i += n;
      }
      if (!ok) {
        bytes.resize(mark);
        bytes.append(t);
      }
    }
    tokens->assign(1, LossyUtf8(bytes));
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      ReplaceAll(&(*tokens)[i], replacement_,
                 (i == 0 && strip_first_) ? "" : " ");
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (FindInvalidUtf8(pending) == std::string_view::npos) {
        out.push_back(pending);
      } else {
        for (size_t k = 0; k < pending.size(); ++k)
          out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (std::string& t : *tokens) {
      int byte = -1;
      if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>') {
        auto hex = [](char c) {
          if (c >= '0' && c <= '9') return c - '0';
          if (c >= 'A' && c <= 'F') return c - 'A' + 10;
          if (c >= 'a' && c <= 'f') return c - 'a' + 10;
          return -1;
        };
        const int hi = hex(t[3]);
        const int lo = hex(t[4]);
        if (hi >= 0 && lo >= 0) byte = hi * 16 + lo;
      }
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    *tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string all;
    for (const auto& t : *tokens) all += t;
    tokens->assign(1, std::move(all));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, int start, int stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    if (content_.empty()) return;
    for (std::string& t : *tokens) {
      size_t b = 0;
      for (int k = 0;
           k < start_ && std::string_view(t).substr(b).starts_with(content_);
           ++k) {
        b += content_.size();
      }
      size_t e = t.size();
      for (int k = 0; k < stop_ && e >= b + content_.size() &&
                      std::string_view(t).substr(b, e - b).ends_with(content_);
           ++k) {
        e -= content_.size();
      }
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  int start_, stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::string from, std::string to)
      : from_(std::move(from)), to_(std::move(to)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& t : *tokens) ReplaceAll(&t, from_, to_);
  }

 private:
  std::string from_, to_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& d : steps_) d->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

}  // namespace

StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const Json& j,
                                                const JsonPath& at) {
  if (j.is_null()) return std::unique_ptr<Decoder>();
  ASSIGN_OR_RETURN(std::string type, GetString(j, "type", at));
  if (type == "ByteLevel")
    return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(std::string replacement,
                     OptString(j, "replacement", at, "\xE2\x96\x81"));
    bool strip_first = true;
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
      ASSIGN_OR_RETURN(std::string s, GetString(j, "prepend_scheme", at));
      if (s != "always" && s != "first" && s != "never") {
        return JsonError(at.Child("prepend_scheme"),
                         "unknown prepend_scheme \"" + s + "\"");
      }
      strip_first = s != "never";
    } else {
      ASSIGN_OR_RETURN(strip_first, OptBool(j, "add_prefix_space", at, true));
    }
    return std::unique_ptr<Decoder>(
        new MetaspaceDecoder(replacement, strip_first));
  }
  if (type == "ByteFallback")
    return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Strip") {
    ASSIGN_OR_RETURN(std::string content, GetString(j, "content", at));
    ASSIGN_OR_RETURN(int64_t start, OptInt(j, "start", at, 0));
    ASSIGN_OR_RETURN(int64_t stop, OptInt(j, "stop", at, 0));
    return std::unique_ptr<Decoder>(new StripDecoder(
        content, static_cast<int>(start), static_cast<int>(stop)));
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(Pattern pattern, GetPattern(j, "pattern", at));
    if (pattern.is_regex) {
      return UnimplementedError(
          at.Child("pattern").ToString() +
          ": regex patterns in a Replace decoder are not supported");
    }
    ASSIGN_OR_RETURN(std::string content, GetString(j, "content", at));
    return std::unique_ptr<Decoder>(new ReplaceDecoder(pattern.text, content));
  }
  if (type == "Sequence") {
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array())
      return JsonError(at.Child("decoders"), "expected an array");
    std::vector<std::unique_ptr<Decoder>> steps;
    for (size_t i = 0; i < it->size(); ++i) {
      ASSIGN_OR_RETURN(auto d,
                       ParseDecoder((*it)[i], at.Child("decoders").Index(i)));
      if (d) steps.push_back(std::move(d));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(steps)));
  }
  return UnimplementedError(at.Child("type").ToString() +
                            ": unsupported decoder type \"" + type + "\"");
}

}  // namespace loom::tok
