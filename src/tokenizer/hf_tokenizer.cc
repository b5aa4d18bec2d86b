// The tokenizer.json back end: added tokens -> normalizer -> pre-tokenizer ->
// BPE -> post-processor, and ids -> decoder for the way back.
#include <algorithm>
#include <unordered_map>

#include "src/core/json_int.h"
#include "src/tokenizer/added_tokens.h"
#include "src/tokenizer/bpe.h"
#include "src/tokenizer/decoder.h"
#include "src/tokenizer/json_util.h"
#include "src/tokenizer/normalizer.h"
#include "src/tokenizer/pre_tokenizer.h"
#include "src/tokenizer/tokenizer_impl.h"

namespace loom::tok::internal {
namespace {

// Tokenizer classes whose fast version rebuilds the post-processor from
// add_bos_token / add_eos_token (transformers' update_post_processor()).
bool RebuildsPostProcessor(const std::string& cls) {
  static const char* kClasses[] = {
      "LlamaTokenizer",         "LlamaTokenizerFast", "CodeLlamaTokenizer",
      "CodeLlamaTokenizerFast", "GemmaTokenizer",     "GemmaTokenizerFast"};
  return std::any_of(std::begin(kClasses), std::end(kClasses),
                     [&](const char* c) { return cls == c; });
}

// Tokenizer classes whose fast version copies add_prefix_space into a
// ByteLevel pre-tokenizer.
bool OverridesByteLevelPrefixSpace(const std::string& cls) {
  static const char* kClasses[] = {"GPT2Tokenizer",    "GPT2TokenizerFast",
                                   "RobertaTokenizer", "RobertaTokenizerFast",
                                   "BartTokenizer",    "BartTokenizerFast"};
  return std::any_of(std::begin(kClasses), std::end(kClasses),
                     [&](const char* c) { return cls == c; });
}

class HfTokenizer : public TokenizerImpl {
 public:
  static StatusOr<std::unique_ptr<HfTokenizer>> Create(
      const Json& j, const TokenizerConfig& config);

  Status Encode(std::string_view text, bool add_special_tokens,
                Encoding* out) const override;
  StatusOr<std::string> Decode(std::span<const int32_t> ids,
                               bool skip_special_tokens) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<std::string> IdToToken(int32_t id) const override {
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      return added_[it->second].content;
    }
    if (const std::string* t = model_->IdToToken(id)) return *t;
    return std::nullopt;
  }
  std::optional<int32_t> TokenToId(std::string_view token) const override {
    if (auto it = added_by_content_.find(token); it != added_by_content_.end())
      return it->second;
    return model_->TokenToId(token);
  }
  bool IsSpecial(int32_t id) const override {
    auto it = added_by_id_.find(id);
    return it != added_by_id_.end() && added_[it->second].special;
  }
  std::vector<int32_t> PrefixIds() const override { return prefix_ids_; }
  std::vector<int32_t> SuffixIds() const override { return suffix_ids_; }

