// Every class of bad input of docs/design/error-model.md at the CLI boundary:
// the real `loom` binary, run on one bad input of the class, exits 1 (2 for a
// usage error), never by a signal, and prints `loom <command>: ` and a message
// naming the object (file, tensor, field, flag) and both values where the
// class has two (expected and found). Bad models are copies of the bundled
// stories260K with config.json or the safetensors header edited, so every
// test here always runs.
//
// Where each class is tested (file:Test; this file when no file is named):
//
//   usage error, exit 2
//     unknown flag, missing required     UsageErrorsExitTwo
//     flag, bad value type (every
//     command), unknown command
//     numeric flag out of its range      NumericFlagsOutOfRangeExitTwo
//     (every numeric flag of every
//     command)
//     two model directories or none      plan_cli_test.cc:PlanCli.
//     (loom plan)                          TwoDifferentModelDirsOrNone...
//   INVALID_ARGUMENT
//     hook name (site, layer)            InvalidArgumentHookNames
//     selector                           InvalidArgumentSelectors
//     size (--max-memory, --device,      InvalidArgumentSizeStrings
//     --reserve)
//     --max-memory key naming no device  InvalidArgumentMaxMemoryDevice
//     tensor shape vs config.json        InvalidArgumentTensorShape
//     config.json key of a wrong type    checkpoint_errors_test.cc:
//                                          ConfigWrongType
//   NOT_FOUND
//     model directory, config.json,      NotFound
//     tensor, input file, tokenizer,
//     compare's saved reference.json
//     manifest.json on --resume          extract_resume_test.cc:
//                                          AbsentManifestIsNotFound
//   DATA_LOSS
//     truncated safetensors              DataLossTruncatedSafetensors
//     safetensors header not JSON        DataLossCorruptSafetensorsHeader
//     config.json (or                    DataLossMalformedConfigJson
//     generation_config.json) not JSON
//     tokenizer.json not JSON            DataLossCorruptTokenizerJson
//     manifest field on --resume         extract_resume_test.cc:
//     (field, expected type, found)        CliExitsWithErrorNotCrash,
//                                          WrongTypedFieldIsDataLoss
//   OUT_OF_RANGE
//     token id outside the vocabulary    OutOfRangeTokenId
//     sequence longer than the maximum   OutOfRangeSequenceLength
//   RESOURCE_EXHAUSTED
//     --max-memory too small (plan,      ResourceExhaustedMaxMemory
//     extract)
//   UNIMPLEMENTED
//     model_type, rope type              UnimplementedModelTypeAndRope
//   UNAVAILABLE (exit 2)
//     --device cuda:N not on this        UnavailableDevice
//     machine, for every command that
//     runs a model
//   IO_ERROR
//     a directory where a file is        IoError
//     expected (input, config.json,
//     tokenizer.json, tokenizer.model,
//     generation_config.json,
//     manifest.json, reference.json,
//     model.safetensors),
//     --out under a regular file
//     serve: an address that is none,   IoErrorServeCannotBind
//     a port in use
//   HTTP mapping of loom serve           src/serve/server_test.cc:
//     400, 404, 501                        MalformedRequestsGet4xx
//     503 + Retry-After (full queue)       FullQueueGets503WithRetryAfter
//     every code                           HttpStatusOfEveryCode
//     500 (DATA_LOSS, IO_ERROR), 503 +     ErrorClassesGetTheirHttpStatus
//     Retry-After (load that cannot fit)
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "tests/golden_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::Slurp;
using testing::Spit;
using Json = nlohmann::ordered_json;
const std::string kModel = std::string(LOOM_MODELS_DIR) + "/stories260K";
const char* const kHook = "blocks.0.hook_resid_post";

struct CliResult {
  int rc = -1;  // the exit status, or 128 + the signal that ended it
  std::string out, err;
};

std::string CommandLine(const std::vector<std::string>& args) {
  std::string s = "loom";
  for (const std::string& a : args) s += " " + a;
  return s;
}

class ErrorClassesTest : public testing::TempDirTest {
 protected:
  // Runs `loom args...` with stdin from /dev/null; stdout and stderr are
  // kept.
  CliResult Loom(const std::vector<std::string>& args) {
    const std::string out_path = Path("stdout"), err_path = Path("stderr");
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int in = ::open("/dev/null", O_RDONLY);
      const int out =
          ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err =
          ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (in < 0 || out < 0 || err < 0) ::_exit(126);
      ::dup2(in, 0);
      ::dup2(out, 1);
      ::dup2(err, 2);
      std::vector<std::string> copy = args;
      std::string bin = LOOM_BINARY;
      std::vector<char*> argv = {bin.data()};
      for (std::string& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(bin.c_str(), argv.data());
      ::_exit(127);
    }
    CliResult r;
    int status = 0;
    if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return r;
    r.rc = WIFEXITED(status)     ? WEXITSTATUS(status)
           : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                 : -1;
    r.out = Slurp(out_path);
    r.err = Slurp(err_path);
    return r;
  }

  // `loom args...` fails with exit `rc`; the line of stderr holding
  // needles[0] starts with `loom <command>: ` (`loom: ` when `command` is
  // empty) and stderr holds every needle. Returns stderr.
  std::string ExpectError(const std::vector<std::string>& args, int rc,
                          const std::string& command,
                          const std::vector<std::string>& needles) {
    const CliResult r = Loom(args);
    const std::string trace = CommandLine(args) + "\nstderr:\n" + r.err;
    EXPECT_EQ(r.rc, rc) << trace;
    const std::string prefix =
        command.empty() ? "loom: " : "loom " + command + ": ";
    const size_t at = needles.empty() ? 0 : r.err.find(needles[0]);
    if (at == std::string::npos) {
      ADD_FAILURE() << "no '" << needles[0] << "' in stderr of " << trace;
    } else {
      const size_t line = r.err.rfind('\n', at);
      const size_t begin = line == std::string::npos ? 0 : line + 1;
      EXPECT_EQ(r.err.compare(begin, prefix.size(), prefix), 0)
          << "the message lacks the prefix '" << prefix << "': " << trace;
    }
    for (size_t i = 1; i < needles.size(); ++i)
      EXPECT_NE(r.err.find(needles[i]), std::string::npos)
          << "no '" << needles[i] << "' in stderr of " << trace;
    return r.err;
  }

