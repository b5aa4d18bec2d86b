// `loom extract --resume` on a damaged or mismatched job: every malformed
// manifest, missing or truncated file and changed option is a clear error
// (a Status naming the field or file, a non-zero exit from the CLI, never a
// crash) and leaves every file of the job byte-identical.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/eval/extract.h"
#include "src/eval/extract_manifest.h"
#include "src/io/npy.h"
#include "tests/golden_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::Slurp;
using testing::Snapshot;
using testing::Spit;
using Json = nlohmann::json;
const std::string kModel = std::string(LOOM_MODELS_DIR) + "/stories260K";

class ExtractResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() /
            ("loom_resume_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::string text;
    for (int i = 0; i < 20; ++i)
      text += "Ann has " + std::to_string(i) + " green cups.\n";
    Spit(dir_ + "/in.txt", text);
    o_.model_dir = kModel;
    o_.input_path = dir_ + "/in.txt";
    o_.out_dir = dir_ + "/out";
    o_.hooks = {"blocks.0.hook_resid_post", "blocks.1.hook_mlp_out"};
    o_.selectors = {"last", "all", "mean"};
    o_.commit_every = 3;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A job interrupted after two commits (6 rows).
  void Interrupt() {
    ExtractOptions o = o_;
    o.stop_after_commits = 2;
    auto s = RunExtract(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_EQ(s->rows, 6);
  }
  std::string Out(const std::string& name) const {
    return o_.out_dir + "/" + name;
  }
  // Rewrites manifest.json through `edit`.
  void EditManifest(const std::function<void(Json&)>& edit) {
    Json m = Json::parse(Slurp(Out("manifest.json")));
    edit(m);
    Spit(Out("manifest.json"), m.dump(2) + "\n");
  }
  // --resume with `o` fails with `code`, the message holds every `parts`,
  // and no file in --out changed.
  void ExpectResumeFails(const ExtractOptions& o, StatusCode code,
                         const std::vector<std::string>& parts) {
    const auto before = Snapshot(o_.out_dir);
    ExtractOptions r = o;
    r.resume = true;
    auto s = RunExtract(r);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), code) << s.status().ToString();
    for (const std::string& p : parts)
      EXPECT_NE(s.status().message().find(p), std::string::npos)
          << "expected \"" << p << "\" in: " << s.status().message();
    EXPECT_EQ(Snapshot(o_.out_dir), before) << "files changed by " << parts[0];
  }
  void ExpectResumeFails(StatusCode code,
                         const std::vector<std::string>& parts) {
    ExpectResumeFails(o_, code, parts);
  }
  // Resuming with the original options completes the job byte-identical to
  // an uninterrupted run.
  void ExpectResumeMatchesUninterrupted() {
    ExtractOptions ref = o_;
    ref.out_dir = dir_ + "/ref";
    ASSERT_TRUE(RunExtract(ref).ok());
    ExtractOptions r = o_;
    r.resume = true;
    auto s = RunExtract(r);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->rows, 20);
    EXPECT_EQ(Snapshot(o_.out_dir), Snapshot(ref.out_dir));
  }

  std::string dir_;
  ExtractOptions o_;
};

TEST_F(ExtractResumeTest, WrongTypedFieldIsDataLoss) {
  Interrupt();
  const std::string original = Slurp(Out("manifest.json"));
  EditManifest([](Json& m) { m["progress"]["rows_committed"] = "2"; });
  ExpectResumeFails(StatusCode::kDataLoss,
                    {"manifest.json", "field progress.rows_committed",
                     "expected an integer", "found a string", "\"2\""});
  struct Case {
    std::function<void(Json&)> edit;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {[](Json& m) { m["progress"]["input_offset"] = 1.5; },
       {"progress.input_offset", "expected an integer", "found a float"}},
      {[](Json& m) { m["progress"]["shards"] = nullptr; },
       {"progress.shards", "expected an integer", "found null"}},
      {[](Json& m) {
         m["progress"]["ragged_rows"]["blocks.0.hook_resid_post.all.npy"] =
             Json::array();
       },
       {"progress.ragged_rows.blocks.0.hook_resid_post.all.npy",
        "found an array"}},
      {[](Json& m) { m["progress"] = 7; },
       {"field progress", "expected an object", "found an integer (7)"}},
      {[](Json& m) { m["complete"] = "no"; },
       {"field complete", "expected a boolean", "found a string"}},
      {[](Json& m) { m["input"]["sha256"] = 12; },
       {"field input.sha256", "expected a string", "found an integer"}},
      {[](Json& m) {
         m["files"] = {"a.npy", 3};
       },
       {"field files[1]", "expected a string", "found an integer"}},
      {[](Json& m) { m["settings"] = Json::array(); },
       {"field settings", "expected an object", "found an array"}},
      {[](Json& m) { m["version"] = "1"; },
       {"field version", "expected an integer", "found a string"}},
      {[](Json& m) { m["progress"]["rows_committed"] = -3; },
       {"progress.rows_committed is -3"}},
  };
  for (const Case& c : cases) {
    Spit(Out("manifest.json"), original);
    EditManifest(c.edit);
    ExpectResumeFails(StatusCode::kDataLoss, c.parts);
  }
  Spit(Out("manifest.json"), original);
  ExpectResumeMatchesUninterrupted();
}

