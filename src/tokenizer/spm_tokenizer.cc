// The tokenizer.model back end: Debian's libsentencepiece driven with the
// rules of transformers' slow LlamaTokenizer (legacy / add_prefix_space,
// added-token splitting, the "<unk>"-prefix trick, and its decode quirks).
#include <sentencepiece_processor.h>

#include <algorithm>
#include <functional>
#include <set>
#include <unordered_map>

#include "src/base/read_file.h"
#include "src/tokenizer/added_tokens.h"
#include "src/tokenizer/normalizer.h"
#include "src/tokenizer/tokenizer_impl.h"

namespace loom::tok::internal {
namespace {

constexpr std::string_view kMeta = "\xE2\x96\x81";  // U+2581 "▁"

// --- Minimal protobuf editing: set NormalizerSpec.add_dummy_prefix = false.
bool ReadVarint(std::string_view s, size_t* pos, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *pos < s.size(); shift += 7) {
    const auto b = static_cast<unsigned char>(s[(*pos)++]);
    *v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

void WriteVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Splits a serialized message into (field number, raw bytes of the whole
// field).
bool ForEachField(std::string_view msg,
                  const std::function<void(uint64_t field, std::string_view raw,
                                           std::string_view payload)>& fn) {
  size_t pos = 0;
  while (pos < msg.size()) {
    const size_t start = pos;
    uint64_t tag = 0;
    if (!ReadVarint(msg, &pos, &tag)) return false;
    const uint64_t wire = tag & 7;
    std::string_view payload;
    uint64_t v = 0;
    switch (wire) {
      case 0:
        if (!ReadVarint(msg, &pos, &v)) return false;
        break;
      case 1:
        pos += 8;
        break;
      case 2: {
        if (!ReadVarint(msg, &pos, &v) || pos + v > msg.size()) return false;
        payload = msg.substr(pos, v);
        pos += v;
        break;
      }
      case 5:
        pos += 4;
        break;
      default:
        return false;
    }
    if (pos > msg.size()) return false;
    fn(tag >> 3, msg.substr(start, pos - start), payload);
  }
  return true;
}

StatusOr<std::string> DisableDummyPrefix(std::string_view model) {
  std::string out;
  std::string normalizer;
  bool have_normalizer = false;
  bool ok = ForEachField(model, [&](uint64_t field, std::string_view raw,
                                    std::string_view payload) {
    if (field == 3) {
      have_normalizer = true;
      normalizer.assign(payload);
    } else {
      out.append(raw);
    }
  });
  std::string spec;
  ok = ok && ForEachField(normalizer, [&](uint64_t field, std::string_view raw,
                                          std::string_view) {
         if (field != 3) spec.append(raw);
       });
  if (!ok)
    return DataLossError(
        "tokenizer.model: not a valid SentencePiece model protobuf");
  (void)have_normalizer;
  spec.push_back(static_cast<char>((3 << 3) | 0));  // add_dummy_prefix, varint
  spec.push_back(0);
  out.push_back(
      static_cast<char>((3 << 3) | 2));  // normalizer_spec, length-delimited
  WriteVarint(spec.size(), &out);
  out.append(spec);
  return out;
}

class SpmTokenizer : public TokenizerImpl {
 public:
  static StatusOr<std::unique_ptr<SpmTokenizer>> Create(
      const std::string& bytes, const TokenizerConfig& config);

  Status Encode(std::string_view text, bool add_special_tokens,
                Encoding* out) const override;
  StatusOr<std::string> Decode(std::span<const int32_t> ids,
                               bool skip_special_tokens) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<std::string> IdToToken(int32_t id) const override {
    if (auto it = added_by_id_.find(id); it != added_by_id_.end())
      return it->second.content;
    if (id >= 0 && id < sp_.GetPieceSize()) return sp_.IdToPiece(id);
    return std::nullopt;
  }
  std::optional<int32_t> TokenToId(std::string_view token) const override {
    if (auto it = added_by_content_.find(std::string(token));
        it != added_by_content_.end()) {
      return it->second;
    }
    const int id = sp_.PieceToId(token);
    if (id >= 0 && id < sp_.GetPieceSize() && sp_.IdToPiece(id) == token)
      return id;
    return std::nullopt;
  }
  bool IsSpecial(int32_t id) const override {
    if (special_ids_.count(id) != 0) return true;
    auto it = added_by_id_.find(id);
    return it != added_by_id_.end() && it->second.special;
  }
  std::vector<int32_t> PrefixIds() const override { return prefix_ids_; }
  std::vector<int32_t> SuffixIds() const override { return suffix_ids_; }

 private:
  struct Piece {
    int32_t id;
    Span32 range;
    bool special_string;  // an added token whose text is a special token
  };
  Status EncodeChunk(const AlignedString& s, size_t b, size_t e,
                     std::vector<Piece>* out) const;
  std::string ConvertTokensToString(std::vector<std::string> tokens) const;

  sentencepiece::SentencePieceProcessor sp_;
  bool legacy_ = true;
  bool add_prefix_space_ = true;
  std::string unk_token_;
  size_t unk_token_length_ = 0;
  std::set<std::string> special_strings_;  // all_special_tokens
  std::set<int32_t> special_ids_;
  std::unordered_map<int32_t, AddedToken> added_by_id_;
  std::unordered_map<std::string, int32_t> added_by_content_;
  AddedTokenMatcher matcher_;
  std::vector<int32_t> prefix_ids_;
  std::vector<int32_t> suffix_ids_;
  int64_t vocab_size_ = 0;
};

StatusOr<std::unique_ptr<SpmTokenizer>> SpmTokenizer::Create(
    const std::string& bytes, const TokenizerConfig& config) {
  std::unique_ptr<SpmTokenizer> t(new SpmTokenizer());
  t->legacy_ = config.legacy.value_or(true);
  t->add_prefix_space_ = config.add_prefix_space.value_or(true);
  std::string model = bytes;
  if (!t->legacy_) {
    ASSIGN_OR_RETURN(model, DisableDummyPrefix(bytes));
  }
  const auto st = t->sp_.LoadFromSerializedProto(model);
  if (!st.ok()) return DataLossError("tokenizer.model: " + st.ToString());
  t->vocab_size_ = t->sp_.GetPieceSize();

  // Special-token strings: the config's, else LlamaTokenizer's defaults.
  auto pick = [&](const std::optional<std::string>& v, const char* fallback) {
    if (v) return *v;
    return config.present ? std::string() : std::string(fallback);
  };
  const std::string bos =
      config.bos_token ? *config.bos_token : pick(config.bos_token, "<s>");
  const std::string eos =
      config.eos_token ? *config.eos_token : pick(config.eos_token, "</s>");
  t->unk_token_ =
      config.unk_token ? *config.unk_token : pick(config.unk_token, "<unk>");
  const std::string pad = config.pad_token.value_or("");

  // Added tokens: added_tokens_decoder, then special tokens not listed there.
  std::vector<AddedToken> added = config.added_tokens_decoder;
  auto add_special = [&](const std::string& content) -> Status {
    if (content.empty()) return Status::Ok();
    t->special_strings_.insert(content);
    for (const AddedToken& a : added) {
      if (a.content == content) return Status::Ok();
    }
    const int id = t->sp_.PieceToId(content);
    if (t->sp_.IdToPiece(id) != content) {
      return InvalidArgumentError("tokenizer_config.json: special token \"" +
                                  content + "\" is not in tokenizer.model");
    }
    AddedToken a;
    a.id = id;
    a.content = content;
    a.special = true;
    added.push_back(a);
    return Status::Ok();
  };
  RETURN_IF_ERROR(add_special(bos));
  RETURN_IF_ERROR(add_special(eos));
  RETURN_IF_ERROR(add_special(t->unk_token_));
  RETURN_IF_ERROR(add_special(pad));
  for (const auto& s : config.additional_special_tokens)
    RETURN_IF_ERROR(add_special(s));
  for (const AddedToken& a : added) {
    t->added_by_id_[a.id] = a;
    t->added_by_content_[a.content] = a.id;
    t->vocab_size_ = std::max<int64_t>(t->vocab_size_, a.id + 1);
    if (t->special_strings_.count(a.content) != 0) t->special_ids_.insert(a.id);
  }
  t->matcher_ = AddedTokenMatcher(added);

  if (!t->unk_token_.empty()) {
    std::vector<int> ids;
    const auto s = t->sp_.Encode(t->unk_token_, &ids);
    if (!s.ok()) return InternalError("sentencepiece: " + s.ToString());
    t->unk_token_length_ = ids.size();
  }
  if (config.add_bos_token.value_or(true)) {
    auto id = t->TokenToId(bos);
    if (bos.empty() || !id) {
      return InvalidArgumentError(
          "tokenizer_config.json: add_bos_token is true but bos_token \"" +
          bos + "\" is not in the vocabulary");
    }
    t->prefix_ids_.push_back(*id);
  }
  if (config.add_eos_token.value_or(false)) {
    auto id = t->TokenToId(eos);
    if (eos.empty() || !id) {
      return InvalidArgumentError(
          "tokenizer_config.json: add_eos_token is true but eos_token \"" +
          eos + "\" is not in the vocabulary");
    }
    t->suffix_ids_.push_back(*id);
  }
  return t;
}

Status SpmTokenizer::EncodeChunk(const AlignedString& s, size_t b, size_t e,
                                 std::vector<Piece>* out) const {
  const std::string_view chunk = std::string_view(s.text).substr(b, e - b);
  const bool unk_trick = !legacy_ &&
                         (chunk.starts_with(kMeta) || chunk.starts_with(' ')) &&
                         !unk_token_.empty();
  std::string input;
  size_t shift = 0;
  size_t skip = 0;
  if (unk_trick) {
    input = unk_token_;
    input.append(chunk);
    shift = unk_token_.size();
    skip = unk_token_length_;
  } else {
    input.assign(chunk);
  }
  sentencepiece::ImmutableSentencePieceText spt;
  const auto st = sp_.Encode(input, spt.mutable_proto());
  if (!st.ok()) return InternalError("sentencepiece: " + st.ToString());
  const size_t n = spt.pieces_size();
  if (n < skip) skip = 0;  // as transformers: keep all when fewer pieces
  for (size_t i = skip; i < n; ++i) {
    const auto p = spt.pieces(static_cast<int>(i));
    const size_t pb = std::max<size_t>(p.begin(), shift) - shift;
    const size_t pe = std::max<size_t>(p.end(), shift) - shift;
    out->push_back({static_cast<int32_t>(p.id()),
                    s.Range(b + pb, b + std::max(pb, pe)), false});
  }
  return Status::Ok();
}

Status SpmTokenizer::Encode(std::string_view text, bool add_special_tokens,
                            Encoding* out) const {
  AlignedString s;
  if (!legacy_ && !text.empty()) {
    // LlamaTokenizer.tokenize(): "▁" -> " ", then prepend "▁".
    if (add_prefix_space_) s.Append(kMeta, {0, 0});
    for (size_t i = 0; i < text.size();) {
      if (text.substr(i).starts_with(kMeta)) {
        s.Append(" ", {static_cast<uint32_t>(i), static_cast<uint32_t>(i + 3)});
        i += 3;
      } else {
        s.text.push_back(text[i]);
        s.align.push_back(
            {static_cast<uint32_t>(i), static_cast<uint32_t>(i + 1)});
        ++i;
      }
    }
  } else {
    s = AlignedString::Identity(text, 0);
  }
  std::vector<AddedTokenMatcher::Match> matches;
  matcher_.FindAll(s.text, &matches);
  std::vector<Piece> pieces;
  size_t pos = 0;
  for (const auto& m : matches) {
    if (m.begin > pos) RETURN_IF_ERROR(EncodeChunk(s, pos, m.begin, &pieces));
    const AddedToken& a = added_by_id_.at(m.id);
    pieces.push_back({m.id, s.Range(m.begin, m.end),
                      special_strings_.count(a.content) != 0});
    pos = m.end;
  }
  if (pos < s.text.size())
    RETURN_IF_ERROR(EncodeChunk(s, pos, s.text.size(), &pieces));
  if (!legacy_ && pieces.size() > 1 && pieces[1].special_string &&
      sp_.IdToPiece(pieces[0].id) == kMeta &&
      added_by_id_.count(pieces[0].id) == 0) {
    pieces.erase(pieces.begin());
  }
  if (add_special_tokens) {
    for (int32_t id : prefix_ids_) {
      out->ids.push_back(id);
      out->offsets.emplace_back(0, 0);
    }
  }
  for (const Piece& p : pieces) {
    out->ids.push_back(p.id);
    out->offsets.emplace_back(p.range.start, p.range.end);
  }
  if (add_special_tokens) {
    for (int32_t id : suffix_ids_) {
      out->ids.push_back(id);
      out->offsets.emplace_back(text.size(), text.size());
    }
  }
  return Status::Ok();
}

std::string SpmTokenizer::ConvertTokensToString(
    std::vector<std::string> tokens) const {
  if (tokens.empty()) return "";
  if (add_prefix_space_ && std::string_view(tokens[0]).starts_with(kMeta)) {
    tokens[0] = tokens[0].substr(kMeta.size());
  }
  std::string out;
  std::vector<std::string> current;
  bool prev_is_special = false;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& token = tokens[i];
    if (special_strings_.count(token) != 0) {
      if (!prev_is_special && i != 0 && legacy_) out += ' ';
      out += sp_.DecodePieces(current) + token;
      prev_is_special = true;
      current.clear();
    } else {
      if (prev_is_special && i == 1 && add_prefix_space_ &&
          !std::string_view(token).starts_with(kMeta)) {
        out += ' ';
      }
      current.push_back(token);
      prev_is_special = false;
    }
  }
  out += sp_.DecodePieces(current);
  return out;
}

StatusOr<std::string> SpmTokenizer::Decode(std::span<const int32_t> ids,
                                           bool skip_special_tokens) const {
  std::vector<std::string> sub_texts;
  std::vector<std::string> current;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (skip_special_tokens && special_ids_.count(id) != 0) continue;
    auto token = IdToToken(id);
    if (!token) {
      return InvalidArgumentError("decode: id " + std::to_string(id) +
                                  " at position " + std::to_string(i) +
                                  " is not in the vocabulary (size " +
                                  std::to_string(vocab_size_) + ")");
    }
    // Non-special added tokens are emitted verbatim, between decoded runs.
    const bool legacy_added =
        added_by_id_.count(id) != 0 && special_strings_.count(*token) == 0;
    if (legacy_added) {
      if (!current.empty())
        sub_texts.push_back(ConvertTokensToString(std::move(current)));
      current.clear();
      sub_texts.push_back(*token);
    } else {
      current.push_back(*token);
    }
  }
  if (!current.empty())
    sub_texts.push_back(ConvertTokensToString(std::move(current)));
  std::string text;
  for (size_t i = 0; i < sub_texts.size(); ++i) {
    if (i > 0)
      text += ' ';  // spaces_between_special_tokens (transformers' default)
    text += sub_texts[i];
  }
  return text;
}

}  // namespace

StatusOr<std::unique_ptr<TokenizerImpl>> LoadSpmTokenizer(
    const std::string& path, const TokenizerConfig& config) {
  ASSIGN_OR_RETURN(const std::string bytes, ReadFileToString(path));
  ASSIGN_OR_RETURN(auto t, SpmTokenizer::Create(bytes, config));
  return std::unique_ptr<TokenizerImpl>(std::move(t));
}

}  // namespace loom::tok::internal
