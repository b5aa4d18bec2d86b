// `loom extract --streaming-chunk-size`: a row longer than --batch-tokens
// runs alone, prefilled chunk by chunk through a KV cache of one sequence,
// and what every selector keeps of it equals the same row run in one pass
// (with a batch big enough for it) to f32 round-off: within 2e-5 of the
// largest magnitude of each output array, the tolerance of
// docs/design/generation.md. Rows that fit a batch are byte-identical to a
// job without streaming. Also: every shared tiny model (sliding windows
// shorter than the row, MoE, learned positions), resume across streamed
// rows, the planned KV term, the device selection path, and the errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "src/backend/registry.h"
#include "src/eval/extract.h"
#include "src/eval/extract_settings.h"
#include "src/io/npy.h"
#include "src/model/registry.h"
#include "src/plan/devices.h"
#include "src/plan/kv_layout.h"
#include "src/plan/planner.h"
#include "src/runtime/kv_cache.h"
#include "src/runtime/model.h"
#include "tests/golden_util.h"
#include "tests/host_as_device.h"

namespace loom::testing {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const std::string kModel = std::string(LOOM_MODELS_DIR) + "/stories260K";
// Of the largest magnitude of each output array (generation.md: chunked
// prefill measured <= 1e-6).
constexpr double kTolerance = 2e-5;
const std::vector<std::string> kEverySelector = {
    "last", "first", "mean", "max", "all", "pos:0,-2,3", "span:1:-1"};

// JSONL token rows of the given lengths: BOS (1) then seeded ids in
// [2, vocab).
std::string TokenRows(const std::vector<int64_t>& lengths, int64_t vocab,
                      uint32_t seed) {
  std::mt19937 rng(seed);
  std::string text;
  for (int64_t n : lengths) {
    Json ids = Json::array({1});
    for (int64_t t = 1; t < n; ++t)
      ids.push_back(2 + static_cast<int64_t>(rng() % (vocab - 2)));
    text += Json{{"tokens", ids}}.dump() + "\n";
  }
  return text;
}

// The manifest's arrays of a job directory.
Json Arrays(const std::string& dir) {
  return ReadJson(dir + "/manifest.json")["arrays"];
}

std::vector<float> F32(const NpyArray& a) {
  std::vector<float> v(a.data.size() / 4);
  std::memcpy(v.data(), a.data.data(), v.size() * 4);
  return v;
}

// The bytes input row `r` holds in array `a` (its slice of a ragged one).
std::string RowBytes(const std::string& dir, const Json& a, int64_t r) {
  const std::string data = Slurp(dir + "/" + a["file"].get<std::string>());
  auto header = ReadNpyHeader(dir + "/" + a["file"].get<std::string>());
  EXPECT_TRUE(header.ok());
  int64_t row_bytes = 4;  // f32 jobs only
  for (const auto& d : a["row_shape"]) row_bytes *= d.get<int64_t>();
  int64_t begin = r, end = r + 1;
  if (a.contains("offsets_file")) {
    auto offs = ReadNpy(dir + "/" + a["offsets_file"].get<std::string>());
    EXPECT_TRUE(offs.ok());
    const int64_t* o = reinterpret_cast<const int64_t*>(offs->data.data());
    begin = o[r];
    end = o[r + 1];
  }
  return data.substr(
      static_cast<size_t>(header->data_offset + begin * row_bytes),
      static_cast<size_t>((end - begin) * row_bytes));
}

// Every array of job `got` against job `want` (same rows, f32): the same
// shape and offsets, values within kTolerance of the array's largest
// magnitude. Returns the largest error / largest magnitude seen.
double ExpectClose(const std::string& got, const std::string& want) {
  double worst = 0;
  const Json arrays = Arrays(want);
  EXPECT_FALSE(arrays.empty());
  for (const Json& a : arrays) {
    const std::string file = a["file"];
    SCOPED_TRACE(file);
    auto g = ReadNpy(got + "/" + file);
    auto w = ReadNpy(want + "/" + file);
    EXPECT_TRUE(g.ok() && w.ok());
    if (!g.ok() || !w.ok()) continue;
    EXPECT_EQ(g->header.shape, w->header.shape);
    if (g->header.shape != w->header.shape) continue;
    if (a.contains("offsets_file")) {
      const std::string offs = a["offsets_file"];
      EXPECT_EQ(Slurp(got + "/" + offs), Slurp(want + "/" + offs));
    }
    const std::vector<float> gv = F32(*g), wv = F32(*w);
    double scale = 0, err = 0;
    for (size_t i = 0; i < wv.size(); ++i) {
      scale = std::max(scale, std::fabs(double{wv[i]}));
      err = std::max(err, std::fabs(double{gv[i]} - double{wv[i]}));
    }
    EXPECT_GT(scale, 0.0);
    if (scale == 0.0) continue;
    EXPECT_LE(err, kTolerance * scale)
        << "max error " << err << " of max |value| " << scale;
    worst = std::max(worst, err / scale);
  }
  return worst;
}

class ExtractStreamingTest : public testing::TempDirTest {
 protected:
  // Every file of job `a` equals job `b`'s, byte for byte.
  void ExpectSameFiles(const std::string& a, const std::string& b,
                       bool manifest = true) {
    int n = 0;
    for (const auto& e : fs::directory_iterator(b)) {
      const std::string name = e.path().filename().string();
      if (!manifest && name == "manifest.json") continue;
      EXPECT_EQ(Slurp(a + "/" + name), Slurp(e.path().string())) << name;
      ++n;
    }
    EXPECT_GT(n, 3);
  }
};

// stories260K (5 layers, 512 positions): rows of 65..500 tokens with
// --batch-tokens 64, streamed in chunks of 7, 16 and 64, against the same
// rows in one pass (--batch-tokens 512); hooks at several layers, attention
// and MLP outputs, the final norm and the logits; and a job whose deepest
// hook is layer 1 (its cache holds layers 0-1 only).
TEST_F(ExtractStreamingTest, StreamedRowsEqualOnePassForEverySelector) {
  // Long rows in several windows (commit_every 3), short ones around them.
  const std::vector<int64_t> lengths = {20, 300, 5, 130, 64, 65, 40, 500, 9};
  WriteFile("in.jsonl", TokenRows(lengths, 512, 11));
  const std::vector<std::vector<std::string>> hook_sets = {
      {"blocks.0.hook_resid_post", "blocks.2.hook_resid_post",
       "blocks.4.hook_resid_post", "blocks.3.attn.hook_z",
       "blocks.1.hook_mlp_out", "ln_final.hook_normalized", "logits"},
      {"blocks.0.attn.hook_q", "blocks.1.hook_resid_post"}};
  double worst = 0;
  for (size_t h = 0; h < hook_sets.size(); ++h) {
    SCOPED_TRACE("hook set " + std::to_string(h));
    ExtractOptions o;
    o.model_dir = kModel;
    o.input_path = Path("in.jsonl");
    o.hooks = hook_sets[h];
    o.selectors = kEverySelector;
    o.precision = Precision::kF32;
    o.commit_every = 3;
    o.batch_tokens = 512;  // every row in one pass
    o.out_dir = Path("ref" + std::to_string(h));
    auto ref = RunExtract(o);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    // Without streaming the long rows are skipped; the short ones are the
    // bytes the streaming jobs must reproduce.
    o.batch_tokens = 64;
    o.on_error = OnError::kSkip;
    o.out_dir = Path("short" + std::to_string(h));
    auto short_only = RunExtract(o);
    ASSERT_TRUE(short_only.ok()) << short_only.status().ToString();
    EXPECT_EQ(short_only->rows_skipped, 4);
    o.on_error = OnError::kFail;
    for (int64_t chunk : {7, 16, 64}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      o.streaming_chunk_size = chunk;
      o.out_dir = Path("s" + std::to_string(h) + "_" + std::to_string(chunk));
      auto s = RunExtract(o);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      EXPECT_EQ(s->rows_ok, static_cast<int64_t>(lengths.size()));
      int64_t total = 0;
      for (int64_t n : lengths) total += n;
      EXPECT_EQ(s->tokens, total);
      worst = std::max(worst,
                       ExpectClose(o.out_dir, Path("ref" + std::to_string(h))));
      for (const Json& a : Arrays(o.out_dir)) {
        for (int64_t r = 0; r < static_cast<int64_t>(lengths.size()); ++r) {
          if (lengths[r] > 64) continue;
          EXPECT_EQ(RowBytes(o.out_dir, a, r),
                    RowBytes(Path("short" + std::to_string(h)), a, r))
              << a["file"] << " row " << r
              << ": a row that fits a batch changed";
        }
      }
    }
  }
  std::printf(
      "streamed vs one pass (stories260K): max error / max |value| "
      "= %.3g\n",
      worst);
  RecordProperty("max_relative_error", std::to_string(worst));
}

// Every shared tiny model: sliding windows shorter than the row (gemma2 and
// mistral_sw16 16, gpt_oss 8: the rings wrap), MoE routing, learned
// positions (gpt2), softcaps, sinks, quantized weights.
TEST_F(ExtractStreamingTest, SharedTinyModelsIncludingSlidingWindows) {
  const std::string shared = SharedGoldenDir();
  if (shared.empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared golden directory not found; the "
                    "sliding-window and other tiny models were not checked";
  const std::vector<std::string> models = RunnableTinyModels(shared);
  ASSERT_FALSE(models.empty());
  for (const char* needed : {"gemma2", "mistral_sw16_sharded"})
    EXPECT_NE(std::find(models.begin(), models.end(), needed), models.end())
        << needed << " is missing from the shared tiny models";
  double worst = 0;
  for (const std::string& name : models) {
    SCOPED_TRACE(name);
    const std::string dir = shared + "/tiny/" + name;
    auto config = LoadModelConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    WriteFile(name + ".jsonl",
              TokenRows({90, 12, 33, 70}, config->vocab_size, 5));
    ExtractOptions o;
    o.model_dir = dir;
    o.input_path = Path(name + ".jsonl");
    o.hooks = {"blocks.*.hook_resid_post", "ln_final.hook_normalized"};
    o.selectors = kEverySelector;
    o.precision = Precision::kF32;
    o.batch_tokens = 128;
    o.out_dir = Path(name + "_ref");
    ASSERT_TRUE(RunExtract(o).ok());
    for (int64_t chunk : {5, 32}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      o.batch_tokens = 32;
      o.streaming_chunk_size = chunk;
      o.max_row_tokens = 96;
      o.out_dir = Path(name + "_" + std::to_string(chunk));
      auto s = RunExtract(o);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      const double e = ExpectClose(o.out_dir, Path(name + "_ref"));
      std::printf("%-22s chunk %2lld: max error / max |value| = %.3g\n",
                  name.c_str(), static_cast<long long>(chunk), e);
      worst = std::max(worst, e);
    }
  }
  RecordProperty("max_relative_error", std::to_string(worst));
}

// A job stopped after each commit (streamed rows in the windows before and
// after) and resumed: byte-identical to an uninterrupted run, manifest
// included.
TEST_F(ExtractStreamingTest, ResumeAcrossStreamedRowsIsByteIdentical) {
  WriteFile("in.jsonl", TokenRows({100, 8, 70, 200, 30, 90, 12}, 512, 3));
  ExtractOptions o;
  o.model_dir = kModel;
  o.input_path = Path("in.jsonl");
  o.hooks = {"blocks.1.hook_resid_post", "blocks.4.hook_mlp_out"};
  o.selectors = {"last", "all", "mean", "max", "pos:-3"};
  o.batch_tokens = 64;
  o.streaming_chunk_size = 16;
  o.commit_every = 2;
  o.out_dir = Path("ref");
  ASSERT_TRUE(RunExtract(o).ok());
  const Json settings = ReadJson(Path("ref/manifest.json"))["settings"];
  EXPECT_EQ(settings["streaming_chunk_size"], 16);
  EXPECT_EQ(settings["max_row_tokens"], 512);  // min(32768, 512)
  for (int stop = 1; stop <= 3; ++stop) {
    SCOPED_TRACE("stop after commit " + std::to_string(stop));
    ExtractOptions p = o;
    p.out_dir = Path("s" + std::to_string(stop));
    p.stop_after_commits = stop;
    auto first = RunExtract(p);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    EXPECT_EQ(first->rows, 2 * stop);
    p.stop_after_commits = 0;
    p.resume = true;
    auto s = RunExtract(p);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->rows, 7);
    ExpectSameFiles(p.out_dir, Path("ref"));
  }
}

// --resume with other streaming options is refused like any changed
// option; a job written before the options existed resumes without them.
TEST_F(ExtractStreamingTest, ResumeRefusesChangedStreamingOptions) {
  WriteFile("in.jsonl", TokenRows({100, 8, 70, 20, 30, 9}, 512, 4));
  ExtractOptions o;
  o.model_dir = kModel;
  o.input_path = Path("in.jsonl");
  o.hooks = {"blocks.0.hook_resid_post"};
  o.selectors = {"last"};
  o.batch_tokens = 64;
  o.streaming_chunk_size = 16;
  o.commit_every = 2;
  o.out_dir = Path("out");
  o.stop_after_commits = 1;
  ASSERT_TRUE(RunExtract(o).ok());
  o.stop_after_commits = 0;
  o.resume = true;
  struct Case {
    std::string setting;
    int64_t chunk, max_row;
  };
  // (Streaming off changes both settings; the first by name is named.)
  for (const Case& c :
       {Case{"streaming_chunk_size", 8, 0}, Case{"max_row_tokens", 0, 0},
        Case{"max_row_tokens", 16, 300}}) {
    SCOPED_TRACE(c.setting + " " + std::to_string(c.chunk));
    ExtractOptions p = o;
    p.streaming_chunk_size = c.chunk;
    p.max_row_tokens = c.max_row;
    const std::string before = Slurp(Path("out/manifest.json"));
    auto s = RunExtract(p);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.status().message().find("setting '" + c.setting + "' differs"),
              std::string::npos)
        << s.status().message();
    EXPECT_EQ(Slurp(Path("out/manifest.json")), before);
  }
  ASSERT_TRUE(RunExtract(o).ok());  // the same options: resumes