TEST_F(ExtractResumeTest, MissingFieldIsDataLoss) {
  Interrupt();
  const std::string original = Slurp(Out("manifest.json"));
  const std::vector<std::vector<std::string>> fields = {
      {"progress", "rows_committed"},
      {"progress", "rows_ok"},
      {"progress", "input_offset"},
      {"progress", "rows_file_bytes"},
      {"progress", "shards"},
      {"input", "bytes"},
      {"input", "sha256"},
      {"complete"},
      {"files"},
      {"settings"},
      {"progress"},
      {"format"},
  };
  for (const auto& f : fields) {
    Spit(Out("manifest.json"), original);
    EditManifest([&](Json& m) {
      Json* j = &m;
      for (size_t i = 0; i + 1 < f.size(); ++i) j = &(*j)[f[i]];
      j->erase(f.back());
    });
    std::string name;
    for (const auto& k : f) name += (name.empty() ? "" : ".") + k;
    ExpectResumeFails(StatusCode::kDataLoss,
                      {"field " + name, "missing", "expected"});
  }
  // A ragged array's committed count.
  Spit(Out("manifest.json"), original);
  EditManifest([](Json& m) {
    m["progress"]["ragged_rows"].erase("blocks.1.hook_mlp_out.all.npy");
  });
  ExpectResumeFails(
      StatusCode::kDataLoss,
      {"field progress.ragged_rows.blocks.1.hook_mlp_out.all.npy", "missing"});
  Spit(Out("manifest.json"), original);
  ExpectResumeMatchesUninterrupted();
}

TEST_F(ExtractResumeTest, TruncatedOrInvalidManifestIsDataLoss) {
  Interrupt();
  const std::string original = Slurp(Out("manifest.json"));
  // Cut: the parser runs out of text at the cut.
  const std::string half = std::to_string(original.size() / 2);
  Spit(Out("manifest.json"), original.substr(0, original.size() / 2));
  ExpectResumeFails(StatusCode::kDataLoss,
                    {"manifest.json: not valid JSON at byte offset " + half +
                     " of " + half + " (truncated or corrupt): "});
  Spit(Out("manifest.json"), "");
  ExpectResumeFails(StatusCode::kDataLoss,
                    {"manifest.json: not valid JSON at byte offset 0 of 0"});
  // A byte changed in the middle: the offset is that byte's.
  std::string corrupt = original;
  const size_t colon = corrupt.find("\": ", corrupt.size() / 2) + 1;
  corrupt[colon] = '=';
  Spit(Out("manifest.json"), corrupt);
  ExpectResumeFails(
      StatusCode::kDataLoss,
      {"manifest.json: not valid JSON at byte offset " + std::to_string(colon) +
           " of " + std::to_string(corrupt.size()),
       "syntax error"});
  Spit(Out("manifest.json"), "[1, 2, 3]\n");
  ExpectResumeFails(StatusCode::kDataLoss,
                    {"manifest.json", "expected a JSON object", "an array"});
  Spit(Out("manifest.json"), "{\"format\": \"something-else\"}");
  ExpectResumeFails(StatusCode::kDataLoss,
                    {"format is \"something-else\"", "loom-activations"});
  Spit(Out("manifest.json"), original);
  ExpectResumeMatchesUninterrupted();
}

