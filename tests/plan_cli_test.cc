// `loom plan` end to end: the table, the JSON, the exit code when a plan does
// not fit, planning from config.json + index alone.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Result {
  int rc = -1;
  std::string out;
};

// Runs `loom <command> <args>`: stdout only, or stdout and stderr.
Result RunLoom(const std::string& command, const std::string& args,
               bool with_stderr) {
  Result r;
  const std::string cmd = std::string(LOOM_BINARY) + " " + command + " " +
                          args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

Result Loom(const std::string& args) { return RunLoom("plan", args, false); }

std::string Dir(const std::string& name) {
  return std::string(LOOM_TESTDATA_DIR) + "/configs/" + name;
}

TEST(PlanCli, JsonFromConfigAndIndexAloneCountsStoredBytes) {
  // gpt-oss-20b: MXFP4 experts as stored U8; the index's total_size exactly,
  // with the storage read from config.json (no --assume-dtype).
  const Result r = Loom(Dir("gpt-oss-20b") +
                        " --device cuda:0=80GiB --batch-tokens 1024 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j.at("fits").get<bool>());
  int64_t weights = 0;
  for (const auto& d : j.at("devices")) {
    EXPECT_TRUE(d.contains("name"));
    EXPECT_TRUE(d.contains("capacity_bytes"));
    EXPECT_TRUE(d.contains("total_bytes"));
    EXPECT_TRUE(d.contains("layers"));
    weights += d.at("weights_bytes").get<int64_t>();
  }
  EXPECT_EQ(weights, 13'761'264'768);
  EXPECT_EQ(j.at("weights").at("index_total_size").get<int64_t>(),
            13'761'264'768);
  EXPECT_EQ(j.at("weights").at("quantization"), "mxfp4");
  // The table names the format in its header line.
  const Result table =
      Loom(Dir("gpt-oss-20b") + " --device cuda:0=80GiB --batch-tokens 1024");
  ASSERT_EQ(table.rc, 0) << table.out;
  EXPECT_NE(table.out.find(", mxfp4"), std::string::npos) << table.out;
  EXPECT_EQ(j.at("devices")[0].at("name"), "cuda:0");
  EXPECT_EQ(j.at("devices")[0].at("capacity_bytes").get<int64_t>(),
            int64_t{80} << 30);
  EXPECT_EQ(j.at("devices")[0].at("layers").size(), 24u);
}

TEST(PlanCli, TableForTwoGpusWithMaxMemory) {
  const Result r =
      Loom(Dir("Llama-3.1-70B") +
           " --max-memory 0=78GiB,1=78GiB --reserve 1GiB --batch-tokens 2048");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("cuda:0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cuda:1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("headroom"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nfits\n"), std::string::npos) << r.out;
}

TEST(PlanCli, DoesNotFitExitsNonZeroWithBreakdownAndSuggestions) {
  const Result r =
      Loom(Dir("Llama-3.1-70B") + " --device cuda:0=80GiB --batch-tokens 2048");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("DOES NOT FIT"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("over by"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("would fit with:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--device disk"), std::string::npos) << r.out;
  const Result j = Loom(Dir("Llama-3.1-70B") + " --device cuda:0=80GiB --json");
  EXPECT_EQ(j.rc, 1);
  EXPECT_FALSE(nlohmann::json::parse(j.out).at("fits").get<bool>());
}

// --offload: the layers that do not fit the GPU stay in host memory and run
// on the GPU (its stream term); without a GPU the flag is refused by name.
TEST(PlanCli, OffloadPutsTheRestOnTheHostComputedOnTheGpu) {
  const std::string args = Dir("Llama-3.1-70B") +
                           " --device cuda:0=80GiB --device cpu=512GiB "
                           "--batch-tokens 2048 --offload";
  const Result j = Loom(args + " --json");
  ASSERT_EQ(j.rc, 0) << j.out;
  const nlohmann::json p = nlohmann::json::parse(j.out);
  EXPECT_TRUE(p.at("fits").get<bool>());
  EXPECT_TRUE(p.at("offload").get<bool>());
  const auto& gpu = p.at("devices")[0];
  const auto& host = p.at("devices")[1];
  EXPECT_EQ(gpu.at("name"), "cuda:0");
  EXPECT_EQ(host.at("name"), "cpu");
  const int64_t offloaded = gpu.at("offloaded_layers").get<int64_t>();
  EXPECT_GT(offloaded, 0);
  EXPECT_EQ(host.at("layers").size(), static_cast<size_t>(offloaded));
  EXPECT_GT(gpu.at("stream_bytes").get<int64_t>(), 0);
  EXPECT_EQ(host.at("activations_bytes").get<int64_t>(), 0);
  const Result table = Loom(args);
  ASSERT_EQ(table.rc, 0) << table.out;
  EXPECT_NE(table.out.find("offloaded from host"), std::string::npos)
      << table.out;
  const Result none =
      RunLoom("plan", Dir("Llama-3.1-70B") + " --device cpu --offload", true);
  EXPECT_NE(none.rc, 0);
  EXPECT_NE(none.out.find("--offload"), std::string::npos) << none.out;
}

TEST(PlanCli, SolveMaxBatchTokens) {
  const Result r = Loom(Dir("Qwen3-30B-A3B") +
                        " --device cuda:0=80GiB --device cpu=512GiB --hooks "
                        "hook_resid_post --solve max-batch-tokens "
                        "--ctx 2048 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_GT(j.at("solve").at("value").get<int64_t>(), 2048);
  EXPECT_EQ(j.at("job").at("batch_tokens"), j.at("solve").at("value"));
}

// Left out, --batch-tokens (2048) and --ctx (the batch tokens) follow the
// model: stories260K holds 512 positions, so `loom plan stories260K` plans
// 512 tokens rather than failing on a --ctx nobody gave, and the job line
// says what was used. A --batch-tokens above the positions packs sequences of
// at most 512; a --ctx given beyond them is refused by name.
TEST(PlanCli, DefaultsFollowTheModelsPositions) {
  const std::string model = std::string(LOOM_MODELS_DIR) + "/stories260K";
  const Result plain = RunLoom("plan", model, true);
  EXPECT_EQ(plain.rc, 0) << plain.out;
  EXPECT_NE(plain.out.find("job: analysis, 512 batch tokens, context 512, 1 "
                           "sequence(s)/batch"),
            std::string::npos)
      << plain.out;
  const Result gen = RunLoom("plan", model + " --mode generation --json", true);
  ASSERT_EQ(gen.rc, 0) << gen.out;
  const nlohmann::json j = nlohmann::json::parse(gen.out);
  EXPECT_EQ(j.at("job").at("batch_tokens"), 512);
  EXPECT_EQ(j.at("job").at("context"), 512);
  const Result packed = RunLoom("plan", model + " --batch-tokens 4096", true);
  EXPECT_EQ(packed.rc, 0) << packed.out;
  EXPECT_NE(packed.out.find("4096 batch tokens, context 512, 8 "
                            "sequence(s)/batch"),
            std::string::npos)
      << packed.out;
  const Result solved = RunLoom(
      "plan", model + " --solve max-batch-tokens --device cpu=64MiB", true);
  EXPECT_EQ(solved.rc, 0) << solved.out;
  EXPECT_NE(solved.out.find("context 512,"), std::string::npos) << solved.out;
  const Result given = RunLoom("plan", model + " --ctx 600", true);
  EXPECT_EQ(given.rc, 1) << given.out;
  EXPECT_NE(given.out.find("loom plan: --ctx = 600 exceeds "
                           "max_position_embeddings = 512"),
            std::string::npos)
      << given.out;
}

TEST(PlanCli, UnsupportedArchitectureNamesTheSupportedOnes) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("loom_plan_cli_mamba_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json")
      << R"({"model_type": "mamba", "hidden_size": 64})";
  const Result r = Loom(dir.string() + " --device cuda:0=80GiB");
  EXPECT_EQ(r.rc, 1);
  const std::string cmd =
      std::string(LOOM_BINARY) + " plan " + dir.string() + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096];
  std::string err;
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) err.append(buf, n);
  pclose(p);
  EXPECT_NE(err.find("not supported; supported:"), std::string::npos) << err;
  // Architectures that are only planned are not offered as runnable.
  const std::string runnable = err.substr(0, err.find(" (planned"));
  EXPECT_EQ(runnable.find("gemma3,"), std::string::npos) << err;
  EXPECT_NE(runnable.find("gemma3_text"), std::string::npos) << err;
  EXPECT_NE(err.find("not yet run: gemma3)"), std::string::npos) << err;
  std::filesystem::remove_all(dir);
}

// DeepSeek-V3 (671B, FP8 block-scaled) plans from its config.json alone and
// says what it would need.
TEST(PlanCli, DeepSeekV3PlansFromItsConfig) {
  const Result r =
      RunLoom("plan", Dir("DeepSeek-V3") + " --device cuda:0=80GiB", true);
  EXPECT_EQ(r.rc, 1) << r.out;  // does not fit one 80 GiB GPU
  EXPECT_NE(r.out.find("model deepseek_v3: 61 layers"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("from config.json only, fp8-block[128x128]"),
            std::string::npos)
      << r.out;
}

// `loom hooks`: every hook of the model with the shape one prompt captures,
// in execution order; `--hooks '*'` plans exactly those hooks.
TEST(HooksCli, ListsEveryHookOfTheModelAndStarPlansThem) {
  const std::string model = std::string(LOOM_MODELS_DIR) + "/stories260K";
  const Result r = RunLoom("hooks", model + " --json", false);
  ASSERT_EQ(r.rc, 0) << r.out;
  const nlohmann::json list = nlohmann::json::parse(r.out);
  // stories260K: 5 layers x 16 sites (no post norms, no MoE, no learned
  // positions) + hook_embed + ln_final + logits.
  ASSERT_EQ(list.size(), 5u * 16 + 3) << r.out;
  EXPECT_EQ(list.front()["name"], "hook_embed");
  EXPECT_EQ(list.back()["name"], "logits");
  std::vector<std::string> names;
  for (const auto& h : list) names.push_back(h["name"]);
  for (const char* want :
       {"blocks.0.attn.hook_pattern", "blocks.4.hook_resid_post",
        "blocks.2.mlp.hook_post", "ln_final.hook_normalized"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  for (const char* absent : {"hook_pos_embed",
                             "blocks.0.ln1_post.hook_"
                             "normalized",
                             "blocks.0.mlp.hook_router_logits"})
    EXPECT_EQ(std::find(names.begin(), names.end(), absent), names.end())
        << absent;
  EXPECT_EQ(list[1]["shape"], "[T, 64]");
  const Result text = RunLoom("hooks", model, false);
  EXPECT_NE(text.out.find("blocks.0.attn.hook_pattern"), std::string::npos);
  EXPECT_NE(text.out.find("[8, T, T]"), std::string::npos) << text.out;
  // '*' plans every one of them.
  const Result plan =
      RunLoom("plan", model + " --hooks '*' --batch-tokens 64 --json", false);
  ASSERT_EQ(plan.rc, 0) << plan.out;
  EXPECT_EQ(nlohmann::json::parse(plan.out)["job"]["hooks"], list.size());
  // A missing model directory is an error naming it.
  const Result bad = RunLoom("hooks", "/nonexistent/model", true);
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.out.find("/nonexistent/model"), std::string::npos) << bad.out;
}

// Every precision runs on every CPU (16-bit weights are widened per panel
// where the ISA lacks them), so no precision is refused or suggested away:
// f32, bf16 and f16 under each ISA cap.
TEST(PrecisionCli, EveryPrecisionRunsUnderEveryIsaCap) {
  const std::string model = std::string(LOOM_MODELS_DIR) + "/stories260K";
  const std::string ids = ::testing::TempDir() + "/loom_precision_ids.txt";
  std::ofstream(ids) << "1 400 50 60 70 80 90 100 5 6 7 8\n";
  for (const char* isa : {"baseline", "avx2", "native"})
    for (const char* precision : {"f32", "bf16", "f16"}) {
      SCOPED_TRACE(std::string(isa) + " " + precision);
      const std::string cmd =
          std::string("LOOM_CPU_ISA=") + isa + " " + LOOM_BINARY +
          " perplexity --model " + model + " --tokens " + ids +
          " --ctx 12 --json --quiet --precision " + precision + " 2>&1";
      FILE* p = popen(cmd.c_str(), "r");
      ASSERT_NE(p, nullptr);
      std::string out;
      char buf[4096];
      size_t n;
      while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
      const int status = pclose(p);
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
      const nlohmann::json j = nlohmann::json::parse(out);
      EXPECT_EQ(j["precision"], std::string(precision) == "f32"    ? "F32"
                                : std::string(precision) == "bf16" ? "BF16"
                                                                   : "F16")
          << out;
    }
}

TEST(PlanCli, ModelFlagAndPositionalPrintTheSameBytes) {
  const std::string dir = Dir("Llama-3.1-70B");
  const std::string job =
      " --device cuda:0=80GiB --device cuda:1=80GiB --batch-tokens 2048 "
      "--hooks hook_resid_post --layers 0,-1";
  const Result positional = Loom(dir + job);
  ASSERT_EQ(positional.rc, 0) << positional.out;
  EXPECT_NE(positional.out.find("\nfits\n"), std::string::npos)
      << positional.out;
  const Result flag = Loom("--model " + dir + job);
  EXPECT_EQ(flag.rc, 0);
  EXPECT_EQ(flag.out, positional.out);
  // Both, naming one directory (spelled differently): the same plan.
  const Result both = Loom("--model " + dir + " " + dir + "/" + job);
  EXPECT_EQ(both.rc, 0);
  EXPECT_EQ(both.out, positional.out);
}

TEST(PlanCli, TwoDifferentModelDirsOrNoneAreUsageErrors) {
  const Result two = RunLoom("plan",
                             "--model " + Dir("Llama-3.1-70B") + " " +
                                 Dir("Qwen3-8B") + " --device cuda:0=80GiB",
                             true);
  EXPECT_EQ(two.rc, 2) << two.out;
  EXPECT_NE(two.out.find("name different directories"), std::string::npos)
      << two.out;
  EXPECT_NE(two.out.find("Qwen3-8B"), std::string::npos) << two.out;
  const Result none = RunLoom("plan", "--device cuda:0=80GiB", true);
  EXPECT_EQ(none.rc, 2) << none.out;
  EXPECT_NE(none.out.find("no model directory"), std::string::npos) << none.out;
}

// The description `loom <command> --help` gives for `flag`, whitespace
// collapsed: what follows the option column (name, type, default, REQUIRED,
// separated from the description by two spaces or a line break) up to the
// next option.
std::string FlagHelp(const std::string& command, const std::string& flag) {
  const Result r = RunLoom(command, "--help", false);
  EXPECT_EQ(r.rc, 0) << command << ": " << r.out;
  const size_t at = r.out.find("\n  " + flag + " ");
  if (at == std::string::npos) return "(" + flag + " missing)";
  const size_t begin = at + 3;
  // The entry ends at the next option, or at an option group's heading
  // ("[Option Group: prompt]": generate's follows its options).
  size_t end = std::min(r.out.find("\n  -", begin), r.out.find("\n[", begin));
  if (end == std::string::npos) end = r.out.size();
  const std::string entry = r.out.substr(begin, end - begin);
  const size_t column = std::min(entry.find("  "), entry.find('\n'));
  if (column == std::string::npos) return "";
  std::istringstream in(entry.substr(column));
  std::string words, word;
  while (in >> word) words += (words.empty() ? "" : " ") + word;
  return words;
}

TEST(PlanCli, DeviceFlagsHaveOneHelpTextInEveryCommand) {
  for (const char* flag :
       {"--device", "--max-memory", "--reserve", "--offload"}) {
    const std::string plan = FlagHelp("plan", flag);
    EXPECT_GT(plan.size(), 20u) << flag << ": " << plan;
    for (const char* command :
         {"extract", "perplexity", "compare", "generate", "patch"})
      EXPECT_EQ(FlagHelp(command, flag), plan) << command << " " << flag;
    // serve places every model it loads (no --offload: one device).
    if (std::string(flag) != "--offload")
      EXPECT_EQ(FlagHelp("serve", flag), plan) << "serve " << flag;
  }
  for (const char* flag : {"--show-plan", "--verify-plan"}) {
    const std::string extract = FlagHelp("extract", flag);
    EXPECT_GT(extract.size(), 20u) << flag << ": " << extract;
    for (const char* command : {"perplexity", "compare", "generate", "patch"})
      EXPECT_EQ(FlagHelp(command, flag), extract) << command << " " << flag;
  }
  // --hooks / --layers: one text for extract and plan (generate and patch
  // add what the hooks are for there); --precision one text everywhere.
  EXPECT_EQ(FlagHelp("plan", "--hooks"), FlagHelp("extract", "--hooks"));
  for (const char* command : {"generate", "patch"}) {
    EXPECT_EQ(
        FlagHelp(command, "--hooks").rfind(FlagHelp("extract", "--hooks"), 0),
        0u)
        << command;
    EXPECT_EQ(FlagHelp(command, "--layers"), FlagHelp("extract", "--layers"));
  }
  for (const char* command :
       {"extract", "perplexity", "generate", "patch", "bench"})
    EXPECT_EQ(FlagHelp(command, "--precision"),
              "Compute precision: auto, f32, bf16 or f16")
        << command;
  EXPECT_NE(FlagHelp("plan", "--model"), "(--model missing)");
}

// Runs `loom ARGS` and returns stdout and stderr together.
Result LoomAll(const std::string& args) { return RunLoom(args, "", true); }

// The activations / workspace / logits columns of the `cpu` row of a plan
// table (fixed-width columns: device, weights, activations, workspace, kv,
// staging, logits).
std::vector<std::string> CpuArenaColumns(const std::string& table) {
  size_t at = table.find("\ncpu ");
  if (at == std::string::npos) return {};
  const std::string row =
      table.substr(at + 1, table.find('\n', at + 1) - at - 1);
  auto column = [&](int i) {  // "%-8s" then " %11s" per column
    const size_t begin = 8 + static_cast<size_t>(i) * 12 + 1;
    return row.size() >= begin + 11 ? row.substr(begin, 11) : std::string();
  };
  return {column(1), column(2), column(5)};
}

TEST(PlanCli, PlanAndExtractShowPlanPrintTheSameArenaBytes) {
  // One job two ways: `loom plan` from the model directory, and the plan
  // `loom extract --show-plan` prints before it runs. Kernel costs come from
  // the CPU backend in both (the GEMM scratchpad included).
  const std::string model = std::string(LOOM_MODELS_DIR) + "/stories260K";
  const std::string dir =
      (std::filesystem::temp_directory_path() / "loom_plan_cli_show_plan")
          .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  {
    std::ofstream in(dir + "/input.jsonl");
    in << "{\"id\": \"a\", \"text\": \"Once upon a time\"}\n";
  }
  for (const char* hooks : {"blocks.1.hook_resid_post",
                            "blocks.0.hook_mlp_out,ln_final.hook_normalized"}) {
    SCOPED_TRACE(hooks);
    const Result plan =
        LoomAll("plan " + model +
                " --device cpu --batch-tokens 256 --ctx 256 --hooks " + hooks);
    ASSERT_EQ(plan.rc, 0) << plan.out;
    std::filesystem::remove_all(dir + "/out");
    const Result extract =
        LoomAll("extract --model " + model + " --input " + dir +
                "/input.jsonl --out " + dir + "/out --hooks " + hooks +
                " --batch-tokens 256 --precision f32 --show-plan");
    ASSERT_EQ(extract.rc, 0) << extract.out;
    const std::vector<std::string> a = CpuArenaColumns(plan.out);
    const std::vector<std::string> b = CpuArenaColumns(extract.out);
    ASSERT_EQ(a.size(), 3u) << plan.out;
    EXPECT_EQ(a, b) << "loom plan:\n"
                    << plan.out << "\nloom extract:\n"
                    << extract.out;
    EXPECT_NE(a[1].find_first_not_of(' '), std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

// A gradient job two ways: `loom plan --backward --batch-tokens T` and
// `loom attribute --show-plan` on T tokens print the same backward line (the
// backward's own bytes) and a plan JSON that states them; --solve with
// --backward is refused.
TEST(PlanCli, BackwardPlanAndAttributeShowPlanAgree) {
  const std::string model = std::string(LOOM_MODELS_DIR) + "/stories260K";
  auto backward_line = [](const std::string& out) {
    const size_t at = out.find("\nbackward: ");
    if (at == std::string::npos) return std::string();
    return out.substr(at + 1, out.find('\n', at + 1) - at - 1);
  };
  const Result plan = LoomAll("plan " + model +
                              " --device cpu --batch-tokens 6 --backward "
                              "--hooks blocks.0.hook_resid_pre");
  ASSERT_EQ(plan.rc, 0) << plan.out;
  const std::string dir =
      (std::filesystem::temp_directory_path() / "loom_plan_cli_backward")
          .string();
  const Result attribute =
      LoomAll("attribute --model " + model +
              " --clean-tokens 1,403,407,261,378,286 --corrupted-tokens "
              "1,403,407,300,378,286 --hooks blocks.0.hook_resid_pre "
              "--precision f32 --show-plan --quiet --out " +
              dir);
  ASSERT_EQ(attribute.rc, 0) << attribute.out;
  std::filesystem::remove_all(dir);
  const std::string a = backward_line(plan.out),
                    b = backward_line(attribute.out);
  ASSERT_FALSE(a.empty()) << plan.out;
  EXPECT_EQ(a, b) << "loom plan:\n"
                  << plan.out << "\nloom attribute:\n"
                  << attribute.out;
  const Result json =
      Loom(model + " --device cpu --batch-tokens 6 --backward --json");
  ASSERT_EQ(json.rc, 0) << json.out;
  const nlohmann::json j = nlohmann::json::parse(json.out);
  EXPECT_GT(j["job"]["backward_bytes"].get<int64_t>(), 0) << json.out;
  EXPECT_EQ(j["job"]["context"], 6) << json.out;
  const Result solve =
      LoomAll("plan " + model + " --backward --solve max-batch-tokens");
  EXPECT_NE(solve.rc, 0);
  EXPECT_NE(solve.out.find("--backward with --solve"), std::string::npos)
      << solve.out;
}

// A streamed extraction's KV cache two ways: `loom plan --kv-context M`
// and `loom extract --streaming-chunk-size N --max-row-tokens M --show-plan`
// print the same kv (one sequence of M positions of every layer run) and
// workspace (the cache's attention workspace included) columns.
TEST(PlanCli, KvContextAndExtractStreamingPlanTheSameCache) {
  const std::string model = std::string(LOOM_MODELS_DIR) + "/stories260K";
  const std::string dir =
      (std::filesystem::temp_directory_path() / "loom_plan_cli_kv_context")
          .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/input.jsonl")
      << "{\"id\": \"a\", \"text\": \"Once upon a time\"}\n";
  auto columns = [](const std::string& table) {
    std::vector<std::string> c = CpuArenaColumns(table);
    size_t at = table.find("\ncpu ");
    if (at == std::string::npos) return c;
    const std::string row =
        table.substr(at + 1, table.find('\n', at + 1) - at - 1);
    c.push_back(row.size() >= 8 + 3 * 12 + 12 ? row.substr(8 + 3 * 12 + 1, 11)
                                              : "");  // kv
    return c;
  };
  for (const char* hooks :
       {"blocks.1.hook_resid_post", "ln_final.hook_normalized"}) {
    SCOPED_TRACE(hooks);
    const Result plan = LoomAll("plan " + model +
                                " --device cpu --batch-tokens 64 --ctx 64 "
                                "--kv-context 300 --hooks " +
                                std::string(hooks));
    ASSERT_EQ(plan.rc, 0) << plan.out;
    EXPECT_NE(plan.out.find("KV cache of 1 x 300 positions"), std::string::npos)
        << plan.out;
    std::filesystem::remove_all(dir + "/out");
    const Result extract =
        LoomAll("extract --model " + model + " --input " + dir +
                "/input.jsonl --out " + dir + "/out --hooks " + hooks +
                " --batch-tokens 64 --streaming-chunk-size 16 "
                "--max-row-tokens 300 --precision f32 --show-plan");
    ASSERT_EQ(extract.rc, 0) << extract.out;
    const std::vector<std::string> a = columns(plan.out);
    const std::vector<std::string> b = columns(extract.out);
    ASSERT_EQ(a.size(), 4u) << plan.out;
    EXPECT_EQ(a[1], b[1]) << "workspace\nloom plan:\n"
                          << plan.out << "\nloom extract:\n"
                          << extract.out;
    EXPECT_EQ(a[3], b[3]) << "kv\nloom plan:\n"
                          << plan.out << "\nloom extract:\n"
                          << extract.out;
    EXPECT_NE(a[3].find_first_not_of(' '), std::string::npos);
    EXPECT_EQ(a[3].find('-'), std::string::npos) << a[3];
  }
  // --kv-context is for analysis jobs; generation's --ctx sizes its cache.
  const Result gen =
      LoomAll("plan " + model +
              " --device cpu --batch-tokens 64 --mode generation "
              "--kv-context 64");
  EXPECT_NE(gen.rc, 0) << gen.out;
  EXPECT_NE(gen.out.find("kv context = 64"), std::string::npos) << gen.out;
  std::filesystem::remove_all(dir);
}

}  // namespace

namespace loom {
namespace {

// `loom devices`: the host always; GPUs when the build has the CUDA backend
// and a device is visible, else the reason (exit 0 either way).
TEST(DevicesCli, ListsTheHostAndEveryGpuOrWhyNone) {
  const Result r = RunLoom("devices", "--json", false);
  ASSERT_EQ(r.rc, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["host"]["device"], "cpu");
  const std::string host_auto = j["host"]["auto_precision"];
  EXPECT_TRUE(host_auto == "bf16" || host_auto == "f16" || host_auto == "f32")
      << host_auto;
  EXPECT_GT(j["host"]["memory_bytes"].get<int64_t>(), 0);
  ASSERT_TRUE(j["gpus"].is_array());
  if (j["gpus"].empty()) {
    EXPECT_FALSE(j["no_gpu_reason"].get<std::string>().empty());
  } else {
    for (const auto& g : j["gpus"]) {
      EXPECT_GT(g["memory_total_bytes"].get<int64_t>(), 0);
      const std::string cap = g["capability"];
      const int major = std::stoi(cap.substr(0, cap.find('.')));
      EXPECT_EQ(g["auto_precision"], major >= 8 ? "bf16" : "f16") << cap;
    }
  }
  const Result text = RunLoom("devices", "", false);
  ASSERT_EQ(text.rc, 0);
  EXPECT_NE(text.out.find("cpu"), std::string::npos) << text.out;
}

// A job on a GPU the build or the machine lacks is refused before loading,
// naming the device: UNAVAILABLE, a usage error (exit 2), a declared size or
// not.
TEST(DevicesCli, JobOnAMissingGpuIsAClearError) {
  const Result r =
      RunLoom("perplexity",
              "--model " + std::string(LOOM_MODELS_DIR) +
                  "/stories260K --tokens /dev/null --device cuda:7=1GiB",
              true);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--device cuda:7: no such GPU"), std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace loom