  // A manifest without the streaming settings (an older job) resumes with
  // streaming off, and only so.
  WriteFile("short.jsonl", TokenRows({10, 8, 20, 30, 9}, 512, 5));
  ExtractOptions old = o;
  old.input_path = Path("short.jsonl");
  old.streaming_chunk_size = 0;
  old.resume = false;
  old.stop_after_commits = 1;
  old.out_dir = Path("old");
  ASSERT_TRUE(RunExtract(old).ok());
  Json m = ReadJson(Path("old/manifest.json"));
  m["settings"].erase("streaming_chunk_size");
  m["settings"].erase("max_row_tokens");
  WriteFile("old/manifest.json", m.dump(2) + "\n");
  old.stop_after_commits = 0;
  old.resume = true;
  old.streaming_chunk_size = 16;
  EXPECT_EQ(RunExtract(old).status().code(), StatusCode::kFailedPrecondition);
  old.streaming_chunk_size = 0;
  auto s = RunExtract(old);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->rows, 5);
}

TEST_F(ExtractStreamingTest, Errors) {
  WriteFile("in.jsonl", TokenRows({20, 300, 10}, 512, 6));
  ExtractOptions o;
  o.model_dir = kModel;
  o.input_path = Path("in.jsonl");
  o.hooks = {"blocks.0.hook_resid_post"};
  o.selectors = {"last"};
  o.batch_tokens = 64;
  int n = 0;
  auto run = [&](const ExtractOptions& p) {
    ExtractOptions q = p;
    q.out_dir = Path("o" + std::to_string(n++));
    return RunExtract(q);
  };
  auto expect = [&](const ExtractOptions& p, StatusCode code,
                    const std::string& part) {
    auto s = run(p);
    ASSERT_FALSE(s.ok()) << part;
    EXPECT_EQ(s.status().code(), code) << s.status().ToString();
    EXPECT_NE(s.status().message().find(part), std::string::npos)
        << s.status().message();
  };
  // Streaming off: the long row is an error that points at the option.
  expect(o, StatusCode::kInvalidArgument,
         "300 tokens > --batch-tokens 64 (raise --batch-tokens, or stream "
         "long rows exactly with --streaming-chunk-size)");
  // A row longer than --max-row-tokens: an error naming both numbers, or a
  // skipped row with that reason.
  o.streaming_chunk_size = 16;
  o.max_row_tokens = 200;
  expect(o, StatusCode::kInvalidArgument,
         "input row 1 (id 1): too long to stream: 300 tokens > "
         "--max-row-tokens 200");
  o.on_error = OnError::kSkip;
  o.out_dir = Path("skip");
  auto s = RunExtract(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->rows_ok, 2);
  EXPECT_EQ(s->rows_skipped, 1);
  const Json m = ReadJson(Path("skip/manifest.json"));
  EXPECT_NE(m["rows"][1]["reason"].get<std::string>().find(
                "300 tokens > --max-row-tokens 200"),
            std::string::npos)
      << m["rows"][1];
  o.on_error = OnError::kFail;
  o.max_row_tokens = 0;
  // Attention patterns: refused, naming the streaming.
  ExtractOptions p = o;
  p.hooks = {"blocks.0.attn.hook_pattern"};
  expect(p, StatusCode::kUnimplemented, "with --streaming-chunk-size");
  // Bad option values.
  struct Bad {
    int64_t chunk, max_row;
    std::string part;
  };
  for (const Bad& b : {
           Bad{-1, 0, "--streaming-chunk-size must be >= 0 (0 = off), got -1"},
           Bad{65, 0, "--streaming-chunk-size 65 exceeds --batch-tokens 64"},
           Bad{0, 300, "--max-row-tokens needs --streaming-chunk-size"},
           Bad{16, -5, "--max-row-tokens must be > 0, got -5"},
           Bad{16, 600,
               "--max-row-tokens 600 exceeds the model's "
               "max_position_embeddings 512"},
           Bad{16, 32, "--max-row-tokens 32 is below --batch-tokens 64"},
       }) {
    SCOPED_TRACE(b.part);
    ExtractOptions q = o;
    q.streaming_chunk_size = b.chunk;
    q.max_row_tokens = b.max_row;
    expect(q, StatusCode::kInvalidArgument, b.part);
  }
  // The CLI: a usage error exits non-zero with the message, no crash.
  const std::string cmd = std::string(LOOM_BINARY) + " extract --model " +
                          kModel + " --input " + Path("in.jsonl") + " --out " +
                          Path("cli") +
                          " --hooks blocks.0.hook_resid_post --batch-tokens 64 "
                          "--streaming-chunk-size 100 --quiet 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  while (size_t k = fread(buf, 1, sizeof buf, pipe)) out.append(buf, k);
  const int rc = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) != 0) << out;
  EXPECT_NE(out.find("--streaming-chunk-size 100 exceeds --batch-tokens 64"),
            std::string::npos)
      << out;
}

