// tokenizer_config.json (plus special_tokens_map.json as a fallback for the
// special-token strings): the transformers-side settings that change what
// encode() produces.
#ifndef LOOM_SRC_TOKENIZER_TOKENIZER_CONFIG_H_
#define LOOM_SRC_TOKENIZER_TOKENIZER_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "src/base/status.h"

namespace loom::tok {

// An added (often special) token: the flags of tokenizer.json "added_tokens"
// and of tokenizer_config.json "added_tokens_decoder".
struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool single_word = false;
};

struct TokenizerConfig {
  bool present = false;  // tokenizer_config.json existed
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
  std::optional<bool> add_prefix_space;
  std::optional<bool> legacy;
  std::optional<bool> spaces_between_special_tokens;
  std::optional<bool> clean_up_tokenization_spaces;
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
  std::optional<std::string> unk_token;
  std::vector<std::string> additional_special_tokens;
  // Absent when the file gives none or the "unbounded" sentinel (~1e30).
  std::optional<int64_t> model_max_length;
  // Kept verbatim for a later chat-template feature. When the file holds a
  // list of named templates, this is the one named "default" (else the first).
  std::string chat_template;
  std::string tokenizer_class;
  std::vector<AddedToken> added_tokens_decoder;

  // Reads dir/tokenizer_config.json and dir/special_tokens_map.json; both are
  // optional. A malformed file is an error naming the file and field.
  static StatusOr<TokenizerConfig> Load(const std::string& dir);
};

}  // namespace loom::tok

#endif  // LOOM_SRC_TOKENIZER_TOKENIZER_CONFIG_H_
