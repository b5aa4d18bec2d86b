// Data-parallel extraction: `--shard I/N` runs the commit windows w with
// w mod N == I, `loom merge` joins the shard outputs byte-identically to one
// process's output, and `--shard auto` reads the rank from each launcher's
// environment. Refusals name both shards and both values.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/eval/extract.h"
#include "src/eval/extract_merge.h"
#include "src/eval/shard.h"
#include "src/io/file_util.h"
#include "tests/golden_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::Slurp;
using testing::Snapshot;
using testing::Spit;
using Json = nlohmann::json;
const std::string kModel = std::string(LOOM_MODELS_DIR) + "/stories260K";

// ---- ShardSpec and the launchers' environments -----------------------------

TEST(ShardSpecTest, ParsesAndMapsRows) {
  auto s = ParseShardSpec("1/3");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(*s, (ShardSpec{1, 3}));
  EXPECT_EQ(s->ToString(), "1/3");
  EXPECT_TRUE(s->Owns(1));
  EXPECT_TRUE(s->Owns(4));
  EXPECT_FALSE(s->Owns(3));
  // Windows of 4 rows: shard 1/3 holds windows 1, 4, 7: rows 4..7, 16..19.
  EXPECT_EQ(s->InputRow(0, 4), 4);
  EXPECT_EQ(s->InputRow(3, 4), 7);
  EXPECT_EQ(s->InputRow(4, 4), 16);
  EXPECT_EQ(s->Window(2), 7);
  for (const char* bad : {"3/3", "1", "a/2", "1/0", "-1/2", "1/2/3", ""}) {
    auto b = ParseShardSpec(bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(b.status().message().find(std::string("'") + bad + "'"),
              std::string::npos)
        << b.status().message();
  }
}

// DetectLauncher over a fake environment.
StatusOr<LauncherEnv> Detect(const std::map<std::string, std::string>& env) {
  return DetectLauncher([&env](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(LauncherTest, EveryLauncher) {
  struct Case {
    std::map<std::string, std::string> env;
    std::string launcher;
    ShardSpec shard;
    int64_t local_rank, local_size;
    bool mpi;
  };
  const std::vector<Case> cases = {
      {{{"OMPI_COMM_WORLD_RANK", "3"},
        {"OMPI_COMM_WORLD_SIZE", "4"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
        // OpenMPI started inside a Slurm allocation: mpirun's ranks count.
        {"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "1"}},
       "openmpi", {3, 4}, 1, 2, true},
      {{{"PMI_RANK", "1"},
        {"PMI_SIZE", "2"},
        {"MPI_LOCALRANKID", "1"},
        {"MPI_LOCALNRANKS", "2"}},
       "mpich", {1, 2}, 1, 2, true},
      {{{"RANK", "5"},
        {"WORLD_SIZE", "8"},
        {"LOCAL_RANK", "1"},
        {"LOCAL_WORLD_SIZE", "4"},
        {"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "2"}},
       "torchrun", {5, 8}, 1, 4, false},
      {{{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}, {"SLURM_LOCALID", "0"}},
       "slurm", {2, 3}, 0, 0, false},
      // sbatch --array=1-3 with one task each: task 3 is shard 2/3.
      {{{"SLURM_ARRAY_TASK_ID", "3"},
        {"SLURM_ARRAY_TASK_COUNT", "3"},
        {"SLURM_ARRAY_TASK_MIN", "1"}},
       "slurm-array", {2, 3}, 0, 0, false},
      // --array=0-6:2 (4 tasks) of srun steps of 2 ranks: task 4, rank 1.
      {{{"SLURM_ARRAY_TASK_ID", "4"},
        {"SLURM_ARRAY_TASK_COUNT", "4"},
        {"SLURM_ARRAY_TASK_MIN", "0"},
        {"SLURM_ARRAY_TASK_STEP", "2"},
        {"SLURM_PROCID", "1"},
        {"SLURM_NTASKS", "2"}},
       "slurm-array+slurm", {5, 8}, 0, 0, false},
  };
  for (const Case& c : cases) {
    auto e = Detect(c.env);
    ASSERT_TRUE(e.ok()) << c.launcher << ": " << e.status().ToString();
    EXPECT_EQ(e->launcher, c.launcher);
    EXPECT_EQ(e->shard, c.shard) << c.launcher << " " << e->shard.ToString();
    EXPECT_EQ(e->local_rank, c.local_rank) << c.launcher;
    EXPECT_EQ(e->local_size, c.local_size) << c.launcher;
    EXPECT_EQ(e->mpi, c.mpi) << c.launcher;
    EXPECT_FALSE(e->source.empty());
  }
}

TEST(LauncherTest, Refusals) {
  auto none = Detect({});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("--shard I/N"), std::string::npos);
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>>
      bad = {
          {{{"RANK", "2"}, {"WORLD_SIZE", "2"}},
           "rank 2 is not below the world size 2 (RANK=2 WORLD_SIZE=2)"},
          {{{"RANK", "x"}, {"WORLD_SIZE", "2"}},
           "RANK=x is not a non-negative integer"},
          {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "0"}},
           "world size 0"},
          {{{"SLURM_ARRAY_TASK_ID", "7"},
            {"SLURM_ARRAY_TASK_COUNT", "3"},
            {"SLURM_ARRAY_TASK_MIN", "1"}},
           "array task 7 is not one of 3 tasks 1, 2, ..."},
      };
  for (const auto& [env, want] : bad) {
    auto e = Detect(env);
    ASSERT_FALSE(e.ok()) << want;
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(e.status().message().find(want), std::string::npos)
        << e.status().message();
  }
}

// ---- Shards and merge on the bundled model ---------------------------------

class ExtractShardTest : public testing::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    // 29 rows with blank lines among them (not rows); windows of 4 rows:
    // 8 windows, the last one of 1 row.
    std::string text;
    for (int i = 0; i < 29; ++i) {
      text += "{\"id\": \"r" + std::to_string(i) + "\", \"text\": \"" +
              std::string(static_cast<size_t>(1 + i % 7), 'a') +
              " little cat number " + std::to_string(i) + "\"}\n";
      if (i % 9 == 4) text += "\n";
    }
    WriteFile("in.jsonl", text);
    o_.model_dir = kModel;
    o_.input_path = Path("in.jsonl");
    o_.hooks = {"blocks.0.hook_resid_post", "blocks.3.hook_mlp_out"};
    o_.selectors = {"last", "all", "mean", "pos:0,-1"};
    o_.commit_every = 4;
    o_.batch_tokens = 40;  // several batches per window
  }
  // Runs `o` into `out`.
  void Run(ExtractOptions o, const std::string& out) {
    o.out_dir = Path(out);
    auto s = RunExtract(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_TRUE(s->complete);
  }
  // The N shard outputs "<prefix>0".."<prefix>N-1" of `o`.
  std::vector<std::string> RunShards(const ExtractOptions& o, int64_t n,
                                     const std::string& prefix) {
    std::vector<std::string> dirs;
    for (int64_t i = 0; i < n; ++i) {
      ExtractOptions s = o;
      s.shard = ShardSpec{i, n};
      Run(s, prefix + std::to_string(i));
      dirs.push_back(Path(prefix + std::to_string(i)));
    }
    return dirs;
  }
  StatusOr<MergeSummary> Merge(const std::string& out,
                               std::vector<std::string> dirs) {
    return MergeExtractShards({.out_dir = Path(out), .shard_dirs = dirs});
  }
  void ExpectSameFiles(const std::string& a, const std::string& b) {
    const auto x = Snapshot(Path(a)), y = Snapshot(Path(b));
    ASSERT_EQ(x.size(), y.size());
    for (const auto& [name, bytes] : x) {
      ASSERT_TRUE(y.count(name)) << name << " missing from " << b;
      EXPECT_TRUE(y.at(name) == bytes) << name << " differs";
    }
  }
  ExtractOptions o_;
};

TEST_F(ExtractShardTest, ShardsMergeToTheSingleRunByteForByte) {
  Run(o_, "single");
  for (int64_t n : {1, 2, 3, 11}) {  // 11 > 8 windows: empty shards
    SCOPED_TRACE("N = " + std::to_string(n));
    const std::string p = "n" + std::to_string(n) + "_";
    std::vector<std::string> dirs = RunShards(o_, n, p);
    std::reverse(dirs.begin(), dirs.end());  // any order
    auto m = Merge(p + "merged", dirs);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->rows, 29);
    EXPECT_EQ(m->windows, 8);
    EXPECT_EQ(m->shards, n);
    ExpectSameFiles("single", p + "merged");
  }
  // A shard's rows are its windows' rows: shard 1/3 holds windows 1, 4, 7.
  const Json rows = Json::parse(Slurp(Path("n3_1/manifest.json")))["rows"];
  ASSERT_EQ(rows.size(), 9u);
  EXPECT_EQ(rows[0]["id"], "r4");
  EXPECT_EQ(rows[4]["id"], "r16");
  EXPECT_EQ(rows[8]["id"], "r28");
}

TEST_F(ExtractShardTest, SafetensorsAndSkippedRows) {
  o_.format = OutputFormat::kSafetensors;
  o_.selectors = {"last", "all"};
  o_.on_error = OnError::kSkip;
  o_.dtype = DType::kBF16;
  // Row 6 (window 1) is not JSON: skipped, in its place.
  std::string text = Slurp(Path("in.jsonl"));
  text.insert(text.find("{\"id\": \"r6\""), "{not json\n");
  WriteFile("in.jsonl", text);
  Run(o_, "single");
  auto m = Merge("merged", RunShards(o_, 3, "s"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->rows_skipped, 1);
  ExpectSameFiles("single", "merged");
  // Shard files are named by their window of the whole input.
  EXPECT_TRUE(fs::exists(
      Path("s1/blocks.0.hook_resid_post.last.shard-00004.safetensors")));
}

TEST_F(ExtractShardTest, AKilledShardResumes) {
  Run(o_, "single");
  std::vector<std::string> dirs = RunShards(o_, 2, "s");
  // Shard 1/2 again, stopped after one commit, then resumed.
  fs::remove_all(Path("s1"));
  ExtractOptions s = o_;
  s.shard = ShardSpec{1, 2};
  s.out_dir = Path("s1");
  s.stop_after_commits = 1;
  auto part = RunExtract(s);
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  EXPECT_FALSE(part->complete);
  EXPECT_EQ(part->rows, 4);
  // Not complete: refused.
  auto early = Merge("merged", dirs);
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(early.status().message().find("s1 (shard 1/2) is not complete "
                                          "(4 rows committed)"),
            std::string::npos)
      << early.status().message();
  EXPECT_FALSE(fs::exists(Path("merged/manifest.json")));
  // Resumed with another shard: refused, naming the setting.
  s.stop_after_commits = 0;
  s.resume = true;
  s.shard = ShardSpec{0, 2};
  auto wrong = RunExtract(s);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("setting 'shard' differs"),
            std::string::npos)
      << wrong.status().message();
  s.shard = ShardSpec{1, 2};
  auto done = RunExtract(s);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_TRUE(done->complete);
  fs::remove_all(Path("merged"));
  auto m = Merge("merged", dirs);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ExpectSameFiles("single", "merged");
}

// A job interrupted by a loom from before shards (no settings.shard, no
// progress.input_rows) resumes to the bytes of an uninterrupted run.
TEST_F(ExtractShardTest, ResumesAManifestFromBeforeShards) {
  Run(o_, "single");
  ExtractOptions o = o_;
  o.out_dir = Path("old");
  o.stop_after_commits = 2;
  ASSERT_TRUE(RunExtract(o).ok());
  Json m = Json::parse(Slurp(Path("old/manifest.json")));
  m["settings"].erase("shard");
  m["progress"].erase("input_rows");
  Spit(Path("old/manifest.json"), m.dump(2) + "\n");
  o.stop_after_commits = 0;
  o.resume = true;
  auto s = RunExtract(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ExpectSameFiles("single", "old");
}

TEST_F(ExtractShardTest, MergeRefusesShardsOfDifferentJobs) {
  std::vector<std::string> dirs = RunShards(o_, 2, "s");
  struct Case {
    std::string name;
    std::function<void(ExtractOptions&)> change;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"hooks", [](ExtractOptions& o) { o.hooks = {"blocks.1.hook_resid_post"}; },
       "setting 'hooks' is [\"blocks.0.hook_resid_post\",\"blocks.3.hook_mlp_"
       "out\"] in "},
      {"selectors", [](ExtractOptions& o) { o.selectors = {"last"}; },
       "setting 'selectors' is"},
      {"dtype", [](ExtractOptions& o) { o.dtype = DType::kF16; },
       "setting 'output_dtype' is \"float32\" in"},
      {"commit", [](ExtractOptions& o) { o.commit_every = 5; },
       "setting 'commit_every' is 4 in"},
      {"template", [](ExtractOptions& o) { o.template_text = "Q: {text}"; },
       "setting 'template' is \"\" in"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ExtractOptions other = o_;
    c.change(other);
    other.shard = ShardSpec{1, 2};
    Run(other, "other_" + c.name);
    auto m = Merge("m_" + c.name, {dirs[0], Path("other_" + c.name)});
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(m.status().message().find(c.want), std::string::npos)
        << m.status().message();
    EXPECT_NE(m.status().message().find("are not shards of one job"),
              std::string::npos);
    EXPECT_FALSE(fs::exists(Path("m_" + c.name + "/manifest.json")));
  }
  // Another input.
  WriteFile("in2.jsonl", "{\"text\": \"one\"}\n{\"text\": \"two\"}\n");
  ExtractOptions other = o_;
  other.input_path = Path("in2.jsonl");
  other.shard = ShardSpec{1, 2};
  Run(other, "other_input");
  auto in = Merge("m_input", {dirs[0], Path("other_input")});
  ASSERT_FALSE(in.ok());
  EXPECT_NE(in.status().message().find("input is {"), std::string::npos)
      << in.status().message();
}

TEST_F(ExtractShardTest, MergeRefusesMissingDuplicateAndBusy) {
  std::vector<std::string> dirs = RunShards(o_, 3, "s");
  auto missing = Merge("m", {dirs[0], dirs[2]});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("shard 1/3 is missing"),
            std::string::npos)
      << missing.status().message();
  auto given_twice = Merge("m", {dirs[0], dirs[1], dirs[1]});
  ASSERT_FALSE(given_twice.ok());
  EXPECT_NE(given_twice.status().message().find("is given twice"),
            std::string::npos)
      << given_twice.status().message();
  fs::copy(dirs[1], Path("copy"), fs::copy_options::recursive);
  auto twice = Merge("m", {dirs[0], dirs[1], Path("copy")});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("are both shard 1/3"),
            std::string::npos)
      << twice.status().message();
  // Different splits.
  ExtractOptions two = o_;
  two.shard = ShardSpec{1, 2};
  Run(two, "two");
  auto split = Merge("m", {dirs[0], Path("two"), dirs[2]});
  ASSERT_FALSE(split.ok());
  EXPECT_NE(split.status().message().find("split the input differently (3 "
                                          "and 2 shards)"),
            std::string::npos)
      << split.status().message();
  // Not an extract output.
  auto none = Merge("m", {dirs[0], dirs[1], Path("nowhere")});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  // A shard still being written (its lock held).
  {
    auto lock = LockOutDir(dirs[1]);
    ASSERT_TRUE(lock.ok());
    auto busy = Merge("m", dirs);
    ASSERT_FALSE(busy.ok());
    EXPECT_NE(busy.status().message().find("is still being written"),
              std::string::npos)
        << busy.status().message();
  }
  // OUT already holding a job.
  ASSERT_TRUE(Merge("m", dirs).ok());
  auto again = Merge("m", dirs);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("already holds a job"),
            std::string::npos);
  // A shard whose rows were edited after they were committed.
  std::string log = Slurp(dirs[2] + "/rows.jsonl");
  log[log.find("\"r8\"") + 2] = '9';
  Spit(dirs[2] + "/rows.jsonl", log);
  auto changed = Merge("m2", dirs);
  ASSERT_FALSE(changed.ok());
  EXPECT_EQ(changed.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(changed.status().message().find("crc32"), std::string::npos);
}

}  // namespace
}  // namespace loom