// The KV cache is a planned term: the job plan's `kv` is KvLayerBytes of
// the layers run for one sequence of --max-row-tokens positions (what
// KvCache allocates), its attention workspace is in the plan's workspace,
// and the job with streaming plans exactly those bytes more.
TEST_F(ExtractStreamingTest, PlanHoldsTheKvCache) {
  auto backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok());
  auto cpu = ParseDevice("cpu=64GiB", int64_t{64} << 30);
  ASSERT_TRUE(cpu.ok());
  for (const std::vector<std::string>& hooks :
       std::vector<std::vector<std::string>>{{"blocks.1.hook_resid_post"},
                                             {"ln_final.hook_normalized"}}) {
    SCOPED_TRACE(hooks[0]);
    ExtractOptions o;
    o.model_dir = kModel;
    o.hooks = hooks;
    o.batch_tokens = 64;
    o.streaming_chunk_size = 16;
    o.max_row_tokens = 300;
    const StatusOr<ModelConfig> config = LoadModelConfig(kModel);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    auto s = ResolveExtractSettings(o, *config, {});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const JobSpec job = ExtractJobSpec(o, *s, DType::kF32);
    EXPECT_EQ(job.kv_context, 300);
    auto plan = PlanModelDir(kModel, job, {*cpu}, int64_t{64} << 30,
                             (*backend)->Costs());
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ExtractOptions off = o;
    off.streaming_chunk_size = 0;
    off.max_row_tokens = 0;
    auto s_off = ResolveExtractSettings(off, *config, {});
    ASSERT_TRUE(s_off.ok());
    auto plan_off =
        PlanModelDir(kModel, ExtractJobSpec(off, *s_off, DType::kF32), {*cpu},
                     int64_t{64} << 30, (*backend)->Costs());
    ASSERT_TRUE(plan_off.ok());
    const ModelConfig& c = s->config;
    const int64_t layers = plan->layers_run;
    EXPECT_EQ(layers, hooks[0] == "ln_final.hook_normalized" ? 5 : 2);
    int64_t want = 0;
    for (int64_t l = 0; l < layers; ++l)
      want += KvLayerBytes(c, l, 300, 1, DType::kF32);
    auto cache = KvCache::Create(c, 1, 300, **backend, {}, layers);
    ASSERT_TRUE(cache.ok()) << cache.status().ToString();
    EXPECT_EQ((*cache)->storage_bytes(), want);
    const DevicePlan& d = plan->devices[0];
    const DevicePlan& d_off = plan_off->devices[0];
    EXPECT_EQ(d.kv, want);
    EXPECT_EQ(d_off.kv, 0);
    EXPECT_EQ(d.workspace - d_off.workspace, (*cache)->workspace_bytes());
    EXPECT_EQ(d.total() - d_off.total(), want + (*cache)->workspace_bytes());
  }
  // The job reports the planned bytes with --verify-plan.
  WriteFile("in.jsonl", TokenRows({100, 8}, 512, 8));
  ExtractOptions o;
  o.model_dir = kModel;
  o.input_path = Path("in.jsonl");
  o.out_dir = Path("out");
  o.hooks = {"blocks.1.hook_resid_post"};
  o.batch_tokens = 64;
  o.streaming_chunk_size = 16;
  o.plan.verify_plan = true;
  auto s = RunExtract(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_GT(s->planned_bytes, 0);
  EXPECT_TRUE(s->verify_plan.contains("resident_bytes"));
}

// Selected on the "device" (a host-memory stand-in for a GPU): the streamed
// job's files are byte-identical to the host's.
TEST_F(ExtractStreamingTest, DeviceSelectionByteIdenticalToHost) {
  WriteFile("in.jsonl", TokenRows({100, 8, 70, 30}, 512, 9));
  ExtractOptions o;
  o.model_dir = kModel;
  o.input_path = Path("in.jsonl");
  o.hooks = {"blocks.*.hook_resid_post", "ln_final.hook_normalized"};
  o.selectors = kEverySelector;
  o.precision = Precision::kF32;
  o.batch_tokens = 40;
  o.streaming_chunk_size = 9;
  o.commit_every = 3;
  o.out_dir = Path("host");
  ASSERT_TRUE(RunExtract(o).ok());
  HostAsDevice gpu;
  o.compute_backend_for_tests = &gpu;
  o.out_dir = Path("device");
  auto s = RunExtract(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_GT(gpu.gathers(), 0);
  EXPECT_GT(gpu.reductions(), 0);
  ExpectSameFiles(Path("device"), Path("host"), /*manifest=*/false);
}

}  // namespace
}  // namespace loom::testing
