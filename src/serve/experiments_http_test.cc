// The HTTP side of /experiments*, /loaders*, /gpu/configure and the unix
// socket transport, against a running server with the bundled model.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "src/io/test_util.h"
#include "src/serve/experiments.h"
#include "src/serve/running_server.h"
#include "src/serve/server.h"

namespace loom::serve {
namespace {

using json = nlohmann::json;
using loom::testing::TempDir;

TEST(ServeExperimentsHttpTest, DisabledIs503) {
  Running s{ServerOptions()};
  auto c = s.Client();
  for (const char* path :
       {"/experiments", "/experiments/x", "/experiments/x/metrics"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 503) << path;
    EXPECT_EQ(Body(r)["detail"],
              "Persistence is not enabled. Set persistence.enabled=true in "
              "config.");
  }
  auto r = c.Post("/experiments/export", R"({"experiment_id": "x"})",
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
}

TEST(ServeExperimentsHttpTest, EveryRoute) {
  TempDir dir;
  Running s{WithPersistence(dir)};
  auto c = s.Client();
  // Another connection to the same database writes; the server reads it.
  auto store = ExperimentStore::Open(dir.File("db/experiments.db"),
                                     dir.File("db/hidden_states"));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto id = (*store)->CreateExperiment("stories260K", {{"max_tokens", 8}});
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE((*store)->AddConversation(*id, "user", "Once upon").ok());
  ASSERT_TRUE((*store)->AddConversation(*id, "assistant", "a time").ok());
  ASSERT_TRUE((*store)->AddMetric(*id, "latency_ms", 6.5, "ms").ok());
  const std::vector<float> v(64, 0.5f);
  ASSERT_TRUE((*store)
                  ->SaveHiddenState(*id, -1, DType::kF32, Shape({64}), v.data())
                  .ok());

  json list = Body(c.Get("/experiments?limit=10&model=stories260K"));
  EXPECT_EQ(list["total"], 1);
  EXPECT_EQ(list["limit"], 10);
  EXPECT_EQ(list["offset"], 0);
  ASSERT_EQ(list["experiments"].size(), 1u);
  EXPECT_EQ(list["experiments"][0]["id"], *id);
  EXPECT_EQ(list["experiments"][0]["config"]["max_tokens"], 8);
  EXPECT_EQ(Body(c.Get("/experiments?model=other"))["total"], 0);
  EXPECT_EQ(
      Body(c.Get("/experiments?date_to=2000-01-01"))["experiments"].size(), 0u);
  auto bad = c.Get("/experiments?limit=abc");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);

  json one = Body(c.Get("/experiments/" + *id));
  EXPECT_EQ(one["experiment"]["id"], *id);
  EXPECT_EQ(one["summary"]["conversation_count"], 2);
  EXPECT_EQ(one["summary"]["metric_count"], 1);
  EXPECT_EQ(one["summary"]["hidden_state_count"], 1);
  auto missing = c.Get("/experiments/nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(Body(missing)["detail"], "Experiment not found: nope");

  json conv = Body(c.Get("/experiments/" + *id + "/conversations?role=user"));
  EXPECT_EQ(conv["experiment_id"], *id);
  EXPECT_EQ(conv["total"], 1);
  EXPECT_EQ(conv["conversations"][0]["content"], "Once upon");
  json hs = Body(c.Get("/experiments/" + *id + "/hidden_states?layer=-1"));
  EXPECT_EQ(hs["total"], 1);
  EXPECT_EQ(hs["layers"], json::array({-1}));
  EXPECT_EQ(hs["hidden_states"][0]["shape"], json::array({64}));
  json metrics =
      Body(c.Get("/experiments/" + *id + "/metrics?metric_name=latency_ms"));
  EXPECT_EQ(metrics["total"], 1);
  EXPECT_EQ(metrics["metric_names"], json::array({"latency_ms"}));
  auto gone = c.Get("/experiments/nope/metrics");
  ASSERT_TRUE(gone);
  EXPECT_EQ(gone->status, 404);

  auto exported = c.Post(
      "/experiments/export",
      json{{"experiment_id", *id}, {"include_hidden_states", true}}.dump(),
      "application/json");
  ASSERT_TRUE(exported);
  ASSERT_EQ(exported->status, 200) << exported->body;
  json e = Body(exported);
  EXPECT_EQ(e["format"], "json");
  EXPECT_EQ(e["total_files"], 1);
  const std::string file = e["output_files"]["experiment"];
  EXPECT_TRUE(std::filesystem::exists(file)) << file;
  EXPECT_EQ(
      json::parse(loom::testing::ReadBytes(file))["hidden_state_data"]["-1"]
          .size(),
      64u);
  e = Body(c.Post(
      "/experiments/export",
      json{{"experiment_id", *id}, {"format", "csv"}, {"output_path", "csv"}}
          .dump(),
      "application/json"));
  EXPECT_EQ(e["total_files"], 4);
  auto outside =
      c.Post("/experiments/export",
             json{{"experiment_id", *id}, {"output_path", "/tmp"}}.dump(),
             "application/json");
  ASSERT_TRUE(outside);
  EXPECT_EQ(outside->status, 400);
  auto xml = c.Post("/experiments/export",
                    json{{"experiment_id", *id}, {"format", "xml"}}.dump(),
                    "application/json");
  ASSERT_TRUE(xml);
  EXPECT_EQ(xml->status, 400);
  auto parquet =
      c.Post("/experiments/export",
             json{{"experiment_id", *id}, {"format", "parquet"}}.dump(),
             "application/json");
  ASSERT_TRUE(parquet);
  EXPECT_EQ(parquet->status, 501);

  json batch =
      Body(c.Post("/experiments/export/batch",
                  json{{"experiment_ids", {*id}}, {"format", "csv"}}.dump(),
                  "application/json"));
  EXPECT_EQ(batch["total_experiments"], 1);
  EXPECT_EQ(batch["format"], "csv");
  EXPECT_EQ(batch["exported"][*id].size(), 4u);
  json summary =
      Body(c.Post("/experiments/export/summary",
                  json{{"format", "json"}}.dump(), "application/json"));
  EXPECT_EQ(summary["total_experiments"], 1);
  EXPECT_TRUE(
      std::filesystem::exists(summary["output_path"].get<std::string>()));
}

TEST(ServeLoadersHttpTest, LoadersProbeAndGpuConfigure) {
  Running s{ServerOptions()};
  auto c = s.Client();
  json loaders = Body(c.Get("/loaders"));
  EXPECT_EQ(loaders["fallback_order"], json::array({"loom"}));
  EXPECT_EQ(loaders["loaders"]["loom"]["name"], "loom");
  EXPECT_FALSE(loaders["loaders"]["loom"]["architectures"].empty());

  json probe = Body(c.Get("/loaders/probe/stories260K"));
  EXPECT_EQ(probe["model_id"], "stories260K");
  EXPECT_EQ(probe["can_load"]["loom"], true);
  EXPECT_EQ(probe["detected_loader"], "loom");
  EXPECT_EQ(probe["selected_loader"], "loom");
  EXPECT_TRUE(probe["configured_loader"].is_null());
  EXPECT_EQ(probe["architecture"], "llama");
  json unknown = Body(c.Get("/loaders/probe/meta-llama--Llama-3-8B"));
  EXPECT_EQ(unknown["model_id"], "meta-llama/Llama-3-8B");
  EXPECT_EQ(unknown["can_load"]["loom"], false);
  EXPECT_TRUE(unknown["detected_loader"].is_null());
  EXPECT_TRUE(unknown.contains("reason"));

  auto post = [&](const json& b) {
    return c.Post("/gpu/configure", b.dump(), "application/json");
  };
  auto r = post(json::object());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(Body(r)["detail"],
            "At least one of 'allowed_devices' or 'default_device' must be "
            "provided");
  r = post({{"allowed_devices", {0}}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(Body(r)["detail"].get<std::string>().find(
                "Invalid device indices: [0]. Available devices: []"),
            std::string::npos);
  r = post({{"default_device", 0}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  r = post({{"allowed_devices", json::array()}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json ok = Body(r);
  EXPECT_EQ(ok["allowed_devices"], json::array());
  EXPECT_EQ(ok["default_device"], "cpu");
  EXPECT_EQ(ok["available_devices"], json::array());
  EXPECT_EQ(ok["message"], "allowed_devices updated to []");
}

// ---- Unix socket transport.

// GET `path` over the unix socket at `socket_path`: the raw response.
std::string GetOverUnixSocket(const std::string& socket_path,
                              const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof addr.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET " + path +
                          " HTTP/1.1\r\nHost: localhost\r\nConnection: "
                          "close\r\n\r\n";
  if (::write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return "";
  }
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;)
    out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

TEST(ServeUnixSocketTest, ServesHealthWithMode0600AndCleansUp) {
  TempDir dir;
  const std::string sock = dir.File("loom.sock");
  ServerOptions o;
  o.transport = "unix";
  o.unix_socket = sock;
  {
    Running s{o};
    EXPECT_EQ(s.server().port(), 0);
    struct stat st;
    ASSERT_EQ(::lstat(sock.c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0600);
    const std::string r = GetOverUnixSocket(sock, "/health");
    EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
    EXPECT_NE(r.find("\"status\":\"healthy\""), std::string::npos) << r;
    const std::string models = GetOverUnixSocket(sock, "/models");
    EXPECT_NE(models.find("stories260K"), std::string::npos) << models;
    // A second server on the same live socket is refused.
    auto second = Server::Create(o);
    ASSERT_TRUE(second.ok());
    auto bound = (*second)->Bind();
    EXPECT_FALSE(bound.ok());
    EXPECT_NE(bound.status().message().find("another server is listening"),
              std::string::npos)
        << bound.status().ToString();
    EXPECT_TRUE(std::filesystem::exists(sock));  // not removed by it
  }
  EXPECT_FALSE(std::filesystem::exists(sock)) << "removed on shutdown";
}

TEST(ServeUnixSocketTest, StaleSocketIsReplacedOtherFilesAreNot) {
  TempDir dir;
  const std::string sock = dir.File("stale.sock");
  {  // A socket file whose server is gone.
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, sock.c_str(), sizeof addr.sun_path - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ::close(fd);
  }
  ServerOptions o;
  o.transport = "both";
  o.unix_socket = sock;
  {
    Running s{o};
    EXPECT_GT(s.server().port(), 0);
    EXPECT_EQ(GetOverUnixSocket(sock, "/health").rfind("HTTP/1.1 200", 0), 0u);
    auto c = s.Client();
    auto r = c.Get("/health");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
  }
  EXPECT_FALSE(std::filesystem::exists(sock));

  const std::string plain = dir.File("plain");
  loom::testing::WriteBytes(plain, "data");
  o.transport = "unix";
  o.unix_socket = plain;
  auto server = Server::Create(o);
  ASSERT_TRUE(server.ok());
  auto bound = (*server)->Bind();
  EXPECT_FALSE(bound.ok());
  EXPECT_NE(bound.status().message().find("is not a socket"),
            std::string::npos);
  EXPECT_EQ(loom::testing::ReadBytes(plain), "data");
}

}  // namespace
}  // namespace loom::serve