 private:
  Status ParsePostProcessor(const Json& j, const JsonPath& at);
  void EncodeText(std::string_view text, uint32_t base, Encoding* out) const;
  void ModelPass(AlignedString s, Encoding* out) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>
      added_by_content_;
  AddedTokenMatcher raw_matcher_;         // normalized == false
  AddedTokenMatcher normalized_matcher_;  // normalized == true
  std::vector<int32_t> prefix_ids_;
  std::vector<int32_t> suffix_ids_;
  int64_t vocab_size_ = 0;
};

Status HfTokenizer::ParsePostProcessor(const Json& j, const JsonPath& at) {
  if (j.is_null()) return Status::Ok();
  ASSIGN_OR_RETURN(std::string type, GetString(j, "type", at));
  if (type == "ByteLevel")
    return Status::Ok();  // offsets only; ours are exact bytes
  if (type == "TemplateProcessing") {
    auto single = j.find("single");
    if (single == j.end() || !single->is_array()) {
      return JsonError(at.Child("single"), "expected an array");
    }
    auto specials = j.find("special_tokens");
    bool seen_sequence = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const Json& piece = (*single)[i];
      const JsonPath p = at.Child("single").Index(i);
      if (piece.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      if (!piece.contains("SpecialToken")) {
        return JsonError(
            p, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
      }
      ASSIGN_OR_RETURN(std::string name, GetString(piece["SpecialToken"], "id",
                                                   p.Child("SpecialToken")));
      if (specials == j.end() || !specials->contains(name)) {
        return JsonError(at.Child("special_tokens"),
                         "no entry for \"" + name + "\"");
      }
      const Json& spec = (*specials)[name];
      auto ids = spec.find("ids");
      if (ids == spec.end() || !ids->is_array()) {
        return JsonError(at.Child("special_tokens").Child(name).Child("ids"),
                         "expected an array");
      }
      for (const Json& id : *ids) {
        const std::optional<int64_t> v = JsonInt64(id);
        if (!v || *v < 0 || *v > INT32_MAX) {
          return JsonError(
              at.Child("special_tokens").Child(name).Child("ids"),
              "expected integer ids in [0, 2^31), found " + id.dump());
        }
        (seen_sequence ? suffix_ids_ : prefix_ids_)
            .push_back(static_cast<int32_t>(*v));
      }
    }
    return Status::Ok();
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    for (const char* key : {"cls", "sep"}) {
      auto it = j.find(key);
      std::optional<int64_t> id;
      if (it != j.end() && it->is_array() && it->size() == 2)
        id = JsonInt64((*it)[1]);
      if (!id || *id < 0 || *id > INT32_MAX) {
        return JsonError(at.Child(key),
                         "expected [token, id] with an id in "
                         "[0, 2^31)");
      }
      (std::string(key) == "cls" ? prefix_ids_ : suffix_ids_)
          .push_back(static_cast<int32_t>(*id));
    }
    return Status::Ok();
  }
  if (type == "Sequence") {
    auto it = j.find("processors");
    if (it == j.end() || !it->is_array())
      return JsonError(at.Child("processors"), "expected an array");
    for (size_t i = 0; i < it->size(); ++i) {
      RETURN_IF_ERROR(
          ParsePostProcessor((*it)[i], at.Child("processors").Index(i)));
    }
    return Status::Ok();
  }
  return UnimplementedError(at.Child("type").ToString() +
                            ": unsupported post-processor type \"" + type +
                            "\"");
}

StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Create(
    const Json& j, const TokenizerConfig& config) {
  const JsonPath root{"tokenizer.json", ""};
  if (!j.is_object()) return JsonError(root, "expected an object");
  std::unique_ptr<HfTokenizer> t(new HfTokenizer());
  auto model = j.find("model");
  if (model == j.end() || !model->is_object())
    return JsonError(root.Child("model"), "missing model");
  ASSIGN_OR_RETURN(std::string model_type,
                   OptString(*model, "type", root.Child("model"), "BPE"));
  if (model_type != "BPE") {
    return UnimplementedError(
        "tokenizer.json: model.type: unsupported model \"" + model_type +
        "\" (only BPE is supported)");
  }
  ASSIGN_OR_RETURN(t->model_, BpeModel::FromJson(*model, root.Child("model")));
  static const Json kNull;
  auto field = [&](const char* key) -> const Json& {
    auto it = j.find(key);
    return it == j.end() ? kNull : *it;
  };
  ASSIGN_OR_RETURN(t->normalizer_, ParseNormalizer(field("normalizer"),
                                                   root.Child("normalizer")));
  ASSIGN_OR_RETURN(
      t->pre_tokenizer_,
      ParsePreTokenizer(field("pre_tokenizer"), root.Child("pre_tokenizer")));
  ASSIGN_OR_RETURN(t->decoder_,
                   ParseDecoder(field("decoder"), root.Child("decoder")));
  RETURN_IF_ERROR(t->ParsePostProcessor(field("post_processor"),
                                        root.Child("post_processor")));

  // Added tokens.
  t->vocab_size_ = t->model_->size();
  const Json& added = field("added_tokens");
  if (!added.is_null() && !added.is_array()) {
    return JsonError(root.Child("added_tokens"), "expected an array");
  }
  std::vector<AddedToken> raw, normalized;
  for (size_t i = 0; !added.is_null() && i < added.size(); ++i) {
    const JsonPath p = root.Child("added_tokens").Index(i);
    AddedToken a;
    ASSIGN_OR_RETURN(int64_t id, GetInt(added[i], "id", p));
    if (id < 0 || id > INT32_MAX)
      return JsonError(p.Child("id"), "id out of range");
    a.id = static_cast<int32_t>(id);
    ASSIGN_OR_RETURN(a.content, GetString(added[i], "content", p));
    ASSIGN_OR_RETURN(a.special, OptBool(added[i], "special", p, false));
    ASSIGN_OR_RETURN(a.lstrip, OptBool(added[i], "lstrip", p, false));
    ASSIGN_OR_RETURN(a.rstrip, OptBool(added[i], "rstrip", p, false));
    ASSIGN_OR_RETURN(a.normalized,
                     OptBool(added[i], "normalized", p, !a.special));
    ASSIGN_OR_RETURN(a.single_word, OptBool(added[i], "single_word", p, false));
    t->added_by_id_[a.id] = t->added_.size();
    t->added_by_content_[a.content] = a.id;
    t->vocab_size_ = std::max<int64_t>(t->vocab_size_, a.id + 1);
    (a.normalized && t->normalizer_ ? normalized : raw).push_back(a);
    t->added_.push_back(std::move(a));
  }
  t->raw_matcher_ = AddedTokenMatcher(std::move(raw));
  t->normalized_matcher_ = AddedTokenMatcher(std::move(normalized));

  // transformers-side adjustments from tokenizer_config.json.
  if (RebuildsPostProcessor(config.tokenizer_class)) {
    t->prefix_ids_.clear();
    t->suffix_ids_.clear();
    auto id_of = [&](const std::optional<std::string>& tok,
                     const char* what) -> StatusOr<int32_t> {
      if (!tok) {
        return InvalidArgumentError(std::string("tokenizer_config.json: add_") +
                                    what + "_token is true but " + what +
                                    "_token is not set");
      }
      auto id = t->TokenToId(*tok);
      if (!id) {
        return InvalidArgumentError(std::string("tokenizer_config.json: ") +
                                    what + "_token \"" + *tok +
                                    "\" is not in the vocabulary");
      }
      return *id;
    };
    if (config.add_bos_token.value_or(true)) {
      ASSIGN_OR_RETURN(int32_t id, id_of(config.bos_token, "bos"));
      t->prefix_ids_.push_back(id);
    }
    if (config.add_eos_token.value_or(false)) {
      ASSIGN_OR_RETURN(int32_t id, id_of(config.eos_token, "eos"));
      t->suffix_ids_.push_back(id);
    }
  }
  if (config.add_prefix_space &&
      OverridesByteLevelPrefixSpace(config.tokenizer_class) &&
      t->pre_tokenizer_) {
    t->pre_tokenizer_->SetAddPrefixSpace(*config.add_prefix_space);
  }
  return t;
}

void HfTokenizer::ModelPass(AlignedString s, Encoding* out) const {
  if (s.text.empty()) return;
  PreTokenized pt;
  pt.s = std::move(s);
  pt.pieces.emplace_back(0, static_cast<uint32_t>(pt.s.text.size()));
  if (pre_tokenizer_) pre_tokenizer_->PreTokenize(&pt);
  thread_local std::vector<WordToken> word;
  for (const auto& [b, e] : pt.pieces) {
    word.clear();
    model_->Tokenize(std::string_view(pt.s.text).substr(b, e - b), &word);
    for (const WordToken& w : word) {
      out->ids.push_back(w.id);
      const Span32 r = pt.s.Range(b + w.begin, b + w.end);
      out->offsets.emplace_back(r.start, r.end);
    }
  }
}

void HfTokenizer::EncodeText(std::string_view text, uint32_t base,
                             Encoding* out) const {
  if (text.empty()) return;
  AlignedString s = AlignedString::Identity(text, base);
  if (normalizer_) {
    // Normalizers only fail on ICU internal errors, which valid UTF-8 rules
    // out.
    normalizer_->Normalize(&s).IgnoreError();
  }
  if (normalized_matcher_.empty()) {
    ModelPass(std::move(s), out);
    return;
  }
  std::vector<AddedTokenMatcher::Match> matches;
  normalized_matcher_.FindAll(s.text, &matches);
  size_t pos = 0;
  for (const auto& m : matches) {
    AlignedString part;
    part.AppendSlice(s, pos, m.begin);
    ModelPass(std::move(part), out);
    out->ids.push_back(m.id);
    const Span32 r = s.Range(m.begin, m.end);
    out->offsets.emplace_back(r.start, r.end);
    pos = m.end;
  }
  AlignedString rest;
  rest.AppendSlice(s, pos, s.text.size());
  ModelPass(std::move(rest), out);
}

Status HfTokenizer::Encode(std::string_view text, bool add_special_tokens,
                           Encoding* out) const {
  if (add_special_tokens) {
    for (int32_t id : prefix_ids_) {
      out->ids.push_back(id);
      out->offsets.emplace_back(0, 0);
    }
  }
  std::vector<AddedTokenMatcher::Match> matches;
  raw_matcher_.FindAll(text, &matches);
  size_t pos = 0;
  for (const auto& m : matches) {
    EncodeText(text.substr(pos, m.begin - pos), static_cast<uint32_t>(pos),
               out);
    out->ids.push_back(m.id);
    out->offsets.emplace_back(m.begin, m.end);
    pos = m.end;
  }
  EncodeText(text.substr(pos), static_cast<uint32_t>(pos), out);
  if (add_special_tokens) {
    for (int32_t id : suffix_ids_) {
      out->ids.push_back(id);
      out->offsets.emplace_back(text.size(), text.size());
    }
  }
  return Status::Ok();
}

StatusOr<std::string> HfTokenizer::Decode(std::span<const int32_t> ids,
                                          bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      if (skip_special_tokens && added_[it->second].special) continue;
      tokens.push_back(added_[it->second].content);
      continue;
    }
    const std::string* t = model_->IdToToken(id);
    if (t == nullptr) {
      return InvalidArgumentError("decode: id " + std::to_string(id) +
                                  " at position " + std::to_string(i) +
                                  " is not in the vocabulary (size " +
                                  std::to_string(vocab_size_) + ")");
    }
    tokens.push_back(*t);
  }
  if (!decoder_) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) joined += ' ';
      joined += tokens[i];
    }
    return joined;
  }
  decoder_->DecodeChain(&tokens);
  std::string text;
  for (const auto& t : tokens) text += t;
  return text;
}

}  // namespace

StatusOr<std::unique_ptr<TokenizerImpl>> LoadHfTokenizer(
    const std::string& path, const TokenizerConfig& config) {
  ASSIGN_OR_RETURN(Json j, ReadJsonFile(path, "tokenizer.json"));
  try {
    ASSIGN_OR_RETURN(auto t, HfTokenizer::Create(j, config));
    return std::unique_ptr<TokenizerImpl>(std::move(t));
  } catch (const Json::exception& e) {
    return DataLossError(std::string("tokenizer.json: unexpected structure: ") +
                         e.what());
  }
}

}  // namespace loom::tok::internal
