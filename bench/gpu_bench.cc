// GPU benchmarks of the CUDA backend on a synthetic checkpoint (normally the
// `loom synth --preset llama-3.1-8b` model; bench/run_gpu_bench.sh writes it).
//
//   BM_GpuPrefill      one forward over all layers (hook: resid_post of the
//                      last layer) of 2048-token batches packed as 1 x 2048
//                      or 4 x 512: tokens/s and MFU.
//   BM_GpuExtractJob   the extraction job: 1000 prompts of 100-500 tokens,
//                      resid_post of layers L/2-1, L/2, L/2+1, the last token
//                      of every prompt copied to the host in bf16:
//                      prompts/s and tokens/s.
//   BM_GpuRunExtract   the same job through RunExtract (src/eval/extract.h)
//                      with --device cuda:0, writing .npy files; only with
//                      LOOM_GPU_BENCH_RUN_EXTRACT=1 (see below).
//
// Environment:
//   LOOM_GPU_BENCH_MODEL       the checkpoint directory (required; the cases
//                              skip without it or without a GPU)
//   LOOM_GPU_BENCH_INPUT       JSONL of {"id": N, "tokens": [...]} prompts
//                              (bench/hf_extract_baseline.py --write-prompts
//                              writes the same prompts the bench generates)
//   LOOM_GPU_PEAK_FLOPS        the peak used for MFU (default 989e12: H100
//                              SXM dense bf16)
//   LOOM_GPU_BENCH_RUN_EXTRACT 1 to run BM_GpuRunExtract: RunExtract plans
//                              on the --device list but runs its forward on
//                              the CPU backend in this tree, which would take
//                              hours on an 8B model.
//
// MFU counts 2 FLOPs per multiply-add of every projection (q, k, v, o, gate,
// up, down) plus causal attention (QK^T and PV over the previous tokens:
// 2 * 2 * heads * head_dim * (position + 1) per token and layer).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "src/backend/registry.h"
#include "src/eval/extract.h"
#include "src/model/registry.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"

namespace loom {
namespace {

constexpr int kPrompts = 1000;
constexpr int64_t kMinPromptTokens = 100;
constexpr int64_t kMaxPromptTokens = 500;
constexpr uint64_t kPromptSeed = 20240611;
constexpr int64_t kExtractBatchTokens = 4096;

// Why the GPU cases cannot run (empty when they can), and the device's name.
std::string GpuSkipReason(std::string* device_name) {
  std::string reason;
  const std::vector<GpuDescription> gpus = ListGpus(&reason);
  if (gpus.empty())
    return "no GPU: " + (reason.empty() ? std::string("none listed") : reason);
  if (device_name) *device_name = gpus[0].name;
  const char* model = std::getenv("LOOM_GPU_BENCH_MODEL");
  if (model == nullptr || *model == '\0')
    return "LOOM_GPU_BENCH_MODEL is not set (a directory written by `loom "
           "synth --preset llama-3.1-8b`; see bench/README-gpu.md)";
  return "";
}

std::string ModelDir() { return std::getenv("LOOM_GPU_BENCH_MODEL"); }

double PeakFlops() {
  const char* env = std::getenv("LOOM_GPU_PEAK_FLOPS");
  if (env != nullptr && *env != '\0') {
    const double v = std::strtod(env, nullptr);
    if (v > 0) return v;
  }
  return 989e12;
}

// FLOPs of one forward over sequences of the given lengths (layers
// [0, layers)): projections plus causal attention.
double ForwardFlops(const ModelConfig& c, int64_t layers,
                    const std::vector<int64_t>& lengths) {
  const double h = static_cast<double>(c.hidden_size);
  const double proj = h * static_cast<double>(c.q_dim()) +
                      2 * h * static_cast<double>(c.kv_dim()) +
                      static_cast<double>(c.q_dim()) * h +
                      3 * h * static_cast<double>(c.intermediate_size);
  double flops = 0;
  for (int64_t n : lengths) {
    const double t = static_cast<double>(n);
    // sum over positions p of (p + 1) = n (n + 1) / 2 key positions.
    const double attn = 4.0 * static_cast<double>(c.q_dim()) * t * (t + 1) / 2;
    flops += static_cast<double>(layers) * (2 * proj * t + attn);
  }
  return flops;
}

// One model per process (16 GB for the 8B preset), loaded on first use.
StatusOr<const Model*> GetModel() {
  static std::unique_ptr<Model> model;
  if (!model) {
    ASSIGN_OR_RETURN(model, Model::Load(ModelDir(), Precision::kBF16));
  }
  return model.get();
}

// One CUDA backend per process.
StatusOr<Backend*> GetBackend() {
  static std::unique_ptr<Backend> backend;
  if (!backend) {
    ASSIGN_OR_RETURN(backend, CreateBackend("cuda:0"));
  }
  return backend.get();
}

// ---- Prompts ---------------------------------------------------------------

struct Prompt {
  int64_t id = 0;
  std::vector<int32_t> tokens;
};

// 64-bit LCG (Knuth's MMIX constants), high bits out; the same generator as
// hf_extract_baseline.py's, so both write identical prompts.
class Lcg {
 public:
  explicit Lcg(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return state_ >> 33;
  }