  // A copy of the bundled model in Path(name): config.json edited by
  // `config`, model.safetensors with its header edited by `header`, the
  // tokenizer files as they are.
  std::string CopyModel(const std::string& name,
                        const std::function<void(Json&)>& config = {},
                        const std::function<void(Json&)>& header = {}) {
    const fs::path dir = dir_ / name;
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(kModel))
      if (e.is_regular_file() && e.path().extension() == ".json")
        fs::copy_file(e.path(), dir / e.path().filename());
    Json c = Json::parse(Slurp(kModel + "/config.json"));
    if (config) config(c);
    Spit((dir / "config.json").string(), c.dump(2));
    const std::string bytes = Slurp(kModel + "/model.safetensors");
    const uint64_t n = HeaderLength(bytes);
    Json h = Json::parse(bytes.substr(8, n));
    if (header) header(h);
    WriteSafetensors((dir / "model.safetensors").string(), h.dump(),
                     bytes.substr(8 + n));
    return dir.string();
  }

  static uint64_t HeaderLength(const std::string& bytes) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i)
      n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
    return n;
  }
  static void WriteSafetensors(const std::string& path,
                               const std::string& header,
                               const std::string& data) {
    std::string out(8, '\0');
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i, n >>= 8)
      out[static_cast<size_t>(i)] = static_cast<char>(n & 0xff);
    Spit(path, out + header + data);
  }

  // A JSONL input of one row.
  std::string Input(const std::string& name, const std::string& row) {
    WriteFile(name, row + "\n");
    return Path(name);
  }
  std::string TextInput() {
    return Input("in.jsonl", R"({"id": "a", "text": "Once upon a time"})");
  }
};

// CLI11's errors: exit 2 with the command's prefix and the flag.
TEST_F(ErrorClassesTest, UsageErrorsExitTwo) {
  const std::string in = TextInput(), out = Path("out");
  const std::vector<std::string> extract = {
      "extract", "--model", kModel, "--input", in, "--out", out};
  auto with = [](std::vector<std::string> base,
                 const std::vector<std::string>& more) {
    base.insert(base.end(), more.begin(), more.end());
    return base;
  };
  struct Case {
    std::vector<std::string> args;
    std::string command;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {with(extract, {"--hooks", kHook, "--bogus"}),
       "extract",
       {"not expected: --bogus"}},
      {extract, "extract", {"--hooks is required"}},
      {with(extract, {"--hooks", kHook, "--batch-tokens", "many"}),
       "extract",
       {"Could not convert: --batch-tokens = many"}},
      {{"perplexity", "--model", kModel, "--text", in, "--bogus"},
       "perplexity",
       {"not expected: --bogus"}},
      {{"perplexity", "--text", in}, "perplexity", {"--model is required"}},
      {{"perplexity", "--model", kModel, "--text", in, "--ctx", "abc"},
       "perplexity",
       {"Could not convert: --ctx = abc"}},
      {{"plan", kModel, "--bogus"}, "plan", {"not expected: --bogus"}},
      {{"plan", "--device", "cpu"}, "plan", {"no model directory"}},
      {{"plan", kModel, "--batch-tokens", "x"},
       "plan",
       {"Could not convert: --batch-tokens = x"}},
      {{"compare", "--model", kModel, "--reference", kModel, "--bogus"},
       "compare",
       {"not expected: --bogus"}},
      {{"compare", "--reference", kModel}, "compare", {"--model is required"}},
      {{"compare", "--model", kModel, "--max-windows", "x"},
       "compare",
       {"Could not convert: --max-windows = x"}},
      {{"tokenize", kModel, "--bogus"}, "tokenize", {"not expected: --bogus"}},
      {{"tokenize"}, "tokenize", {"model_dir is required"}},
      {{"tokenize", kModel, "--text", "a", "--file", in},
       "tokenize",
       {"excludes", "--text", "--file"}},
      {{"generate", "--model", kModel, "--prompt", "a", "--bogus"},
       "generate",
       {"not expected: --bogus"}},
      {{"generate", "--model", kModel},
       "generate",
       {"Exactly 1 option from [--prompt,--prompt-tokens] is required"}},
      {{"generate", "--model", kModel, "--prompt", "a", "--prompt-tokens", "1"},
       "generate",
       {"--prompt excludes --prompt-tokens"}},
      {{"generate", "--model", kModel, "--prompt", "a", "--max-tokens", "ten"},
       "generate",
       {"Could not convert: --max-tokens = ten"}},
      {{"inspect", kModel, "--bogus"}, "inspect", {"not expected: --bogus"}},
      {{"inspect"}, "inspect", {"MODEL_DIR is required"}},
      {{"inspect", kModel, "extra"}, "inspect", {"not expected: extra"}},
      {{"serve", "--bogus"}, "serve", {"not expected: --bogus"}},
      {{"serve", "--port", "abc"},
       "serve",
       {"Could not convert: --port = abc"}},
      {{}, "", {"A subcommand is required"}},
      {{"frobnicate"},
       "",
       {"unknown command 'frobnicate'", "extract", "perplexity", "serve"}},
  };
  for (const Case& c : cases) ExpectError(c.args, 2, c.command, c.needles);
  EXPECT_FALSE(fs::exists(out)) << "a usage error wrote output";
}

