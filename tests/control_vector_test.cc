// llama.cpp control vectors through the CLI (src/model/control_vectors.h):
// `--control-vector F.gguf` is the same edit as `--steer
// blocks.N.hook_resid_post=direction_N.npy*1` for each tensor direction.N,
// byte for byte; --control-vector-scaled scales a file and several files are
// summed; --control-vector-layer-range keeps layers A..B; direction.0, a
// layer beyond the model, a wrong width, a missing file and a file that is
// not GGUF are refused with messages naming the file and the values. The
// model is the bundled stories260K (hidden size 64, 5 layers).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/io/npy.h"
#include "src/io/safetensors_writer.h"
#include "tests/golden_util.h"

namespace loom {
namespace {

constexpr int64_t kHidden = 64;
const std::string kModel = std::string(LOOM_MODELS_DIR) + "/stories260K";

using testing::RunShell;

void PutU(std::string& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out += static_cast<char>(v >> (8 * i));
}
void PutStr(std::string& out, const std::string& s) {
  PutU(out, s.size(), 8);
  out += s;
}

// A GGUF v3 control-vector file as cvector-generator writes one: metadata
// general.architecture = "controlvector", one f32 tensor per entry.
std::string ControlVectorBytes(
    const std::map<std::string, std::vector<float>>& tensors) {
  std::string out = "GGUF";
  PutU(out, 3, 4);
  PutU(out, tensors.size(), 8);
  PutU(out, 1, 8);
  PutStr(out, "general.architecture");
  PutU(out, 8, 4);  // string
  PutStr(out, "controlvector");
  uint64_t offset = 0;
  for (const auto& [name, v] : tensors) {
    PutStr(out, name);
    PutU(out, 1, 4);
    PutU(out, v.size(), 8);
    PutU(out, 0, 4);  // F32
    PutU(out, offset, 8);
    offset += (v.size() * 4 + 31) / 32 * 32;
  }
  out.resize((out.size() + 31) / 32 * 32, '\0');
  for (const auto& [name, v] : tensors) {
    for (float f : v) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      PutU(out, u, 4);
    }
    out.resize((out.size() + 31) / 32 * 32, '\0');
  }
  return out;
}

// A deterministic vector of the model's width.
std::vector<float> Vec(int seed, int64_t n = kHidden) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i] = 0.05f * static_cast<float>((i * 7 + seed * 13) % 17) - 0.4f;
  return v;
}

class ControlVectorTest : public testing::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    WriteFile("rows.jsonl",
              "{\"tokens\": [1, 403, 22, 91, 300, 7, 250]}\n"
              "{\"tokens\": [1, 12, 480]}\n");
  }
  std::string Gguf(const std::string& name,
                   const std::map<std::string, std::vector<float>>& t) {
    WriteFile(name, ControlVectorBytes(t));
    return Path(name);
  }
  std::string Npy(const std::string& name, const std::vector<float>& v) {
    auto w = NpyWriter::Create(Path(name), DType::kF32,
                               {static_cast<int64_t>(v.size())});
    EXPECT_TRUE(w.ok()) << w.status().message();
    if (!w.ok()) return "";
    EXPECT_TRUE((*w)->AppendRows(v.data(), 1).ok());
    EXPECT_TRUE((*w)->Commit().ok());
    EXPECT_TRUE((*w)->Close().ok());
    return Path(name);
  }
  // `loom extract` of the rows with `flags` into `out`; its exit code and
  // output in `log`.
  int Extract(const std::string& out, const std::string& flags,
              std::string* log) {
    const std::string cmd = std::string(LOOM_BINARY) + " extract --model " +
                            kModel + " --input " + Path("rows.jsonl") +
                            " --out " + Path(out) +
                            " --select all --precision f32 --quiet --hooks "
                            "'blocks.*.hook_resid_post' logits " +
                            flags;
    return RunShell(cmd, log);
  }
  // Extracts with each of the two flag sets and expects identical outputs.
  void ExpectSameOutputs(const std::string& a, const std::string& b) {
    std::string log;
    ASSERT_EQ(Extract("a", a, &log), 0) << a << "\n" << log;
    ASSERT_EQ(Extract("b", b, &log), 0) << b << "\n" << log;
    for (const char* f : {"logits.all.npy", "blocks.1.hook_resid_post.all.npy",
                          "blocks.4.hook_resid_post.all.npy"}) {
      const std::string x = testing::Slurp(Path("a") + "/" + f);
      EXPECT_FALSE(x.empty()) << f;
      EXPECT_EQ(x, testing::Slurp(Path("b") + "/" + f)) << f;
    }
    std::filesystem::remove_all(Path("a"));
    std::filesystem::remove_all(Path("b"));
  }
  std::string Steer(int layer, const std::string& npy) {
    return " --steer blocks." + std::to_string(layer) +
           ".hook_resid_post=" + npy + "*1";
  }
};

