// Internal interface shared by the tokenizer.json and tokenizer.model
// back ends. Not part of the public API.
#ifndef LOOM_SRC_TOKENIZER_TOKENIZER_IMPL_H_
#define LOOM_SRC_TOKENIZER_TOKENIZER_IMPL_H_

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "src/base/status.h"
#include "src/tokenizer/tokenizer.h"

namespace loom::tok::internal {

class TokenizerImpl {
 public:
  virtual ~TokenizerImpl() = default;
  // `text` is valid UTF-8 and shorter than 4 GiB. Appends to `out`.
  virtual Status Encode(std::string_view text, bool add_special_tokens,
                        Encoding* out) const = 0;
  virtual StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                       bool skip_special_tokens) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<std::string> IdToToken(int32_t id) const = 0;
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;
  // The ids Encode(…, true) puts before / after the text.
  virtual std::vector<int32_t> PrefixIds() const = 0;
  virtual std::vector<int32_t> SuffixIds() const = 0;
};

StatusOr<std::unique_ptr<TokenizerImpl>> LoadHfTokenizer(
    const std::string& path, const TokenizerConfig& config);
StatusOr<std::unique_ptr<TokenizerImpl>> LoadSpmTokenizer(
    const std::string& path, const TokenizerConfig& config);

}  // namespace loom::tok::internal

#endif  // LOOM_SRC_TOKENIZER_TOKENIZER_IMPL_H_
