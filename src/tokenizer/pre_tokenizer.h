// tokenizer.json pre-tokenizers: ByteLevel, Split, Metaspace, Digits,
// Punctuation, Whitespace, WhitespaceSplit, BertPreTokenizer, Sequence.
//
// A PreTokenized holds one aligned buffer and the list of pieces (byte ranges
// of that buffer) the model will see one at a time. Splitting only edits the
// piece list; rewriting pre-tokenizers (ByteLevel, Metaspace) rebuild the
// buffer once per call, so no per-piece allocation happens.
#ifndef LOOM_SRC_TOKENIZER_PRE_TOKENIZER_H_
#define LOOM_SRC_TOKENIZER_PRE_TOKENIZER_H_

#include <memory>
#include <vector>

#include "src/base/status.h"
#include "src/tokenizer/json_util.h"
#include "src/tokenizer/normalizer.h"
#include "src/tokenizer/regex.h"

namespace loom::tok {

using ByteRange = std::pair<uint32_t, uint32_t>;

struct PreTokenized {
  AlignedString s;
  std::vector<ByteRange> pieces;
};

enum class SplitBehavior {
  kRemoved,
  kIsolated,
  kMergedWithPrevious,
  kMergedWithNext,
  kContiguous
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void PreTokenize(PreTokenized* pt) const = 0;
  // The top-level ByteLevel pre-tokenizer's add_prefix_space can be overridden
  // by tokenizer_config.json (GPT-2 style tokenizers); returns false when this
  // pre-tokenizer has no such setting.
  virtual bool SetAddPrefixSpace(bool value) { return false; }
};

StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const Json& j,
                                                          const JsonPath& at);

}  // namespace loom::tok

#endif  // LOOM_SRC_TOKENIZER_PRE_TOKENIZER_H_
