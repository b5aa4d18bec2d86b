// Harness: prompt files. The input is written as a prompt file (mode bit 0:
// `.jsonl` or `.txt`, so both the JSONL and the plain-text readers run) and
//   - read row by row by extract's InputReader and prepared by RowPreparer
//     (the bundled model's tokenizer; template, BOS, lengths, vocabulary,
//     selectors);
//   - read again from the byte offset of a middle row, as --resume does: the
//     rows from there must be the same;
//   - read by ReadWindow under both --on-error policies;
//   - read by perplexity's LoadEvalInput as a token-id file, and its first
//     line parsed as a row selector.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "src/eval/extract_rows.h"
#include "src/eval/input.h"
#include "src/eval/row_selector.h"
#include "src/model/registry.h"
#include "src/tokenizer/tokenizer.h"

namespace loom::fuzz {
namespace {

struct Fixture {
  ModelConfig config;
  std::unique_ptr<tok::Tokenizer> tokenizer;
  std::vector<RowSelector> selectors;
  std::unique_ptr<RowPreparer> preparer;
};

const Fixture& Get() {
  static const Fixture* f = [] {
    auto* f = new Fixture;
    const std::string dir = SourcePath("models/stories260K");
    auto c = LoadModelConfig(dir);
    auto t = tok::Tokenizer::Load(dir);
    if (!c.ok() || !t.ok()) Fail("bundled model: cannot load");
    f->config = *c;
    f->tokenizer = std::move(*t);
    for (const char* s : {"last", "span:1:3", "all", "pos:0,-1"}) {
      auto sel = ParseRowSelector(s);
      if (!sel.ok()) Fail(sel.status().ToString());
      f->selectors.push_back(*sel);
    }
    RowPreparer::Options o;
    o.template_text = "Q: {text}";
    o.batch_tokens = 32;
    o.max_row_tokens = 96;
    o.max_positions = f->config.max_position_embeddings;
    o.vocab_size = f->config.vocab_size;
    o.config_bos_id = f->config.bos_token_id;
    f->preparer =
        std::make_unique<RowPreparer>(o, f->tokenizer.get(), "", &f->selectors);
    return f;
  }();
  return *f;
}

struct Read {
  int64_t offset = 0;  // where the row starts
  PreparedRow row;
};

std::vector<Read> ReadAll(const std::string& path, int64_t offset,
                          int64_t first_index, bool replace) {
  std::vector<Read> out;
  auto reader = InputReader::Open(path, offset, first_index);
  if (!reader.ok())
    Fail("cannot open " + path + ": " + reader.status().ToString());
  for (int guard = 0; guard < 100000; ++guard) {
    const int64_t at = (*reader)->offset();
    InputRow row;
    auto more = (*reader)->Next(&row, replace);
    if (!more.ok() || !*more) break;
    if (row.index != first_index + static_cast<int64_t>(out.size()))
      Fail("row index " + std::to_string(row.index) + " out of sequence");
    out.push_back({at, Get().preparer->Prepare(std::move(row))});
  }
  return out;
}

bool Same(const PreparedRow& a, const PreparedRow& b) {
  return a.index == b.index && a.id == b.id && a.ids == b.ids &&
         a.reason == b.reason;
}

}  // namespace
}  // namespace loom::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom;
  using namespace loom::fuzz;
  const auto in = TakeMode(data, size);
  const std::string path =
      WriteScratch(in.mode % 2 ? "prompts.txt" : "prompts.jsonl", in.rest);
  const bool replace = (in.mode >> 1) % 2;
  const std::vector<Read> all = ReadAll(path, 0, 0, replace);
  if (!all.empty()) {
    const size_t k = all.size() / 2;
    const std::vector<Read> rest =
        ReadAll(path, all[k].offset, static_cast<int64_t>(k), replace);
    if (rest.size() != all.size() - k)
      Fail("resuming at row " + std::to_string(k) + " read " +
           std::to_string(rest.size()) + " rows, not " +
           std::to_string(all.size() - k));
    for (size_t i = 0; i < rest.size(); ++i)
      if (!Same(rest[i].row, all[k + i].row) ||
          rest[i].offset != all[k + i].offset)
        Fail("row " + std::to_string(k + i) + " differs when resumed");
  }
  for (OnError policy : {OnError::kFail, OnError::kSkip}) {
    auto reader = InputReader::Open(path, 0, 0);
    if (!reader.ok()) Fail(reader.status().ToString());
    bool eof = false;
    for (int w = 0; w < 1000 && !eof; ++w) {
      auto window =
          ReadWindow(**reader, *Get().preparer, 7, replace, policy, 0, &eof);
      if (!window.ok()) break;
    }
  }
  eval::InputOptions io;
  io.tokens_file = path;
  (void)eval::LoadEvalInput(io, Get().config);
  (void)ParseRowSelector(std::string(Split(in.rest, '\n', 2)[0]));
  return 0;
}
