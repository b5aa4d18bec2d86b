// Generation with the KV cache: Hugging Face's greedy continuation of
// stories260K token for token, cached decode = full recompute, batched
// decode (sequences joining and leaving) = one sequence at a time, token
// selection (greedy ties, top-k, top-p, seeds) and errors.
#include "src/eval/generate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "src/runtime/executor.h"
#include "src/runtime/model.h"
#include "src/tokenizer/tokenizer.h"
#include "tests/golden_util.h"

namespace loom::eval {
namespace {

using loom::testing::ConstructedModelDir;
using loom::testing::ReadJson;
using loom::testing::SharedGoldenDir;

std::string Stories() { return std::string(LOOM_MODELS_DIR) + "/stories260K"; }

TEST(GenerateTest, GreedyReproducesHuggingFace) {
  const std::string manifest =
      SharedGoldenDir() + "/real/stories260K/manifest.json";
  if (SharedGoldenDir().empty() || !std::filesystem::exists(manifest)) {
    std::fprintf(stderr, "SKIPPED LOUDLY: %s not found\n", manifest.c_str());
    GTEST_SKIP();
  }
  const nlohmann::json golden = ReadJson(manifest)["greedy_f32"];
  const std::vector<int32_t> all = golden["ids"].get<std::vector<int32_t>>();
  auto model = Model::Load(Stories(), Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto tok = tok::Tokenizer::Load(Stories());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  auto enc = (*tok)->Encode(golden["prompt"].get<std::string>(), true);
  ASSERT_TRUE(enc.ok());
  // The golden ids are the prompt's (with BOS) followed by the generated.
  const std::vector<int32_t>& prompt = enc->ids;
  ASSERT_LT(prompt.size(), all.size());
  ASSERT_TRUE(std::equal(prompt.begin(), prompt.end(), all.begin()));
  const std::vector<int32_t> want(all.begin() + prompt.size(), all.end());

  for (int64_t chunk : {256, 5}) {  // one prefill forward, or chunks of 5
    SCOPED_TRACE("prefill chunk " + std::to_string(chunk));
    Generator::Options go;
    go.context = 128;
    go.prefill_chunk = chunk;
    auto gen = Generator::Create(**model, go);
    ASSERT_TRUE(gen.ok()) << gen.status().ToString();
    GenerateOptions o;
    o.max_new_tokens = static_cast<int64_t>(want.size());
    auto stops = LoadStopIds(**model);
    ASSERT_TRUE(stops.ok());
    o.stop_ids = *stops;
    auto out = (*gen)->Generate({prompt}, o, tok->get());
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_EQ((*out)[0].token_ids, want);
    EXPECT_EQ((*out)[0].text, golden["text"].get<std::string>());
    EXPECT_EQ((*out)[0].stop_reason, "max_tokens");
  }
}

// The cached decode's logits at every step equal those of a forward without
// cache over the whole prefix (last row), to f32 round-off: the only
// difference is the GEMM reduction order of one-row (decode) GEMMs.
void CheckCachedDecodeEqualsRecompute(const std::string& dir) {
  SCOPED_TRACE(dir);
  auto model = Model::Load(dir, Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const ModelConfig& c = (*model)->config();
  const int64_t V = c.vocab_size, steps = 40, n_prompt = 9;
  std::mt19937 rng(3);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n_prompt; ++i)
    ids.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(V)));
  Generator::Options go;
  go.context = n_prompt + steps;
  go.prefill_chunk = 4;  // the prompt in chunks of 4, 4, 1
  auto gen = Generator::Create(**model, go);
  ASSERT_TRUE(gen.ok()) << gen.status().ToString();
  HookSet hooks;
  hooks.Add({HookSite::kLogits, -1});
  ExecutorOptions eo;
  eo.max_tokens = n_prompt + steps;
  auto full = Executor::Create(**model, hooks, eo);
  ASSERT_TRUE(full.ok());
  const std::vector<int64_t> slot = {0};
  double worst = 0.0;
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t n = static_cast<int64_t>(ids.size());
    // Prefill (step 0) or one decode token.
    const float* cached = nullptr;
    for (int64_t p0 = step == 0 ? 0 : n - 1; p0 < n; p0 += go.prefill_chunk) {
      const int64_t len = std::min(go.prefill_chunk, n - p0);
      const std::vector<int64_t> seq = {0, len}, pos0 = {p0};
      auto logits = (*gen)->StepLogits(
          Batch{std::span<const int32_t>(ids).subspan(p0, len), seq},
          {&(*gen)->cache(), slot, pos0});
      ASSERT_TRUE(logits.ok()) << logits.status().ToString();
      cached = *logits;
    }
    loom::testing::CaptureSink sink;
    const std::vector<int64_t> seq = {0, n};
    ASSERT_TRUE((*full)->Forward(Batch{ids, seq}, &sink).ok());
    const float* want =
        sink.Get({HookSite::kLogits, -1}).data.data() + (n - 1) * V;
    double scale = 1.0, err = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      scale = std::max(scale, std::abs(double{want[v]}));
      err = std::max(err, std::abs(double{cached[v]} - want[v]));
    }
    // ~300 u of the largest logit (see kv_cache_test for the derivation).
    EXPECT_LE(err, 2e-5 * scale) << "step " << step;
    worst = std::max(worst, err / scale);
    ids.push_back(static_cast<int32_t>(ArgMax(want, V)));
  }
  std::printf("%s: cached decode vs recompute, max relative error %.3g\n",
              std::filesystem::path(dir).filename().c_str(), worst);
}

