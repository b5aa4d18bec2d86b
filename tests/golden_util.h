// Helpers for tests that compare Loom's outputs with reference outputs from
// Hugging Face transformers (golden files): locating them, reading tensors,
// capturing activations, and tolerance checks that report where they fail.
#ifndef LOOM_TESTS_GOLDEN_UTIL_H_
#define LOOM_TESTS_GOLDEN_UTIL_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/io/safetensors.h"
#include "src/runtime/executor.h"

namespace loom::testing {

// The shared golden directory beside the repository, or "" if absent.
std::string SharedGoldenDir();

// A constructed test model and its float64 reference, in the repository
// (tests/data/constructed/<name>, make_goldens.py there).
std::string ConstructedModelDir(const std::string& name);

// The names of the shared tiny golden models (<shared>/tiny/<name>) whose
// architecture Loom runs, sorted. The others (architectures the shared data
// has ahead of Loom) are named on stderr, loudly, and not returned.
std::vector<std::string> RunnableTinyModels(const std::string& shared);

// A model of a parameterised test: bundled under models/, or one of the
// shared tiny golden models.
struct ModelCase {
  std::string name;
  bool bundled = false;
};
// models/<name> or <shared>/golden/tiny/<name>.
std::string ModelCaseDir(const ModelCase& m);

// Every hook `c` has: the embeddings (and learned positions), every layer
// site that exists in each layer (CheckHookExists; attn.hook_pattern only
// `with_pattern`), the final norm and the logits.
HookSet EveryHookOf(const ModelConfig& c, bool with_pattern);
// Bundled golden data inside the repository (always present).
std::string BundledGoldenDir();

nlohmann::json ReadJson(const std::string& path);

// A golden safetensors file: tensors as f32 (int64 inputs as int32 ids).
class GoldenFile {
 public:
  static std::unique_ptr<GoldenFile> Open(const std::string& path);
  bool Has(const std::string& name) const;
  std::vector<float> F32(const std::string& name, Shape* shape = nullptr) const;
  std::vector<int32_t> Ids(const std::string& name,
                           Shape* shape = nullptr) const;

 private:
  std::unique_ptr<SafetensorsFile> file_;
};

// Stores every delivered hook as a dense [T, cols] f32 array (patterns as
// [heads, L, L] per sequence, keyed by sequence).
class CaptureSink : public HookSink {
 public:
  Status OnActivation(const HookPoint& hook, const Batch& batch, int64_t seq,
                      int64_t row_begin, const ActivationView& view) override;
  struct Tensor {
    std::vector<float> data;
    int64_t cols = 0;
  };
  const Tensor& Get(const HookPoint& h, int64_t seq = -1) const;
  bool Has(const HookPoint& h, int64_t seq = -1) const;

 private:
  std::map<std::pair<HookPoint, int64_t>, Tensor> tensors_;
};

struct CompareResult {
  bool ok = true;
  double max_abs_err = 0;
  int64_t worst_index = -1;
  std::string message;
};
// |a - b| <= atol + rtol |b| elementwise (b = expected).
CompareResult Compare(const float* actual, const float* expected, int64_t n,
                      double atol, double rtol);

// The attribution goldens' rule (golden/attribution/README.md), elementwise:
// |got - want| <= max(atol_abs, atol_rel max|want|) + rtol |want|; the first
// five failures are reported, naming `what`, the index and both values.
template <typename T>
void ExpectWithinAttributionRule(const std::vector<T>& got,
                                 const std::vector<float>& want,
                                 double atol_abs, double atol_rel, double rtol,
                                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double mx = 0;
  for (float v : want) mx = std::max(mx, std::abs(double{v}));
  const double atol = std::max(atol_abs, atol_rel * mx);
  int failures = 0;
  for (size_t i = 0; i < got.size() && failures < 5; ++i) {
    const double g = static_cast<double>(got[i]), w = want[i];
    if (!(std::abs(g - w) <= atol + rtol * std::abs(w))) {
      ++failures;
      ADD_FAILURE() << what << "[" << i << "]: loom " << g << ", HF " << w;
    }
  }
}

// log_softmax(logits[t])[ids[t+1]] for t = 0..T-2, in double.
std::vector<double> LogprobNext(const float* logits, int64_t T, int64_t V,
                                const int32_t* ids);

// Runs a shell command with stderr merged into stdout; returns its exit code
// and, when `out` is given, the output.
int RunShell(const std::string& cmd, std::string* out = nullptr);

// A whole file's bytes ("" when it cannot be read).
inline std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Writes `bytes` as the whole file.
inline void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Every file of a directory: name -> bytes.
inline std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    files[e.path().filename().string()] = Slurp(e.path().string());
  return files;
}

// A fixture with a fresh directory per test, named after the process and
// the test, removed afterwards; Path() and WriteFile() work inside it.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("loom_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const {
    return (dir_ / name).string();
  }
  void WriteFile(const std::string& name, const std::string& content) {
    std::ofstream(Path(name), std::ios::binary) << content;
  }
  std::filesystem::path dir_;
};

}  // namespace loom::testing

#endif  // LOOM_TESTS_GOLDEN_UTIL_H_
