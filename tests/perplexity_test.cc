// Perplexity and compare against Hugging Face goldens: hf-stride perplexity of
// stories260K on the WikiText-2 prefix (golden value and per-window sums), the
// llama-cpp and all-tokens protocols against values computed here from the
// golden per-token log-probs, logprob_next of every golden sequence, compare
// of a model with itself and f32 vs bf16, errors, and the logits-memory bound.
#include "src/eval/perplexity.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "src/eval/compare.h"
#include "src/eval/input.h"
#include "src/eval/windows.h"
#include "src/model/synth.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"
#include "tests/golden_util.h"

// Whether this test is compiled with AddressSanitizer (gcc or clang).
#if defined(__SANITIZE_ADDRESS__)
#define LOOM_ASAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LOOM_ASAN_BUILD 1
#endif
#endif
#ifndef LOOM_ASAN_BUILD
#define LOOM_ASAN_BUILD 0
#endif

namespace loom::eval {
namespace {

using ::loom::testing::ConstructedModelDir;
using ::loom::testing::BundledGoldenDir;
using ::loom::testing::GoldenFile;
using ::loom::testing::ReadJson;
using ::loom::testing::SharedGoldenDir;

std::string StoriesDir() {
  return std::string(LOOM_MODELS_DIR) + "/stories260K";
}
std::string StoriesGoldenDir() { return BundledGoldenDir() + "/stories260K"; }

std::unique_ptr<Model> Load(const std::string& dir,
                            Precision p = Precision::kF32) {
  auto m = Model::Load(dir, p);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

struct PplGolden {
  std::vector<int32_t> ids;
  std::vector<float> token_logprob;  // [N], NaN at 0
  nlohmann::json manifest;           // perplexity_f32
};

const PplGolden& Golden() {
  static const PplGolden* g = [] {
    auto* p = new PplGolden;
    auto f = GoldenFile::Open(StoriesGoldenDir() + "/goldens_f32.safetensors");
    p->ids = f->Ids("ppl.input_ids");
    p->token_logprob = f->F32("ppl.token_logprob");
    p->manifest =
        ReadJson(StoriesGoldenDir() + "/manifest.json")["perplexity_f32"];
    return p;
  }();
  return *g;
}

PerplexityResult Evaluate(const Model& model, std::span<const int32_t> ids,
                          const WindowOptions& wo, int64_t chunk = 256) {
  auto plan = PlanWindows(static_cast<int64_t>(ids.size()), wo);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  EvalOptions eo;
  eo.logits_chunk_rows = chunk;
  eo.keep_token_logprobs = true;
  auto r = EvaluatePerplexity(model, ids, *plan, eo);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : PerplexityResult{};
}

// Max |ours - golden| over the scored tokens whose context the golden run
// shares.
double MaxTokenError(
    const PerplexityResult& r, const std::vector<float>& golden,
    const std::function<bool(int64_t index, int64_t position)>& comparable,
    int64_t* compared) {
  double worst = 0;
  *compared = 0;
  for (size_t i = 0; i < r.token_position.size(); ++i) {
    if (!comparable(static_cast<int64_t>(i), r.token_position[i])) continue;
    worst = std::max(worst, std::fabs(static_cast<double>(r.token_logprob[i]) -
                                      golden[r.token_position[i]]));
    ++*compared;
  }
  return worst;
}

// The acceptance number: stories260K, first 16,000 characters of
// wiki.test.raw, BOS once, ctx 256 / stride 128 -> ppl 111.528.
TEST(PerplexityGoldenTest, HfStrideMatchesGoldenStories260K) {
  auto model = Load(StoriesDir());
  ASSERT_NE(model, nullptr);
  const PplGolden& g = Golden();
  ASSERT_EQ(g.ids.size(), 9847u);
  ASSERT_EQ(g.ids[0], 1) << "golden ids start with BOS";
  const PerplexityResult r =
      Evaluate(*model, g.ids,
               {.protocol = Protocol::kHfStride, .ctx = 256, .stride = 128});
  const double expected = g.manifest["ppl"];
  EXPECT_EQ(r.windows, 76);
  EXPECT_EQ(r.tokens_scored, 9846);
  EXPECT_NEAR(r.perplexity, expected, 1e-5 * expected)
      << "golden ppl " << expected;
  EXPECT_NEAR(r.nll_sum, g.manifest["nll_sum"].get<double>(),
              1e-5 * g.manifest["nll_sum"].get<double>());
  const auto& windows = g.manifest["windows"];
  ASSERT_EQ(windows.size(), r.window_nll_sum.size());
  for (size_t w = 0; w < windows.size(); ++w) {
    const double e = windows[w]["nll_sum"];
    EXPECT_NEAR(r.window_nll_sum[w], e, 1e-5 * e)
        << "window " << w << " [" << windows[w]["begin"] << ", "
        << windows[w]["end"] << ")";
  }
  int64_t n = 0;
  const double err = MaxTokenError(
      r, g.token_logprob, [](int64_t, int64_t) { return true; }, &n);
  EXPECT_EQ(n, 9846);
  EXPECT_LE(err, 1e-4) << "max |log p - golden| over every scored token";
  // Positions are each scored once, 1..N-1 in order.
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(r.token_position[i], i + 1);
}

// A smaller chunk only changes how the rows are grouped: the lm_head GEMM
// then runs with another M, for which oneDNN may pick another kernel (another
// summation order over the hidden dimension H). Each token's log-prob may
// move by the rounding of that dot product and of the log-sum-exp:
// 4 (H + 2) u (1 + |log p|), u = 2^-24; the sum by at most the sum of those.
TEST(PerplexityGoldenTest, ChunkSizeDoesNotChangeTheResult) {
  auto model = Load(StoriesDir());
  ASSERT_NE(model, nullptr);
  const PplGolden& g = Golden();
  WindowOptions wo{.protocol = Protocol::kHfStride,
                   .ctx = 256,
                   .stride = 128,
                   .max_windows = 6};
  const PerplexityResult a = Evaluate(*model, g.ids, wo, 256);
  const PerplexityResult b = Evaluate(*model, g.ids, wo, 7);
  ASSERT_EQ(a.token_logprob.size(), b.token_logprob.size());
  ASSERT_FALSE(a.token_logprob.empty());
  const double u = std::ldexp(1.0, -24);
  const double h = static_cast<double>(model->config().hidden_size);
  double total_tol = 0;
  for (size_t i = 0; i < a.token_logprob.size(); ++i) {
    const double tol = 4 * (h + 2) * u *
                       (1 + std::fabs(static_cast<double>(a.token_logprob[i])));
    total_tol += tol;
    ASSERT_NEAR(a.token_logprob[i], b.token_logprob[i], tol) << "token " << i;
  }
  EXPECT_NEAR(a.nll_sum, b.nll_sum, total_tol);
}

// llama-cpp without per-window BOS: chunk i scores [256 i + 129, 256 i + 256)
// from context 256 i — the same contexts as the golden hf-stride run.
TEST(PerplexityGoldenTest, LlamaCppMatchesGoldenLogprobs) {
  auto model = Load(StoriesDir());
  ASSERT_NE(model, nullptr);
  const PplGolden& g = Golden();
  const PerplexityResult r =
      Evaluate(*model, g.ids, {.protocol = Protocol::kLlamaCpp, .ctx = 256});
  const int64_t chunks = 9847 / 256;
  EXPECT_EQ(r.windows, chunks);
  EXPECT_EQ(r.tokens_scored, chunks * 127);
  double expected = 0;
  for (int64_t i = 0; i < chunks; ++i)
    for (int64_t t = 256 * i + 129; t < 256 * i + 256; ++t)
      expected -= g.token_logprob[t];
  EXPECT_NEAR(r.nll_sum, expected, 1e-5 * expected);
  EXPECT_NEAR(r.perplexity, std::exp(expected / (chunks * 127)),
              1e-5 * r.perplexity);
  int64_t n = 0;
  EXPECT_LE(MaxTokenError(
                r, g.token_logprob, [](int64_t, int64_t) { return true; }, &n),
            1e-4);
  EXPECT_EQ(n, r.tokens_scored);

  // With BOS in every chunk: chunk 0 (already starting with BOS) is unchanged,
  // later chunks see a different first token.
  const PerplexityResult rb = Evaluate(*model, g.ids,
                                       {.protocol = Protocol::kLlamaCpp,
                                        .ctx = 256,
                                        .max_windows = 2,
                                        .window_bos = 1});
  EXPECT_NEAR(rb.window_nll_sum[0], r.window_nll_sum[0],
              1e-9 * r.window_nll_sum[0]);
  EXPECT_NE(rb.window_nll_sum[1], r.window_nll_sum[1]);
}

// all-tokens, ctx 256 / stride 128: window a scores a+1 .. a+255. The golden
// run used context a for positions a+128 .. a+255 (and context 0 for
// 1 .. 255), so those are checked token by token, and window 0 in full.
TEST(PerplexityGoldenTest, AllTokensMatchesGoldenLogprobs) {
  auto model = Load(StoriesDir());
  ASSERT_NE(model, nullptr);
  const PplGolden& g = Golden();
  const PerplexityResult r =
      Evaluate(*model, g.ids,
               {.protocol = Protocol::kAllTokens, .ctx = 256, .stride = 128});
  const int64_t windows =
      (9847 - 256 + 127) / 128;  // a = 0, 128, ... < N - ctx
  EXPECT_EQ(r.windows, windows);
  EXPECT_EQ(r.tokens_scored, windows * 255);
  int64_t n = 0;
  const double err = MaxTokenError(
      r, g.token_logprob,
      [](int64_t i, int64_t t) {
        const int64_t a = (i / 255) * 128;  // window start
        return a == 0 || t >= a + 128;
      },
      &n);
  EXPECT_EQ(n, 255 + (windows - 1) * 128);
  EXPECT_LE(err, 1e-4);
  double window0 = 0;
  for (int64_t t = 1; t < 256; ++t) window0 -= g.token_logprob[t];
  EXPECT_NEAR(r.window_nll_sum[0], window0, 1e-5 * window0);
  // Overlapping tokens are scored again: mean over all windows' tokens.
  double sum = 0;
  for (double w : r.window_nll_sum) sum += w;
  EXPECT_NEAR(r.nll_mean, sum / r.tokens_scored, 1e-12 * r.nll_mean);
}

// logprob_next of one golden sequence = hf-stride with ctx = T (one window).
void CheckLogprobNext(const Model& model, const std::vector<int32_t>& ids,
                      const std::vector<float>& golden, double atol,
                      const std::string& what) {
  const int64_t T = static_cast<int64_t>(ids.size());
  ASSERT_EQ(static_cast<int64_t>(golden.size()), T - 1) << what;
  const PerplexityResult r = Evaluate(
      model, ids, {.protocol = Protocol::kHfStride, .ctx = T}, /*chunk=*/5);
  ASSERT_EQ(r.tokens_scored, T - 1) << what;
  double worst = 0, nll = 0;
  for (int64_t t = 0; t < T - 1; ++t) {
    worst = std::max(
        worst, std::fabs(static_cast<double>(r.token_logprob[t]) - golden[t]));
    nll -= golden[t];
  }
  EXPECT_LE(worst, atol) << what << ": max |log p - HF logprob_next|";
  EXPECT_NEAR(r.nll_sum, nll, atol * (T - 1)) << what;
}

TEST(PerplexityGoldenTest, LogprobNextStories260KPrompts) {
  auto f32 = Load(StoriesDir());
  ASSERT_NE(f32, nullptr);
  auto golden =
      GoldenFile::Open(StoriesGoldenDir() + "/goldens_f32.safetensors");
  auto golden_bf16 =
      GoldenFile::Open(StoriesGoldenDir() + "/goldens_bf16.safetensors");
  std::unique_ptr<Model> bf16;
  if (CpuSupportsComputeDType(DType::kBF16))
    bf16 = Load(StoriesDir(), Precision::kBF16);
  for (int p = 0; p < 4; ++p) {
    const std::string name = "prompt" + std::to_string(p);
    const std::vector<int32_t> ids = golden->Ids(name + ".input_ids");
    CheckLogprobNext(*f32, ids, golden->F32(name + ".logprob_next"), 1e-4,
                     "stories260K f32 " + name);
    // bf16: the golden README's bound for a bf16 engine.
    if (bf16)
      CheckLogprobNext(*bf16, ids, golden_bf16->F32(name + ".logprob_next"),
                       0.25, "stories260K bf16 " + name);
  }
  if (!bf16)
    GTEST_SKIP() << "SKIPPED LOUDLY: no bf16 compute on this CPU; bf16 "
                    "log-probs not checked";
}

// The constructed models' float64 reference (tests/data/constructed).
TEST(PerplexityGoldenTest, LogprobNextConstructedModels) {
  for (const char* name : {"cohere", "glm", "falcon_mq", "bloom"}) {
    const std::string dir = ConstructedModelDir(name);
    auto model = Load(dir);
    ASSERT_NE(model, nullptr) << name;
    auto golden = GoldenFile::Open(dir + "/goldens_f32.safetensors");
    ASSERT_NE(golden, nullptr) << name;
    const nlohmann::json manifest = ReadJson(dir + "/manifest.json");
    int checked = 0;
    for (const auto& s : manifest["sequences"]) {
      const std::string seq = s["name"];
      if (s["length"].get<int64_t>() < 2) continue;
      CheckLogprobNext(*model, golden->Ids(seq + ".input_ids"),
                       golden->F32(seq + ".logprob_next"), 1e-4,
                       std::string(name) + " " + seq);
      ++checked;
    }
    EXPECT_GT(checked, 0) << name;
  }
}

TEST(PerplexityGoldenTest, LogprobNextTinyModels) {
  if (SharedGoldenDir().empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared golden directory "
                 << LOOM_SHARED_DIR
                 << "/golden not found; tiny-model logprob_next is not checked "
                    "on this machine";
  for (const char* name : {"llama",
                           "llama3rope_bf16",
                           "mistral_sw16_sharded",
                           "qwen2",
                           "qwen3",
                           "gemma",
                           "gemma2",
                           "phi3",
                           "gpt2",
                           "olmo",
                           "olmo2",
                           "gpt_neox",
                           "phi",
                           "granite",
                           "starcoder2",
                           "olmoe",
                           "deepseek_v3",
                           "gpt_neo",
                           "opt",
                           "gpt_bigcode",
                           "gptj",
                           "codegen",
                           "falcon",
                           "stablelm",
                           "nemotron",
                           "persimmon",
                           "granitemoe",
                           "gemma3"}) {
    const std::string dir = SharedGoldenDir() + "/tiny/" + name;
    auto model = Load(dir);
    ASSERT_NE(model, nullptr) << name;
    auto golden = GoldenFile::Open(dir + "/goldens_f32.safetensors");
    const nlohmann::json manifest = ReadJson(dir + "/manifest.json");
    int checked = 0;
    for (const auto& s : manifest["sequences"]) {
      const std::string seq = s["name"];
      if (!golden->Has(seq + ".logprob_next")) continue;
      CheckLogprobNext(*model, golden->Ids(seq + ".input_ids"),
                       golden->F32(seq + ".logprob_next"), 1e-4,
                       std::string(name) + " " + seq);
      ++checked;
    }
    // The padded batch: each row up to its valid length.
    Shape shape;
    const std::vector<int32_t> padded = golden->Ids("batch.input_ids", &shape);
    const std::vector<float> lp = golden->F32("batch.logprob_next");
    const int64_t Tp = shape[1];
    for (int64_t b = 0; b < shape[0]; ++b) {
      const int64_t len = manifest["batch"]["valid_lengths"][b];
      std::vector<int32_t> ids(padded.begin() + b * Tp,
                               padded.begin() + b * Tp + len);
      std::vector<float> expected(lp.begin() + b * (Tp - 1),
                                  lp.begin() + b * (Tp - 1) + len - 1);
      CheckLogprobNext(*model, ids, expected, 1e-4,
                       std::string(name) + " batch row " + std::to_string(b));
      ++checked;
    }
    EXPECT_GE(checked, 8) << name;
  }
}

std::string WikiPrefixPath() {
  return std::string(LOOM_TESTDATA_DIR) +
         "/wikitext2/wiki.test.raw.first16000chars.txt";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream b;
  b << in.rdbuf();
  return b.str();
}

// --text: the bundled first 16,000 characters through the tokenizer, BOS
// once at the start (stories260K's tokenizer adds BOS by default) gives the
// golden ids exactly.
TEST(PerplexityGoldenTest, TextPathGivesTheGoldenIds) {
  auto model = Load(StoriesDir());
  ASSERT_NE(model, nullptr);
  const std::string text = ReadAll(WikiPrefixPath());
  ASSERT_EQ(text.size(), 16023u) << WikiPrefixPath();
  auto input = TokenizeText(text, StoriesDir(), AddBos::kAuto, model->config());
  ASSERT_TRUE(input.ok()) << input.status().ToString();
  EXPECT_TRUE(input->bos);
  EXPECT_EQ(input->ids, Golden().ids);
  auto no_bos = TokenizeText(text, StoriesDir(), AddBos::kNo, model->config());
  ASSERT_TRUE(no_bos.ok());
  EXPECT_EQ(no_bos->ids.size() + 1, Golden().ids.size());
}

// ---- the CLI, end to end ----

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

CliResult RunCli(const std::string& args) {
  CliResult r;
  // One file per test process: ctest runs the CLI tests in parallel.
  const std::string err_path = ::testing::TempDir() + "/loom_cli_stderr_" +
                               std::to_string(getpid()) + ".txt";
  FILE* p = popen(
      (std::string(LOOM_BINARY) + " " + args + " 2>" + err_path).c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = ReadAll(err_path);
  return r;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(LOOM_BINARY))
      GTEST_SKIP() << "SKIPPED LOUDLY: " << LOOM_BINARY << " not built";
  }
};

TEST_F(CliTest, PerplexityTextJsonMatchesGolden) {
  const CliResult r =
      RunCli("perplexity --model " + StoriesDir() + " --text " +
             WikiPrefixPath() + " --ctx 256 --stride 128 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const double expected = Golden().manifest["ppl"];
  EXPECT_NEAR(j["perplexity"].get<double>(), expected, 1e-5 * expected);
  EXPECT_NEAR(j["nll_mean"].get<double>(),
              Golden().manifest["mean_nll"].get<double>(), 1e-5);
  EXPECT_EQ(j["tokens_scored"], 9846);
  EXPECT_EQ(j["windows"], 76);
  EXPECT_EQ(j["protocol"], "hf-stride");
  EXPECT_EQ(j["ctx"], 256);
  EXPECT_EQ(j["stride"], 128);
  EXPECT_TRUE(r.err.empty())
      << "no progress bar when stderr is not a terminal: " << r.err;
}

TEST_F(CliTest, PerplexityTokensFileAndProtocols) {
  const std::string tokens = ::testing::TempDir() + "/loom_ppl_ids.txt";
  {
    std::ofstream out(tokens);
    for (int32_t id : Golden().ids) out << id << " ";
  }
  const CliResult r =
      RunCli("perplexity --model " + StoriesDir() + " --tokens " + tokens +
             " --protocol llama-cpp --ctx 256 --max-windows 4 --json --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["protocol"], "llama-cpp");
  EXPECT_EQ(j["windows"], 4);
  EXPECT_EQ(j["tokens_scored"], 4 * 127);
  EXPECT_EQ(j["stride"], 256);
  EXPECT_EQ(j["bos"], true);  // the ids start with BOS: every chunk gets one
  const CliResult text = RunCli("perplexity --model " + StoriesDir() +
                                " --tokens " + tokens + " --ctx 256");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("perplexity   111.52"), std::string::npos)
      << text.out;
}

// `loom generate --json`: HF's greedy continuation of stories260K (the ids
// of golden/real/stories260K greedy_f32 after its 16 prompt ids).
TEST_F(CliTest, GenerateGreedyJson) {
  const CliResult r =
      RunCli("generate --model " + StoriesDir() +
             " --prompt 'Once upon a time, there was a little girl named Lily.'"
             " --max-tokens 32 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["text"],
            "She loved to play outside in the park. One day, she saw a big, "
            "red ball. She wanted");
  EXPECT_EQ(j["token_ids"].size(), 32u);
  EXPECT_EQ(j["token_ids"][0], 338);
  EXPECT_EQ(j["prompt_ids"].size(), 16u);
  EXPECT_EQ(j["stop_reason"], "max_tokens");
  const CliResult bad = RunCli("generate --model " + StoriesDir() +
                               " --prompt 'Once upon a time' --ctx 3");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("has 5 tokens, more than the context of 3"),
            std::string::npos)
      << bad.err;
}

TEST_F(CliTest, ClearErrors) {
  const std::string tokens = ::testing::TempDir() + "/loom_short_ids.txt";
  {
    std::ofstream out(tokens);
    out << "1 5 6 7 8\n";
  }
  // hf-stride scores a text shorter than ctx as one window (Hugging Face's
  // recipe); llama-cpp needs a whole chunk of ctx tokens.
  CliResult r = RunCli("perplexity --model " + StoriesDir() + " --tokens " +
                       tokens + " --ctx 64 --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["tokens_scored"], 4) << r.out;
  r = RunCli("perplexity --model " + StoriesDir() + " --tokens " + tokens +
             " --ctx 64 --protocol llama-cpp");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(
      r.err.find("the text has 5 tokens, fewer than one window of ctx = 64"),
      std::string::npos)
      << r.err;
  r = RunCli("perplexity --model " + StoriesDir() + " --text " +
             WikiPrefixPath() + " --ctx 4096");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("max_position_embeddings = 512"), std::string::npos)
      << r.err;
  r = RunCli("perplexity --model " + StoriesDir() + " --text " +
             WikiPrefixPath() + " --protocol wikitext");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown protocol 'wikitext'"), std::string::npos)
      << r.err;
  const std::string other = ::testing::TempDir() + "/loom_vocab1024_cli";
  ASSERT_TRUE(WriteSyntheticModel(other, {.preset = "small",
                                          .num_layers = 1,
                                          .vocab_size = 1024,
                                          .dtype = DType::kF32})
                  .ok());
  // A live compare needs both tokenizers to check that they agree...
  r = RunCli("compare --model " + other + " --reference " + StoriesDir() +
             " --text " + WikiPrefixPath());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot check that --model and --reference share a "
                       "tokenizer: " +
                       other + " has none"),
            std::string::npos)
      << r.err;
  // ... unless the user vouches for the ids (token input only).
  r = RunCli("compare --model " + other + " --reference " + StoriesDir() +
             " --text " + WikiPrefixPath() + " --same-tokens");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--same-tokens needs --tokens"), std::string::npos)
      << r.err;
  r = RunCli("compare --model " + other + " --reference " + StoriesDir() +
             " --tokens " + tokens + " --same-tokens");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("vocabulary of 1024 tokens but the reference"),
            std::string::npos)
      << r.err;
}

