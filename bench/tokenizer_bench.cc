// Tokenizer throughput on the WikiText-2 raw test text (from the shared data
// beside the repository) with the qwen3, llama3 and llama2 tokenizers.
// Reports bytes/s and tokens/s; nothing is asserted.
//
//   build/loom_bench --benchmark_filter=Tokenize
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "src/tokenizer/tokenizer.h"

namespace loom::tok {
namespace {

const std::string kShared = LOOM_TOKENIZER_BENCH_SHARED_DIR;

const std::string* WikiText() {
  static const std::string* text = []() -> std::string* {
    std::ifstream in(kShared + "/data/wiki.test.raw", std::ios::binary);
    if (!in) return nullptr;
    std::stringstream s;
    s << in.rdbuf();
    return new std::string(s.str());
  }();
  return text;
}

const std::vector<std::string>& WikiLines() {
  static const std::vector<std::string> lines = [] {
    std::vector<std::string> out;
    if (const std::string* text = WikiText()) {
      std::stringstream s(*text);
      std::string line;
      while (std::getline(s, line)) out.push_back(line + "\n");
    }
    return out;
  }();
  return lines;
}

const Tokenizer* Get(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>>* cache =
      new std::map<std::string, std::unique_ptr<Tokenizer>>();
  auto it = cache->find(name);
  if (it != cache->end()) return it->second.get();
  auto t = Tokenizer::Load(kShared + "/models/tokenizers/" + name);
  if (!t.ok()) return nullptr;
  return (*cache)[name] = std::move(*t), (*cache)[name].get();
}

bool Prepare(benchmark::State& state, const std::string& name,
             const Tokenizer** tok) {
  *tok = Get(name);
  if (WikiText() == nullptr || *tok == nullptr) {
    state.SkipWithError(("shared data not found (" + kShared +
                         "/data/wiki.test.raw or the " + name +
                         " tokenizer): benchmark NOT run")
                            .c_str());
    return false;
  }
  return true;
}

// The whole file as one input, one thread.
void BM_TokenizeWholeText(benchmark::State& state, std::string name) {
  const Tokenizer* tok = nullptr;
  if (!Prepare(state, name, &tok)) return;
  int64_t tokens = 0;
  for (auto _ : state) {
    auto enc = tok->Encode(*WikiText(), false);
    if (!enc.ok()) {
      state.SkipWithError(enc.status().ToString().c_str());
      return;
    }
    tokens += static_cast<int64_t>(enc->ids.size());
  }
  state.SetBytesProcessed(state.iterations() *
                          static_cast<int64_t>(WikiText()->size()));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens),
                                                  benchmark::Counter::kIsRate);
}

// Line by line (one Encode per line), on `threads` threads via EncodeBatch.
void BM_TokenizeLines(benchmark::State& state, std::string name) {
  const Tokenizer* tok = nullptr;
  if (!Prepare(state, name, &tok)) return;
  const int threads = static_cast<int>(state.range(0));
  EncodeOptions options;
  options.add_special_tokens = false;
  int64_t tokens = 0;
  for (auto _ : state) {
    auto encs = tok->EncodeBatch(WikiLines(), options, threads);
    if (!encs.ok()) {
      state.SkipWithError(encs.status().ToString().c_str());
      return;
    }
    for (const auto& e : *encs) tokens += static_cast<int64_t>(e.ids.size());
  }
  state.SetBytesProcessed(state.iterations() *
                          static_cast<int64_t>(WikiText()->size()));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens),
                                                  benchmark::Counter::kIsRate);
  state.counters["threads"] = threads;
}

BENCHMARK_CAPTURE(BM_TokenizeWholeText, qwen3, std::string("qwen3"))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TokenizeWholeText, llama3, std::string("llama3"))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TokenizeWholeText, llama2, std::string("llama2"))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TokenizeLines, qwen3, std::string("qwen3"))
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TokenizeLines, llama3, std::string("llama3"))
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TokenizeLines, llama2, std::string("llama2"))
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace loom::tok