TEST(GenerateTest, CachedDecodeEqualsRecomputeStories) {
  CheckCachedDecodeEqualsRecompute(Stories());
}

TEST(GenerateTest, CachedDecodeEqualsRecomputeTinyModels) {
  if (SharedGoldenDir().empty()) {
    std::fprintf(stderr, "SKIPPED LOUDLY: shared golden directory absent\n");
    GTEST_SKIP();
  }
  // Sliding-window rings (window 16 < 49 positions: mistral, starcoder2),
  // attention sinks with alternating windows, Granite's multipliers and
  // OLMoE's full-width q/k norms with unrenormalised routing; parallel
  // blocks with partial rotary (GPT-NeoX, Phi); GPT-Neo's learned
  // positions with a local (window 8) and a global layer; OPT's positions
  // read at p + 2; GPTBigCode's one k/v head; GPT-J's interleaved rotary;
  // CodeGen's [q | v | k] chunks; Falcon's per-kv-group q/k/v; StableLM's
  // and Persimmon's q/k LayerNorms before a partial rotary; Nemotron's
  // LayerNorm1P and relu^2; GraniteMoE's 3-D experts and multipliers;
  // Gemma 3's two RoPE tables with decode past its window of 8.
  for (const char* m : {"mistral_sw16_sharded",
                        "gpt_oss",
                        "gemma2",
                        "granite",
                        "starcoder2",
                        "olmoe",
                        "gpt_neox",
                        "phi",
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
                        "gemma3"})
    CheckCachedDecodeEqualsRecompute(SharedGoldenDir() + "/tiny/" + m);
}

// The constructed models (tests/data/constructed): Cohere's parallel block
// with interleaved rotary over the whole head and per-head q/k LayerNorms,
// GLM's partial interleaved rotary.
TEST(GenerateTest, CachedDecodeEqualsRecomputeConstructedModels) {
  for (const char* m : {"cohere", "glm", "falcon_mq", "bloom"})
    CheckCachedDecodeEqualsRecompute(ConstructedModelDir(m));
}

// Three prompts through two slots (the third joins when the first leaves)
// give each prompt's tokens alone.
TEST(GenerateTest, BatchedDecodeEqualsOneAtATime) {
  auto model = Model::Load(Stories(), Precision::kF32);
  ASSERT_TRUE(model.ok());
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 403, 407, 261}, {1, 300, 301, 302, 303, 304, 305}, {1, 290}};
  GenerateOptions o;
  o.max_new_tokens = 12;
  o.sampling.temperature = 0.8f;
  o.sampling.top_k = 20;
  o.sampling.top_p = 0.9f;
  o.sampling.seed = 11;
  Generator::Options go;
  go.slots = 2;
  go.context = 64;
  auto gen = Generator::Create(**model, go);
  ASSERT_TRUE(gen.ok());
  // Different lengths so the first sequence leaves early.
  GenerateOptions first = o;
  auto together = (*gen)->Generate(prompts, first);
  ASSERT_TRUE(together.ok()) << together.status().ToString();
  for (size_t i = 0; i < prompts.size(); ++i) {
    Generator::Options one = go;
    one.slots = 1;
    auto g1 = Generator::Create(**model, one);
    ASSERT_TRUE(g1.ok());
    GenerateOptions oi = o;
    oi.sampling.seed = o.sampling.seed + i;  // the seed of prompt i
    auto alone = (*g1)->Generate({prompts[i]}, oi);
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ((*together)[i].token_ids, (*alone)[0].token_ids) << i;
    EXPECT_EQ((*together)[i].prompt_ids, prompts[i]);
  }
}

