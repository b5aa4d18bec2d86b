// The `loom serve` binary: started on a loopback port with the bundled
// model, driven over HTTP, stopped by SIGTERM (exit 0 after the requests in
// flight); configuration errors exit 1 naming the key or variable.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "src/io/npy.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Stories() { return std::string(LOOM_MODELS_DIR) + "/stories260K"; }

// A `loom serve` child process whose standard error is read through a pipe.
class Child {
 public:
  Child(const std::vector<std::string>& args,
        const std::vector<std::string>& env = {}) {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 2);
      close(fds[0]);
      for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> argv;
      std::string bin = LOOM_BINARY;
      argv.push_back(bin.data());
      std::vector<std::string> copy = args;
      for (std::string& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(bin.c_str(), argv.data());
      _exit(127);
    }
    close(fds[1]);
    fd_ = fds[0];
  }
  ~Child() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(fd_);
  }
  // Reads standard error until `needle` appears (or EOF / 60 s).
  bool WaitFor(const std::string& needle) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(60);
    char buf[4096];
    while (err_.find(needle) == std::string::npos &&
           std::chrono::steady_clock::now() < deadline) {
      const ssize_t n = read(fd_, buf, sizeof(buf));
      if (n <= 0) return err_.find(needle) != std::string::npos;
      err_.append(buf, static_cast<size_t>(n));
    }
    return err_.find(needle) != std::string::npos;
  }
  int Port() {
    if (!WaitFor("listening on http://127.0.0.1:")) return -1;
    const size_t p = err_.find("127.0.0.1:") + 10;
    return std::stoi(err_.substr(p));
  }
  int Wait() {
    char buf[4096];
    ssize_t n;
    while ((n = read(fd_, buf, sizeof(buf))) > 0)
      err_.append(buf, static_cast<size_t>(n));
    int status = 0;
    waitpid(pid_, &status, 0);
    exited_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  pid_t pid() const { return pid_; }
  const std::string& err() const { return err_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool exited_ = false;
  std::string err_;
};

TEST(ServeCliTest, ServesAndStopsOnSigterm) {
  Child c({"serve", "--model", Stories(), "--port", "0", "--threads", "1"});
  const int port = c.Port();
  ASSERT_GT(port, 0) << c.err();
  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(60);
  auto h = http.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body)["model_loaded"], "stories260K");
  // A long request in flight when SIGTERM arrives still completes.
  std::atomic<int> status{0};
  std::thread client([&] {
    httplib::Client c2("127.0.0.1", port);
    c2.set_read_timeout(60);
    auto r = c2.Post("/generate",
                     json({{"prompt", "Once upon a time"},
                           {"max_tokens", 300},
                           {"temperature", 0},
                           {"ignore_eos", true}})
                         .dump(),
                     "application/json");
    status = r ? r->status : -1;
  });
  // Wait until the request is admitted, then stop the server.
  for (int i = 0; i < 500; ++i) {
    auto m = http.Get("/metrics");
    if (m && m->body.find("loom_active_sequences{model=\"stories260K\"} 1") !=
                 std::string::npos)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(c.pid(), SIGTERM);
  client.join();
  EXPECT_EQ(status.load(), 200);
  EXPECT_EQ(c.Wait(), 0) << c.err();
  EXPECT_NE(c.err().find("SIGTERM"), std::string::npos) << c.err();
  EXPECT_NE(c.err().find("stopped"), std::string::npos) << c.err();
}

