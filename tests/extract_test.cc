// `loom extract` end to end: values equal HF's hidden states (token rows and
// text rows through the tokenizer), numpy opens every output with the right
// shape/dtype/values, a stop after any commit + --resume gives byte-identical
// output (SIGKILL at random points: extract_faults_test), and every class of
// bad input fails clearly or is recorded when skipped.
#include "src/eval/extract.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "src/io/npy.h"
#include "src/io/safetensors.h"
#include "src/model/registry.h"
#include "tests/golden_util.h"

namespace loom::testing {
namespace {

namespace fs = std::filesystem;
const std::string kModel = std::string(LOOM_MODELS_DIR) + "/stories260K";

class ExtractTest : public testing::TempDirTest {
 protected:
  std::vector<float> ReadF32(const std::string& path,
                             std::vector<int64_t>* shape = nullptr) {
    auto a = ReadNpy(path);
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    if (!a.ok()) return {};
    if (shape) *shape = a->header.shape;
    std::vector<float> v(a->data.size() / 4);
    std::memcpy(v.data(), a->data.data(), v.size() * 4);
    return v;
  }
  // A job over `text` (written to in.txt) capturing `hook`.
  ExtractOptions TextJob(const std::string& text, const std::string& hook) {
    WriteFile("in.txt", text);
    ExtractOptions o;
    o.model_dir = kModel;
    o.input_path = Path("in.txt");
    o.hooks = {hook};
    return o;
  }
  // A job over `rows` lines "Tom had i apples." capturing
  // blocks.0.hook_resid_post.
  ExtractOptions ApplesJob(int rows) {
    std::string text;
    for (int i = 0; i < rows; ++i)
      text += "Tom had " + std::to_string(i) + " apples.\n";
    return TextJob(text, "blocks.0.hook_resid_post");
  }
};

using testing::RunShell;

// Token rows of the tiny golden models: last / all / mean of every layer's
// resid_pre (HF hidden.K) match the golden hidden states.
TEST_F(ExtractTest, TokenRowsMatchGoldenHiddenStates) {
  if (SharedGoldenDir().empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared golden data not found";
  for (const std::string name : {"llama", "gemma2", "gpt2", "olmo2"}) {
    SCOPED_TRACE(name);
    const std::string gdir = SharedGoldenDir() + "/tiny/" + name;
    auto golden = GoldenFile::Open(gdir + "/goldens_f32.safetensors");
    const nlohmann::json manifest = ReadJson(gdir + "/manifest.json");
    std::string jsonl;
    std::vector<std::string> seqs = {"seq1", "seq2", "seq3", "seq4"};
    for (const auto& s : seqs) {
      nlohmann::json row = {{"id", s},
                            {"tokens", golden->Ids(s + ".input_ids")}};
      jsonl += row.dump() + "\n";
    }
    WriteFile(name + ".jsonl", jsonl);
    ExtractOptions o;
    o.model_dir = gdir;
    o.input_path = Path(name + ".jsonl");
    o.out_dir = Path("out_" + name);
    o.hooks = {"blocks.*.hook_resid_pre"};
    o.selectors = {"last", "all", "mean", "pos:0,-2"};
    o.precision = Precision::kF32;
    o.batch_tokens = 40;  // several batches, sorted by length
    o.commit_every = 3;   // two windows
    auto s = RunExtract(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const int64_t L = manifest["num_layers"];
    for (int64_t k = 0; k < L; ++k) {
      const std::string hook =
          "blocks." + std::to_string(k) + ".hook_resid_pre";
      std::vector<int64_t> shape;
      auto last = ReadF32(o.out_dir + "/" + hook + ".last.npy", &shape);
      ASSERT_EQ(shape, (std::vector<int64_t>{4, 64}));
      auto all = ReadF32(o.out_dir + "/" + hook + ".all.npy");
      auto mean = ReadF32(o.out_dir + "/" + hook + ".mean.npy");
      auto pos = ReadF32(o.out_dir + "/" + hook + ".pos_0_-2.npy", &shape);
      ASSERT_EQ(shape, (std::vector<int64_t>{4, 2, 64}));
      auto offs_arr = ReadNpy(o.out_dir + "/all.offsets.npy");
      ASSERT_TRUE(offs_arr.ok());
      std::vector<int64_t> offs(offs_arr->data.size() / 8);
      std::memcpy(offs.data(), offs_arr->data.data(), offs.size() * 8);
      ASSERT_EQ(offs.size(), 5u);
      for (size_t r = 0; r < seqs.size(); ++r) {
        std::vector<float> h =
            golden->F32(seqs[r] + ".hidden." + std::to_string(k));
        const int64_t T = static_cast<int64_t>(h.size()) / 64;
        ASSERT_EQ(offs[r + 1] - offs[r], T);
        EXPECT_TRUE(Compare(&last[r * 64], &h[(T - 1) * 64], 64, 1e-4, 1e-4).ok)
            << hook << " last row " << r;
        EXPECT_TRUE(
            Compare(&all[offs[r] * 64], h.data(), T * 64, 1e-4, 1e-4).ok)
            << hook << " all row " << r;
        EXPECT_TRUE(Compare(&pos[(r * 2) * 64], &h[0], 64, 1e-4, 1e-4).ok)
            << hook << " pos 0 row " << r;
        EXPECT_TRUE(
            Compare(&pos[(r * 2 + 1) * 64], &h[(T - 2) * 64], 64, 1e-4, 1e-4)
                .ok)
            << hook << " pos -2";
        std::vector<float> m(64, 0.0f);
        for (int64_t j = 0; j < 64; ++j) {
          double acc = 0;
          for (int64_t t = 0; t < T; ++t) acc += h[t * 64 + j];
          m[j] = static_cast<float>(acc / T);
        }
        EXPECT_TRUE(Compare(&mean[r * 64], m.data(), 64, 1e-4, 1e-4).ok)
            << hook << " mean row " << r;
      }
    }
  }
}

// attn.hook_pattern through extract: one [heads, keys] row per query token
// (keys = min(--batch-tokens, max_position_embeddings)), HF's eager
// attention probabilities over the row's keys and zero past them; `last`
// holds the last query's row. Sliding-window layers (gemma2) included.
TEST_F(ExtractTest, AttentionPatternMatchesGoldenProbabilities) {
  if (SharedGoldenDir().empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared golden data not found";
  for (const std::string name : {"llama", "gemma2", "gpt2"}) {
    SCOPED_TRACE(name);
    const std::string gdir = SharedGoldenDir() + "/tiny/" + name;
    auto golden = GoldenFile::Open(gdir + "/goldens_f32.safetensors");
    auto config = LoadModelConfig(gdir);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    const int64_t heads = config->num_heads;
    std::string jsonl;
    std::vector<std::string> seqs;
    for (const std::string s : {"seq1", "seq2", "seq3", "seq4"})
      if (golden->Has(s + ".attn_probs.0")) {
        seqs.push_back(s);
        jsonl +=
            nlohmann::json{{"tokens", golden->Ids(s + ".input_ids")}}.dump() +
            "\n";
      }
    ASSERT_FALSE(seqs.empty());
    WriteFile(name + ".jsonl", jsonl);
    ExtractOptions o;
    o.model_dir = gdir;
    o.input_path = Path(name + ".jsonl");
    o.out_dir = Path("pattern_" + name);
    o.hooks = {"blocks.0.attn.hook_pattern"};
    o.selectors = {"all", "last"};
    o.precision = Precision::kF32;
    o.batch_tokens = 120;
    auto s = RunExtract(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const std::string base = o.out_dir + "/blocks.0.attn.hook_pattern.";
    std::vector<int64_t> all_shape, last_shape;
    auto all = ReadF32(base + "all.npy", &all_shape);
    auto last = ReadF32(base + "last.npy", &last_shape);
    const int64_t K = all_shape.back();
    ASSERT_EQ(all_shape.size(), 3u);
    EXPECT_EQ(all_shape[1], heads);
    EXPECT_EQ(last_shape, (std::vector<int64_t>{
                              static_cast<int64_t>(seqs.size()), heads, K}));
    auto offs_arr = ReadNpy(o.out_dir + "/all.offsets.npy");
    ASSERT_TRUE(offs_arr.ok());
    std::vector<int64_t> offs(offs_arr->data.size() / 8);
    std::memcpy(offs.data(), offs_arr->data.data(), offs.size() * 8);
    for (size_t r = 0; r < seqs.size(); ++r) {
      const std::vector<float> g = golden->F32(seqs[r] + ".attn_probs.0");
      const int64_t T = offs[r + 1] - offs[r];
      ASSERT_EQ(static_cast<int64_t>(g.size()), heads * T * T);
      ASSERT_LE(T, K);
      double worst = 0, past = 0, last_diff = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < heads; ++h) {
          const float* row = &all[((offs[r] + t) * heads + h) * K];
          for (int64_t j = 0; j < K; ++j) {
            if (j >= T) {
              past = std::max(past, std::fabs(double{row[j]}));
              continue;
            }
            worst = std::max(
                worst, std::fabs(double{row[j]} - g[(h * T + t) * T + j]));
            if (t == T - 1)
              last_diff = std::max(
                  last_diff,
                  std::fabs(double{row[j]} - last[(r * heads + h) * K + j]));
          }
        }
      EXPECT_LE(worst, 1e-5) << seqs[r];  // the README's bound for probs
      EXPECT_EQ(past, 0.0) << seqs[r] << ": keys past the row are not zero";
      EXPECT_EQ(last_diff, 0.0) << seqs[r] << ": last != all's last row";
    }
  }
}

// MoE hooks through extract (qwen3_moe, seq4): router logits match HF's
// gate logits; expert ids are written as exact integers and, with the
// weights, are HF's routing recomputed from the golden logits (softmax over
// all experts, top k, renormalised: norm_topk_prob).
TEST_F(ExtractTest, MoeRouterHooksMatchGoldenRouting) {
  if (SharedGoldenDir().empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared golden data not found";
  const std::string gdir = SharedGoldenDir() + "/tiny/qwen3_moe";
  auto golden = GoldenFile::Open(gdir + "/goldens_f32.safetensors");
  ASSERT_NE(golden, nullptr);
  nlohmann::json row = {{"id", "seq4"},
                        {"tokens", golden->Ids("seq4.input_ids")}};
  WriteFile("moe.jsonl", row.dump() + "\n");
  ExtractOptions o;
  o.model_dir = gdir;
  o.input_path = Path("moe.jsonl");
  o.out_dir = Path("out_moe");
  o.hooks = {"mlp.hook_router_logits", "mlp.hook_expert_ids",
             "mlp.hook_expert_weights"};
  o.layers = {"*"};
  o.selectors = {"all"};
  o.precision = Precision::kF32;
  auto s = RunExtract(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const int64_t E = 4, K = 2;
  for (int64_t l = 0; l < 2; ++l) {
    const std::string b = o.out_dir + "/blocks." + std::to_string(l);
    const std::vector<float> g =
        golden->F32("seq4.router_logits." + std::to_string(l));  // [T, E]
    const int64_t T = static_cast<int64_t>(g.size()) / E;
    std::vector<int64_t> shape;
    auto logits = ReadF32(b + ".mlp.hook_router_logits.all.npy", &shape);
    ASSERT_EQ(shape, (std::vector<int64_t>{T, E}));
    EXPECT_TRUE(Compare(logits.data(), g.data(), T * E, 1e-4, 1e-4).ok);
    auto ids = ReadF32(b + ".mlp.hook_expert_ids.all.npy", &shape);
    ASSERT_EQ(shape, (std::vector<int64_t>{T, K}));
    auto w = ReadF32(b + ".mlp.hook_expert_weights.all.npy");
    for (int64_t t = 0; t < T; ++t) {
      // HF's routing from the golden logits, in double.
      std::vector<double> p(E);
      // (Unnormalised: the top two are renormalised below.)
      double m = g[t * E];
      for (int64_t e = 0; e < E; ++e) m = std::max(m, double{g[t * E + e]});
      for (int64_t e = 0; e < E; ++e) p[e] = std::exp(g[t * E + e] - m);
      std::vector<int> order = {0, 1, 2, 3};
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int c) { return p[a] > p[c]; });
      const double top = p[order[0]] + p[order[1]];
      for (int64_t k = 0; k < K; ++k) {
        EXPECT_EQ(ids[t * K + k], static_cast<float>(order[k]))
            << "layer " << l << " token " << t << " slot " << k;
        EXPECT_NEAR(w[t * K + k], p[order[k]] / top, 1e-4);
      }
    }
  }
}

// Text rows through the tokenizer + the CLI; numpy reads every output.
TEST_F(ExtractTest, CliTextRowsNumpyAndGolden) {
  auto golden = GoldenFile::Open(BundledGoldenDir() +
                                 "/stories260K/goldens_f32.safetensors");
  const nlohmann::json manifest =
      ReadJson(BundledGoldenDir() + "/stories260K/manifest.json");
  std::string jsonl;
  for (const auto& p : manifest["prompts"])
    jsonl +=
        nlohmann::json{{"id", p["name"]}, {"text", p["text"]}}.dump() + "\n";
  WriteFile("prompts.jsonl", jsonl);
  const std::string out = Path("out");
  std::string log;
  ASSERT_EQ(RunShell(std::string(LOOM_BINARY) + " extract --model " + kModel +
                         " --input " + Path("prompts.jsonl") + " --out " + out +
                         " --hooks hook_resid_post,ln_final.hook_normalized "
                         "--layers 0.5,1.0 "
                         "--select last --select all --precision f32 --quiet",
                     &log),
            0)
      << log;
  // Layers: floor(0.5 x 5) = 2 and 1.0 -> 4 (the last).
  EXPECT_TRUE(fs::exists(out + "/blocks.2.hook_resid_post.last.npy"));
  EXPECT_TRUE(fs::exists(out + "/blocks.4.hook_resid_post.all.npy"));
  const int64_t n = static_cast<int64_t>(manifest["prompts"].size());
  for (int64_t r = 0; r < n; ++r) {
    const std::string pname = manifest["prompts"][r]["name"];
    std::vector<float> h =
        golden->F32(pname + ".hidden.3");  // resid_post of layer 2
    const int64_t T = static_cast<int64_t>(h.size()) / 64;
    auto last = ReadF32(out + "/blocks.2.hook_resid_post.last.npy");
    EXPECT_TRUE(Compare(&last[r * 64], &h[(T - 1) * 64], 64, 1e-4, 1e-4).ok)
        << pname;
  }
  // numpy: shapes, dtypes, offsets, values (python3 with numpy may be absent).
  std::string py;
  for (const char* cand : {"python3", "/usr/bin/python3"})
    if (RunShell(std::string(cand) + " -c 'import numpy'") == 0) {
      py = cand;
      break;
    }
  if (py.empty())
    GTEST_SKIP()
        << "SKIPPED LOUDLY: no python3 with numpy; the numpy check did not run";
  const std::string script =
      "import numpy as np, json, sys\n"
      "d=sys.argv[1]; m=json.load(open(d+'/manifest.json'))\n"
      "assert m['complete'] and m['row_count']==" +
      std::to_string(n) +
      "\n"
      "for a in m['arrays']:\n"
      "  x=np.load(d+'/'+a['file'], mmap_mode='r')\n"
      "  assert x.dtype==np.float32, x.dtype\n"
      "  if 'offsets_file' in a:\n"
      "    o=np.load(d+'/'+a['offsets_file']); assert o.dtype==np.int64 and "
      "len(o)==" +
      std::to_string(n + 1) +
      "\n"
      "    assert x.shape==(o[-1],64), x.shape\n"
      "    assert [r['tokens'] for r in m['rows']]==list(np.diff(o))\n"
      "  else:\n"
      "    assert x.shape==(" +
      std::to_string(n) +
      ",64), x.shape\n"
      "  assert np.isfinite(x).all()\n"
      "l=np.load(d+'/blocks.4.hook_resid_post.last.npy'); "
      "a=np.load(d+'/blocks.4.hook_resid_post.all.npy')\n"
      "o=np.load(d+'/all.offsets.npy'); assert np.array_equal(l, a[o[1:]-1])\n"
      "print('numpy ok')\n";
  WriteFile("check.py", script);
  ASSERT_EQ(RunShell(py + " " + Path("check.py") + " " + out, &log), 0) << log;
  EXPECT_NE(log.find("numpy ok"), std::string::npos) << log;
}

// Resume after a simulated stop at each commit also restores exactly.
TEST_F(ExtractTest, ResumeAfterEveryCommitPoint) {
  ExtractOptions o = ApplesJob(20);
  o.selectors = {"last", "span:1:3"};
  o.commit_every = 3;
  o.out_dir = Path("ref");
  ASSERT_TRUE(RunExtract(o).ok());
  for (int stop = 1; stop <= 6; ++stop) {
    ExtractOptions p = o;
    p.out_dir = Path("s" + std::to_string(stop));
    p.stop_after_commits = stop;
    ASSERT_TRUE(RunExtract(p).ok());
    p.stop_after_commits = 0;
    p.resume = true;
    auto s = RunExtract(p);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->rows, 20);
    for (const auto& e : fs::directory_iterator(Path("ref")))
      EXPECT_EQ(Slurp(e.path().string()),
                Slurp(p.out_dir + "/" + e.path().filename().string()))
          << e.path().filename() << " after stop at commit " << stop;
  }
}

// A short input plans its default batch for its own tokens (rounded up to
// 64), not for 4096: the manifest records it, the outputs are the bytes of a
// run with --batch-tokens given, and a bad row keeps the default budget (its
// message names that).
// A bf16 job's .npy files hold uint16 bits: the summary and each manifest
// array say so (and how to read them); other dtypes say only their dtype.
TEST_F(ExtractTest, Bf16FilesSayTheyHoldUint16Bits) {
  using Json = nlohmann::json;
  ExtractOptions o = ApplesJob(2);
  o.dtype = DType::kBF16;
  o.out_dir = Path("bf16");
  auto s = RunExtract(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const Json summary = s->ToJson();
  EXPECT_EQ(summary["dtype"], "bfloat16");
  ASSERT_TRUE(summary.contains("storage")) << summary.dump();
  EXPECT_EQ(summary["storage"].get<std::string>().rfind(
                "uint16: the bfloat16 bits (numpy has no bfloat16)", 0),
            0u);
  const Json manifest = Json::parse(Slurp(Path("bf16/manifest.json")));
  ASSERT_FALSE(manifest["arrays"].empty());
  for (const Json& a : manifest["arrays"]) {
    EXPECT_EQ(a["dtype"], "bfloat16");
    EXPECT_EQ(a["storage"], summary["storage"]);
  }
  o.dtype = DType::kF32;
  o.out_dir = Path("f32");
  s = RunExtract(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->ToJson()["dtype"], "float32");
  EXPECT_FALSE(s->ToJson().contains("storage"));
  EXPECT_FALSE(
      Json::parse(Slurp(Path("f32/manifest.json")))["arrays"][0].contains(
          "storage"));
}

TEST_F(ExtractTest, ShortInputPlansItsOwnTokens) {
  ExtractOptions o = ApplesJob(8);
  o.selectors = {"last", "all"};
  o.out_dir = Path("short");
  auto a = RunExtract(o);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const std::string manifest = Slurp(Path("short/manifest.json"));
  const auto tokens = a->tokens;
  ASSERT_GT(tokens, 8);
  const int64_t want = (tokens + 63) / 64 * 64;
  EXPECT_NE(manifest.find("\"batch_tokens\": " + std::to_string(want)),
            std::string::npos)
      << tokens << " tokens: " << manifest;
  ExtractOptions p = o;
  p.out_dir = Path("given");
  p.batch_tokens = 256;
  ASSERT_TRUE(RunExtract(p).ok());
  for (const char* f : {"blocks.0.hook_resid_post.last.npy",
                        "blocks.0.hook_resid_post.all.npy"})
    EXPECT_EQ(Slurp(Path(std::string("short/") + f)),
              Slurp(Path(std::string("given/") + f)))
        << f;
  // A job recorded with another budget (an older version planned 512 for
  // any input): --resume is refused naming --batch-tokens, files unchanged;
  // with that option it resumes.
  ExtractOptions r = o;
  r.out_dir = Path("old");
  r.commit_every = 3;
  r.stop_after_commits = 1;
  ASSERT_TRUE(RunExtract(r).ok());
  std::string m = Slurp(Path("old/manifest.json"));
  const std::string from = "\"batch_tokens\": " + std::to_string(want);
  ASSERT_NE(m.find(from), std::string::npos);
  m.replace(m.find(from), from.size(), "\"batch_tokens\": 512");
  WriteFile("old/manifest.json", m);
  r.stop_after_commits = 0;
  r.resume = true;
  auto refused = RunExtract(r);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("resume with --batch-tokens 512"),
            std::string::npos)
      << refused.status().ToString();
  EXPECT_EQ(Slurp(Path("old/manifest.json")), m);
  r.batch_tokens = 512;
  auto resumed = RunExtract(r);
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->rows, 8);
  // A row the vocabulary refuses (skipped): the default budget stays.
  WriteFile("bad.jsonl",
            "{\"id\": 0, \"tokens\": [1, 2, 3]}\n"
            "{\"id\": 1, \"tokens\": [1, 99999999]}\n");
  ExtractOptions b = o;
  b.input_path = Path("bad.jsonl");
  b.out_dir = Path("bad");
  b.on_error = OnError::kSkip;
  ASSERT_TRUE(RunExtract(b).ok());
  EXPECT_EQ(Slurp(Path("bad/manifest.json")).find("\"batch_tokens\": 64"),
            std::string::npos);
}

struct BadCase {
  std::string name;
  std::string line;    // one input line (JSONL)
  std::string reason;  // substring of the error
};

TEST_F(ExtractTest, BadRowsFailClearlyOrAreRecordedWhenSkipped) {
  const std::string too_long = "{\"tokens\": [" + [] {
    std::string s;
    for (int i = 0; i < 600; ++i) s += (i ? "," : "") + std::to_string(5);
    return s;
  }() + "]}";
  const std::vector<BadCase> cases = {
      {"empty_text", "{\"id\": \"e\", \"text\": \"\"}", "empty text"},
      {"too_long", too_long,
       "too long for the model: 600 tokens > max_position_embeddings 512"},
      {"invalid_utf8", "{\"id\": \"u\", \"text\": \"caf\xc3\x28\"}",
       "invalid UTF-8 at byte"},
      {"truncated_json", "{\"text\": ", "malformed JSON at byte 9"},
      {"not_object", "[1, 2]", "not a JSON object (a JSON array)"},
      {"text_and_tokens", "{\"text\": \"a\", \"tokens\": [1]}",
       "both 'text' and 'tokens'"},
      {"bad_token", "{\"tokens\": [1, 2, 9999]}",
       "token id 9999 outside the vocabulary"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string good = "{\"id\": \"g\", \"text\": \"The cat sat.\"}\n";
    WriteFile(c.name + ".jsonl", good + good + c.line + "\n" + good);
    ExtractOptions o;
    o.model_dir = kModel;
    o.input_path = Path(c.name + ".jsonl");
    o.hooks = {"blocks.0.hook_resid_post"};
    o.selectors = {"last", "all"};
    o.commit_every = 2;
    o.out_dir = Path("fail_" + c.name);
    auto s = RunExtract(o);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find(c.reason), std::string::npos)
        << s.status().message();
    EXPECT_NE(s.status().message().find("input row 2"), std::string::npos)
        << s.status().message();
    // The two rows committed before the bad one are kept.
    auto kept = ReadNpy(o.out_dir + "/blocks.0.hook_resid_post.last.npy");
    ASSERT_TRUE(kept.ok());
    EXPECT_EQ(kept->header.shape[0], 2);
    EXPECT_NE(s.status().message().find("--resume --on-error skip"),
              std::string::npos)
        << s.status().message();
    // The hint works: --resume may change --on-error.
    ExtractOptions r = o;
    r.resume = true;
    r.on_error = OnError::kSkip;
    auto resumed = RunExtract(r);
    ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
    EXPECT_EQ(resumed->rows, 4);
    EXPECT_EQ(resumed->rows_skipped, 1);

    o.on_error = OnError::kSkip;
    o.out_dir = Path("skip_" + c.name);
    s = RunExtract(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->rows, 4);
    EXPECT_EQ(s->rows_skipped, 1);
    std::vector<int64_t> shape;
    auto last =
        ReadF32(o.out_dir + "/blocks.0.hook_resid_post.last.npy", &shape);
    ASSERT_EQ(shape[0], 4);  // row i = input row i, the skipped one NaN
    EXPECT_TRUE(std::isnan(last[2 * 64]));
    EXPECT_FALSE(std::isnan(last[3 * 64]));
    const nlohmann::json m = ReadJson(o.out_dir + "/manifest.json");
    EXPECT_EQ(m["rows"][2]["status"], "skipped");
    EXPECT_NE(m["rows"][2]["reason"].get<std::string>().find(c.reason),
              std::string::npos)
        << m["rows"][2].dump();
  }
}

// A new job that fails before its first commit leaves --out as it found it
// (a directory it created is removed), so the same command line with
// --on-error skip (the hint) just works; one that found --out there keeps it.
TEST_F(ExtractTest, FailureBeforeTheFirstCommitLeavesNothing) {
  WriteFile("bad_first.jsonl",
            "{\"text\": \"\"}\n{\"text\": \"The cat sat.\"}\n");
  ExtractOptions o;
  o.model_dir = kModel;
  o.input_path = Path("bad_first.jsonl");
  o.hooks = {"blocks.0.hook_resid_post"};
  o.out_dir = Path("fresh");
  auto s = RunExtract(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("no row was committed"),
            std::string::npos)
      << s.status().message();
  EXPECT_FALSE(fs::exists(o.out_dir)) << "a created --out is removed";
  fs::create_directories(Path("mine"));
  WriteFile("mine/notes.txt", "kept");
  o.out_dir = Path("mine");
  ASSERT_FALSE(RunExtract(o).ok());
  EXPECT_EQ(std::vector<std::string>{"notes.txt"}, [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(o.out_dir))
      names.push_back(e.path().filename().string());
    return names;
  }()) << "only what the job created is removed";
  o.on_error = OnError::kSkip;
  s = RunExtract(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->rows_skipped, 1);
}

// The CLI's warnings and usage errors around rows: an empty input or a run
// that skipped every row exits 0 with a warning (also under --quiet);
// --quiet excludes --progress; text rows for a model without a tokenizer are
// refused before --out is created, pointing at token rows.
TEST_F(ExtractTest, CliWarnsOnEmptyOrSkippedInputAndChecksTheTokenizer) {
  const std::string loom = std::string(LOOM_BINARY) + " extract --model ";
  const std::string hooks = " --hooks blocks.0.hook_resid_post";
  WriteFile("empty.txt", "");
  std::string log;
  EXPECT_EQ(RunShell(loom + kModel + " --input " + Path("empty.txt") +
                         " --out " + Path("e") + hooks + " --quiet",
                     &log),
            0)
      << log;
  EXPECT_NE(log.find("warning: the input held no rows"), std::string::npos)
      << log;
  WriteFile("all_bad.jsonl", "{\"text\": \"\"}\n{\"text\": \"\"}\n");
  EXPECT_EQ(
      RunShell(loom + kModel + " --input " + Path("all_bad.jsonl") + " --out " +
                   Path("s") + hooks + " --on-error skip --quiet",
               &log),
      0)
      << log;
  EXPECT_NE(log.find("warning: every row (2) was skipped"), std::string::npos)
      << log;
  EXPECT_EQ(RunShell(loom + kModel + " --input " + Path("all_bad.jsonl") +
                         " --out " + Path("q") + hooks + " --quiet --progress",
                     &log),
            2)
      << log;
  EXPECT_NE(log.find("--progress"), std::string::npos) << log;
  // A model without a tokenizer: text rows are refused up front, token rows
  // run.
  const std::string bare = Path("bare_model");
  fs::create_directories(bare);
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(kModel + "/" + f, bare + "/" + f);
  WriteFile("text.txt", "Once upon a time\n");
  EXPECT_EQ(RunShell(loom + bare + " --input " + Path("text.txt") + " --out " +
                         Path("t") + hooks,
                     &log),
            1)
      << log;
  EXPECT_NE(log.find("has no tokenizer"), std::string::npos) << log;
  EXPECT_NE(log.find("{\"tokens\": [1, 2, ...]}"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(Path("t"))) << "--out is not created";
  WriteFile("ids.jsonl", "{\"tokens\": [1, 5, 9]}\n");
  EXPECT_EQ(RunShell(loom + bare + " --input " + Path("ids.jsonl") + " --out " +
                         Path("i") + hooks + " --quiet",
                     &log),
            0)
      << log;
}

TEST_F(ExtractTest, OptionErrors) {
  ExtractOptions o = TextJob("hello\n", "hook_resid_post");
  o.out_dir = Path("o");
  EXPECT_NE(RunExtract(o).status().message().find("needs a layer"),
            std::string::npos);
  o.hooks = {"blocks.{1.5}.hook_resid_post"};
  EXPECT_NE(RunExtract(o).status().message().find("outside [0, 1]"),
            std::string::npos);
  o.hooks = {"blocks.7.hook_resid_post"};
  EXPECT_EQ(RunExtract(o).status().code(), StatusCode::kOutOfRange);
  o.hooks = {"blocks.0.hook_resid_post"};
  o.selectors = {"middle"};
  EXPECT_NE(RunExtract(o).status().message().find("selector 'middle'"),
            std::string::npos);
  o.selectors = {"last"};
  ASSERT_TRUE(RunExtract(o).ok());
  auto again = RunExtract(o);  // existing job: never overwritten
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
}

// --format safetensors: one shard per hook x selector per commit window, with
// the same values as the .npy output and ragged offsets local to the shard.
TEST_F(ExtractTest, SafetensorsShardsHoldTheSameRows) {
  std::string text;
  for (int i = 0; i < 7; ++i)
    text += "Sue saw " + std::to_string(i) + " red birds.\n";
  ExtractOptions o = TextJob(text, "blocks.1.hook_mlp_out");
  o.selectors = {"last", "all"};
  o.commit_every = 3;  // shards of 3, 3 and 1 rows
  o.out_dir = Path("npy");
  ASSERT_TRUE(RunExtract(o).ok());
  o.format = OutputFormat::kSafetensors;
  o.out_dir = Path("st");
  auto s = RunExtract(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::vector<float> last =
      ReadF32(Path("npy") + "/blocks.1.hook_mlp_out.last.npy");
  std::vector<float> all =
      ReadF32(Path("npy") + "/blocks.1.hook_mlp_out.all.npy");
  std::vector<float> st_last, st_all;
  for (int shard = 0; shard < 3; ++shard) {
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, ".shard-%05d.safetensors", shard);
    for (const std::string sel : {"last", "all"}) {
      auto f = SafetensorsFile::Open(Path("st") + "/blocks.1.hook_mlp_out." +
                                     sel + suffix);
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      const TensorInfo* t = (*f)->Find("activations");
      ASSERT_NE(t, nullptr);
      const TensorView v = (*f)->View(*t);
      std::vector<float>& dst = sel == "last" ? st_last : st_all;
      dst.insert(dst.end(), static_cast<const float*>(v.data),
                 static_cast<const float*>(v.data) + v.numel());
      EXPECT_EQ(t->shape[0] > 0, true);
      if (sel == "all") {
        const TensorInfo* offs = (*f)->Find("offsets");
        ASSERT_NE(offs, nullptr);
        EXPECT_EQ(offs->shape[0], (shard < 2 ? 3 : 1) + 1);
      }
    }
  }
  EXPECT_EQ(st_last, last);
  EXPECT_EQ(st_all, all);
  EXPECT_EQ(s->files.size(), 6u);
}

TEST(SelectorTest, Parse) {
  EXPECT_EQ(ParseRowSelector("pos:0,-1")->file_name, "pos_0_-1");
  EXPECT_EQ(ParseRowSelector("span:2:5")->file_name, "span_2_5");
  EXPECT_FALSE(ParseRowSelector("span:5:2").ok());
  EXPECT_FALSE(ParseRowSelector("pos:x").ok());
}

}  // namespace
}  // namespace loom::testing
