// `loom serve` under load: 64 concurrent HTTP clients send /generate
// requests to an in-process server on a loopback port. Two servers, run in
// the same process on the same model and the same requests: a one-at-a-time
// server (one KV slot: every forward carries one sequence, as TheLoom's
// sequential loop) and the batching server (16 slots: prefills and decodes
// of many requests share forwards). Reported: requests/s and generated
// tokens/s of each, and the batching server's speedup.
//
// Models: the bundled stories260K, and the synthetic TinyLlama-1.1B-shaped
// model (bf16) with stories260K's tokenizer copied in (its ids are valid
// ids of the 32000-token vocabulary; the text is meaningless, the forwards
// are real).
#include <benchmark/benchmark.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "src/serve/server.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string ModelDir(int which) {
  const std::string stories = std::string(LOOM_MODELS_DIR) + "/stories260K";
  if (which == 0) return stories;
  const std::string dir = bench::SyntheticTinyLlamaDir();
  for (const char* f :
       {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
    if (!fs::exists(fs::path(dir) / f))
      fs::copy_file(fs::path(stories) / f, fs::path(dir) / f);
  return dir;
}

struct LoadResult {
  double seconds = 0;
  int64_t ok = 0, failed = 0, tokens = 0;
};

LoadResult RunLoad(const std::string& model, int64_t slots, int clients,
                   int per_client, int64_t max_tokens, int compute_threads) {
  serve::ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.model_paths = {model};
  o.engine.precision = Precision::kAuto;
  o.engine.slots = slots;
  o.engine.context = 256;
  o.engine.prefill_chunk = 128;
  o.engine.max_queue = 1024;
  o.engine.threads = compute_threads;
  auto server = serve::Server::Create(o);
  LoadResult r;
  if (!server.ok() || !(*server)->LoadModel(model).ok() ||
      !(*server)->Bind().ok()) {
    r.failed = 1;
    return r;
  }
  std::thread run([&] { (*server)->Run().IgnoreError(); });
  const int port = (*server)->port();
  std::atomic<int64_t> ok{0}, failed{0}, tokens{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      httplib::Client http("127.0.0.1", port);
      http.set_read_timeout(600);
      for (int k = 0; k < per_client; ++k) {
        const nlohmann::json body = {
            {"prompt", "Once upon a time, in a town far away, there lived a " +
                           std::to_string(c * per_client + k)},
            {"max_tokens", max_tokens},
            {"temperature", 0.8},
            {"seed", c},
            {"ignore_eos", true},
            {"hidden_state_layers", {-1}}};
        auto res = http.Post("/generate", body.dump(), "application/json");
        if (res && res->status == 200) {
          ++ok;
          tokens +=
              nlohmann::json::parse(res->body)["token_count"].get<int64_t>();
        } else {
          ++failed;
        }
      }
    });
  for (auto& t : threads) t.join();
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  (*server)->Stop();
  run.join();
  r.ok = ok;
  r.failed = failed;
  r.tokens = tokens;
  return r;
}

// range(0): 0 = stories260K, 1 = synthetic TinyLlama-1.1B.
void BM_ServeBatchingVsOneAtATime(benchmark::State& state) {
  const int which = static_cast<int>(state.range(0));
  const std::string model = ModelDir(which);
  const int clients = 64;
  const int per_client = which == 0 ? 4 : 1;
  const int64_t max_tokens = which == 0 ? 32 : 4;
  // stories260K's forwards are too small to share between threads: one
  // compute thread (both servers), the other core serves HTTP.
  const int threads = which == 0 ? 1 : 0;
  LoadResult one, batched;
  for (auto _ : state) {
    one = RunLoad(model, 1, clients, per_client, max_tokens, threads);
    batched = RunLoad(model, 16, clients, per_client, max_tokens, threads);
    if (one.failed + batched.failed > 0) {
      state.SkipWithError("requests failed");
      return;
    }
    state.SetIterationTime(one.seconds + batched.seconds);
  }
  state.counters["one_req/s"] = one.ok / one.seconds;
  state.counters["one_tok/s"] = one.tokens / one.seconds;
  state.counters["batched_req/s"] = batched.ok / batched.seconds;
  state.counters["batched_tok/s"] = batched.tokens / batched.seconds;
  state.counters["speedup"] = one.seconds / batched.seconds;
}
BENCHMARK(BM_ServeBatchingVsOneAtATime)
    ->ArgName("model")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kSecond);

}  // namespace
}  // namespace loom
