// tokenizer.json decoders: ByteLevel, Metaspace, ByteFallback, Fuse, Strip,
// Replace, Sequence. Each maps a list of token strings to a new list, as
// Hugging Face's decode_chain does; the final text is their concatenation.
#ifndef LOOM_SRC_TOKENIZER_DECODER_H_
#define LOOM_SRC_TOKENIZER_DECODER_H_

#include <memory>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/tokenizer/json_util.h"

namespace loom::tok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
};

StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const Json& j,
                                                const JsonPath& at);

}  // namespace loom::tok

#endif  // LOOM_SRC_TOKENIZER_DECODER_H_