TEST_F(ControlVectorTest, IsTheSteeringVectorAtEachLayersOutput) {
  const std::string cv =
      Gguf("cv.gguf", {{"direction.1", Vec(1)}, {"direction.3", Vec(3)}});
  ExpectSameOutputs(
      "--control-vector " + cv,
      Steer(1, Npy("v1.npy", Vec(1))) + Steer(3, Npy("v3.npy", Vec(3))));
  // And it changes the outputs.
  std::string log;
  ASSERT_EQ(Extract("none", "", &log), 0) << log;
  ASSERT_EQ(Extract("cv", "--control-vector " + cv, &log), 0) << log;
  EXPECT_NE(testing::Slurp(Path("none") + "/logits.all.npy"),
            testing::Slurp(Path("cv") + "/logits.all.npy"));
  EXPECT_EQ(
      testing::Slurp(Path("none") + "/blocks.1.hook_resid_post.all.npy").size(),
      testing::Slurp(Path("cv") + "/blocks.1.hook_resid_post.all.npy").size());
  // The manifest records them as interventions.
  const nlohmann::json m = testing::ReadJson(Path("cv") + "/manifest.json");
  EXPECT_NE(m.dump().find("blocks.3.hook_resid_post"), std::string::npos)
      << m.dump();
}

// --steer HOOK=FILE#TENSOR reads one tensor of a GGUF or .safetensors file:
// the same bytes as the .npy of that vector.
TEST_F(ControlVectorTest, SteerReadsOneTensorOfAGgufOrSafetensorsFile) {
  const std::vector<float> v1 = Vec(1), v3 = Vec(3), other = Vec(7);
  const std::string cv =
      Gguf("cv.gguf", {{"direction.1", v1}, {"direction.3", Vec(9)}});
  SafetensorsWriter w;
  ASSERT_TRUE(
      w.Add("layer3", DType::kF32, {kHidden}, v3.data(), 4 * kHidden).ok());
  ASSERT_TRUE(
      w.Add("other", DType::kF32, {1, kHidden}, other.data(), 4 * kHidden)
          .ok());
  ASSERT_TRUE(w.Write(Path("v.safetensors")).ok());
  ExpectSameOutputs(Steer(1, Npy("v1.npy", v1)) + Steer(3, Npy("v3.npy", v3)),
                    Steer(1, cv + "#direction.1") +
                        Steer(3, Path("v.safetensors") + "#layer3"));
  std::string log;
  EXPECT_NE(Extract("bad", Steer(1, cv), &log), 0);
  EXPECT_NE(log.find("holds 2 tensors; name one with `tensor` (FILE#TENSOR on "
                     "the command line): direction.1, direction.3"),
            std::string::npos)
      << log;
  EXPECT_NE(Extract("bad2", Steer(1, Path("v.safetensors") + "#layer9"), &log),
            0);
  EXPECT_NE(log.find("has no tensor 'layer9'"), std::string::npos) << log;
}

TEST_F(ControlVectorTest, ScaledFilesAreSummedPerLayer) {
  const std::vector<float> a1 = Vec(1), a2 = Vec(2), b2 = Vec(5), b4 = Vec(4);
  const std::string a =
      Gguf("a.gguf", {{"direction.1", a1}, {"direction.2", a2}});
  const std::string b =
      Gguf("b.gguf", {{"direction.2", b2}, {"direction.4", b4}});
  std::vector<float> s1(kHidden), s2(kHidden), s4(kHidden);
  for (int64_t i = 0; i < kHidden; ++i) {
    s1[i] = a1[i] * 2.0f;
    s2[i] = a2[i] * 2.0f + b2[i] * -0.5f;
    s4[i] = b4[i] * -0.5f;
  }
  ExpectSameOutputs("--control-vector-scaled " + a +
                        " 2 --control-vector-scaled " + b + " -0.5",
                    Steer(1, Npy("s1.npy", s1)) + Steer(2, Npy("s2.npy", s2)) +
                        Steer(4, Npy("s4.npy", s4)));
  // --control-vector is scale 1, and mixes with the scaled form.
  std::vector<float> t2(kHidden);
  for (int64_t i = 0; i < kHidden; ++i) t2[i] = a2[i] + b2[i] * 3.0f;
  ExpectSameOutputs(
      "--control-vector " + a + " --control-vector-scaled " + b + " 3",
      Steer(1, Npy("t1.npy", a1)) + Steer(2, Npy("t2.npy", t2)) +
          Steer(4, Npy("t4.npy", [&] {
                  std::vector<float> v(kHidden);
                  for (int64_t i = 0; i < kHidden; ++i) v[i] = b4[i] * 3.0f;
                  return v;
                }())));
}