// Every numeric flag of every command has a range (tools/cli/flag_ranges.h);
// a value outside it is a usage error while parsing, before anything is read
// or written, naming the flag, the value and the range. Zero is inside the
// range only where it has a documented meaning (--threads 0 = all cores,
// --streaming-chunk-size 0 = off, --top-k 0 = off, --max-tokens 0,
// --kv-context 0 = none).
TEST_F(ErrorClassesTest, NumericFlagsOutOfRangeExitTwo) {
  const std::string in = TextInput(), out = Path("out");
  const std::vector<std::string> extract = {"extract", "--model", kModel,
                                            "--input", in,        "--out",
                                            out,       "--hooks", kHook};
  const std::vector<std::string> perplexity = {"perplexity", "--model", kModel,
                                               "--text", in};
  const std::vector<std::string> compare = {
      "compare", "--model", kModel, "--reference", kModel, "--text", in};
  const std::vector<std::string> generate = {"generate", "--model", kModel,
                                             "--prompt", "a"};
  const std::vector<std::string> plan = {"plan", kModel};
  const std::vector<std::string> serve = {"serve", "--model", kModel};
  const std::vector<std::string> synth = {"synth", Path("synth")};
  const std::string at_least_1 = "expected an integer >= 1";
  const std::string at_least_0 = "expected an integer >= 0";
  const std::string threads = "expected an integer in [0, 4096]";
  struct Case {
    const std::vector<std::string>* base;
    std::string flag, value, range;
  };
  const std::vector<Case> cases = {
      {&extract, "--batch-tokens", "0", at_least_1},
      {&extract, "--batch-tokens", "-1", at_least_1},
      {&extract, "--threads", "-5", threads},
      {&extract, "--threads", "100000", threads},
      {&extract, "--commit-every", "0", at_least_1},
      {&extract, "--streaming-chunk-size", "-1", at_least_0},
      {&extract, "--max-row-tokens", "-1", at_least_1},
      {&extract, "--max-row-tokens", "0", at_least_1},
      {&perplexity, "--ctx", "-4", "expected an integer >= 2"},
      {&perplexity, "--ctx", "1", "expected an integer >= 2"},
      {&perplexity, "--stride", "0", at_least_1},
      {&perplexity, "--max-windows", "-1", at_least_1},
      {&perplexity, "--max-windows", "0", at_least_1},
      {&perplexity, "--chunk-rows", "0", at_least_1},
      {&perplexity, "--threads", "-1", threads},
      {&compare, "--ctx", "0", "expected an integer >= 2"},
      {&compare, "--stride", "-3", at_least_1},
      {&compare, "--max-windows", "0", at_least_1},
      {&compare, "--chunk-rows", "-2", at_least_1},
      {&compare, "--top-k", "0", at_least_1},
      {&compare, "--threads", "-1", threads},
      {&generate, "--ctx", "-1", at_least_1},
      {&generate, "--max-tokens", "-1",
       "expected an integer in [0, 1073741824]"},
      {&generate, "--top-k", "-1", "expected an integer in [0, 1073741824]"},
      {&generate, "--top-p", "0", "expected a finite number in (0, 1]"},
      {&generate, "--top-p", "2", "expected a finite number in (0, 1]"},
      {&generate, "--temperature", "-1", "expected a finite number in [0, 2]"},
      {&generate, "--temperature", "nan", "expected a finite number in [0, 2]"},
      {&generate, "--temperature", "2.5", "expected a finite number in [0, 2]"},
      {&generate, "--seed", "-1",
       "expected an integer in [0, 18446744073709551615]"},
      {&generate, "--prefill-chunk", "0", at_least_1},
      {&generate, "--threads", "-1", threads},
      {&plan, "--ctx", "-1", at_least_1},
      {&plan, "--batch-tokens", "0", at_least_1},
      {&plan, "--seqs-per-batch", "0", at_least_1},
      {&plan, "--capture-buffers", "0", at_least_1},
      {&plan, "--logits-chunk", "-8", at_least_1},
      {&plan, "--kv-context", "-1", at_least_0},
      {&serve, "--threads", "-1", threads},
      {&serve, "--port", "70000", "expected an integer in [0, 65535]"},
      {&serve, "--port", "-5", "expected an integer in [0, 65535]"},
      {&synth, "--layers", "0", at_least_1},
      {&synth, "--vocab", "0", "expected an integer in [1, 2147483647]"},
      {&synth, "--seed", "-2",
       "expected an integer in [0, 18446744073709551615]"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = *c.base;
    args.push_back(c.flag);
    args.push_back(c.value);
    ExpectError(args, 2, args[0],
                {c.flag + ": got " + c.value + ", " + c.range});
  }
  // The alias names the option by its first name.
  ExpectError({"generate", "--model", kModel, "--prompt", "a",
               "--streaming-chunk-size", "-4"},
              2, "generate", {"--prefill-chunk: got -4, " + at_least_1});
  EXPECT_FALSE(fs::exists(out)) << "a usage error wrote output";
  EXPECT_FALSE(fs::exists(Path("synth"))) << "a usage error wrote a model";
  // The documented zeros are in range.
  const CliResult zeros =
      Loom({"generate", "--model", kModel, "--prompt", "Once", "--max-tokens",
            "0", "--top-k", "0", "--threads", "0", "--json"});
  EXPECT_EQ(zeros.rc, 0) << zeros.err;
  EXPECT_NE(zeros.out.find(R"("token_ids":[])"), std::string::npos)
      << zeros.out;
}

// `loom generate --prompt-tokens` generates from ids as given: the ids of
// the text prompt give the same tokens; a checkpoint without a tokenizer
// prints the generated ids, and refuses text naming the flag to use.
TEST_F(ErrorClassesTest, GenerateFromTokenIdsWithOrWithoutATokenizer) {
  const CliResult text = Loom({"generate", "--model", kModel, "--prompt",
                               "Once upon", "--max-tokens", "5", "--json"});
  ASSERT_EQ(text.rc, 0) << text.err;
  const Json t = Json::parse(text.out);
  std::string ids;
  for (const Json& id : t["prompt_ids"])
    ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
  const CliResult given =
      Loom({"generate", "--model", kModel, "--prompt-tokens", ids,
            "--max-tokens", "5", "--json"});
  ASSERT_EQ(given.rc, 0) << given.err;
  const Json g = Json::parse(given.out);
  EXPECT_EQ(g["token_ids"], t["token_ids"]);
  EXPECT_EQ(g["text"], t["text"]);
  EXPECT_TRUE(g["prompt"].is_null());

  const fs::path bare = dir_ / "no_tokenizer";
  fs::create_directories(bare);
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(fs::path(kModel) / f, bare / f);
  const CliResult plain = Loom({"generate", "--model", bare.string(),
                                "--prompt-tokens", ids, "--max-tokens", "5"});
  ASSERT_EQ(plain.rc, 0) << plain.err;
  std::string want;
  for (const Json& id : t["token_ids"])
    want += (want.empty() ? "" : ",") + std::to_string(id.get<int>());
  EXPECT_EQ(plain.out, want + "\n");
  ExpectError(
      {"generate", "--model", bare.string(), "--prompt", "Once"}, 1, "generate",
      {"--prompt: text needs a tokenizer, and " + bare.string() + " has none (",
       "give token ids with --prompt-tokens"});
}

// A library message that already names the command ("bench: --tokens ...",
// "generate: prompt 0 ...", shared with serve and Python) gets the CLI's
// prefix once: "loom bench: --tokens 5000 outside ...".
TEST_F(ErrorClassesTest, OnePrefixPerMessage) {
  const std::string err = ExpectError({"bench", kModel, "--tokens", "5000"}, 1,
                                      "bench", {"--tokens 5000 outside [1, "});
  EXPECT_EQ(err.find("bench: bench:"), std::string::npos) << err;
  EXPECT_NE(err.find("loom bench: --tokens 5000 outside"), std::string::npos)
      << err;
}

TEST_F(ErrorClassesTest, InvalidArgumentHookNames) {
  const std::string in = TextInput();
  const std::string typo = ExpectError(
      {"extract", "--model", kModel, "--input", in, "--out", Path("out"),
       "--hooks", "blocks.0.hook_resid_psot"},
      1, "extract",
      {"hook 'blocks.0.hook_resid_psot'", "unknown site 'hook_resid_psot'",
       "did you mean 'blocks.0.hook_resid_post'?",
       "hooks of this llama model:", "blocks.{L}.hook_resid_post",
       "ln_final.hook_normalized", "`loom hooks MODEL_DIR`"});
  EXPECT_EQ(typo.find("hook_pos_embed"), std::string::npos) << typo;
  // Only this model's hooks are listed (stories260K has no hook_pos_embed)
  // and --layers that no bare hook uses is refused.
  ExpectError(
      {"extract", "--model", kModel, "--input", in, "--out", Path("out"),
       "--hooks", "blocks.0.hook_resid_post", "--layers", "1"},
      1, "extract",
      {"--layers 1 applies to bare hook names",
       "every --hooks item names its own layer"});
  ExpectError({"extract", "--model", kModel, "--input", in, "--out",
               Path("out"), "--hooks", "blocks.9.hook_resid_post"},
              1, "extract",
              {"hook 'blocks.9.hook_resid_post'", "layer 9",
               "a model with 5 layers", "valid: 0..4 or -5..-1"});
  ExpectError({"plan", kModel, "--batch-tokens", "256", "--hooks",
               "blocks.0.hook_nope"},
              1, "plan", {"hook 'blocks.0.hook_nope'", "hooks of this llama"});
  ExpectError({"generate", "--model", kModel, "--prompt", "a", "--hooks",
               "blocks.-6.hook_resid_post"},
              1, "generate",
              {"hook 'blocks.-6.hook_resid_post'", "layer -6", "5 layers"});
  EXPECT_FALSE(fs::exists(Path("out")));
}

// A grid whose every recovery would be 0/0 is refused before loading, with
// the reason; the message carries one prefix ("loom patch: "), not two.
TEST_F(ErrorClassesTest, InvalidArgumentPatchInputs) {
  const std::vector<std::string> base = {
      "patch", "--model", kModel, "--out", Path("out"), "--hooks", kHook};
  const auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  ExpectError(run({"--clean", "", "--corrupted", "b a"}), 1, "patch",
              {"--clean: the prompt is empty"});
  ExpectError(run({"--clean", "a b", "--corrupted", "a b"}), 1, "patch",
              {"the clean and corrupted prompts are the same", "0/0"});
  ExpectError(run({"--clean-tokens", "1,403,407", "--corrupted-tokens",
                   "1,403,408", "--answer", "5", "--wrong", "5"}),
              1, "patch", {"answer and wrong are the same token 5"});
  const std::string err =
      ExpectError(run({"--clean", "a b", "--corrupted", "b a", "--hooks",
                       "blocks.0.attn.hook_pattern"}),
                  1, "patch", {"hooks: 'blocks.0.attn.hook_pattern'"});
  EXPECT_EQ(err.find("patch: patch:"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(Path("out"))) << "refused after writing";
}

TEST_F(ErrorClassesTest, InvalidArgumentSelectors) {
  const std::string in = TextInput();
  ExpectError({"extract", "--model", kModel, "--input", in, "--out",
               Path("out"), "--hooks", kHook, "--select", "lastt"},
              1, "extract", {"selector 'lastt'", "expected last, first, mean"});
  ExpectError({"extract", "--model", kModel, "--input", in, "--out",
               Path("out"), "--hooks", kHook, "--select", "span:5:2"},
              1, "extract", {"selector 'span:5:2'", "A must be < B"});
  ExpectError({"plan", kModel, "--batch-tokens", "256", "--hooks", kHook,
               "--select", "pos:1"},
              1, "plan", {"--select 'pos:1'", "expected all, last or mean"});
  ExpectError({"generate", "--model", kModel, "--prompt", "a", "--hooks", kHook,
               "--select", "median"},
              1, "generate", {"selector 'median'", "expected last"});
}

// A size string names the flag, the item and the text that is no size.
TEST_F(ErrorClassesTest, InvalidArgumentSizeStrings) {
  ExpectError(
      {"plan", kModel, "--batch-tokens", "256", "--max-memory", "0=abc"}, 1,
      "plan", {"--max-memory '0=abc'", "byte size 'abc'", "expected a number"});
  ExpectError(
      {"extract", "--model", kModel, "--input", TextInput(), "--out",
       Path("out"), "--hooks", kHook, "--device", "cpu=12XB"},
      1, "extract",
      {"--device 'cpu=12XB'", "byte size '12XB'", "unknown unit 'xb'", "GiB"});
  ExpectError({"perplexity", "--model", kModel, "--text", TextInput(),
               "--reserve", "lots"},
              1, "perplexity", {"--reserve 'lots'", "byte size 'lots'"});
  EXPECT_FALSE(fs::exists(Path("out")));
}

// A --max-memory key names a device, as accelerate's: one --device gave, or,
// with no GPU given there, the next of cuda:0..N-1 it declares. The message
// names the key and the devices known.
TEST_F(ErrorClassesTest, InvalidArgumentMaxMemoryDevice) {
  ExpectError({"plan", kModel, "--max-memory", "5=1GiB"}, 1, "plan",
              {"--max-memory 5=1GiB: no device cuda:5 among the devices "
               "given (cpu)",
               "numbered from 0", "cuda:0 is missing", "--device cuda:5=SIZE"});
  ExpectError({"plan", kModel, "--device", "cuda:0=8GiB", "--max-memory",
               "0=1GiB,1=2GiB"},
              1, "plan",
              {"--max-memory 1=2GiB: no device cuda:1 among the devices "
               "given (cuda:0, cpu)",
               "--device cuda:1=SIZE"});
  ExpectError(
      {"extract", "--model", kModel, "--input", TextInput(), "--out",
       Path("out"), "--hooks", kHook, "--max-memory", "cpu=1GiB,cuda:2=1GiB"},
      1, "extract",
      {"--max-memory cuda:2=1GiB: no device cuda:2 among the devices "
       "given (cpu)"});
  EXPECT_FALSE(fs::exists(Path("out")));
  // Budgets alone declare GPUs from 0 (README: --max-memory 0=78GiB,1=78GiB).
  const CliResult two =
      Loom({"plan", kModel, "--max-memory", "1=1GiB,0=1GiB", "--json"});
  EXPECT_EQ(two.rc, 0) << two.err;
  const Json plan = Json::parse(two.out, nullptr, false);
  ASSERT_TRUE(plan.is_object()) << two.out;
  ASSERT_GE(plan["devices"].size(), 2u) << two.out;
  EXPECT_EQ(plan["devices"][0]["name"], "cuda:1");
  EXPECT_EQ(plan["devices"][1]["name"], "cuda:0");
}

TEST_F(ErrorClassesTest, InvalidArgumentTensorShape) {
  const std::string model = CopyModel("model", {}, [](Json& h) {
    h["model.layers.0.mlp.down_proj.weight"]["shape"] = {172, 64};  // [64, 172]
  });
  const std::vector<std::string> needles = {
      "tensor model.layers.0.mlp.down_proj.weight in " + model +
          "/model.safetensors",
      "shape [172, 64] in file", "expected [64, 172] from config.json"};
  ExpectError({"extract", "--model", model, "--input", TextInput(), "--out",
               Path("out"), "--hooks", kHook},
              1, "extract", needles);
  ExpectError({"generate", "--model", model, "--prompt", "a"}, 1, "generate",
              needles);
  ExpectError({"inspect", model}, 1, "inspect", needles);
}

TEST_F(ErrorClassesTest, NotFound) {
  const std::string in = TextInput();
  // The model directory.
  const std::string nowhere = Path("nowhere");
  ExpectError({"extract", "--model", nowhere, "--input", in, "--out",
               Path("out"), "--hooks", kHook},
              1, "extract", {nowhere + "/config.json", std::strerror(ENOENT)});
  ExpectError({"plan", nowhere}, 1, "plan", {nowhere + "/config.json"});
  // config.json.
  const std::string no_config = CopyModel("no_config");
  fs::remove(no_config + "/config.json");
  ExpectError({"generate", "--model", no_config, "--prompt", "a"}, 1,
              "generate", {no_config + "/config.json", std::strerror(ENOENT)});
  // A tensor: its name, the file, and the shape declared for it.
  const std::string no_tensor = CopyModel("no_tensor", {}, [](Json& h) {
    h.erase("model.layers.3.mlp.up_proj.weight");
  });
  ExpectError({"perplexity", "--model", no_tensor, "--text", in}, 1,
              "perplexity",
              {"tensor model.layers.3.mlp.up_proj.weight",
               "missing from " + no_tensor + "/model.safetensors",
               "declares it with shape [172, 64]"});
  // The input file.
  const std::string missing = Path("missing.txt");
  ExpectError({"extract", "--model", kModel, "--input", missing, "--out",
               Path("out"), "--hooks", kHook},
              1, "extract", {"--input: " + missing, std::strerror(ENOENT)});
  ExpectError({"perplexity", "--model", kModel, "--tokens", missing}, 1,
              "perplexity", {missing, std::strerror(ENOENT)});
  // compare's saved reference.
  fs::create_directories(Path("saved"));
  ExpectError(
      {"compare", "--model", kModel, "--reference-logprobs", Path("saved"),
       "--text", in, "--ctx", "4"},
      1, "compare",
      {"--reference-logprobs: " + Path("saved") + "/reference.json: open: ",
       std::strerror(ENOENT)});
  // generation_config.json is optional: absent, the eos of config.json.
  const std::string no_gen = CopyModel("no_gen");
  fs::remove(no_gen + "/generation_config.json");
  const CliResult gen = Loom(
      {"generate", "--model", no_gen, "--prompt", "Once", "--max-tokens", "2"});
  EXPECT_EQ(gen.rc, 0) << gen.err;
  ExpectError({"tokenize", kModel, "--file", missing}, 1, "tokenize",
              {missing, std::strerror(ENOENT)});
  // The tokenizer.
  const std::string no_tokenizer = CopyModel("no_tokenizer");
  fs::remove(no_tokenizer + "/tokenizer.json");
  ExpectError({"tokenize", no_tokenizer, "--text", "a"}, 1, "tokenize",
              {no_tokenizer, "neither tokenizer.json nor tokenizer.model"});
  ExpectError({"generate", "--model", no_tokenizer, "--prompt", "a"}, 1,
              "generate",
              {no_tokenizer, "neither tokenizer.json nor tokenizer.model"});
  ExpectError({"extract", "--model", no_tokenizer, "--input", in, "--out",
               Path("out"), "--hooks", kHook},
              1, "extract",
              {"no tokenizer", no_tokenizer,
               "neither tokenizer.json nor tokenizer.model"});
}

// The file, the tensor whose bytes are cut, where they end and where the
// data now ends.
TEST_F(ErrorClassesTest, DataLossTruncatedSafetensors) {
  const std::string model = CopyModel("model");
  const std::string file = model + "/model.safetensors";
  const int64_t size = static_cast<int64_t>(fs::file_size(file));
  const int64_t data =
      size - 8 - static_cast<int64_t>(HeaderLength(Slurp(file)));
  fs::resize_file(file, static_cast<uintmax_t>(size - 100));
  const std::vector<std::string> needles = {
      file + ": tensor ", std::to_string(data) + "]",
      "run past the end of the data section (" + std::to_string(data - 100) +
          " bytes)"};
  ExpectError({"generate", "--model", model, "--prompt", "a"}, 1, "generate",
              needles);
  ExpectError({"inspect", model}, 1, "inspect", needles);
}

// The file and the position (line, column of the header) where the JSON
// breaks.
TEST_F(ErrorClassesTest, DataLossCorruptSafetensorsHeader) {
  const std::string model = CopyModel("model");
  const std::string file = model + "/model.safetensors";
  const std::string bytes = Slurp(file);
  const uint64_t n = HeaderLength(bytes);
  std::string header = bytes.substr(8, n);
  const size_t at = header.find("\"shape\"");
  ASSERT_NE(at, std::string::npos);
  header[at] = 'x';
  WriteSafetensors(file, header, bytes.substr(8 + n));
  const std::vector<std::string> needles = {
      file + ": header is not valid JSON",
      "line 1, column " + std::to_string(at + 1)};
  ExpectError({"extract", "--model", model, "--input", TextInput(), "--out",
               Path("out"), "--hooks", kHook},
              1, "extract", needles);
  ExpectError({"plan", model, "--batch-tokens", "256"}, 1, "plan", needles);
}

TEST_F(ErrorClassesTest, DataLossMalformedConfigJson) {
  const std::string model = CopyModel("model");
  Spit(model + "/config.json",
       "{\"model_type\": \"llama\",\n \"hidden_size\": 64,,\n}");
  const std::vector<std::string> needles = {
      model + "/config.json: not valid JSON", "line 2, column 20"};
  ExpectError({"inspect", model}, 1, "inspect", needles);
  ExpectError({"plan", model}, 1, "plan", needles);
  ExpectError({"perplexity", "--model", model, "--text", TextInput()}, 1,
              "perplexity", needles);
  // generation_config.json, read as config.json is.
  const std::string gen = CopyModel("gen");
  Spit(gen + "/generation_config.json", "{\"eos_token_id\": 2,,}");
  ExpectError(
      {"generate", "--model", gen, "--prompt", "a"}, 1, "generate",
      {gen + "/generation_config.json: not valid JSON", "line 1, column 20"});
}

TEST_F(ErrorClassesTest, DataLossCorruptTokenizerJson) {
  const std::string model = CopyModel("model");
  const std::string tokenizer = Slurp(model + "/tokenizer.json");
  Spit(model + "/tokenizer.json", tokenizer.substr(0, tokenizer.size() / 2));
  const std::vector<std::string> needles = {"tokenizer.json: not valid JSON",
                                            model, "parse error at line"};
  ExpectError({"tokenize", model, "--text", "a"}, 1, "tokenize", needles);
  ExpectError({"generate", "--model", model, "--prompt", "a"}, 1, "generate",
              needles);
}

// The id and the vocabulary it is outside of.
TEST_F(ErrorClassesTest, OutOfRangeTokenId) {
  WriteFile("ids.txt", "1 2 3 999 4 5");
  ExpectError(
      {"perplexity", "--model", kModel, "--tokens", Path("ids.txt"), "--ctx",
       "4"},
      1, "perplexity",
      {"token id 999 at position 3", "outside the vocabulary", "[0, 512)"});
  const std::string in =
      Input("ids.jsonl", R"({"id": "r", "tokens": [1, 2, 999]})");
  ExpectError({"extract", "--model", kModel, "--input", in, "--out",
               Path("out"), "--hooks", kHook},
              1, "extract",
              {"input row 0 (id \"r\")", "token id 999",
               "outside the vocabulary [0, 512)"});
}

// Both lengths: the sequence's and the model's maximum.
TEST_F(ErrorClassesTest, OutOfRangeSequenceLength) {
  Json row = {{"id", "long"}, {"tokens", Json::array()}};
  for (int i = 0; i < 600; ++i) row["tokens"].push_back(i == 0 ? 1 : 100);
  const std::string in = Input("long.jsonl", row.dump());
  ExpectError({"extract", "--model", kModel, "--input", in, "--out",
               Path("out"), "--hooks", kHook, "--batch-tokens", "1024"},
              1, "extract",
              {"input row 0 (id \"long\")",
               "600 tokens > max_position_embeddings 512"});
  ExpectError(
      {"perplexity", "--model", kModel, "--text", TextInput(), "--ctx", "600"},
      1, "perplexity", {"--ctx = 600", "max_position_embeddings = 512"});
  ExpectError({"generate", "--model", kModel, "--prompt", "a", "--ctx", "1000"},
              1, "generate",
              {"context of 1000 positions", "max_position_embeddings = 512"});
}

// A GPU this machine (or build) lacks, for every command that runs a model:
// exit 2 naming the device, before anything is read (the checkpoint here is
// garbage, and not reported) or written.
TEST_F(ErrorClassesTest, UnavailableDevice) {
  // cuda:0 where no GPU is visible (every CI machine); past the last GPU
  // otherwise.
  const CliResult devices = Loom({"devices"});
  int gpu = 0;
  while (devices.out.find("cuda:" + std::to_string(gpu)) != std::string::npos)
    ++gpu;
  const std::string dev = "cuda:" + std::to_string(gpu);
  const std::string model = CopyModel("garbage");
  Spit(model + "/model.safetensors", "not a safetensors file");
  const std::vector<std::string> needles = {"--device " + dev + ": no such GPU",
                                            "nothing was loaded"};
  const std::string out = Path("out");
  const std::vector<std::vector<std::string>> runs = {
      {"generate", "--model", model, "--prompt", "a", "--device", dev},
      {"generate", "--model", model, "--prompt", "a", "--hooks", kHook,
       "--device", dev},
      {"patch", "--model", model, "--clean", "a b", "--corrupted", "b a",
       "--out", out, "--device", dev},
      {"serve", "--model", model, "--port", "0", "--device", dev},
      {"perplexity", "--model", model, "--text", TextInput(), "--device", dev},
      {"extract", "--model", model, "--input", TextInput(), "--out", out,
       "--hooks", kHook, "--device", dev},
  };
  for (const std::vector<std::string>& run : runs)
    ExpectError(run, 2, run[0], needles);
  EXPECT_FALSE(fs::exists(out)) << "refused after writing";
  // A GPU declared by --max-memory alone is the same.
  ExpectError({"generate", "--model", model, "--prompt", "a", "--max-memory",
               std::to_string(gpu) + "=1GiB"},
              2, "generate", {"--max-memory " + dev + ": no such GPU"});
}

// Both byte counts: what the job needs and what the cap leaves.
TEST_F(ErrorClassesTest, ResourceExhaustedMaxMemory) {
  const std::regex both("cpu: needs [0-9.]+ (KiB|MiB), usable 100\\.00 KiB");
  std::string err = ExpectError(
      {"plan", kModel, "--batch-tokens", "256", "--max-memory", "cpu=100KiB"},
      1, "plan", {"the plan does not fit", "over by"});
  EXPECT_TRUE(std::regex_search(err, both)) << err;
  err = ExpectError(
      {"extract", "--model", kModel, "--input", TextInput(), "--out",
       Path("out"), "--hooks", kHook, "--max-memory", "cpu=100KiB"},
      1, "extract", {"the plan does not fit", "DOES NOT FIT", "over by"});
  EXPECT_TRUE(std::regex_search(err, both)) << err;
  EXPECT_FALSE(fs::exists(Path("out"))) << "refused after writing";
  // Generation and patching are planned the same way (their KV cache and
  // batches counted), and refused before loading.
  for (const std::vector<std::string>& run :
       std::vector<std::vector<std::string>>{
           {"generate", "--model", kModel, "--prompt", "a", "--max-memory",
            "cpu=100KiB"},
           {"generate", "--model", kModel, "--prompt", "a", "--hooks", kHook,
            "--max-memory", "cpu=100KiB"},
           {"patch", "--model", kModel, "--clean", "a b", "--corrupted", "b a",
            "--out", Path("out"), "--max-memory", "cpu=100KiB"}}) {
    err = ExpectError(run, 1, run[0],
                      {"the plan does not fit", "DOES NOT FIT", "over by"});
    EXPECT_TRUE(std::regex_search(err, both)) << err;
  }
  EXPECT_FALSE(fs::exists(Path("out"))) << "refused after writing";
}

// The unsupported value and what is supported.
TEST_F(ErrorClassesTest, UnimplementedModelTypeAndRope) {
  const std::string mamba =
      CopyModel("mamba", [](Json& c) { c["model_type"] = "mamba9"; });
  const std::vector<std::string> type = {
      mamba + "/config.json: model_type 'mamba9' is not supported",
      "supported: ", "llama", "qwen3"};
  ExpectError({"inspect", mamba}, 1, "inspect", type);
  ExpectError({"plan", mamba}, 1, "plan", type);
  ExpectError({"generate", "--model", mamba, "--prompt", "a"}, 1, "generate",
              type);
  const std::string rope = CopyModel("rope", [](Json& c) {
    c["rope_scaling"] = {{"rope_type", "frobnicate"}, {"factor", 2.0}};
  });
  const std::vector<std::string> rope_type = {
      rope + "/config.json: rope_scaling type 'frobnicate' is not supported",
      "llama3", "yarn"};
  ExpectError({"inspect", rope}, 1, "inspect", rope_type);
  ExpectError({"extract", "--model", rope, "--input", TextInput(), "--out",
               Path("out"), "--hooks", kHook},
              1, "extract", rope_type);
}

// OS errors name the path and carry strerror. (Tests run as root, so
// permissions block nothing: a directory where a file is expected, a
// regular file where a directory is.)
TEST_F(ErrorClassesTest, IoError) {
  const std::string is_dir = std::strerror(EISDIR);
  fs::create_directories(Path("dir"));
  const std::string dir = Path("dir");
  ExpectError({"tokenize", kModel, "--file", dir}, 1, "tokenize",
              {dir + ": read: " + is_dir});
  ExpectError({"perplexity", "--model", kModel, "--text", dir}, 1, "perplexity",
              {dir + ": read: " + is_dir});
  ExpectError({"extract", "--model", kModel, "--input", dir, "--out",
               Path("out"), "--hooks", kHook},
              1, "extract", {"--input: " + dir, is_dir});
  const std::string config_dir = CopyModel("config_dir");
  fs::remove(config_dir + "/config.json");
  fs::create_directory(config_dir + "/config.json");
  ExpectError({"inspect", config_dir}, 1, "inspect",
              {config_dir + "/config.json: read: " + is_dir});
  const std::string tokenizer_dir = CopyModel("tokenizer_dir");
  fs::remove(tokenizer_dir + "/tokenizer.json");
  fs::create_directory(tokenizer_dir + "/tokenizer.json");
  // The directory is named once, as part of the path (not "d: d/…").
  const std::string err =
      ExpectError({"tokenize", tokenizer_dir, "--text", "a"}, 1, "tokenize",
                  {tokenizer_dir + "/tokenizer.json: read: " + is_dir});
  EXPECT_EQ(err, "loom tokenize: " + tokenizer_dir +
                     "/tokenizer.json: read: " + is_dir + "\n");
  ExpectError({"tokenize", tokenizer_dir + "/", "--text", "a"}, 1, "tokenize",
              {"loom tokenize: " + tokenizer_dir + "/tokenizer.json: read: "});
  // model.safetensors, in the words of ReadFileToString.
  const std::string weights_dir = CopyModel("weights_dir");
  fs::remove(weights_dir + "/model.safetensors");
  fs::create_directory(weights_dir + "/model.safetensors");
  for (const std::string command : {"inspect", "plan"})
    ExpectError({command, weights_dir}, 1, command,
                {weights_dir + "/model.safetensors: read: " + is_dir});
  ExpectError({"generate", "--model", weights_dir, "--prompt", "a"}, 1,
              "generate",
              {weights_dir + "/model.safetensors: read: " + is_dir});
  const std::string in = TextInput();
  ExpectError({"extract", "--model", kModel, "--input", in, "--out",
               in + "/out", "--hooks", kHook},
              1, "extract", {"--out " + in + "/out", std::strerror(ENOTDIR)});
  // Every other file read whole: tokenizer.model (SentencePiece, read when
  // tokenizer.json is absent), generation_config.json (optional, but not
  // when unreadable), extract's manifest.json on --resume, compare's saved
  // reference.json.
  const std::string spm_dir = CopyModel("spm_dir");
  fs::remove(spm_dir + "/tokenizer.json");
  fs::create_directory(spm_dir + "/tokenizer.model");
  ExpectError({"tokenize", spm_dir, "--text", "a"}, 1, "tokenize",
              {spm_dir + "/tokenizer.model: read: " + is_dir});
  const std::string gen_dir = CopyModel("gen_dir");
  fs::remove(gen_dir + "/generation_config.json");
  fs::create_directory(gen_dir + "/generation_config.json");
  ExpectError({"generate", "--model", gen_dir, "--prompt", "a"}, 1, "generate",
              {gen_dir + "/generation_config.json: read: " + is_dir});
  fs::create_directories(Path("job/manifest.json"));
  ExpectError({"extract", "--model", kModel, "--input", in, "--out",
               Path("job"), "--hooks", kHook, "--resume"},
              1, "extract",
              {"--resume: " + Path("job") + "/manifest.json: read: " + is_dir});
  fs::create_directories(Path("saved/reference.json"));
  ExpectError({"compare", "--model", kModel, "--reference-logprobs",
               Path("saved"), "--text", in, "--ctx", "4"},
              1, "compare",
              {"--reference-logprobs: " + Path("saved") +
               "/reference.json: read: " + is_dir});
}

// Why `loom serve` cannot listen, as the OS says it: getaddrinfo's error for
// a host that is no address, bind(2)'s for a port in use.
TEST_F(ErrorClassesTest, IoErrorServeCannotBind) {
  ExpectError(
      {"serve", "--model", kModel, "--host", "999.1.1.1", "--port", "8089"}, 1,
      "serve", {"cannot bind 999.1.1.1:8089: getaddrinfo: "});
  ExpectError(
      {"serve", "--model", kModel, "--host", "999.1.1.1", "--port", "0"}, 1,
      "serve", {"cannot bind 999.1.1.1 to a free port: getaddrinfo: "});
  // A port this test holds.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), len), 0)
      << std::strerror(errno);
  ASSERT_EQ(::listen(fd, 1), 0) << std::strerror(errno);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  ExpectError(
      {"serve", "--model", kModel, "--host", "127.0.0.1", "--port", port}, 1,
      "serve",
      {"cannot bind 127.0.0.1:" + port +
       ": bind: " + std::strerror(EADDRINUSE)});
  ::close(fd);
}

}  // namespace
}  // namespace loom
