// Test helper shared by the serve tests: a Server on a free loopback port
// (127.0.0.1, port 0) serving one model, run on a thread until destroyed.
#ifndef LOOM_SERVE_RUNNING_SERVER_H_
#define LOOM_SERVE_RUNNING_SERVER_H_

#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "src/io/test_util.h"
#include "src/serve/server.h"

namespace loom::serve {

// The bundled model.
inline std::string Stories() {
  return std::string(LOOM_MODELS_DIR) + "/stories260K";
}

// A reply's JSON body (discarded on a parse error; a failed request is a test
// failure).
inline nlohmann::json Body(const httplib::Result& r) {
  EXPECT_TRUE(r) << "no response";
  if (!r) return nlohmann::json();
  return nlohmann::json::parse(r->body, nullptr, false);
}

// Options with persistence on, its database and folders inside `dir`.
inline ServerOptions WithPersistence(const loom::testing::TempDir& dir) {
  ServerOptions o;
  o.persistence.enabled = true;
  o.persistence.db_path = dir.File("db/experiments.db");
  o.persistence.hidden_states_dir = dir.File("db/hidden_states");
  o.persistence.export_dir = dir.File("exports");
  return o;
}

// A server on a free loopback port, run on a thread.
class Running {
 public:
  explicit Running(ServerOptions o, const std::string& model = Stories()) {
    o.host = "127.0.0.1";
    o.port = 0;
    if (o.model_paths.empty()) o.model_paths = {model};
    auto s = Server::Create(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    auto id = server_->LoadModel(model);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    auto port = server_->Bind();
    EXPECT_TRUE(port.ok()) << port.status().ToString();
    thread_ = std::thread([this] { status_ = server_->Run(); });
  }
  ~Running() { Stop(); }
  void Stop() {
    if (!thread_.joinable()) return;
    server_->Stop();
    thread_.join();
    EXPECT_TRUE(status_.ok()) << status_.ToString();
  }
  httplib::Client Client() const {
    httplib::Client c("127.0.0.1", server_->port());
    // Generous: under the sanitizers on a loaded 2-core machine a queued
    // request of the load test waits minutes (a timeout, not a speed check).
    c.set_read_timeout(600);
    return c;
  }
  Server& server() { return *server_; }

 private:
  std::unique_ptr<Server> server_;
  std::thread thread_;
  Status status_;
};

}  // namespace loom::serve

#endif  // LOOM_SERVE_RUNNING_SERVER_H_
