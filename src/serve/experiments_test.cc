// The /experiments store: schema and records, filters, exports, the route
// layer's checks, crash safety (a writer killed with SIGKILL) and concurrent
// readers.
#include "src/serve/experiments.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "src/io/safetensors.h"
#include "src/io/test_util.h"

namespace loom::serve {
namespace {

using json = nlohmann::json;
using loom::testing::TempDir;

std::unique_ptr<ExperimentStore> OpenStore(const TempDir& dir) {
  auto s = ExperimentStore::Open(dir.File("db/experiments.db"),
                                 dir.File("hidden_states"));
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(ExperimentStoreTest, RecordsAndReadsEveryTable) {
  TempDir dir;
  auto store = OpenStore(dir);
  ASSERT_NE(store, nullptr);
  auto id = store->CreateExperiment("stories260K", {{"temperature", 0.7}},
                                    "running", "first run");
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(id->size(), 36u);
  EXPECT_EQ((*id)[14], '4');  // uuid4
  ASSERT_TRUE(store->AddConversation(*id, "user", "Hello, there").ok());
  ASSERT_TRUE(store->AddConversation(*id, "assistant", "Hi\n\"quoted\"").ok());
  ASSERT_TRUE(store->AddMetric(*id, "latency", 12.5, "ms", {{"step", 1}}).ok());
  ASSERT_TRUE(store->AddMetric(*id, "tokens", 8).ok());
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  auto hs = store->SaveHiddenState(*id, -1, DType::kF32, Shape({2, 3}),
                                   values.data());
  ASSERT_TRUE(hs.ok()) << hs.status().ToString();
  ASSERT_TRUE(store->SetStatus(*id, "completed").ok());

  auto got = store->Get(*id);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  const json& e = (*got)["experiment"];
  EXPECT_EQ(e["id"], *id);
  EXPECT_EQ(e["model"], "stories260K");
  EXPECT_EQ(e["config"]["temperature"], 0.7);
  EXPECT_EQ(e["status"], "completed");
  EXPECT_EQ(e["notes"], "first run");
  const std::string created = e["created_at"];
  ASSERT_EQ(created.size(), 26u) << created;  // 2026-11-26T11:42:42.123456
  EXPECT_EQ(created[10], 'T');
  const json& conv = (*got)["conversations"];
  ASSERT_EQ(conv.size(), 2u);
  EXPECT_EQ(conv[0]["sequence_num"], 0);
  EXPECT_EQ(conv[1]["sequence_num"], 1);
  EXPECT_EQ(conv[1]["role"], "assistant");
  const json& metrics = (*got)["metrics"];
  ASSERT_EQ(metrics.size(), 2u);
  EXPECT_EQ(metrics[0]["unit"], "ms");
  EXPECT_EQ(metrics[0]["metadata"]["step"], 1);
  EXPECT_TRUE(metrics[1]["unit"].is_null());
  const json& states = (*got)["hidden_states"];
  ASSERT_EQ(states.size(), 1u);
  EXPECT_EQ(states[0]["layer"], -1);
  EXPECT_EQ(states[0]["shape"], json::array({2, 3}));
  EXPECT_EQ(states[0]["dtype"], "float32");
  const json& summary = (*got)["summary"];
  EXPECT_EQ(summary["conversation_count"], 2);
  EXPECT_EQ(summary["metric_count"], 2);
  EXPECT_EQ(summary["hidden_state_count"], 1);

  // The array is a safetensors file beside the database.
  const std::string path = states[0]["file_path"];
  EXPECT_EQ(std::filesystem::path(path).parent_path(),
            std::filesystem::path(dir.File("hidden_states")));
  EXPECT_NE(path.find(*id + "_layer-1_"), std::string::npos) << path;
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const TensorInfo* t = (*file)->Find("hidden_state");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, Shape({2, 3}));
  EXPECT_EQ((*file)->header().metadata.at("experiment_id"), *id);
  EXPECT_EQ(std::memcmp((*file)->View(*t).data, values.data(), 24), 0);

  auto c = store->Conversations(*id, std::string("user"));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)["total"], 1);
  auto m = store->Metrics(*id, std::nullopt);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)["metric_names"], json::array({"latency", "tokens"}));
  auto h = store->HiddenStates(*id, 3);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ((*h)["total"], 0);
  EXPECT_EQ((*h)["layers"], json::array({-1}));

  for (const auto& status :
       {store->Get("nope").status(),
        store->Conversations("nope", std::nullopt).status(),
        store->AddConversation("nope", "user", "x").status(),
        store
            ->SaveHiddenState("nope", 0, DType::kF32, Shape({1}), values.data())
            .status()}) {
    EXPECT_EQ(status.code(), StatusCode::kNotFound);
    EXPECT_EQ(status.message(), "Experiment not found: nope");
  }
  EXPECT_EQ(store->CreateExperiment("m", {}, "done").status().code(),
            StatusCode::kInvalidArgument);

  ASSERT_TRUE(store->DeleteExperiment(*id).ok());
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_EQ(store->Get(*id).status().code(), StatusCode::kNotFound);
}

