// The token stream an evaluation runs over: read from a text file (through
// the model's tokenizer, without special tokens, then BOS handled by the
// --add-bos rule) or from a file of pre-tokenised ids, plus the window
// options that follow from it (docs/eval/perplexity.md, "BOS").
#ifndef LOOM_EVAL_INPUT_H_
#define LOOM_EVAL_INPUT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/eval/windows.h"
#include "src/model/config.h"

namespace loom::eval {

// --add-bos auto|yes|no.
enum class AddBos { kAuto, kYes, kNo };
StatusOr<AddBos> ParseAddBos(std::string_view text);

struct InputOptions {
  std::string text_file;  // exactly one of text_file / tokens_file
  std::string tokens_file;
  std::string tokenizer_dir;  // for text_file
  AddBos add_bos = AddBos::kAuto;
};

struct EvalInput {
  std::vector<int32_t>
      ids;           // the stream, with the leading BOS when bos is true
  bool bos = false;  // the stream starts with a BOS (added or given)
  int32_t bos_id = -1;
  std::string source;  // "text FILE (N bytes)" / "tokens FILE"
};

// Text: the file's bytes as UTF-8 (no newline translation), encoded without
// special tokens; BOS prepended once when add_bos is yes, or auto and the
// tokenizer adds BOS by default. Tokens: whitespace/comma-separated ids (a
// JSON array works) used as given; yes prepends BOS unless the ids already
// start with it; auto means "BOS if the ids start with it". The BOS id is the
// tokenizer's, else config.bos_token_id.
StatusOr<EvalInput> LoadEvalInput(const InputOptions& options,
                                  const ModelConfig& config);

// Encodes `text` like LoadEvalInput does for a text file.
StatusOr<EvalInput> TokenizeText(std::string_view text,
                                 const std::string& tokenizer_dir,
                                 AddBos add_bos, const ModelConfig& config);

// Token ids given as they are (a tokens file's, or the Python module's
// list), with the BOS rule of a tokens file: yes prepends BOS unless the ids
// start with it, auto means "BOS if they start with it"; the BOS id is
// config.bos_token_id.
StatusOr<EvalInput> TokenIdsInput(std::vector<int32_t> ids, AddBos add_bos,
                                  const ModelConfig& config);

// Whitespace/comma-separated ids ('[' and ']' ignored).
StatusOr<std::vector<int32_t>> ParseTokenIds(std::string_view text,
                                             const std::string& what);

// The window options for `protocol` over this input: llama-cpp puts BOS at
// the start of every window when the stream starts with BOS.
WindowOptions MakeWindowOptions(Protocol protocol, int64_t ctx, int64_t stride,
                                int64_t max_windows, const EvalInput& input);

}  // namespace loom::eval

#endif  // LOOM_EVAL_INPUT_H_