// Two models whose tokenizers differ are refused by a live compare, even
// when their vocabularies have the same size (stories260K: 512 tokens; a
// copy of it with two ids' tokens swapped).
TEST_F(CliTest, CompareRefusesDifferentTokenizers) {
  const std::string copy = ::testing::TempDir() + "/loom_renamed_token";
  std::filesystem::remove_all(copy);
  std::filesystem::copy(StoriesDir(), copy,
                        std::filesystem::copy_options::recursive);
  std::string tj;
  {
    std::ifstream in(copy + "/tokenizer.json");
    tj.assign(std::istreambuf_iterator<char>(in), {});
  }
  nlohmann::json t = nlohmann::json::parse(tj);
  auto& vocab = t["model"]["vocab"];
  ASSERT_TRUE(vocab.is_object()) << "stories260K: a BPE vocab object";
  // Ids 300 and 301 swap their tokens (the merges, by string, still hold).
  std::string at300, at301;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (it.value() == 300) at300 = it.key();
    if (it.value() == 301) at301 = it.key();
  }
  ASSERT_FALSE(at300.empty() || at301.empty());
  vocab[at300] = 301;
  vocab[at301] = 300;
  std::ofstream(copy + "/tokenizer.json") << t.dump();
  const CliResult r =
      RunCli("compare --model " + copy + " --reference " + StoriesDir() +
             " --text " + WikiPrefixPath() + " --ctx 64 --max-windows 1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.err.find("have different tokenizers: id 300 is '" + at301 +
                       "' in the model and '" + at300 + "' in the reference"),
            std::string::npos)
      << r.err;
}

