// End-to-end test of `loom tokenize` on the bundled stories260K model.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "src/tokenizer/tokenizer.h"

namespace loom::tok {
namespace {

namespace fs = std::filesystem;

const std::string kBinary = LOOM_BINARY;
const std::string kModel = std::string(LOOM_MODELS_DIR) + "/stories260K";

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

Result RunLoom(const std::string& args) {
  Result r;
  FILE* p = popen((kBinary + " " + args + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0)
    r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class TokenizeCliTest : public testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kBinary)) {
      GTEST_SKIP() << "loom binary not built at " << kBinary
                   << ": CLI test NOT run";
    }
  }
};

TEST_F(TokenizeCliTest, JsonMatchesLibrary) {
  const Result r =
      RunLoom("tokenize " + kModel + " --text 'Hello world' --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  auto tok = Tokenizer::Load(kModel);
  ASSERT_TRUE(tok.ok());
  auto enc = (*tok)->Encode("Hello world", true);
  ASSERT_TRUE(enc.ok());
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), enc->ids);
  ASSERT_EQ(j["tokens"].size(), enc->ids.size());
  ASSERT_EQ(j["offsets"].size(), enc->ids.size());
  EXPECT_EQ(j["ids"][0], 1);  // BOS
  EXPECT_EQ(j["tokens"][0], "<s>");
  for (size_t i = 0; i < enc->ids.size(); ++i) {
    EXPECT_EQ(j["tokens"][i], (*tok)->IdToToken(enc->ids[i]));
    EXPECT_EQ(j["offsets"][i][0], enc->offsets[i].first);
    EXPECT_EQ(j["offsets"][i][1], enc->offsets[i].second);
  }
  EXPECT_EQ(j["offsets"].back()[1], 11);
}

TEST_F(TokenizeCliTest, NoSpecialDropsBos) {
  const Result r = RunLoom("tokenize " + kModel +
                           " --text 'Hello world' --json --no-special");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  ASSERT_FALSE(j["ids"].empty());
  EXPECT_NE(j["ids"][0], 1);
}

TEST_F(TokenizeCliTest, TableOutputAndFileInput) {
  const std::string path =
      (fs::path(testing::TempDir()) / "loom_cli_text.txt").string();
  std::ofstream(path) << "Once upon a time";
  const Result r = RunLoom("tokenize " + kModel + " --file " + path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"<s>\""), std::string::npos) << r.output;
}

TEST_F(TokenizeCliTest, InvalidUtf8FailsUnlessReplaced) {
  const std::string path =
      (fs::path(testing::TempDir()) / "loom_cli_bad.txt").string();
  std::ofstream(path, std::ios::binary) << "ok \xFF no";
  const Result bad = RunLoom("tokenize " + kModel + " --file " + path);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("byte offset 3"), std::string::npos) << bad.output;
  const Result fixed = RunLoom("tokenize " + kModel + " --file " + path +
                               " --replace-invalid-utf8");
  EXPECT_EQ(fixed.exit_code, 0) << fixed.output;
}

TEST_F(TokenizeCliTest, MissingModelDirFails) {
  const Result r = RunLoom("tokenize /nonexistent/model/dir --text hi");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("loom tokenize:"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace loom::tok