// Greedy with a paged cache equals greedy with the contiguous one: four
// prompts through three slots, and a pool of pages for about two sequences,
// so prompts also wait for pages; every page is free again at the end. On
// stories260K and on models mixing sliding-window rings with paged global
// layers.
TEST(GenerateTest, GreedyWithPagingEqualsWithout) {
  std::vector<std::string> dirs = {Stories()};
  if (!SharedGoldenDir().empty())
    for (const char* m : {"mistral_sw16_sharded", "gemma2", "gpt_oss"})
      dirs.push_back(SharedGoldenDir() + "/tiny/" + m);
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    auto model = Model::Load(dir, Precision::kF32);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    const int64_t V = (*model)->config().vocab_size;
    std::mt19937 rng(5);
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t len : {7, 19, 3, 26}) {
      std::vector<int32_t> p;
      for (int64_t i = 0; i < len; ++i)
        p.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(V)));
      prompts.push_back(p);
    }
    GenerateOptions o;
    o.max_new_tokens = 24;
    Generator::Options go;
    go.slots = 3;
    go.context = 48;
    go.prefill_chunk = 8;
    auto flat = Generator::Create(**model, go);
    ASSERT_TRUE(flat.ok()) << flat.status().ToString();
    auto want = (*flat)->Generate(prompts, o);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    go.paging = {5, 21};  // 26 + 24 = 50 -> 48 positions: 10 pages each
    auto paged = Generator::Create(**model, go);
    ASSERT_TRUE(paged.ok()) << paged.status().ToString();
    auto got = (*paged)->Generate(prompts, o);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ((*got)[i].token_ids, (*want)[i].token_ids) << i;
      EXPECT_EQ((*got)[i].stop_reason, (*want)[i].stop_reason) << i;
    }
    EXPECT_EQ((*paged)->cache().free_pages(), 21);
    // A pool smaller than one sequence's pages is an error, not a hang.
    go.paging = {5, 3};
    auto tiny = Generator::Create(**model, go);
    ASSERT_TRUE(tiny.ok());
    auto none = (*tiny)->Generate({prompts[0]}, o);
    EXPECT_EQ(none.status().code(), StatusCode::kResourceExhausted);
  }
}

TEST(GenerateTest, PromptLongerThanTheContextIsOutOfRange) {
  auto model = Model::Load(Stories(), Precision::kF32);
  ASSERT_TRUE(model.ok());
  Generator::Options go;
  go.context = 8;
  auto gen = Generator::Create(**model, go);
  ASSERT_TRUE(gen.ok());
  auto out = (*gen)->Generate({std::vector<int32_t>(9, 5)}, GenerateOptions{});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(out.status().message().find("9 tokens"), std::string::npos);
  EXPECT_NE(out.status().message().find("8 positions"), std::string::npos);
  // Generation stops when the cache is full.
  GenerateOptions o;
  o.max_new_tokens = 100;
  auto full = (*gen)->Generate({std::vector<int32_t>(5, 5)}, o);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ((*full)[0].stop_reason, "context");
  EXPECT_EQ((*full)[0].token_ids.size(), 4u);  // fed at positions 5, 6, 7
}

TEST(SelectTokenTest, GreedyTakesTheFirstMaximum) {
  const std::vector<float> x = {0.0f, 3.0f, -1.0f, 3.0f};
  SamplingScratch s(4);
  std::mt19937_64 rng(0);
  EXPECT_EQ(SelectToken(x.data(), 4, SamplingOptions{}, rng, s), 1);
}

TEST(SelectTokenTest, TopKTopPAndSeeds) {
  const std::vector<float> x = {0.0f, 2.0f, 1.0f, 0.5f, 1.9f};
  SamplingScratch s(5);
  SamplingOptions o;
  o.temperature = 1.0f;
  o.top_k = 2;  // only ids 1 and 4
  std::mt19937_64 rng(1);
  std::vector<int> counts(5, 0);
  for (int i = 0; i < 4000; ++i) ++counts[SelectToken(x.data(), 5, o, rng, s)];
  EXPECT_EQ(counts[0] + counts[2] + counts[3], 0);
  // p(1) = e^2 / (e^2 + e^1.9) = 0.525
  EXPECT_NEAR(counts[1] / 4000.0, 0.525, 0.03);
  // top-p = 0.3: the most probable token alone holds more than 0.3.
  o.top_k = 0;
  o.top_p = 0.3f;
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(SelectToken(x.data(), 5, o, rng, s), 1);
  // The same seed gives the same draws.
  o.top_p = 1.0f;
  std::mt19937_64 a(42), b(42);
  for (int i = 0; i < 50; ++i)
    EXPECT_EQ(SelectToken(x.data(), 5, o, a, s),
              SelectToken(x.data(), 5, o, b, s));
  o.top_p = 0.0f;
  EXPECT_FALSE(ValidateSampling(o).ok());
}

}  // namespace
}  // namespace loom::eval
