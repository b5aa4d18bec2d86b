// Harness: tokenizers from the hub, and text through them.
//   mode 0: the input is tokenizer.json (alone in its directory);
//   mode 1: the input is a SentencePiece tokenizer.model;
//   mode 2: the input is tokenizer_config.json beside a valid tokenizer.json;
//     each loaded tokenizer encodes and decodes a fixed text and ids;
//   mode 3: the input is text, encoded by one of the bundled tokenizers (the
//     next byte picks it and the options) and decoded back;
//   mode 4: the input is token ids (int32, any value) to decode.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "src/tokenizer/tokenizer.h"

namespace loom::fuzz {
namespace {

void Exercise(const tok::Tokenizer& t, std::string_view text) {
  for (bool special : {false, true}) {
    tok::EncodeOptions eo;
    eo.add_special_tokens = special;
    eo.invalid_utf8 = tok::InvalidUtf8Policy::kReplace;
    auto enc = t.Encode(text, eo);
    if (!enc.ok()) continue;
    for (int32_t id : enc->ids)
      if (id < 0 || id >= t.vocab_size())
        Fail("Encode gave id " + std::to_string(id) + " outside vocab " +
             std::to_string(t.vocab_size()));
    for (bool skip : {false, true}) {
      auto dec = t.Decode(enc->ids, skip);
      if (!dec.ok())
        Fail("Decode of Encode's own ids failed: " + dec.status().ToString());
    }
  }
}

constexpr std::string_view kText =
    "Hello world! 123 \xc3\xbc"
    "n"
    "\xc3\xaf"
    "c"
    "\xc3\xb6"
    "d"
    "\xc3\xa9"
    " \xe4\xbd\xa0\xe5\xa5\xbd <s> </s> <|endoftext|>\n\t  end \xff";

void LoadAndExercise(const std::string& dir) {
  auto t = tok::Tokenizer::Load(dir);
  if (!t.ok()) return;
  Exercise(**t, kText);
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < 64 && i < (*t)->vocab_size(); ++i) ids.push_back(i);
  (void)(*t)->Decode(ids, false);
  (void)(*t)->Decode(ids, true);
}

const std::vector<std::unique_ptr<tok::Tokenizer>>& Bundled() {
  static const auto* all = [] {
    auto* v = new std::vector<std::unique_ptr<tok::Tokenizer>>;
    for (const char* d :
         {"tests/data/tokenizers/tiny_bytebpe512_gpt2",
          "tests/data/tokenizers/tiny_bytebpe512_qwen2",
          "tests/data/tokenizers/tiny_spm512", "models/stories260K"}) {
      auto t = tok::Tokenizer::Load(SourcePath(d));
      if (!t.ok()) Fail("bundled tokenizer " + t.status().ToString());
      v->push_back(std::move(*t));
    }
    return v;
  }();
  return *all;
}

}  // namespace
}  // namespace loom::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom::fuzz;
  const auto in = TakeMode(data, size);
  switch (in.mode % 5) {
    case 0:
      WriteScratch("json/tokenizer.json", in.rest);
      LoadAndExercise(ScratchDir() + "/json");
      break;
    case 1:
      WriteScratch("spm/tokenizer.model", in.rest);
      LoadAndExercise(ScratchDir() + "/spm");
      break;
    case 2: {
      static const bool copied =
          (CopyDir(SourcePath("tests/data/tokenizers/tiny_bytebpe512_gpt2"),
                   ScratchDir() + "/config"),
           true);
      (void)copied;
      WriteScratch("config/tokenizer_config.json", in.rest);
      LoadAndExercise(ScratchDir() + "/config");
      break;
    }
    case 3: {
      if (in.rest.empty()) break;
      const auto& all = Bundled();
      const auto& t = *all[static_cast<uint8_t>(in.rest[0]) % all.size()];
      Exercise(t, in.rest.substr(1));
      break;
    }
    case 4: {
      if (in.rest.empty()) break;
      const auto& all = Bundled();
      const auto& t = *all[static_cast<uint8_t>(in.rest[0]) % all.size()];
      std::vector<int32_t> ids((in.rest.size() - 1) / 4);
      if (!ids.empty())
        std::memcpy(ids.data(), in.rest.data() + 1, ids.size() * 4);
      auto a = t.Decode(ids, false);
      auto b = t.Decode(ids, true);
      if (a.ok() != b.ok()) Fail("Decode validity depends on skip_special");
      break;
    }
  }
  return 0;
}