// The arrays block follows from the settings, and the committed files are
// checked against this job's shapes: a changed block (fuzz_resume changed a
// ragged array's row_shape) is written back as this loom writes it, and the
// job ends byte-identical to an uninterrupted run.
TEST_F(ExtractResumeTest, ChangedArraysBlockIsWrittenAsThisJobsOwn) {
  Interrupt();
  EditManifest([](Json& m) {
    for (Json& a : m["arrays"]) a["row_shape"] = Json::array({88});
  });
  ExpectResumeMatchesUninterrupted();
}

// The tokenizer the interrupted run used must be the model's (fuzz_resume:
// a changed tokenizer hash was accepted and carried into the finished
// manifest). A changed or absent record is refused with both values, files
// unchanged; fields this loom does not write are not carried through.
TEST_F(ExtractResumeTest, ChangedTokenizerIsRefused) {
  Interrupt();
  const std::string original = Slurp(Out("manifest.json"));
  EditManifest([](Json& m) { m["tokenizer"]["sha256"] = "0123abcd"; });
  ExpectResumeFails(StatusCode::kFailedPrecondition,
                    {"--resume: the tokenizer", "tokenizer.json (sha256 ",
                     "recorded tokenizer.json (sha256 0123abcd)"});
  EditManifest([](Json& m) { m["tokenizer"] = Json{{"file", ""}}; });
  ExpectResumeFails(StatusCode::kFailedPrecondition,
                    {"--resume: the tokenizer", "recorded none"});
  EditManifest([](Json& m) { m["tokenizer"] = 7; });
  ExpectResumeFails(StatusCode::kDataLoss,
                    {"field tokenizer: expected an object"});
  Spit(Out("manifest.json"), original);
  EditManifest([](Json& m) { m["extra"] = "not this loom's"; });
  ExpectResumeMatchesUninterrupted();
}

TEST_F(ExtractResumeTest, AbsentManifestIsNotFound) {
  Interrupt();
  fs::remove(Out("manifest.json"));
  ExpectResumeFails(StatusCode::kNotFound,
                    {"--resume", "manifest.json", "nothing to resume"});
}

TEST_F(ExtractResumeTest, MissingInputFileIsNotFound) {
  Interrupt();
  const std::string input = Slurp(o_.input_path);
  fs::remove(o_.input_path);
  ExpectResumeFails(StatusCode::kNotFound, {"--resume: input", "in.txt"});
  Spit(o_.input_path, input);
  ExpectResumeMatchesUninterrupted();
}

TEST_F(ExtractResumeTest, ChangedInputIsRefused) {
  Interrupt();
  const std::string input = Slurp(o_.input_path);
  // Same size, one byte different: only the hash tells.
  std::string changed = input;
  changed[changed.size() - 3] = 'X';
  Spit(o_.input_path, changed);
  ExpectResumeFails(StatusCode::kFailedPrecondition,
                    {"--resume: input", "changed: sha256"});
  Spit(o_.input_path, input + "One more row.\n");
  ExpectResumeFails(StatusCode::kFailedPrecondition,
                    {"--resume: input", "bytes, the interrupted run read"});
  Spit(o_.input_path, input);
  ExpectResumeMatchesUninterrupted();
}