TEST(ExperimentStoreTest, ListFiltersNewestFirst) {
  TempDir dir;
  auto store = OpenStore(dir);
  ASSERT_NE(store, nullptr);
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    auto id = store->CreateExperiment(i % 2 ? "a" : "b", {},
                                      i == 4 ? "failed" : "completed");
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ExperimentQuery q;
  auto all = store->List(q);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ((*all)["total"], 5);
  ASSERT_EQ((*all)["experiments"].size(), 5u);
  EXPECT_EQ((*all)["experiments"][0]["id"], ids[4]);
  EXPECT_EQ((*all)["experiments"][4]["id"], ids[0]);
  q.limit = 2;
  q.offset = 1;
  auto page = store->List(q);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ((*page)["experiments"].size(), 2u);
  EXPECT_EQ((*page)["experiments"][0]["id"], ids[3]);
  EXPECT_EQ((*page)["limit"], 2);
  EXPECT_EQ((*page)["offset"], 1);
  q = ExperimentQuery();
  q.model = "b";
  q.status = "completed";
  auto b = store->List(q);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)["total"], 2);
  // Dates filter the list, not the total (as TheLoom's).
  auto second = store->Get(ids[1]);
  ASSERT_TRUE(second.ok());
  q = ExperimentQuery();
  q.date_from = (*second)["experiment"]["created_at"];
  q.date_to = (*second)["experiment"]["created_at"];
  auto dated = store->List(q);
  ASSERT_TRUE(dated.ok());
  EXPECT_EQ((*dated)["total"], 5);
  ASSERT_EQ((*dated)["experiments"].size(), 1u);
  EXPECT_EQ((*dated)["experiments"][0]["id"], ids[1]);
}

TEST(ExperimentStoreTest, IsoTimestamps) {
  EXPECT_EQ(NormalizeIsoTimestamp("2026-01-31").value(),
            "2026-01-31T00:00:00.000000");
  EXPECT_EQ(NormalizeIsoTimestamp("2026-01-31T12:30").value(),
            "2026-01-31T12:30:00.000000");
  EXPECT_EQ(NormalizeIsoTimestamp("2026-01-31T12:30:05.5Z").value(),
            "2026-01-31T12:30:05.500000");
  EXPECT_EQ(NormalizeIsoTimestamp("2026-01-31T01:00:00+02:00").value(),
            "2026-01-30T23:00:00.000000");
  EXPECT_FALSE(NormalizeIsoTimestamp("yesterday").ok());
  EXPECT_FALSE(NormalizeIsoTimestamp("2026-13-01").ok());
  EXPECT_EQ(IsoTimestampNow().size(), 26u);
}