TEST_F(ControlVectorTest, LayerRangeKeepsLayersAToBInclusive) {
  std::map<std::string, std::vector<float>> t;
  for (int l = 1; l <= 4; ++l) t["direction." + std::to_string(l)] = Vec(l);
  const std::string cv = Gguf("cv.gguf", t);
  ExpectSameOutputs(
      "--control-vector " + cv + " --control-vector-layer-range 2 3",
      Steer(2, Npy("v2.npy", Vec(2))) + Steer(3, Npy("v3.npy", Vec(3))));
  // As in llama.cpp, a start <= 0 is layer 1 and an end <= 0 the last.
  ExpectSameOutputs(
      "--control-vector " + cv + " --control-vector-layer-range 0 2",
      Steer(1, Npy("v1.npy", Vec(1))) + Steer(2, Npy("v2.npy", Vec(2))));
  std::string log;
  EXPECT_NE(
      Extract("bad",
              "--control-vector " + cv + " --control-vector-layer-range 3 2",
              &log),
      0);
  EXPECT_NE(log.find("--control-vector-layer-range 3 2: the start (layer 3) "
                     "is after the end (layer 2)"),
            std::string::npos)
      << log;
}

TEST_F(ControlVectorTest, PerplexityTakesTheSameFlags) {
  WriteFile("toks.txt", "1 403 22 91 300 7 250 12 480 33 64 128 5");
  const std::string cv = Gguf("cv.gguf", {{"direction.2", Vec(2)}});
  const std::string common = std::string(LOOM_BINARY) + " perplexity --model " +
                             kModel + " --tokens " + Path("toks.txt") +
                             " --json --quiet";
  std::string with_cv, with_steer, none;
  ASSERT_EQ(RunShell(common + " --control-vector " + cv, &with_cv), 0)
      << with_cv;
  ASSERT_EQ(RunShell(common + Steer(2, Npy("v2.npy", Vec(2))), &with_steer), 0)
      << with_steer;
  ASSERT_EQ(RunShell(common, &none), 0) << none;
  auto ppl = [](const std::string& out) {
    const size_t brace = out.find('{');
    const nlohmann::json j =
        brace == std::string::npos
            ? nlohmann::json()
            : nlohmann::json::parse(out.substr(brace), nullptr, false);
    return j.is_object() && j.contains("perplexity")
               ? j["perplexity"].get<double>()
               : -1.0;
  };
  EXPECT_GT(ppl(with_cv), 0.0) << with_cv;
  EXPECT_EQ(ppl(with_cv), ppl(with_steer));
  EXPECT_NE(ppl(with_cv), ppl(none));
  for (const char* command : {"compare", "generate"}) {
    std::string help;
    RunShell(std::string(LOOM_BINARY) + " " + command + " --help", &help);
    for (const char* flag : {"--control-vector ", "--control-vector-scaled",
                             "--control-vector-layer-range"})
      EXPECT_NE(help.find(flag), std::string::npos) << command << " " << flag;
  }
}

// Runs extract with `flags`, expects failure and `needle` in the output.
#define EXPECT_REFUSED(flags, needle)                                        \
  do {                                                                       \
    std::string log;                                                         \
    EXPECT_NE(Extract("refused", flags, &log), 0) << flags;                  \
    EXPECT_NE(log.find(needle), std::string::npos) << needle << "\n" << log; \
  } while (0)

TEST_F(ControlVectorTest, BadFilesAreRefusedNamingFileTensorAndValues) {
  const std::string zero =
      Gguf("zero.gguf", {{"direction.0", Vec(0)}, {"direction.1", Vec(1)}});
  EXPECT_REFUSED("--control-vector " + zero,
                 zero +
                     ": tensor 'direction.0': layer 0 gets no control "
                     "vector");
  const std::string deep = Gguf("deep.gguf", {{"direction.5", Vec(5)}});
  EXPECT_REFUSED("--control-vector " + deep,
                 deep +
                     ": tensor 'direction.5': layer 5 is outside the "
                     "model's 5 layers (0 to 4)");
  const std::string narrow = Gguf("narrow.gguf", {{"direction.2", Vec(2, 32)}});
  EXPECT_REFUSED("--control-vector " + narrow,
                 narrow +
                     ": tensor 'direction.2' has width 32 but the "
                     "model's hidden_size is 64");
  const std::string other = Gguf("other.gguf", {{"token_embd", Vec(1)}});
  EXPECT_REFUSED("--control-vector " + other,
                 other +
                     ": tensor 'token_embd' is not a control-vector "
                     "direction");
  EXPECT_REFUSED("--control-vector " + Path("missing.gguf"),
                 Path("missing.gguf"));
  WriteFile("bad.gguf", "GGML" + std::string(60, '\0'));
  EXPECT_REFUSED("--control-vector " + Path("bad.gguf"),
                 Path("bad.gguf") + ": not a GGUF file: magic 'GGML'");
  WriteFile("short.gguf",
            ControlVectorBytes({{"direction.1", Vec(1)}}).substr(0, 100));
  EXPECT_REFUSED("--control-vector " + Path("short.gguf"),
                 Path("short.gguf") + ": truncated");
  const std::string ok = Gguf("ok.gguf", {{"direction.1", Vec(1)}});
  EXPECT_REFUSED("--control-vector-scaled " + ok + " big",
                 "--control-vector-scaled " + ok +
                     " big: the scale is not a finite number");
}

}  // namespace
}  // namespace loom