TEST_F(ExtractResumeTest, ChangedOptionsAreRefused) {
  Interrupt();
  // A copy of the model elsewhere: same config, another path.
  const std::string model_copy = dir_ + "/model_copy";
  fs::copy(kModel, model_copy, fs::copy_options::recursive);
  struct Case {
    std::string setting;
    std::function<void(ExtractOptions&)> change;
  };
  const std::vector<Case> cases = {
      {"hooks",
       [](ExtractOptions& o) { o.hooks = {"blocks.0.hook_resid_post"}; }},
      {"selectors",
       [](ExtractOptions& o) {
         o.selectors = {"last", "all"};
       }},
      {"output_dtype", [](ExtractOptions& o) { o.dtype = DType::kBF16; }},
      {"compute_dtype",
       [](ExtractOptions& o) { o.precision = Precision::kBF16; }},
      {"model", [&](ExtractOptions& o) { o.model_dir = model_copy; }},
      {"template", [](ExtractOptions& o) { o.template_text = "Q: {text}"; }},
      {"add_bos", [](ExtractOptions& o) { o.add_bos = eval::AddBos::kNo; }},
      {"batch_tokens", [](ExtractOptions& o) { o.batch_tokens = 100; }},
      {"commit_every", [](ExtractOptions& o) { o.commit_every = 4; }},
      // (on_error may change: it decides only what happens to rows not
      // yet read; ExtractTest.BadRowsFailClearlyOrAreRecordedWhenSkipped.)
      {"format",
       [](ExtractOptions& o) { o.format = OutputFormat::kSafetensors; }},
      {"hf_bf16_activations",
       [](ExtractOptions& o) { o.hf_bf16_activations = true; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.setting);
    ExtractOptions o = o_;
    c.change(o);
    ExpectResumeFails(o, StatusCode::kFailedPrecondition,
                      {"setting '" + c.setting + "' differs", "there,",
                       "now); resume with the same options"});
  }
  ExpectResumeMatchesUninterrupted();
}

TEST_F(ExtractResumeTest, MissingOrTruncatedArrayIsDataLoss) {
  Interrupt();
  const std::string last = Out("blocks.0.hook_resid_post.last.npy");
  const std::string all = Out("blocks.1.hook_mlp_out.all.npy");
  const std::string offsets = Out("all.offsets.npy");
  for (const std::string& path : {last, all, offsets}) {
    SCOPED_TRACE(path);
    const std::string bytes = Slurp(path);
    fs::remove(path);
    ExpectResumeFails(StatusCode::kDataLoss,
                      {"--resume: " + path + " is missing", "commits"});
    // Cut inside the committed rows.
    Spit(path, bytes.substr(0, bytes.size() - 10));
    ExpectResumeFails(
        StatusCode::kDataLoss,
        {"--resume: " + path, "committed rows need", "(truncated)"});
    // Cut inside the header.
    Spit(path, bytes.substr(0, 20));
    ExpectResumeFails(StatusCode::kDataLoss, {path, "npy header"});
    Spit(path, bytes);
  }
  // An array that commits fewer rows than the manifest.
  EditManifest([](Json& m) { m["progress"]["rows_committed"] = 9; });
  EditManifest([](Json& m) { m["progress"]["rows_ok"] = 9; });
  ExpectResumeFails(StatusCode::kDataLoss,
                    {"blocks.0.hook_resid_post.last.npy commits 6 rows",
                     "the manifest commits 9"});
}

TEST_F(ExtractResumeTest, MissingOrTruncatedRowsLogIsDataLoss) {
  Interrupt();
  const std::string rows = Slurp(Out("rows.jsonl"));
  fs::remove(Out("rows.jsonl"));
  ExpectResumeFails(StatusCode::kDataLoss,
                    {"--resume: ", "rows.jsonl", "the manifest commits"});
  Spit(Out("rows.jsonl"), rows.substr(0, rows.size() / 2));
  ExpectResumeFails(StatusCode::kDataLoss,
                    {"rows.jsonl has", "(truncated: it ends at byte offset"});
  Spit(Out("rows.jsonl"), rows);
  ExpectResumeMatchesUninterrupted();
}

TEST_F(ExtractResumeTest, MissingShardIsDataLoss) {
  o_.format = OutputFormat::kSafetensors;
  Interrupt();
  const std::string shard =
      Out("blocks.1.hook_mlp_out.mean.shard-00001.safetensors");
  ASSERT_TRUE(fs::exists(shard));
  const std::string bytes = Slurp(shard);
  fs::remove(shard);
  ExpectResumeFails(StatusCode::kDataLoss,
                    {"committed shard", "shard-00001", "is missing"});
  Spit(shard, bytes);
  ExpectResumeMatchesUninterrupted();
}

// Runs the CLI; returns the exit status (-signal if killed), output in *out.
int RunCli(const std::string& args, std::string* out) {
  FILE* p = popen(
      (std::string(LOOM_BINARY) + " extract " + args + " 2>&1").c_str(), "r");
  std::string s;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) s.append(buf, n);
  const int rc = pclose(p);
  *out = s;
  if (WIFSIGNALED(rc)) return -WTERMSIG(rc);
  return WEXITSTATUS(rc);
}