 private:
  uint64_t state_;
};

std::vector<Prompt> GeneratePrompts(int64_t vocab_size) {
  Lcg rng(kPromptSeed);
  std::vector<Prompt> prompts(kPrompts);
  for (int i = 0; i < kPrompts; ++i) {
    prompts[i].id = i;
    const int64_t n =
        kMinPromptTokens +
        static_cast<int64_t>(rng.Next() %
                             (kMaxPromptTokens - kMinPromptTokens + 1));
    prompts[i].tokens.resize(static_cast<size_t>(n));
    for (auto& t : prompts[i].tokens)
      t = static_cast<int32_t>(rng.Next() % static_cast<uint64_t>(vocab_size));
  }
  return prompts;
}

StatusOr<std::vector<Prompt>> ReadPrompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) return IoError(path + ": cannot open");
  std::vector<Prompt> prompts;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("tokens"))
      return InvalidArgumentError(path + ": expected {\"id\", \"tokens\"} rows");
    Prompt p;
    p.id = j.value("id", static_cast<int64_t>(prompts.size()));
    p.tokens = j["tokens"].get<std::vector<int32_t>>();
    prompts.push_back(std::move(p));
  }
  return prompts;
}

Status WritePrompts(const std::vector<Prompt>& prompts,
                    const std::string& path) {
  std::ofstream out(path);
  for (const Prompt& p : prompts) {
    out << "{\"id\": " << p.id << ", \"tokens\": [";
    for (size_t i = 0; i < p.tokens.size(); ++i)
      out << (i ? "," : "") << p.tokens[i];
    out << "]}\n";
  }
  if (!out) return IoError(path + ": write failed");
  return Status();
}

// The prompts of $LOOM_GPU_BENCH_INPUT, else the generated ones.
StatusOr<std::vector<Prompt>> BenchPrompts(int64_t vocab_size) {
  const char* env = std::getenv("LOOM_GPU_BENCH_INPUT");
  if (env != nullptr && *env != '\0') return ReadPrompts(env);
  return GeneratePrompts(vocab_size);
}

// The JSONL file RunExtract reads: $LOOM_GPU_BENCH_INPUT, else the generated
// prompts written to the temp dir.
StatusOr<std::string> BenchInputFile(int64_t vocab_size) {
  const char* env = std::getenv("LOOM_GPU_BENCH_INPUT");
  if (env != nullptr && *env != '\0') return std::string(env);
  const std::string path =
      (std::filesystem::temp_directory_path() / "loom-gpu-bench-prompts.jsonl")
          .string();
  RETURN_IF_ERROR(WritePrompts(GeneratePrompts(vocab_size), path));
  return path;
}

// ---- BM_GpuPrefill ---------------------------------------------------------

