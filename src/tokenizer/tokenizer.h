// Text <-> token ids, identical to Hugging Face for the supported families.
//
//   ASSIGN_OR_RETURN(auto tok, loom::tok::Tokenizer::Load(model_dir));
//   ASSIGN_OR_RETURN(loom::tok::Encoding enc, tok->Encode("Hello world",
//   true));
//   // enc.ids, enc.offsets (byte ranges into the input)
//
// Load() prefers tokenizer.json (the fast-tokenizer definition) and falls back
// to tokenizer.model (SentencePiece, with the slow LlamaTokenizer's rules);
// tokenizer_config.json adjusts both. See docs/design/tokenizers.md.
//
// Thread-safety: a loaded Tokenizer is immutable; every const method may be
// called from many threads at once.
#ifndef LOOM_SRC_TOKENIZER_TOKENIZER_H_
#define LOOM_SRC_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/base/status.h"
#include "src/tokenizer/tokenizer_config.h"

namespace loom::tok {

struct Encoding {
  std::vector<int32_t> ids;
  // Per token, the byte range [first, second) of the input text it covers.
  // Special tokens added by post-processing (BOS/EOS) and text inserted by the
  // tokenizer (a prefix space or "▁") have an empty range at the point where
  // they apply.
  std::vector<std::pair<int64_t, int64_t>> offsets;
};

enum class InvalidUtf8Policy {
  kError,    // invalid UTF-8 is an InvalidArgument error naming the byte offset
  kReplace,  // each maximal invalid sequence becomes U+FFFD, as Python's
             // bytes.decode("utf-8", errors="replace") would give HF
};

struct EncodeOptions {
  bool add_special_tokens = true;  // HF add_special_tokens
  InvalidUtf8Policy invalid_utf8 = InvalidUtf8Policy::kError;
};

struct DecodeOptions {
  bool skip_special_tokens = false;
  // HF clean_up_tokenization_spaces (" ," -> "," and similar); unset: the
  // value of tokenizer_config.json (false when absent).
  std::optional<bool> clean_up_tokenization_spaces;
};

namespace internal {
class TokenizerImpl;
}

class Tokenizer {
 public:
  // Loads the tokenizer in `dir` (a model directory or one holding only the
  // tokenizer files).
  static StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& dir);
  ~Tokenizer();

  StatusOr<Encoding> Encode(std::string_view text,
                            bool add_special_tokens) const;
  StatusOr<Encoding> Encode(std::string_view text,
                            const EncodeOptions& options) const;
  // Encodes `texts` on up to `num_threads` threads (0: hardware concurrency).
  // Fails with the first error, naming the index of the text.
  StatusOr<std::vector<Encoding>> EncodeBatch(
      std::span<const std::string> texts, const EncodeOptions& options,
      int num_threads = 0) const;

  // HF decode(ids, skip_special_tokens); clean_up_tokenization_spaces follows
  // tokenizer_config.json as in transformers. An id outside the vocabulary is
  // an InvalidArgument error.
  StatusOr<std::string> Decode(std::span<const int32_t> ids,
                               bool skip_special_tokens) const;
  StatusOr<std::string> Decode(std::span<const int32_t> ids,
                               const DecodeOptions& options) const;

  int32_t bos_id() const { return bos_id_; }  // -1 if none
  int32_t eos_id() const { return eos_id_; }  // -1 if none
  int32_t pad_id() const { return pad_id_; }  // -1 if none
  int32_t unk_id() const { return unk_id_; }  // -1 if none
  // Whether Encode(text, true) starts with bos_id() / ends with eos_id().
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  // Model vocabulary plus added tokens (largest id + 1).
  int64_t vocab_size() const;
  // "" when `id` is unknown.
  std::string IdToToken(int32_t id) const;
  std::optional<int32_t> TokenToId(std::string_view token) const;
  bool IsSpecial(int32_t id) const;

  const TokenizerConfig& config() const { return config_; }
  // "tokenizer.json" or "tokenizer.model".
  const std::string& source() const { return source_; }

 private:
  Tokenizer() = default;
  std::unique_ptr<internal::TokenizerImpl> impl_;
  TokenizerConfig config_;
  std::string source_;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  int32_t pad_id_ = -1;
  int32_t unk_id_ = -1;
  bool add_bos_ = false;
  bool add_eos_ = false;
};

}  // namespace loom::tok

#endif  // LOOM_SRC_TOKENIZER_TOKENIZER_H_