// Through the CLI: exit 1 with the message, not an abort (exit 134).
TEST_F(ExtractResumeTest, CliExitsWithErrorNotCrash) {
  Interrupt();
  const std::string args = "--model " + kModel + " --input " + o_.input_path +
                           " --out " + o_.out_dir +
                           " --hooks blocks.0.hook_resid_post,blocks.1.hook_"
                           "mlp_out --select last --select all --select mean "
                           "--commit-every 3 --quiet --resume";
  const std::string original = Slurp(Out("manifest.json"));
  EditManifest([](Json& m) { m["progress"]["rows_committed"] = "2"; });
  auto before = Snapshot(o_.out_dir);
  std::string log;
  EXPECT_EQ(RunCli(args, &log), 1) << log;
  EXPECT_NE(log.find("loom extract: "), std::string::npos) << log;
  EXPECT_NE(log.find("progress.rows_committed: expected an integer, found a "
                     "string (\"2\")"),
            std::string::npos)
      << log;
  EXPECT_EQ(Snapshot(o_.out_dir), before);

  Spit(Out("manifest.json"), original);
  const std::string input = Slurp(o_.input_path);
  fs::remove(o_.input_path);
  before = Snapshot(o_.out_dir);
  EXPECT_EQ(RunCli(args, &log), 1) << log;
  EXPECT_NE(log.find("--resume: input: " + o_.input_path), std::string::npos)
      << log;
  EXPECT_EQ(Snapshot(o_.out_dir), before);

  Spit(o_.input_path, input);
  EXPECT_EQ(RunCli(args, &log), 0) << log;
  EXPECT_NE(Slurp(Out("manifest.json")).find("\"complete\": true"),
            std::string::npos);
}

// The manifest's accessors on their own.
TEST(ManifestTest, CheckedAccessors) {
  const std::string path =
      (fs::temp_directory_path() /
       ("loom_manifest_" + std::to_string(::getpid()) + ".json"))
          .string();
  Manifest m =
      Manifest::Create(path, Json{{"a", 1}}, Json{{"bytes", 5}}, Json::object(),
                       Json::array(), {"x.npy"}, {"x.npy"});
  ASSERT_TRUE(m.Save().ok());
  auto loaded = Manifest::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(*loaded->GetInt({"input", "bytes"}), 5);
  EXPECT_EQ(*loaded->GetBool({"complete"}), false);
  EXPECT_EQ(*loaded->GetStrings({"files"}), std::vector<std::string>{"x.npy"});
  auto p = loaded->ReadProgress({"x.npy"});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->ragged_rows.at("x.npy"), 0);
  const Status wrong = loaded->GetString({"input", "bytes"}).status();
  EXPECT_EQ(wrong.code(), StatusCode::kDataLoss);
  EXPECT_EQ(wrong.message(), path +
                                 ": field input.bytes: expected a string, "
                                 "found an integer (5)");
  const Status deeper = loaded->GetInt({"input", "bytes", "x"}).status();
  EXPECT_EQ(deeper.message(), path +
                                  ": field input.bytes: expected an "
                                  "object, found an integer (5)");
  EXPECT_EQ(loaded->CheckSettings(Json{{"a", 2}}).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(loaded->CheckSettings(Json{{"a", 1}}).ok());
  fs::remove(path);
}

// Where a text stops being JSON: the offset of the offending byte, or the
// text's end when it stops too early; nothing for JSON.

// Outputs computed inside the forward (the logit lens: float logits and
// int32 top-k ids, src/eval/extract_derived.h) resume like the hooks' arrays,
// byte-identical to an uninterrupted run, in .npy and in safetensors shards;
// a changed --lens-topk is refused by name.
TEST_F(ExtractResumeTest, LensOutputsResumeByteIdentical) {
  o_.hooks = {"blocks.0.hook_resid_post",
              "blocks.1.hook_resid_post.hook_lens_logits"};
  o_.selectors = {"last", "all"};
  o_.analysis.lens = "logit";
  o_.analysis.lens_topk = 5;
  for (const OutputFormat format :
       {OutputFormat::kNpy, OutputFormat::kSafetensors}) {
    SCOPED_TRACE(std::string(OutputFormatName(format)));
    fs::remove_all(o_.out_dir);
    fs::remove_all(dir_ + "/ref");
    o_.format = format;
    Interrupt();
    if (format == OutputFormat::kNpy) {
      ExtractOptions o = o_;
      o.analysis.lens_topk = 6;
      ExpectResumeFails(o, StatusCode::kFailedPrecondition,
                        {"setting 'analyses' differs"});
      auto ids = ReadNpyHeader(Out("blocks.0.hook_resid_post.lens_topk_ids.all.npy"));
      ASSERT_TRUE(ids.ok()) << ids.status().ToString();
      EXPECT_EQ(ids->dtype, DType::kI32);
    }
    ExpectResumeMatchesUninterrupted();
  }
}

}  // namespace
}  // namespace loom