TEST(ServeCliTest, ConfigFileEnvAndErrors) {
  const fs::path dir = fs::temp_directory_path() / "loom_serve_cli";
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    Child c({"serve", "--port", "0"});
    EXPECT_EQ(c.Wait(), 1);
    EXPECT_NE(c.err().find("nothing to serve"), std::string::npos) << c.err();
  }
  std::ofstream(dir / "bad.yaml") << "server:\n  http_prot: 9000\n";
  {
    Child c({"serve", "--model", Stories(), "--config",
             (dir / "bad.yaml").string()});
    EXPECT_EQ(c.Wait(), 1);
    EXPECT_NE(c.err().find("server.http_prot"), std::string::npos) << c.err();
  }
  {
    Child c({"serve", "--model", Stories(), "--port", "0"},
            {"LOOM_SERVER__MAX_QUEUE=lots"});
    EXPECT_EQ(c.Wait(), 1);
    EXPECT_NE(c.err().find("LOOM_SERVER__MAX_QUEUE"), std::string::npos)
        << c.err();
  }
  // A config with a models directory, a preloaded model and a token.
  std::ofstream(dir / "ok.yaml")
      << "server:\n  http_port: 0\n  auth_token: tok\n"
      << "models:\n  dirs: [" << LOOM_MODELS_DIR << "]\n"
      << "  preload: [stories260K]\n"
      << "batching:\n  slots: 2\n  context: 64\n"
      << "persistence:\n  enabled: false\n"
      << "loaders:\n  default: transformers\n";
  Child c({"serve", "--config", (dir / "ok.yaml").string()},
          {"LOOM_BATCHING__SLOTS=3"});
  const int port = c.Port();
  ASSERT_GT(port, 0) << c.err();
  EXPECT_NE(c.err().find("loaders"), std::string::npos)
      << "ignored TheLoom section not reported: " << c.err();
  httplib::Client http("127.0.0.1", port);
  auto r = http.Get("/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  http.set_bearer_token_auth("tok");
  r = http.Get("/models");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const json m = json::parse(r->body)["models"][0];
  EXPECT_EQ(m["slots"], 3);  // the environment wins over the file
  EXPECT_EQ(m["context"], 64);
  // The id is a name under models.dirs; a path outside is refused.
  r = http.Post("/models/load", R"({"model": "../stories260K"})",
                "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  kill(c.pid(), SIGTERM);
  EXPECT_EQ(c.Wait(), 0) << c.err();
  fs::remove_all(dir);
}

// `loom generate --hooks`: the prompt's hidden states equal `loom
// extract`'s (chunked prefill: to f32 round-off).
TEST(ServeCliTest, GenerateHooksEqualExtract) {
  const fs::path dir = fs::temp_directory_path() / "loom_generate_hooks";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string prompt = "Tom had a red ball. He threw it high";
  std::ofstream(dir / "in.jsonl") << json({{"text", prompt}}).dump() << "\n";
  const std::string hooks = "blocks.1.hook_resid_post,ln_final.hook_normalized";
  {
    Child c({"extract", "--model", Stories(), "--input",
             (dir / "in.jsonl").string(), "--out", (dir / "out").string(),
             "--hooks", hooks, "--select", "all", "--precision", "f32"});
    ASSERT_EQ(c.Wait(), 0) << c.err();
  }
  FILE* p = popen((std::string(LOOM_BINARY) + " generate --model " + Stories() +
                   " --prompt '" + prompt + "' --max-tokens 0 --hooks " +
                   hooks + " --select all --prefill-chunk 3")
                      .c_str(),
                  "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << out;
  const json j = json::parse(out);
  EXPECT_EQ(j["token_ids"].size(), 0u);
  for (const std::string hook :
       {"blocks.1.hook_resid_post", "ln_final.hook_normalized"}) {
    SCOPED_TRACE(hook);
    auto npy = loom::ReadNpy((dir / "out" / (hook + ".all.npy")).string());
    ASSERT_TRUE(npy.ok()) << npy.status().ToString();
    std::vector<float> want(npy->data.size() / 4);
    std::memcpy(want.data(), npy->data.data(), npy->data.size());
    const json& got = j["activations"][hook]["all"];
    ASSERT_EQ(got["shape"][0].get<size_t>() * 64, want.size());
    float scale = 0;
    for (float v : want) scale = std::max(scale, std::fabs(v));
    for (size_t r = 0; r < want.size() / 64; ++r)
      for (size_t k = 0; k < 64; ++k)
        ASSERT_NEAR(got["data"][r][k].get<float>(), want[r * 64 + k],
                    2e-5f * scale);
  }
  fs::remove_all(dir);
}

// `loom ARGS 2>&1` (ARGS as the shell reads them): exit code and output.
std::pair<int, std::string> RunLoom(const std::string& args) {
  FILE* p =
      popen((std::string(LOOM_BINARY) + " " + args + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// `loom serve --precision` like every command that computes: it sets
// memory.precision_mode (over the YAML file's), echoed in /health; a value
// no command takes is refused naming the flag.
TEST(ServeCliTest, PrecisionFlagOverridesTheConfig) {
  const fs::path dir = fs::temp_directory_path() /
                       ("loom_serve_precision_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "c.yaml") << "memory:\n  precision_mode: fp32\n";
  {
    Child c(
        {"serve", "--model", Stories(), "--port", "0", "--precision", "f64"});
    EXPECT_EQ(c.Wait(), 1);
    EXPECT_NE(c.err().find("--precision 'f64': expected auto, f32, bf16 or "
                           "f16"),
              std::string::npos)
        << c.err();
  }
  Child c({"serve", "--model", Stories(), "--port", "0", "--config",
           (dir / "c.yaml").string(), "--precision", "bf16"});
  const int port = c.Port();
  ASSERT_GT(port, 0) << c.err();
  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(60);
  auto m = http.Get("/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(json::parse(m->body)["models"][0]["dtype"], "BF16") << m->body;
  auto h = http.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(json::parse(h->body)["config"]["memory"]["precision_mode"], "bf16");
  auto g = http.Post("/generate",
                     R"({"prompt": "Once", "max_tokens": 2, "temperature": 0})",
                     "application/json");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->status, 200) << g->body;
  kill(c.pid(), SIGTERM);
  EXPECT_EQ(c.Wait(), 0) << c.err();
  fs::remove_all(dir);
}

// `loom generate` agrees with serve: max_tokens 0 stops with "prompt" (with
// and without --hooks), an empty prompt is refused as extract and serve
// refuse it, the temperature range is serve's, and errors name CLI flags,
// not serve's YAML keys.
TEST(ServeCliTest, GenerateAgreesWithServe) {
  const std::string gen =
      "generate --model " + Stories() + " --prompt 'Once upon' ";
  for (const std::string extra :
       {"--json", "--hooks blocks.0.hook_resid_post"}) {
    SCOPED_TRACE(extra);
    const auto [code, out] = RunLoom(gen + "--max-tokens 0 " + extra);
    ASSERT_EQ(code, 0) << out;
    const json j = json::parse(out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << out;
    EXPECT_EQ(j["stop_reason"], "prompt");
    EXPECT_EQ(j["token_ids"].size(), 0u);
  }
  auto [code, out] = RunLoom("generate --model " + Stories() + " --prompt ''");
  EXPECT_EQ(code, 1);
  EXPECT_EQ(out, "loom generate: --prompt: empty text\n");
  std::tie(code, out) = RunLoom(gen + "--temperature 2.5");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(
      out.find("--temperature: got 2.5, expected a finite number in [0, 2]"),
      std::string::npos)
      << out;
  std::tie(code, out) = RunLoom(gen + "--temperature 2 --max-tokens 2");
  EXPECT_EQ(code, 0) << out;
  for (const std::string hooks : {"logits", "blocks.0.attn.hook_pattern"}) {
    SCOPED_TRACE(hooks);
    std::tie(code, out) = RunLoom(gen + "--hooks " + hooks);
    EXPECT_EQ(code, 1) << out;
    EXPECT_EQ(out.rfind("loom generate: --hooks: ", 0), 0u) << out;
    EXPECT_EQ(out.find("memory.activation_cache_filter"), std::string::npos)
        << out;
  }
}

}  // namespace