// Args: sequences per batch, tokens per sequence.
void BM_GpuPrefill(benchmark::State& state) {
  std::string device_name;
  const std::string skip = GpuSkipReason(&device_name);
  if (!skip.empty()) {
    state.SkipWithError(skip.c_str());
    return;
  }
  const int64_t seqs = state.range(0);
  const int64_t seq_len = state.range(1);
  const int64_t tokens = seqs * seq_len;
  auto model = GetModel();
  auto backend = GetBackend();
  if (!model.ok() || !backend.ok()) {
    state.SkipWithError(
        (model.ok() ? backend.status() : model.status()).ToString().c_str());
    return;
  }
  const ModelConfig& c = (*model)->config();
  HookSet hooks;
  hooks.Add({HookSite::kResidPost, c.num_layers - 1});
  auto ex = Executor::Create(**model, hooks,
                             {.max_tokens = tokens,
                              .max_seq_len = seq_len,
                              .hf_bf16_activations = false,
                              .backend = *backend});
  if (!ex.ok()) {
    state.SkipWithError(ex.status().ToString().c_str());
    return;
  }
  std::vector<int32_t> ids(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i)
    ids[static_cast<size_t>(i)] =
        static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
  std::vector<int64_t> starts(static_cast<size_t>(seqs + 1));
  for (int64_t s = 0; s <= seqs; ++s)
    starts[static_cast<size_t>(s)] = s * seq_len;
  const Batch batch{ids, starts};
  // Warm-up: cuBLASLt plans, first-touch of the arenas.
  for (int i = 0; i < 2; ++i) {
    Status s = (*ex)->Forward(batch, nullptr);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  for (auto _ : state) {
    Status s = (*ex)->Forward(batch, nullptr);  // synchronizes at the end
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  const std::vector<int64_t> lengths(static_cast<size_t>(seqs), seq_len);
  const double flops_per_batch = ForwardFlops(c, c.num_layers, lengths);
  const double iters = static_cast<double>(state.iterations());
  state.counters["tok/s"] = benchmark::Counter(
      static_cast<double>(tokens) * iters, benchmark::Counter::kIsRate);
  state.counters["TFLOP/s"] = benchmark::Counter(
      flops_per_batch * iters / 1e12, benchmark::Counter::kIsRate);
  // The rate divided by the peak: a rate counter divided by a constant.
  state.counters["MFU"] = benchmark::Counter(
      flops_per_batch * iters / PeakFlops(), benchmark::Counter::kIsRate);
  state.counters["layers"] = static_cast<double>(c.num_layers);
  state.counters["peak_TFLOP/s"] = PeakFlops() / 1e12;
  state.SetLabel(device_name + ", " + std::to_string(seqs) + "x" +
                 std::to_string(seq_len) + " tokens, " +
                 std::to_string(c.num_layers) + " layers");
}

BENCHMARK(BM_GpuPrefill)
    ->ArgNames({"seqs", "len"})
    ->Args({1, 2048})
    ->Args({4, 512})
    ->Iterations(20)  // one call: each call uploads the weights again
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// ---- BM_GpuExtractJob ------------------------------------------------------

// Copies the last token of every sequence of every hook to pinned host memory
// in bf16 on the device (GatherRowsConvert), as the extraction job's capture
// does; the host copies them out after the forward.
class LastTokenSink : public HookSink {
 public:
  static StatusOr<std::unique_ptr<LastTokenSink>> Create(Backend& backend,
                                                         int64_t max_rows,
                                                         int64_t cols) {
    auto sink = std::unique_ptr<LastTokenSink>(new LastTokenSink(backend));
    sink->cols_ = cols;
    sink->max_rows_ = max_rows;
    ASSIGN_OR_RETURN(sink->index_, backend.Allocate(max_rows * 4,
                                                    MemoryKind::kPinnedHost));
    ASSIGN_OR_RETURN(sink->rows_, backend.Allocate(max_rows * cols * 2,
                                                   MemoryKind::kPinnedHost));
    return sink;
  }

  // Starts a batch: nothing staged.
  void Reset() { used_ = 0; }
  int64_t used() const { return used_; }
  const uint16_t* rows() const {
    return static_cast<const uint16_t*>(rows_.data());
  }

  Status OnActivation(const HookPoint& hook, const Batch& batch, int64_t seq,
                      int64_t row_begin, const ActivationView& view) override {
    if (view.dtype != DType::kF32 || view.cols != cols_)
      return InternalError("unexpected activation view");
    int32_t* index = static_cast<int32_t*>(index_.data()) + used_;
    int64_t n = 0;
    for (int64_t s = 0; s < batch.num_seqs(); ++s) {
      const int64_t last = batch.seq_start[static_cast<size_t>(s) + 1] - 1;
      if (last < row_begin || last >= row_begin + view.rows) continue;
      if (used_ + n >= max_rows_) return InternalError("sink full");
      index[n++] = static_cast<int32_t>(last - row_begin);
    }
    if (n == 0) return Status();
    backend_.GatherRowsConvert(static_cast<const float*>(view.data), view.ld,
                               index, n, cols_,
                               static_cast<uint16_t*>(rows_.data()) +
                                   used_ * cols_,
                               DType::kBF16);
    used_ += n;
    return Status();
  }

 private:
  explicit LastTokenSink(Backend& backend) : backend_(backend) {}
  Backend& backend_;
  int64_t cols_ = 0, max_rows_ = 0, used_ = 0;
  Buffer index_, rows_;
};

// Packs prompts (sorted by length) into batches of at most `budget` tokens;
// returns the prompt indices of each batch.
std::vector<std::vector<size_t>> PackBatches(const std::vector<Prompt>& prompts,
                                             int64_t budget) {
  std::vector<size_t> order(prompts.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return prompts[a].tokens.size() < prompts[b].tokens.size();
  });
  std::vector<std::vector<size_t>> batches;
  int64_t tokens = 0;
  for (size_t i : order) {
    const int64_t n = static_cast<int64_t>(prompts[i].tokens.size());
    if (batches.empty() || tokens + n > budget) {
      batches.emplace_back();
      tokens = 0;
    }
    batches.back().push_back(i);
    tokens += n;
  }
  return batches;
}

void BM_GpuExtractJob(benchmark::State& state) {
  std::string device_name;
  const std::string skip = GpuSkipReason(&device_name);
  if (!skip.empty()) {
    state.SkipWithError(skip.c_str());
    return;
  }
  auto model = GetModel();
  auto backend = GetBackend();
  if (!model.ok() || !backend.ok()) {
    state.SkipWithError(
        (model.ok() ? backend.status() : model.status()).ToString().c_str());
    return;
  }
  const ModelConfig& c = (*model)->config();
  auto prompts = BenchPrompts(c.vocab_size);
  if (!prompts.ok()) {
    state.SkipWithError(prompts.status().ToString().c_str());
    return;
  }
  int64_t max_len = 0, total_tokens = 0;
  for (const Prompt& p : *prompts) {
    max_len = std::max<int64_t>(max_len, static_cast<int64_t>(p.tokens.size()));
    total_tokens += static_cast<int64_t>(p.tokens.size());
  }
  const int64_t budget = std::max(kExtractBatchTokens, max_len);
  const int64_t mid = c.num_layers / 2;
  HookSet hooks;
  for (int64_t l = std::max<int64_t>(mid - 1, 0);
       l <= std::min(mid + 1, c.num_layers - 1); ++l)
    hooks.Add({HookSite::kResidPost, l});
  const int64_t num_hooks = static_cast<int64_t>(hooks.hooks().size());
  auto ex = Executor::Create(**model, hooks,
                             {.max_tokens = budget,
                              .max_seq_len = max_len,
                              .hf_bf16_activations = false,
                              .backend = *backend});
  if (!ex.ok()) {
    state.SkipWithError(ex.status().ToString().c_str());
    return;
  }
  // At most one row per token and hook in a batch.
  auto sink = LastTokenSink::Create(**backend, budget * num_hooks,
                                    c.hidden_size);
  if (!sink.ok()) {
    state.SkipWithError(sink.status().ToString().c_str());
    return;
  }
  const auto batches = PackBatches(*prompts, budget);
  // Host copies of the selected rows: [hook][prompt][hidden] bf16.
  std::vector<uint16_t> out(static_cast<size_t>(num_hooks) * prompts->size() *
                            static_cast<size_t>(c.hidden_size));
  std::vector<int32_t> ids;
  std::vector<int64_t> starts;
  auto run_batch = [&](const std::vector<size_t>& members) -> Status {
    ids.clear();
    starts.assign(1, 0);
    for (size_t i : members) {
      const auto& t = (*prompts)[i].tokens;
      ids.insert(ids.end(), t.begin(), t.end());
      starts.push_back(static_cast<int64_t>(ids.size()));
    }
    (*sink)->Reset();
    RETURN_IF_ERROR((*ex)->Forward(Batch{ids, starts}, sink->get()));
    // Forward synchronized: the gathered rows are in pinned memory, hook by
    // hook, in batch order.
    const size_t row_bytes = static_cast<size_t>(c.hidden_size) * 2;
    if ((*sink)->used() != num_hooks * static_cast<int64_t>(members.size()))
      return InternalError("unexpected number of captured rows");
    for (int64_t h = 0; h < num_hooks; ++h)
      for (size_t k = 0; k < members.size(); ++k)
        std::memcpy(out.data() + (static_cast<size_t>(h) * prompts->size() +
                                  members[k]) *
                                     static_cast<size_t>(c.hidden_size),
                    (*sink)->rows() +
                        (static_cast<size_t>(h) * members.size() + k) *
                            static_cast<size_t>(c.hidden_size),
                    row_bytes);
    return Status();
  };
  {
    Status s = run_batch(batches.back());  // warm-up: the longest prompts
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& b : batches) {
      Status s = run_batch(b);
      if (!s.ok()) {
        state.SkipWithError(s.ToString().c_str());
        return;
      }
    }
    const double dt =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    state.SetIterationTime(dt);
    seconds += dt;
  }
  std::vector<int64_t> lengths;
  for (const Prompt& p : *prompts)
    lengths.push_back(static_cast<int64_t>(p.tokens.size()));
  const double iters = static_cast<double>(state.iterations());
  state.counters["prompts/s"] =
      static_cast<double>(prompts->size()) * iters / seconds;
  state.counters["tok/s"] = static_cast<double>(total_tokens) * iters / seconds;
  // The layers run: the forward stops after the deepest hooked layer.
  const int64_t layers_run = hooks.hooks().back().layer + 1;
  state.counters["MFU"] =
      ForwardFlops(c, layers_run, lengths) * iters / seconds / PeakFlops();
  state.counters["prompts"] = static_cast<double>(prompts->size());
  state.counters["batches"] = static_cast<double>(batches.size());
  state.counters["layers_run"] = static_cast<double>(layers_run);
  state.SetLabel(device_name + ", resid_post of layers " +
                 std::to_string(hooks.hooks().front().layer) + ".." +
                 std::to_string(hooks.hooks().back().layer) +
                 ", last token, " + std::to_string(budget) +
                 "-token batches");
}