TEST_F(CliTest, CompareWithItselfJson) {
  const CliResult r =
      RunCli("compare --model " + StoriesDir() + " --reference " +
             StoriesDir() + " --text " + WikiPrefixPath() +
             " --ctx 256 --max-windows 4 --drift --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["kl_mean"], 0.0);
  EXPECT_EQ(j["kl_max"], 0.0);
  EXPECT_EQ(j["same_top1"], 1.0);
  EXPECT_EQ(j["ln_ppl_ratio"], 0.0);
  ASSERT_EQ(j["drift"].size(), 5u);
  for (const auto& d : j["drift"]) {
    EXPECT_EQ(d["rel_frobenius"], 0.0);
    EXPECT_TRUE(d["sqnr_db"].is_null());  // +inf
  }
  for (const char* key :
       {"kl_uncertainty", "kl_median", "kl_p90", "kl_p95", "kl_p99", "ppl",
        "ppl_reference", "ppl_diff", "rms_delta_p", "prob_pearson",
        "tokens_scored", "windows", "protocol"})
    EXPECT_TRUE(j.contains(key)) << key;
}

// Quantized checkpoints through the CLI: perplexity of the NVFP4 model equals
// the golden log-probs (one window over seq6), and compare of the same
// quantized model stored as ModelOpt against compressed-tensors finds KL at
// f32 noise (their effective weights differ by f32 rounding only).
TEST_F(CliTest, QuantizedPerplexityAndCompare) {
  if (SharedGoldenDir().empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared golden directory not found";
  const std::string modelopt = SharedGoldenDir() + "/tiny/llama_nvfp4_modelopt";
  const std::string ct = SharedGoldenDir() + "/tiny/llama_nvfp4_ct";
  auto golden = GoldenFile::Open(ct + "/goldens_f32.safetensors");
  ASSERT_TRUE(golden);
  const std::vector<int32_t> ids = golden->Ids("seq6.input_ids");
  const std::vector<float> lp = golden->F32("seq6.logprob_next");
  const std::string tokens = ::testing::TempDir() + "/loom_quant_ids.txt";
  {
    std::ofstream out(tokens);
    for (int32_t id : ids) out << id << " ";
  }
  double nll = 0;
  for (float v : lp) nll -= v;
  const std::string n = std::to_string(ids.size());
  CliResult r = RunCli("perplexity --model " + ct + " --tokens " + tokens +
                       " --ctx " + n + " --precision f32 --json --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tokens_scored"].get<size_t>(), lp.size());
  EXPECT_NEAR(j["nll_sum"].get<double>(), nll, 1e-4 * lp.size());
  r = RunCli("compare --model " + modelopt + " --reference " + ct +
             " --tokens " + tokens +
             " --ctx 64 --precision f32 --reference-precision f32 --json "
             "--same-tokens");  // neither directory holds a tokenizer
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_LT(std::abs(j["kl_max"].get<double>()), 1e-6);
  EXPECT_LT(std::abs(j["kl_mean"].get<double>()), 1e-7);
  EXPECT_LT(std::abs(j["ln_ppl_ratio"].get<double>()), 1e-6);
  EXPECT_EQ(j["same_top1"], 1.0);
}

// ---- compare ----

TEST(CompareTest, ModelWithItselfHasZeroKlAndDrift) {
  auto a = Load(StoriesDir());
  auto b = Load(StoriesDir());
  ASSERT_TRUE(a && b);
  const PplGolden& g = Golden();
  auto plan = PlanWindows(static_cast<int64_t>(g.ids.size()),
                          {.protocol = Protocol::kHfStride,
                           .ctx = 256,
                           .stride = 128,
                           .max_windows = 8});
  ASSERT_TRUE(plan.ok());
  CompareOptions o;
  o.drift = true;
  o.logits_chunk_rows = 64;
  auto r = CompareModels(*a, *b, g.ids, *plan, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kl.value, 0.0);
  EXPECT_EQ(r->kl_max, 0.0);
  EXPECT_EQ(r->ln_ppl_ratio.value, 0.0);
  EXPECT_EQ(r->ppl_diff.value, 0.0);
  EXPECT_EQ(r->same_top1.value, 1.0);
  EXPECT_EQ(r->rms_delta_p.value, 0.0);
  EXPECT_NEAR(r->prob_pearson, 1.0, 1e-12);
  ASSERT_EQ(r->drift.size(), 5u);
  for (const LayerDrift& d : r->drift) {
    EXPECT_EQ(d.rel_frobenius, 0.0) << "layer " << d.layer;
    EXPECT_NEAR(d.cosine, 1.0, 1e-12) << "layer " << d.layer;
    EXPECT_TRUE(std::isinf(d.sqnr_db) && d.sqnr_db > 0) << "layer " << d.layer;
  }
  // The perplexity inside compare is `loom perplexity`'s.
  EvalOptions eo;
  eo.logits_chunk_rows = 64;
  auto p = EvaluatePerplexity(*a, g.ids, *plan, eo);
  ASSERT_TRUE(p.ok());
  EXPECT_NEAR(r->ppl_a, p->perplexity, 1e-12 * p->perplexity);
  EXPECT_EQ(r->tokens_scored, p->tokens_scored);
}

// KL of a bf16 run against the f32 run of the same checkpoint.
// 1. compare's per-token KL equals KL computed here, in double, from the two
//    executors' full logits (the executor's own lm_head, not compare's).
// 2. The golden files give HF's KL(f32 || bf16) on the same tokens. HF's bf16
//    forward keeps every activation in bf16; Loom's bf16 rounds only GEMM
//    inputs and keeps activations in f32 (docs/eval/perplexity.md), so its
//    KL is positive, of the same order, and not larger than HF's (measured:
//    6.6e-5 vs 4.6e-4 nats).
double NaiveKl(const float* ref, const float* cand, int64_t V) {
  double mr = -INFINITY, mc = -INFINITY, sr = 0, sc = 0;
  for (int64_t v = 0; v < V; ++v)
    mr = std::max(mr, double(ref[v])), mc = std::max(mc, double(cand[v]));
  for (int64_t v = 0; v < V; ++v)
    sr += std::exp(ref[v] - mr), sc += std::exp(cand[v] - mc);
  const double zr = mr + std::log(sr), zc = mc + std::log(sc);
  double kl = 0;
  for (int64_t v = 0; v < V; ++v)
    kl += std::exp(ref[v] - zr) * ((ref[v] - zr) - (cand[v] - zc));
  return kl;
}

std::vector<float> ExecutorLogits(const Model& model,
                                  const std::vector<int32_t>& ids) {
  HookSet hooks;
  hooks.Add({HookSite::kLogits, -1});
  const int64_t T = static_cast<int64_t>(ids.size());
  auto ex = Executor::Create(
      model, hooks,
      {.max_tokens = T, .max_seq_len = T, .logits_chunk_rows = 3});
  EXPECT_TRUE(ex.ok());
  ::loom::testing::CaptureSink sink;
  std::vector<int64_t> starts = {0, T};
  EXPECT_TRUE((*ex)->Forward(Batch{ids, starts}, &sink).ok());
  return sink.Get({HookSite::kLogits, -1}).data;
}

TEST(CompareTest, F32VsBf16KlMatchesIndependentComputationAndGoldenOrder) {
  if (!CpuSupportsComputeDType(DType::kBF16))
    GTEST_SKIP() << "SKIPPED LOUDLY: no bf16 compute on this CPU";
  auto ref = Load(StoriesDir(), Precision::kF32);
  auto cand = Load(StoriesDir(), Precision::kBF16);
  ASSERT_TRUE(ref && cand);
  auto gf = GoldenFile::Open(StoriesGoldenDir() + "/goldens_f32.safetensors");
  auto gb = GoldenFile::Open(StoriesGoldenDir() + "/goldens_bf16.safetensors");
  const int64_t V = 512;
  double ours_sum = 0, golden_sum = 0, worst = 0;
  int64_t tokens = 0;
  for (int p = 0; p < 4; ++p) {
    const std::string name = "prompt" + std::to_string(p);
    const std::vector<int32_t> ids = gf->Ids(name + ".input_ids");
    const int64_t T = static_cast<int64_t>(ids.size());
    auto plan = PlanWindows(T, {.protocol = Protocol::kHfStride, .ctx = T});
    ASSERT_TRUE(plan.ok());
    CompareOptions o;
    o.keep_token_logprobs = true;
    o.logits_chunk_rows = 4;
    auto r = CompareModels(*cand, *ref, ids, *plan, o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_GT(r->kl.value, 0.0) << name;
    const std::vector<float> xf = ExecutorLogits(*ref, ids),
                             xb = ExecutorLogits(*cand, ids);
    const std::vector<float> lf = gf->F32(name + ".logits"),
                             lb = gb->F32(name + ".logits");
    for (int64_t t = 0; t + 1 < T; ++t) {
      const double expected = NaiveKl(&xf[t * V], &xb[t * V], V);
      worst = std::max(worst, std::fabs(r->token_kl[t] - expected));
      golden_sum += NaiveKl(&lf[t * V], &lb[t * V], V);
      ours_sum += r->token_kl[t];
      ++tokens;
    }
  }
  EXPECT_LE(worst, 1e-7) << "max |compare KL - KL from the executors' logits|";
  const double ours = ours_sum / tokens, golden = golden_sum / tokens;
  std::printf(
      "mean KL(f32 || bf16) over %lld tokens: Loom %.6g, HF goldens %.6g\n",
      static_cast<long long>(tokens), ours, golden);
  EXPECT_GT(ours, 0.02 * golden);
  EXPECT_LE(ours, golden);
}

// Item 6 of the MoE/quantized issue: `compare` of the MXFP4 gpt-oss (A)
// against the bf16-checkpoint gpt-oss (B), both computed in f32: the mean
// KL(B || A) per token equals the KL between the two models' HF golden
// logits (the same inputs, same seed; only the experts differ), and the
// per-token KL equals the KL of the executors' own logits.
TEST(CompareTest, Mxfp4GptOssAgainstBf16GptOssKlMatchesHfGoldens) {
  const std::string golden = SharedGoldenDir();
  if (golden.empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared golden directory not found; the "
                    "MXFP4 vs bf16 gpt-oss KL is not checked on this machine";
  auto quant = Load(golden + "/tiny/gpt_oss_mxfp4", Precision::kF32);
  auto ref = Load(golden + "/tiny/gpt_oss", Precision::kF32);
  ASSERT_TRUE(quant && ref);
  auto gq =
      GoldenFile::Open(golden + "/tiny/gpt_oss_mxfp4/goldens_f32.safetensors");
  auto gr = GoldenFile::Open(golden + "/tiny/gpt_oss/goldens_f32.safetensors");
  ASSERT_TRUE(gq && gr);
  const int64_t V = ref->config().vocab_size;
  double ours_sum = 0, golden_sum = 0, worst_exec = 0, worst_golden = 0;
  int64_t tokens = 0;
  for (const char* seq : {"seq1", "seq2", "seq3", "seq4"}) {
    const std::vector<int32_t> ids = gr->Ids(std::string(seq) + ".input_ids");
    ASSERT_EQ(ids, gq->Ids(std::string(seq) + ".input_ids")) << seq;
    const int64_t T = static_cast<int64_t>(ids.size());
    auto plan = PlanWindows(T, {.protocol = Protocol::kHfStride, .ctx = T});
    ASSERT_TRUE(plan.ok());
    CompareOptions o;
    o.keep_token_logprobs = true;
    o.logits_chunk_rows = 5;
    auto r = CompareModels(*quant, *ref, ids, *plan, o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const std::vector<float> xq = ExecutorLogits(*quant, ids),
                             xr = ExecutorLogits(*ref, ids);
    const std::vector<float> lq = gq->F32(std::string(seq) + ".logits"),
                             lr = gr->F32(std::string(seq) + ".logits");
    for (int64_t t = 0; t + 1 < T; ++t) {
      const double exec = NaiveKl(&xr[t * V], &xq[t * V], V);
      const double hf = NaiveKl(&lr[t * V], &lq[t * V], V);
      worst_exec = std::max(worst_exec, std::fabs(r->token_kl[t] - exec));
      worst_golden = std::max(worst_golden, std::fabs(r->token_kl[t] - hf));
      ours_sum += r->token_kl[t];
      golden_sum += hf;
      ++tokens;
    }
  }
  std::printf("mean KL(bf16 || mxfp4) over %lld tokens: Loom %.6g, HF %.6g\n",
              static_cast<long long>(tokens), ours_sum / tokens,
              golden_sum / tokens);
  EXPECT_LE(worst_exec, 1e-7)
      << "max |compare KL - KL of the executors' logits|";
  // Logits match HF to 1e-4 (atol), so each token's KL does to ~1e-4.
  EXPECT_LE(worst_golden, 1e-3)
      << "max |compare KL - KL of HF's golden logits|";
  EXPECT_NEAR(ours_sum / tokens, golden_sum / tokens,
              1e-3 * std::max(1.0, golden_sum / tokens));
  EXPECT_GT(golden_sum / tokens, 1e-3) << "the quantization must be visible";
}

// ---- errors ----

TEST(PerplexityErrorTest, TextShorterThanOneWindow) {
  // hf-stride scores it as one short window (Hugging Face's recipe);
  // llama-cpp needs a whole chunk.
  auto one = PlanWindows(100, {.protocol = Protocol::kHfStride, .ctx = 256});
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(one->windows.size(), 1u);
  EXPECT_EQ(one->tokens_scored, 99);
  auto plan = PlanWindows(100, {.protocol = Protocol::kLlamaCpp, .ctx = 256});
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("100 tokens"), std::string::npos)
      << plan.status().message();
  EXPECT_NE(plan.status().message().find("ctx = 256"), std::string::npos)
      << plan.status().message();
}

TEST(PerplexityErrorTest, CtxAboveModelMaximum) {
  auto model = Load(StoriesDir());
  ASSERT_NE(model, nullptr);
  std::vector<int32_t> ids(2000, 5);
  auto plan = PlanWindows(2000, {.protocol = Protocol::kHfStride, .ctx = 1024});
  ASSERT_TRUE(plan.ok());
  auto r = EvaluatePerplexity(*model, ids, *plan, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("1024"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("max_position_embeddings = 512"),
            std::string::npos)
      << r.status().message();
}

TEST(PerplexityErrorTest, CompareNeedsTheSameVocabulary) {
  const std::string dir = ::testing::TempDir() + "/loom_vocab1024";
  ASSERT_TRUE(WriteSyntheticModel(dir, {.preset = "small",
                                        .num_layers = 1,
                                        .vocab_size = 1024,
                                        .dtype = DType::kF32})
                  .ok());
  auto a = Load(dir);
  auto b = Load(StoriesDir());
  ASSERT_TRUE(a && b);
  std::vector<int32_t> ids(64, 7);
  auto plan = PlanWindows(64, {.protocol = Protocol::kHfStride, .ctx = 32});
  ASSERT_TRUE(plan.ok());
  auto r = CompareModels(*a, *b, ids, *plan, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("1024"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("512"), std::string::npos)
      << r.status().message();
}

// ---- memory ----

// ctx 2048 with a 32k vocabulary: full logits would be 2048 x 32000 x 4 B =
// 250 MiB. The plan holds one [chunk, vocab] logits buffer.
TEST(PerplexityMemoryTest, Ctx2048Vocab32kStaysWithinChunkBound) {
  const std::string dir = ::testing::TempDir() + "/loom_vocab32k";
  ASSERT_TRUE(WriteSyntheticModel(dir, {.preset = "small",
                                        .num_layers = 1,
                                        .vocab_size = 32000,
                                        .dtype = DType::kF32})
                  .ok());
  auto model = Load(dir);
  ASSERT_NE(model, nullptr);
  std::mt19937 rng(3);
  std::vector<int32_t> ids(3000);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % 32000);
  const int64_t ctx = 2048, chunk = 256, V = 32000;
  auto plan = PlanWindows(
      static_cast<int64_t>(ids.size()),
      {.protocol = Protocol::kHfStride, .ctx = ctx, .stride = 1024});
  ASSERT_TRUE(plan.ok());
  EvalOptions eo;
  eo.logits_chunk_rows = chunk;
  auto r = EvaluatePerplexity(*model, ids, *plan, eo);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(std::isfinite(r->perplexity));
  // Planned bound: one logits chunk + (per token) the executor's activations
  // and the evaluation's ids, O(ctx x (hidden + intermediate + heads)), with
  // a generous constant; attention workspace per thread.
  const int64_t chunk_bytes = chunk * V * 4;
  const int64_t full_logits = ctx * V * 4;
  const int64_t planned = r->executor_bytes + r->eval_bytes;
  std::printf(
      "planned: executor %lld B + eval %lld B; one logits chunk %lld B; full "
      "logits would be %lld B\n",
      static_cast<long long>(r->executor_bytes),
      static_cast<long long>(r->eval_bytes),
      static_cast<long long>(chunk_bytes), static_cast<long long>(full_logits));
  EXPECT_LE(r->eval_bytes, chunk_bytes + 64 * ctx + 4 * 1024 * 1024);
  EXPECT_LT(planned, full_logits / 4);

  // Measured: the peak RSS of `loom perplexity` in a child process.
  if (!std::filesystem::exists(LOOM_BINARY))
    GTEST_SKIP() << "SKIPPED LOUDLY: " << LOOM_BINARY << " not built";
  const std::string tokens = ::testing::TempDir() + "/loom_vocab32k_tokens.txt";
  {
    std::ofstream out(tokens);
    for (int32_t id : ids) out << id << "\n";
  }
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(LOOM_BINARY, LOOM_BINARY, "perplexity", "--model", dir.c_str(),
          "--tokens", tokens.c_str(), "--ctx", "2048", "--stride", "1024",
          "--json", "--quiet", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  struct rusage usage {};
  ASSERT_EQ(wait4(pid, &status, 0, &usage), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "loom perplexity failed, status " << status;
  const int64_t peak = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  const int64_t weights = static_cast<int64_t>(
      std::filesystem::file_size(dir + "/model.safetensors"));
  std::printf(
      "loom perplexity peak RSS %.1f MiB (weights %.1f MiB, planned %.1f MiB, "
      "full logits %.1f MiB)\n",
      peak / 1048576.0, weights / 1048576.0, planned / 1048576.0,
      full_logits / 1048576.0);
#if LOOM_ASAN_BUILD
  // ASan's shadow memory and allocator quarantine inflate the RSS of an
  // instrumented `loom`, so the bound is asserted by the uninstrumented run
  // of this test (`make test`); here the run itself is what is checked.
  std::printf("RSS bound not asserted in this AddressSanitizer build\n");
#else
  // Process baseline (libraries, oneDNN, OpenMP) well under 100 MiB.
  EXPECT_LT(peak, weights + planned + 100 * 1024 * 1024);
  EXPECT_LT(peak, full_logits);
#endif
}

}  // namespace
}  // namespace loom::eval

namespace loom::eval {
namespace {

// --save-reference / --reference-logprobs: the saved top-k reproduces the
// reference's log-probs of the correct tokens exactly (PPL_B), gives a KL that
// is a lower bound of the live KL and close to it, ~0 against itself, and
// refuses a run with other windows.
TEST(CompareTest, SavedReferenceTopKIsALowerBoundOfTheLiveKl) {
  auto a = Model::Load(std::string(LOOM_MODELS_DIR) + "/stories260K",
                       Precision::kBF16);
  auto b = Model::Load(std::string(LOOM_MODELS_DIR) + "/stories260K",
                       Precision::kF32);
  ASSERT_TRUE(a.ok() && b.ok());
  auto golden = testing::GoldenFile::Open(
      testing::BundledGoldenDir() + "/stories260K/goldens_f32.safetensors");
  const std::vector<int32_t> ids = golden->Ids("ppl.input_ids");
  WindowOptions wo{.protocol = Protocol::kHfStride,
                   .ctx = 256,
                   .stride = 128,
                   .max_windows = 6};
  auto plan = PlanWindows(static_cast<int64_t>(ids.size()), wo);
  ASSERT_TRUE(plan.ok());
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("loom_ref_" + std::to_string(::getpid())))
                              .string();
  std::filesystem::remove_all(dir);
  CompareOptions o;
  o.logits_chunk_rows = 64;
  o.save_reference_dir = dir;
  o.top_k = 16;
  auto live = CompareModels(**a, **b, ids, *plan, o);
  ASSERT_TRUE(live.ok()) << live.status().ToString();
  o.save_reference_dir.clear();
  auto saved = CompareWithSavedReference(**a, ids, *plan, dir, o);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_NEAR(saved->ppl_b, live->ppl_b, 1e-6 * live->ppl_b);
  EXPECT_EQ(saved->ppl_a, live->ppl_a);
  EXPECT_GT(saved->kl.value, 0.0);
  EXPECT_LE(saved->kl.value, live->kl.value * (1 + 1e-6));
  EXPECT_GT(saved->kl.value, 0.5 * live->kl.value)
      << "top-16 of 512 should hold most of the divergence";
  EXPECT_EQ(saved->same_top1.value, live->same_top1.value);
  auto self = CompareWithSavedReference(**b, ids, *plan, dir, o);
  ASSERT_TRUE(self.ok());
  EXPECT_LT(self->kl.value, 1e-6);  // log-probs stored as float32
  WindowOptions other = wo;
  other.ctx = 128;
  other.stride = 64;
  auto plan2 = PlanWindows(static_cast<int64_t>(ids.size()), other);
  ASSERT_TRUE(plan2.ok());
  auto mismatch = CompareWithSavedReference(**a, ids, *plan2, dir, o);
  EXPECT_EQ(mismatch.status().code(), StatusCode::kFailedPrecondition);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace loom::eval