TEST(ExperimentStoreTest, ExportsJsonAndCsv) {
  TempDir dir;
  auto store = OpenStore(dir);
  ASSERT_NE(store, nullptr);
  auto id = store->CreateExperiment("m", {{"k", "v"}});
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(store->AddConversation(*id, "user", "a, \"b\"").ok());
  const std::vector<float> v = {0.5f, -1.0f, 2.0f, 4.0f};
  // One layer's last-position state [2] and its full sequence [2, 2]: the
  // export keeps both (by record id), and TheLoom's layer-keyed object the
  // last stored.
  const std::vector<float> last = {2.0f, 4.0f};
  ASSERT_TRUE(
      store->SaveHiddenState(*id, 2, DType::kF32, Shape({2}), last.data())
          .ok());
  ASSERT_TRUE(
      store->SaveHiddenState(*id, 2, DType::kF32, Shape({2, 2}), v.data())
          .ok());

  auto files = store->Export(*id, "json", dir.File("out"), true);
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  ASSERT_EQ(files->size(), 1u);
  EXPECT_EQ(files->at("experiment"), dir.File("out/" + *id + ".json"));
  const json doc = json::parse(Slurp(files->at("experiment")));
  EXPECT_EQ(doc["experiment"]["id"], *id);
  EXPECT_EQ(doc["conversations"].size(), 1u);
  EXPECT_TRUE(doc["metrics"].empty());
  EXPECT_EQ(doc["hidden_state_data"]["2"],
            json::parse("[[0.5, -1.0], [2.0, 4.0]]"));
  ASSERT_EQ(doc["hidden_states"].size(), 2u);
  const json& by_id = doc["hidden_state_data_by_id"];
  ASSERT_EQ(by_id.size(), 2u) << by_id.dump();
  auto key = [](const json& id) {
    return id.is_string() ? id.get<std::string>() : id.dump();
  };
  EXPECT_EQ(by_id[key(doc["hidden_states"][0]["id"])],
            json::parse("[2.0, 4.0]"));
  EXPECT_EQ(by_id[key(doc["hidden_states"][1]["id"])],
            json::parse("[[0.5, -1.0], [2.0, 4.0]]"));
  EXPECT_TRUE(doc.contains("export_timestamp"));

  files = store->Export(*id, "csv", dir.File("csv"), false);
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  EXPECT_EQ(files->size(), 3u);  // no metrics: no metrics file
  EXPECT_EQ(files->count("metrics"), 0u);
  const std::string exp = Slurp(files->at("experiment"));
  EXPECT_EQ(exp.substr(0, exp.find('\n')),
            "id,created_at,model,config,status,notes");
  EXPECT_NE(exp.find(",m,\"{\"\"k\"\":\"\"v\"\"}\",completed,\n"),
            std::string::npos)
      << exp;
  const std::string conv = Slurp(files->at("conversations"));
  EXPECT_NE(conv.find(",user,\"a, \"\"b\"\"\"\n"), std::string::npos) << conv;
  const std::string hs = Slurp(files->at("hidden_states"));
  EXPECT_NE(hs.find(",\"[2,2]\",float32,"), std::string::npos) << hs;

  auto n = store->ExportSummary("csv", dir.File("out/summary.csv"), 10);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 1);
  const std::string summary = Slurp(dir.File("out/summary.csv"));
  EXPECT_EQ(summary.substr(0, summary.find('\n')),
            "id,created_at,model,status,notes,conversation_count,metric_count,"
            "hidden_state_count");
  EXPECT_NE(summary.find(",1,0,2\n"), std::string::npos) << summary;
  n = store->ExportSummary("json", dir.File("out/summary.json"), 10);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(
      json::parse(Slurp(dir.File("out/summary.json")))["total_experiments"], 1);

  EXPECT_EQ(store->Export(*id, "parquet", dir.path(), false).status().code(),
            StatusCode::kUnimplemented);
  const Status bad = store->Export(*id, "xml", dir.path(), false).status();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(),
            "Invalid format: xml. Must be one of: json, csv, parquet");
}