BENCHMARK(BM_GpuExtractJob)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kSecond);

// ---- BM_GpuRunExtract ------------------------------------------------------

void BM_GpuRunExtract(benchmark::State& state) {
  std::string device_name;
  const std::string skip = GpuSkipReason(&device_name);
  if (!skip.empty()) {
    state.SkipWithError(skip.c_str());
    return;
  }
  const char* run = std::getenv("LOOM_GPU_BENCH_RUN_EXTRACT");
  if (run == nullptr || std::strcmp(run, "1") != 0) {
    state.SkipWithError(
        "set LOOM_GPU_BENCH_RUN_EXTRACT=1 to run RunExtract with --device "
        "cuda:0 (its forward runs on the CPU backend in this tree)");
    return;
  }
  auto config = LoadModelConfig(ModelDir());
  if (!config.ok()) {
    state.SkipWithError(config.status().ToString().c_str());
    return;
  }
  auto input = BenchInputFile(config->vocab_size);
  if (!input.ok()) {
    state.SkipWithError(input.status().ToString().c_str());
    return;
  }
  const int64_t mid = config->num_layers / 2;
  ExtractSummary last;
  for (auto _ : state) {
    ExtractOptions o;
    o.model_dir = ModelDir();
    o.input_path = *input;
    o.out_dir =
        (std::filesystem::temp_directory_path() / "loom-gpu-bench-extract-out")
            .string();
    std::filesystem::remove_all(o.out_dir);
    o.hooks = {"hook_resid_post"};
    o.layers = {std::to_string(mid - 1), std::to_string(mid),
                std::to_string(mid + 1)};
    o.selectors = {"last"};
    o.precision = Precision::kBF16;
    o.batch_tokens = kExtractBatchTokens;
    o.plan.devices = {"cuda:0"};
    auto s = RunExtract(o);
    if (!s.ok()) {
      state.SkipWithError(s.status().ToString().c_str());
      return;
    }
    last = *s;
    state.SetIterationTime(s->seconds);
  }
  state.counters["prompts/s"] =
      static_cast<double>(last.rows_ok) / last.seconds;
  state.counters["tok/s"] = static_cast<double>(last.tokens) / last.seconds;
  state.SetLabel(device_name + ", RunExtract --device cuda:0");
}

BENCHMARK(BM_GpuRunExtract)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kSecond);

}  // namespace
}  // namespace loom
