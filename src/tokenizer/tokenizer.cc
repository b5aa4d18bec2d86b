#include "src/tokenizer/tokenizer.h"

#include <atomic>
#include <filesystem>
#include <thread>

#include "src/tokenizer/tokenizer_impl.h"
#include "src/tokenizer/utf8.h"

namespace loom::tok {
namespace {

// An error of loading a file of `dir`, naming `dir` once: a message that
// starts with a path inside it ("<dir>/tokenizer.json: read: …") stays as
// it is; one naming only the file ("tokenizer.json: not valid JSON") gets
// "<dir>: " in front.
Status InDir(const Status& s, const std::string& dir) {
  const std::string& m = s.message();
  const bool names_dir =
      m.starts_with(dir) &&
      (dir.ends_with('/') || (m.size() > dir.size() && m[dir.size()] == '/'));
  return names_dir ? s : s.WithContext(dir);
}

}  // namespace

Tokenizer::~Tokenizer() = default;

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return NotFoundError("tokenizer directory " + dir + " not found");
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  {
    auto cfg = TokenizerConfig::Load(dir);
    if (!cfg.ok()) return InDir(cfg.status(), dir);
    t->config_ = std::move(*cfg);
  }
  const std::string json_path = (fs::path(dir) / "tokenizer.json").string();
  const std::string model_path = (fs::path(dir) / "tokenizer.model").string();
  if (fs::exists(json_path, ec)) {
    t->source_ = "tokenizer.json";
    auto impl = internal::LoadHfTokenizer(json_path, t->config_);
    if (!impl.ok()) return InDir(impl.status(), dir);
    t->impl_ = std::move(*impl);
  } else if (fs::exists(model_path, ec)) {
    t->source_ = "tokenizer.model";
    auto impl = internal::LoadSpmTokenizer(model_path, t->config_);
    if (!impl.ok()) return InDir(impl.status(), dir);
    t->impl_ = std::move(*impl);
  } else {
    return NotFoundError(dir +
                         ": neither tokenizer.json nor tokenizer.model found");
  }

  auto id_of = [&](const std::optional<std::string>& token) -> int32_t {
    if (!token || token->empty()) return -1;
    return t->impl_->TokenToId(*token).value_or(-1);
  };
  t->bos_id_ = id_of(t->config_.bos_token);
  t->eos_id_ = id_of(t->config_.eos_token);
  t->pad_id_ = id_of(t->config_.pad_token);
  t->unk_id_ = id_of(t->config_.unk_token);
  const std::vector<int32_t> prefix = t->impl_->PrefixIds();
  const std::vector<int32_t> suffix = t->impl_->SuffixIds();
  // Without a config, the post-processor's single leading / trailing special
  // token stands for BOS / EOS.
  if (t->bos_id_ < 0 && !t->config_.bos_token && prefix.size() == 1)
    t->bos_id_ = prefix[0];
  if (t->eos_id_ < 0 && !t->config_.eos_token && suffix.size() == 1)
    t->eos_id_ = suffix[0];
  t->add_bos_ =
      t->bos_id_ >= 0 && !prefix.empty() && prefix.front() == t->bos_id_;
  t->add_eos_ =
      t->eos_id_ >= 0 && !suffix.empty() && suffix.back() == t->eos_id_;
  return t;
}

StatusOr<Encoding> Tokenizer::Encode(std::string_view text,
                                     bool add_special_tokens) const {
  EncodeOptions options;
  options.add_special_tokens = add_special_tokens;
  return Encode(text, options);
}

StatusOr<Encoding> Tokenizer::Encode(std::string_view text,
                                     const EncodeOptions& options) const {
  if (text.size() >= (uint64_t{1} << 32) - 16) {
    return OutOfRangeError("encode: text of " + std::to_string(text.size()) +
                           " bytes exceeds the 4 GiB limit");
  }
  Encoding enc;
  const size_t bad = FindInvalidUtf8(text);
  if (bad == std::string_view::npos) {
    RETURN_IF_ERROR(impl_->Encode(text, options.add_special_tokens, &enc));
    return enc;
  }
  if (options.invalid_utf8 == InvalidUtf8Policy::kError) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%02X",
                  static_cast<unsigned char>(text[bad]));
    return InvalidArgumentError("encode: invalid UTF-8 at byte offset " +
                                std::to_string(bad) + " (byte " + hex + ")");
  }
  // Replace invalid sequences by U+FFFD, encode, and map offsets back.
  std::vector<std::pair<uint32_t, uint32_t>> src;
  const std::string fixed = LossyUtf8(text, &src);
  RETURN_IF_ERROR(impl_->Encode(fixed, options.add_special_tokens, &enc));
  for (auto& [b, e] : enc.offsets) {
    const int64_t ob =
        b < static_cast<int64_t>(src.size()) ? src[b].first : text.size();
    const int64_t oe = e > b ? src[e - 1].second : ob;
    b = ob;
    e = oe;
  }
  return enc;
}

StatusOr<std::vector<Encoding>> Tokenizer::EncodeBatch(
    std::span<const std::string> texts, const EncodeOptions& options,
    int num_threads) const {
  std::vector<Encoding> out(texts.size());
  std::vector<Status> errors(texts.size());
  int threads = num_threads > 0
                    ? num_threads
                    : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::max(1, std::min<int>(threads, static_cast<int>(texts.size())));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < texts.size(); i = next++) {
      auto enc = Encode(texts[i], options);
      if (enc.ok()) {
        out[i] = std::move(*enc);
      } else {
        errors[i] = enc.status();
      }
    }
  };
  if (threads == 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (int k = 0; k < threads; ++k) pool.emplace_back(work);
    for (auto& th : pool) th.join();
  }
  for (size_t i = 0; i < errors.size(); ++i) {
    if (!errors[i].ok())
      return errors[i].WithContext("text " + std::to_string(i));
  }
  return out;
}

StatusOr<std::string> Tokenizer::Decode(std::span<const int32_t> ids,
                                        bool skip_special_tokens) const {
  DecodeOptions options;
  options.skip_special_tokens = skip_special_tokens;
  return Decode(ids, options);
}

namespace {
// transformers' clean_up_tokenization().
std::string CleanUpTokenizationSpaces(std::string s) {
  static const std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},     {" !", "!"},   {" ,", ","},
      {" ' ", "'"},    {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"},
      {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    std::string out;
    size_t pos = 0;
    for (size_t hit; (hit = s.find(from, pos)) != std::string::npos;
         pos = hit + from.size()) {
      out.append(s, pos, hit - pos);
      out.append(to);
    }
    out.append(s, pos, std::string::npos);
    s = std::move(out);
  }
  return s;
}
}  // namespace

StatusOr<std::string> Tokenizer::Decode(std::span<const int32_t> ids,
                                        const DecodeOptions& options) const {
  ASSIGN_OR_RETURN(std::string text,
                   impl_->Decode(ids, options.skip_special_tokens));
  if (options.clean_up_tokenization_spaces.value_or(
          config_.clean_up_tokenization_spaces.value_or(false))) {
    text = CleanUpTokenizationSpaces(std::move(text));
  }
  return text;
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size(); }

std::string Tokenizer::IdToToken(int32_t id) const {
  return impl_->IdToToken(id).value_or("");
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  return impl_->TokenToId(token);
}

bool Tokenizer::IsSpecial(int32_t id) const { return impl_->IsSpecial(id); }

}  // namespace loom::tok