TEST(ExperimentRoutesTest, DisabledAnswers503AndChecksRequests) {
  PersistenceOptions off;
  auto routes = ExperimentRoutes::Create(off);
  ASSERT_TRUE(routes.ok());
  EXPECT_EQ((*routes)->store(), nullptr);
  const Status s = (*routes)->List({}).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);  // 503
  EXPECT_EQ(s.message(),
            "Persistence is not enabled. Set persistence.enabled=true in "
            "config.");
  EXPECT_EQ((*routes)->ExportSummary(json::object()).status().code(),
            StatusCode::kFailedPrecondition);

  TempDir dir;
  PersistenceOptions on;
  on.enabled = true;
  on.db_path = dir.File("e.db");
  on.hidden_states_dir = dir.File("h");
  on.export_dir = dir.File("exports");
  routes = ExperimentRoutes::Create(on);
  ASSERT_TRUE(routes.ok()) << routes.status().ToString();
  ExperimentRoutes& r = **routes;
  ASSERT_NE(r.store(), nullptr);
  EXPECT_EQ(r.List({{"limit", "0"}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(r.List({{"limit", "x"}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(r.List({{"date_from", "soon"}}).status().code(),
            StatusCode::kInvalidArgument);
  auto listed = r.List({{"limit", "5"}, {"date_from", "2020-01-01"}});
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ((*listed)["limit"], 5);
  // Exports stay inside export_dir.
  EXPECT_EQ(r.ExportPath("", "output_path").value(),
            std::filesystem::weakly_canonical(dir.File("exports")).string());
  EXPECT_TRUE(r.ExportPath("sub/dir", "output_path").ok());
  const Status outside = r.ExportPath("../x", "output_path").status();
  EXPECT_EQ(outside.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(outside.message().find("outside persistence.export_dir"),
            std::string::npos);
  EXPECT_EQ(r.ExportPath("/etc", "output_dir").status().code(),
            StatusCode::kInvalidArgument);
  auto id = r.store()->CreateExperiment("m");
  ASSERT_TRUE(id.ok());
  auto out = r.Export({{"experiment_id", *id}, {"format", "csv"}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ((*out)["total_files"], 1);
  EXPECT_EQ((*out)["format"], "csv");
  EXPECT_EQ(r.Export({{"experiment_id", "nope"}}).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(r.Export(json::object()).status().code(),
            StatusCode::kInvalidArgument);
  auto batch = r.ExportBatch({{"experiment_ids", {*id}}, {"output_dir", "b"}});
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  EXPECT_EQ((*batch)["total_experiments"], 1);
  EXPECT_TRUE((*batch)["exported"].contains(*id));
  EXPECT_EQ(r.ExportBatch({{"experiment_ids", json::array()}}).status().code(),
            StatusCode::kInvalidArgument);
  auto summary = r.ExportSummary(json::object());
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ((*summary)["format"], "csv");
  EXPECT_EQ((*summary)["total_experiments"], 1);
  EXPECT_TRUE(
      std::filesystem::exists(dir.File("exports/experiments_summary.csv")));
}

// ---- Crash safety: a writer killed mid-write loses nothing it committed.

// The child: writes experiments (each: the experiment, two messages, a
// metric, a hidden state) as fast as it can and reports each id on `fd`
// once every write of it has returned.
[[noreturn]] void WriterChild(const std::string& db, const std::string& hs,
                              int fd) {
  auto store = ExperimentStore::Open(db, hs);
  if (!store.ok()) _exit(2);
  std::vector<float> v(256, 0.25f);
  for (int i = 0;; ++i) {
    auto id = (*store)->CreateExperiment("m", {{"i", i}}, "running");
    if (!id.ok()) _exit(3);
    if (!(*store)->AddConversation(*id, "user", "question").ok() ||
        !(*store)->AddConversation(*id, "assistant", "answer").ok() ||
        !(*store)->AddMetric(*id, "i", i).ok() ||
        !(*store)
             ->SaveHiddenState(*id, -1, DType::kF32, Shape({4, 64}), v.data())
             .ok() ||
        !(*store)->SetStatus(*id, "completed").ok())
      _exit(4);
    const std::string line = *id + "\n";
    if (::write(fd, line.data(), line.size()) !=
        static_cast<ssize_t>(line.size()))
      _exit(5);
  }
}

TEST(ExperimentStoreTest, SigkillDuringWritesLosesNothingCommitted) {
  TempDir dir;
  const std::string db = dir.File("experiments.db");
  const std::string hs = dir.File("hidden_states");
  std::set<std::string> committed;
  for (int round = 0; round < 3; ++round) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      WriterChild(db, hs, fds[1]);
    }
    ::close(fds[1]);
    // Wait for some committed experiments, then kill the writer while it is
    // in the middle of the next ones.
    std::string buf;
    int got = 0;
    char chunk[4096];
    while (got < 15) {
      const ssize_t n = ::read(fds[0], chunk, sizeof chunk);
      if (n <= 0) {
        int status = 0;
        ::waitpid(pid, &status, 0);
        FAIL() << "the writer died early: exit status "
               << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
      }
      buf.append(chunk, static_cast<size_t>(n));
      got = static_cast<int>(std::count(buf.begin(), buf.end(), '\n'));
    }
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    // Ids written before the kill and still in the pipe count too.
    while (true) {
      const ssize_t n = ::read(fds[0], chunk, sizeof chunk);
      if (n <= 0) break;
      buf.append(chunk, static_cast<size_t>(n));
    }
    ::close(fds[0]);
    std::istringstream lines(buf);
    for (std::string id; std::getline(lines, id);) committed.insert(id);
  }

  // The database opens clean and holds every reported experiment whole.
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &raw), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(raw, "PRAGMA integrity_check", -1, &st, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)), "ok");
  sqlite3_finalize(st);
  ASSERT_EQ(sqlite3_prepare_v2(raw, "PRAGMA journal_mode", -1, &st, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)),
               "wal");
  sqlite3_finalize(st);
  sqlite3_close(raw);

  auto store = ExperimentStore::Open(db, hs);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_GE(committed.size(), 45u);
  for (const std::string& id : committed) {
    auto e = (*store)->Get(id);
    ASSERT_TRUE(e.ok()) << id << ": " << e.status().ToString();
    EXPECT_EQ((*e)["experiment"]["status"], "completed");
    EXPECT_EQ((*e)["summary"]["conversation_count"], 2);
    EXPECT_EQ((*e)["summary"]["metric_count"], 1);
    ASSERT_EQ((*e)["summary"]["hidden_state_count"], 1);
  }
  // Every recorded hidden state (of committed experiments or of the one cut
  // short) names a complete file.
  auto all = (*store)->List(ExperimentQuery{1000, 0, {}, {}, {}, {}});
  ASSERT_TRUE(all.ok());
  EXPECT_GE((*all)["total"].get<int64_t>(),
            static_cast<int64_t>(committed.size()));
  for (const json& e : (*all)["experiments"]) {
    auto h = (*store)->HiddenStates(e["id"], std::nullopt);
    ASSERT_TRUE(h.ok());
    for (const json& row : (*h)["hidden_states"]) {
      auto f = SafetensorsFile::Open(row["file_path"]);
      EXPECT_TRUE(f.ok()) << f.status().ToString();
    }
  }
  // And the store takes new writes.
  EXPECT_TRUE((*store)->CreateExperiment("after").ok());
}

// ---- Concurrent readers beside a writer.

TEST(ExperimentStoreTest, ConcurrentReadersSeeConsistentSnapshots) {
  TempDir dir;
  auto store = OpenStore(dir);
  ASSERT_NE(store, nullptr);
  std::atomic<bool> done{false};
  std::atomic<int> failures{0}, reads{0};
  std::thread writer([&] {
    for (int i = 0; i < 200; ++i) {
      auto id = store->CreateExperiment("m", {{"i", i}});
      if (!id.ok() || !store->AddConversation(*id, "user", "q").ok() ||
          !store->AddMetric(*id, "x", i).ok())
        ++failures;
    }
    done = true;
  });
  std::vector<std::thread> readers;
  for (int r = 0; r < 4; ++r) {
    readers.emplace_back([&] {
      int64_t last = 0;
      while (!done.load()) {
        ExperimentQuery q;
        q.limit = 5;
        auto list = store->List(q);
        if (!list.ok()) {
          ++failures;
          continue;
        }
        const int64_t total = (*list)["total"];
        if (total < last) ++failures;  // never goes back
        last = total;
        for (const json& e : (*list)["experiments"]) {
          auto got = store->Get(e["id"]);
          if (!got.ok()) ++failures;
        }
        ++reads;
      }
    });
  }
  // A second process's connection reads too (WAL lets other processes in).
  auto other = ExperimentStore::Open(dir.File("db/experiments.db"),
                                     dir.File("hidden_states"));
  ASSERT_TRUE(other.ok());
  writer.join();
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ((*other)->Count(), 200);
  EXPECT_EQ(store->Count(), 200);
}

}  // namespace
}  // namespace loom::serve
