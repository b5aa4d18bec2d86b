// persistence.auto_persist: the generation routes record experiments,
// against a running server with the bundled model.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "src/io/test_util.h"
#include "src/serve/experiments.h"
#include "src/serve/running_server.h"
#include "src/serve/server.h"

namespace loom::serve {
namespace {

using json = nlohmann::json;
using loom::testing::TempDir;

httplib::Result Post(httplib::Client& c, const std::string& path,
                     const json& body) {
  return c.Post(path, body.dump(), "application/json");
}

// A sample of /metrics without labels; -1 when absent.
int64_t MetricValue(httplib::Client& c, const std::string& name) {
  auto r = c.Get("/metrics");
  if (!r) return -1;
  std::istringstream lines(r->body);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind(name + " ", 0) == 0)
      return std::strtoll(line.c_str() + name.size() + 1, nullptr, 10);
  return -1;
}

// Waits (up to a minute: the writer is a background thread) until the
// metric reaches `want`; returns its last value.
int64_t WaitMetric(httplib::Client& c, const std::string& name, int64_t want) {
  int64_t v = MetricValue(c, name);
  for (int i = 0; i < 600 && v < want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    v = MetricValue(c, name);
  }
  return v;
}

// The experiments, oldest first.
json Experiments(httplib::Client& c) {
  json list = Body(c.Get("/experiments?limit=1000"))["experiments"];
  json out = json::array();
  for (auto it = list.rbegin(); it != list.rend(); ++it) out.push_back(*it);
  return out;
}

// name -> metric object.
std::map<std::string, json> MetricsByName(const json& detail) {
  std::map<std::string, json> out;
  for (const json& m : detail["metrics"]) out[m["name"]] = m;
  return out;
}

TEST(ServeAutoPersistTest, GenerateRecordsConversationMetricsHiddenStates) {
  TempDir dir;
  Running s{WithPersistence(dir)};
  auto c = s.Client();
  auto r = Post(c, "/generate",
                {{"prompt", "Once upon a time"},
                 {"max_tokens", 5},
                 {"temperature", 0},
                 {"return_hidden_states", true},
                 {"hidden_state_layers", {0, -1}}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json out = Body(r);
  EXPECT_EQ(WaitMetric(c, "loom_experiments_persisted_total", 1), 1);
  EXPECT_EQ(MetricValue(c, "loom_experiments_persist_errors_total"), 0);

  const json list = Experiments(c);
  ASSERT_EQ(list.size(), 1u);
  const std::string id = list[0]["id"];
  const json d = Body(c.Get("/experiments/" + id));
  EXPECT_EQ(d["experiment"]["model"], "stories260K");
  EXPECT_EQ(d["experiment"]["status"], "completed");
  const json& config = d["experiment"]["config"];
  EXPECT_EQ(config["route"], "/generate");
  EXPECT_EQ(config["max_tokens"], 5);
  EXPECT_EQ(config["temperature"], 0.0);
  EXPECT_EQ(config["top_p"], 0.9);  // a default, applied
  EXPECT_EQ(config["return_hidden_states"], true);
  EXPECT_EQ(config["hidden_state_layers"], json::array({0, -1}));
  EXPECT_EQ(config["hidden_state_dtype"], "float32");
  EXPECT_FALSE(config.contains("prompt"));

  ASSERT_EQ(d["conversations"].size(), 2u);
  EXPECT_EQ(d["conversations"][0]["role"], "user");
  EXPECT_EQ(d["conversations"][0]["content"], "Once upon a time");
  EXPECT_EQ(d["conversations"][1]["role"], "assistant");
  EXPECT_EQ(d["conversations"][1]["content"], out["text"]);

  auto m = MetricsByName(d);
  ASSERT_EQ(m.size(), 4u) << d["metrics"].dump();
  EXPECT_EQ(m["prompt_tokens"]["value"], out["metadata"]["input_tokens"]);
  EXPECT_EQ(m["prompt_tokens"]["unit"], "tokens");
  EXPECT_EQ(m["completion_tokens"]["value"], out["token_count"]);
  EXPECT_EQ(m["completion_tokens"]["unit"], "tokens");
  EXPECT_EQ(m["latency_ms"]["unit"], "ms");
  EXPECT_GE(m["latency_ms"]["value"].get<double>(), 0.0);
  EXPECT_EQ(m["tokens_per_second"]["unit"], "tokens/s");
  EXPECT_NEAR(m["tokens_per_second"]["value"].get<double>(),
              out["metadata"]["tokens_per_second"].get<double>(), 1e-6);

  ASSERT_EQ(d["hidden_states"].size(), 2u);
  std::set<int64_t> layers;
  for (const json& h : d["hidden_states"]) {
    layers.insert(h["layer"].get<int64_t>());
    EXPECT_EQ(h["shape"], out["hidden_states"]["-1"]["shape"]);
    EXPECT_EQ(h["dtype"], "float32");
    EXPECT_TRUE(std::filesystem::exists(h["file_path"].get<std::string>()));
  }
  EXPECT_EQ(layers, (std::set<int64_t>{0, -1}));

  // The saved arrays are the returned ones.
  auto exported =
      Post(c, "/experiments/export",
           {{"experiment_id", id}, {"include_hidden_states", true}});
  ASSERT_TRUE(exported);
  ASSERT_EQ(exported->status, 200) << exported->body;
  const json file = json::parse(loom::testing::ReadBytes(
      Body(exported)["output_files"]["experiment"].get<std::string>()));
  for (const char* layer : {"0", "-1"}) {
    const json& saved = file["hidden_state_data"][layer];
    const json& returned = out["hidden_states"][layer]["data"];
    ASSERT_EQ(saved.size(), returned.size()) << layer;
    for (size_t i = 0; i < saved.size(); ++i)
      ASSERT_NEAR(saved[i].get<double>(), returned[i].get<double>(), 1e-6)
          << layer << "[" << i << "]";
  }
}

TEST(ServeAutoPersistTest, ChatAndEveryOtherRouteRecord) {
  TempDir dir;
  Running s{WithPersistence(dir)};
  auto c = s.Client();
  const json messages = {{{"role", "system"}, {"content", "Be brief."}},
                         {{"role", "user"}, {"content", "Tell a story."}}};
  auto r = Post(c, "/v1/chat/completions",
                {{"messages", messages}, {"max_tokens", 4}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json chat = Body(r);
  ASSERT_EQ(WaitMetric(c, "loom_experiments_persisted_total", 1), 1);

  json list = Experiments(c);
  ASSERT_EQ(list.size(), 1u);
  json d = Body(c.Get("/experiments/" + list[0]["id"].get<std::string>()));
  EXPECT_EQ(d["experiment"]["status"], "completed");
  EXPECT_EQ(d["experiment"]["config"]["route"], "/v1/chat/completions");
  EXPECT_EQ(d["experiment"]["config"]["max_tokens"], 4);
  EXPECT_EQ(d["experiment"]["config"]["top_p"], 1.0);
  EXPECT_FALSE(d["experiment"]["config"].contains("messages"));
  ASSERT_EQ(d["conversations"].size(), 3u);
  EXPECT_EQ(d["conversations"][0]["role"], "system");
  EXPECT_EQ(d["conversations"][0]["content"], "Be brief.");
  EXPECT_EQ(d["conversations"][1]["role"], "user");
  EXPECT_EQ(d["conversations"][1]["content"], "Tell a story.");
  EXPECT_EQ(d["conversations"][2]["role"], "assistant");
  EXPECT_EQ(d["conversations"][2]["content"],
            chat["choices"][0]["message"]["content"]);
  auto m = MetricsByName(d);
  EXPECT_EQ(m["prompt_tokens"]["value"], chat["usage"]["prompt_tokens"]);
  EXPECT_EQ(m["completion_tokens"]["value"],
            chat["usage"]["completion_tokens"]);
  // A chat returns the last layer's state ([1, hidden]); stored as [hidden].
  ASSERT_EQ(d["hidden_states"].size(), 1u);
  EXPECT_EQ(d["hidden_states"][0]["layer"], -1);
  EXPECT_EQ(d["hidden_states"][0]["shape"],
            json::array({chat["hidden_state"]["shape"][1]}));

  // Streamed (both formats), /generate/stream, /v1/generate, and a batch of
  // two (one experiment each).
  r = Post(c, "/v1/chat/completions",
           {{"messages", messages}, {"max_tokens", 3}, {"stream", true}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_NE(r->body.find("[DONE]"), std::string::npos);
  r = Post(c, "/v1/chat/completions",
           {{"messages", messages},
            {"max_tokens", 3},
            {"stream", true},
            {"stream_format", "theloom"}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  r = Post(c, "/generate/stream", {{"prompt", "Lily"}, {"max_tokens", 3}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_NE(r->body.find("event: done"), std::string::npos);
  r = Post(c, "/v1/generate", {{"prompt", "Tom"}, {"max_tokens", 2}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  r = Post(c, "/generate/batch",
           {{"prompts", {"A cat", "A dog"}}, {"max_tokens", 2}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(WaitMetric(c, "loom_experiments_persisted_total", 7), 7);
  list = Experiments(c);
  ASSERT_EQ(list.size(), 7u);
  std::multiset<std::string> routes;
  std::set<std::string> batch_prompts;
  for (const json& x : list) {
    EXPECT_EQ(x["status"], "completed");
    routes.insert(x["config"]["route"].get<std::string>());
    d = Body(c.Get("/experiments/" + x["id"].get<std::string>()));
    EXPECT_EQ(d["conversations"].back()["role"], "assistant");
    EXPECT_EQ(d["metrics"].size(), 4u);
    if (x["config"]["route"] == "/generate/batch") {
      EXPECT_TRUE(x["config"].contains("batch_index"));
      batch_prompts.insert(d["conversations"][0]["content"].get<std::string>());
    }
    if (x["config"]["route"] == "/generate/stream") {
      EXPECT_EQ(d["conversations"][0]["content"], "Lily");
    }
  }
  EXPECT_EQ(routes.count("/v1/chat/completions"), 3u);
  EXPECT_EQ(routes.count("/generate/stream"), 1u);
  EXPECT_EQ(routes.count("/v1/generate"), 1u);
  EXPECT_EQ(routes.count("/generate/batch"), 2u);
  EXPECT_EQ(batch_prompts, (std::set<std::string>{"A cat", "A dog"}));
}

TEST(ServeAutoPersistTest, PersistFalseRecordsNothing) {
  TempDir dir;
  Running s{WithPersistence(dir)};
  auto c = s.Client();
  auto r =
      Post(c, "/generate",
           {{"prompt", "Not kept"}, {"max_tokens", 2}, {"persist", false}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  r = Post(c, "/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", "Not kept"}}}},
            {"max_tokens", 2},
            {"persist", false}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto bad = Post(c, "/generate", {{"prompt", "x"}, {"persist", "no"}});
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  // One that is kept: the writer keeps the order, so once it is there the
  // ones before it would be too.
  r = Post(c, "/generate",
           {{"prompt", "Kept"},
            {"max_tokens", 2},
            {"hidden_state_dtype", "bfloat16"}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(WaitMetric(c, "loom_experiments_persisted_total", 1), 1);
  const json list = Experiments(c);
  ASSERT_EQ(list.size(), 1u);
  const json d =
      Body(c.Get("/experiments/" + list[0]["id"].get<std::string>()));
  EXPECT_EQ(d["conversations"][0]["content"], "Kept");
  ASSERT_EQ(d["hidden_states"].size(), 1u);
  EXPECT_EQ(d["hidden_states"][0]["dtype"], "bfloat16");
}

TEST(ServeAutoPersistTest, AutoPersistOffRecordsNothing) {
  TempDir dir;
  ServerOptions o = WithPersistence(dir);
  o.persistence.auto_persist = false;
  {
    Running s{o};
    auto c = s.Client();
    auto r = Post(c, "/generate", {{"prompt", "Once"}, {"max_tokens", 2}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(MetricValue(c, "loom_experiments_persisted_total"), -1);
    EXPECT_EQ(Body(c.Get("/experiments"))["total"], 0);
  }  // the server is gone: anything queued would have been written
  auto store = ExperimentStore::Open(dir.File("db/experiments.db"),
                                     dir.File("db/hidden_states"));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->Count(), 0);
}

TEST(ServeAutoPersistTest, FailingStoreStillAnswersAndCountsTheError) {
  TempDir dir;
  Running s{WithPersistence(dir)};
  auto c = s.Client();
  // The hidden-state folder becomes a plain file: saving an array fails
  // (whoever runs the test, root included).
  const std::string hs = dir.File("db/hidden_states");
  std::filesystem::remove_all(hs);
  loom::testing::WriteBytes(hs, "not a folder");
  auto r = Post(c, "/generate",
                {{"prompt", "Once upon a time"},
                 {"max_tokens", 3},
                 {"return_hidden_states", true}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_FALSE(Body(r).contains("error"));
  EXPECT_EQ(WaitMetric(c, "loom_experiments_persist_errors_total", 1), 1);
  EXPECT_EQ(MetricValue(c, "loom_experiments_persisted_total"), 0);
  // The half-written experiment was removed again.
  EXPECT_EQ(Body(c.Get("/experiments"))["total"], 0);
  // The server goes on answering.
  r = Post(c, "/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
            {"max_tokens", 2}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(WaitMetric(c, "loom_experiments_persist_errors_total", 2), 2);
}

}  // namespace
}  // namespace loom::serve
