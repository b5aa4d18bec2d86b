// Finds added tokens in text the way Hugging Face does: leftmost-longest
// matches, with each token's single_word, lstrip and rstrip rules.
#ifndef LOOM_SRC_TOKENIZER_ADDED_TOKENS_H_
#define LOOM_SRC_TOKENIZER_ADDED_TOKENS_H_

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "src/tokenizer/tokenizer_config.h"

namespace loom::tok {

class AddedTokenMatcher {
 public:
  struct Match {
    uint32_t begin;  // including whitespace eaten by lstrip
    uint32_t end;    // including whitespace eaten by rstrip
    int32_t id;
  };
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);
  bool empty() const { return tokens_.empty(); }
  // Appends the matches in `text` (valid UTF-8) in order.
  void FindAll(std::string_view text, std::vector<Match>* out) const;

 private:
  std::vector<AddedToken> tokens_;
  // Candidates per first byte, longest first.
  std::array<std::vector<uint32_t>, 256> by_first_byte_;
};

}  // namespace loom::tok

#endif  // LOOM_SRC_TOKENIZER_ADDED_TOKENS_H_
