// TheLoom's /api/patching/* routes over real HTTP: configure, run (a real
// patched path: non-zero causal effects), results, experiments and the
// cache routes on the bundled model; the golden llama activation-patching
// grid through the route (recovery equal to Hugging Face's within 1e-3);
// hostile requests get 4xx naming the field; a run beside generation
// requests leaves their outputs unchanged.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "src/serve/running_server.h"
#include "src/serve/server.h"
#include "tests/golden_util.h"

namespace loom::serve {
namespace {

using nlohmann::json;

ServerOptions Defaults() {
  ServerOptions o;
  o.engine.precision = Precision::kF32;
  o.engine.slots = 4;
  o.engine.context = 256;
  return o;
}

json Send(httplib::Client& c, const std::string& method,
          const std::string& path, const std::string& body, int* status) {
  httplib::Result r = method == "POST" ? c.Post(path, body, "application/json")
                      : method == "DELETE" ? c.Delete(path)
                                           : c.Get(path);
  EXPECT_TRUE(r) << method << " " << path << ": no response";
  if (!r) return json();
  *status = r->status;
  return json::parse(r->body, nullptr, false);
}

json Post(httplib::Client& c, const std::string& path, const json& body,
          int* status) {
  return Send(c, "POST", path, body.dump(), status);
}

json Get(httplib::Client& c, const std::string& path, int* status) {
  return Send(c, "GET", path, "", status);
}

// Clean and corrupted prompts of the bundled model: token ids differing at
// position 3.
const json kClean = {1, 403, 407, 261, 378, 286};
const json kCorrupted = {1, 403, 407, 300, 378, 286};

TEST(ServePatchingTest, ConfigureRunResultsExperimentsCache) {
  Running s(Defaults());
  auto c = s.Client();
  int status = 0;
  const json conf = Post(c, "/api/patching/configure",
                         {{"experiment_name", "ioi"},
                          {"layers", {0, 2, -1}},
                          {"components", {"resid_pre", "MLP_POST"}}},
                         &status);
  ASSERT_EQ(status, 200) << conf.dump();
  EXPECT_EQ(conf["status"], "configured");
  EXPECT_EQ(conf["message"],
            "Experiment configured with 3 layers and 2 components");
  const std::string id = conf["experiment_id"];
  EXPECT_EQ(id.size(), 36u);
  json list = Get(c, "/api/patching/experiments", &status);
  ASSERT_EQ(status, 200);
  ASSERT_EQ(list["total_count"], 1);
  EXPECT_EQ(list["experiments"][0]["status"], "configured");
  Get(c, "/api/patching/results/" + id, &status);
  EXPECT_EQ(status, 404) << "no run recorded yet";

  const json run = Post(c, "/api/patching/run",
                        {{"model", "stories260K"},
                         {"experiment_id", id},
                         {"clean_input", kClean},
                         {"corrupted_input", kCorrupted}},
                        &status);
  ASSERT_EQ(status, 200) << run.dump();
  EXPECT_EQ(run["experiment_id"], id);
  EXPECT_EQ(run["experiment_name"], "ioi");
  EXPECT_EQ(run["layers_patched"], json({0, 2, -1}));
  EXPECT_EQ(run["components_patched"], json({"resid_pre", "mlp_post"}));
  // 3 layers x 2 components x 6 positions.
  ASSERT_EQ(run["patched_results"].size(), 36u);
  EXPECT_EQ(run["metadata"]["num_patched_runs"], 36);
  EXPECT_EQ(run["clean_path"]["metadata"]["token_count"], 6);
  const json& first = run["patched_results"][0];
  EXPECT_EQ(first["hook_name"], "blocks.0.hook_resid_pre");
  EXPECT_EQ(run["patched_results"][6]["hook_name"], "blocks.0.mlp.hook_post");
  EXPECT_EQ(run["patched_results"][35]["hook_name"], "blocks.4.mlp.hook_post");
  const json meta = run["metadata"];
  const double clean = meta["clean_logit_diff"],
               corrupted = meta["corrupted_logit_diff"];
  EXPECT_NE(clean, corrupted);
  bool nonzero = false;
  for (const json& p : run["patched_results"]) {
    const double effect = p["causal_effect"];
    EXPECT_NEAR(effect, p["logit_diff"].get<double>() - corrupted, 1e-9);
    nonzero |= std::fabs(effect) > 1e-3;
    // Before the differing position the two runs are identical.
    if (p["position"].get<int64_t>() < 3) {
      EXPECT_NEAR(effect, 0.0, 1e-5);
    }
  }
  EXPECT_TRUE(nonzero) << "a real patched path moves the metric";
  // resid_pre of block 0 at the differing position is the clean prompt's
  // embedding there: the clean run again.
  EXPECT_NEAR(run["patched_results"][3]["recovery_rate"].get<double>(), 1.0,
              1e-5);
  EXPECT_EQ(run["patched_results"][3]["patched_output"],
            run["clean_path"]["output_text"]);

  const json res = Get(c, "/api/patching/results/" + id, &status);
  ASSERT_EQ(status, 200) << res.dump();
  EXPECT_TRUE(res["has_all_paths"].get<bool>());
  EXPECT_EQ(res["num_patched_paths"], 36);
  EXPECT_EQ(res["clean_output"], run["clean_path"]["output_text"]);
  const json& ce = res["causal_effects"][3];
  EXPECT_EQ(ce["recovery_class"], "full_recovery");
  EXPECT_EQ(ce["clean_baseline"], clean);
  EXPECT_EQ(ce["corrupted_metric"], corrupted);
  EXPECT_EQ(ce["causal_effect"], run["patched_results"][3]["causal_effect"]);
  EXPECT_EQ(
      Get(c, "/api/patching/results/" + id + "?include_causal_effects=false",
          &status)["causal_effects"]
          .size(),
      0u);
  list = Get(c, "/api/patching/experiments", &status);
  EXPECT_EQ(list["experiments"][0]["status"], "completed");

  // An ad-hoc run (no experiment id), text prompts, the last position only,
  // given answer tokens.
  const json adhoc = Post(c, "/api/patching/run",
                          {{"clean_input", "Once upon a time"},
                           {"corrupted_input", "Once upon a time"},
                           {"positions", "last"},
                           {"answer_token_ids", {{"A", 10}, {"B", 20}}}},
                          &status);
  ASSERT_EQ(status, 200) << adhoc.dump();
  EXPECT_EQ(adhoc["experiment_name"].get<std::string>().rfind(
                "ad_hoc_experiment_", 0),
            0u);
  EXPECT_EQ(adhoc["layers_patched"], json({0, 2, 4}));  // [0, n/2, n-1]
  EXPECT_EQ(adhoc["metadata"]["answer_token_ids"],
            json({{"A", 10}, {"B", 20}}));
  // Identical prompts: no corruption (clean and corrupted logit differences
  // are equal), so recovery is undefined: null, not TheLoom's inf (the
  // patched runs, batched, differ from the single run by f32 round-off).
  EXPECT_EQ(adhoc["metadata"]["clean_logit_diff"],
            adhoc["metadata"]["corrupted_logit_diff"]);
  for (const json& p : adhoc["patched_results"]) {
    EXPECT_NEAR(p["causal_effect"].get<double>(), 0.0, 1e-4) << p.dump();
    EXPECT_TRUE(p["recovery_rate"].is_null() || p["recovery_rate"] == 0.0)
        << p.dump();
  }
  EXPECT_EQ(Get(c, "/api/patching/experiments", &status)["total_count"], 2);

  // The ad-hoc run (cleanup off) kept its two un-patched runs.
  const json cache = Get(c, "/api/patching/cache/status", &status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(cache["num_caches"], 2) << cache.dump();
  EXPECT_EQ(Send(c, "DELETE", "/api/patching/cache", "", &status)["status"],
            "cleared");
  EXPECT_EQ(status, 200);
  EXPECT_EQ(Get(c, "/api/patching/cache/status", &status)["num_caches"], 0);
  Send(c, "DELETE", "/api/patching/cache/x_clean", "", &status);
  EXPECT_EQ(status, 404);
}

// TheLoom's cache: a run of an experiment without cleanup keeps its clean
// captures and both last logits (`<id>_clean`, `<id>_corrupted`); the next
// run of that experiment reuses them (two forwards fewer, the same results);
// deleting one part stops the reuse; a run of an experiment with cleanup
// (the configure default) clears every cache, as TheLoom's does.
TEST(ServePatchingTest, CacheKeepsAndReusesTheUnpatchedRuns) {
  Running s(Defaults());
  auto c = s.Client();
  int status = 0;
  const json body = {{"clean_input", kClean},
                     {"corrupted_input", kCorrupted},
                     {"layers", {0, 2, 4}}};
  const json first = Post(c, "/api/patching/run", body, &status);
  ASSERT_EQ(status, 200) << first.dump();
  const std::string id = first["experiment_id"];
  EXPECT_FALSE(first["metadata"]["reused_baselines"].get<bool>());
  json cache = Get(c, "/api/patching/cache/status", &status);
  ASSERT_EQ(cache["num_caches"], 2) << cache.dump();
  EXPECT_EQ(cache["cache_ids"], json({id + "_clean", id + "_corrupted"}));
  // 3 hooks x 6 tokens x 64 values + 512 logits; 512 logits.
  EXPECT_EQ(cache["cache_details"][id + "_clean"], 4 * (3 * 6 * 64 + 512));
  EXPECT_EQ(cache["cache_details"][id + "_corrupted"], 4 * 512);
  EXPECT_EQ(cache["max_size_mb"], 256.0);

  json again = body;
  again["experiment_id"] = id;
  const json second = Post(c, "/api/patching/run", again, &status);
  ASSERT_EQ(status, 200) << second.dump();
  EXPECT_TRUE(second["metadata"]["reused_baselines"].get<bool>());
  EXPECT_EQ(second["metadata"]["forwards"].get<int64_t>(),
            first["metadata"]["forwards"].get<int64_t>() - 2);
  EXPECT_EQ(second["patched_results"], first["patched_results"]);
  EXPECT_EQ(second["metadata"]["recovery"], first["metadata"]["recovery"]);
  // Other prompts for the same experiment: not reused.
  json other = again;
  other["clean_input"] = kCorrupted;
  other["corrupted_input"] = kClean;
  EXPECT_FALSE(Post(c, "/api/patching/run", other,
                    &status)["metadata"]["reused_baselines"]
                   .get<bool>());
  ASSERT_EQ(status, 200);
  EXPECT_TRUE(Post(c, "/api/patching/run", other,
                   &status)["metadata"]["reused_baselines"]
                  .get<bool>());

  const json del = Send(c, "DELETE", "/api/patching/cache/" + id + "_corrupted",
                        "", &status);
  ASSERT_EQ(status, 200) << del.dump();
  EXPECT_EQ(del["message"], "Cache " + id + "_corrupted deleted successfully");
  Send(c, "DELETE", "/api/patching/cache/" + id + "_corrupted", "", &status);
  EXPECT_EQ(status, 404);
  cache = Get(c, "/api/patching/cache/status", &status);
  EXPECT_EQ(cache["cache_ids"], json({id + "_clean"}));
  EXPECT_FALSE(Post(c, "/api/patching/run", other,
                    &status)["metadata"]["reused_baselines"]
                   .get<bool>());
  // 3 captured hooks + the clean logits + the corrupted logits.
  const json cleared = Send(c, "DELETE", "/api/patching/cache", "", &status);
  EXPECT_EQ(cleared["entries_cleared"], 5) << cleared.dump();

  // A configured experiment cleans up on completion: every cache goes.
  ASSERT_EQ(Post(c, "/api/patching/run", body, &status)["status"], "completed");
  EXPECT_EQ(Get(c, "/api/patching/cache/status", &status)["num_caches"], 2);
  const json conf =
      Post(c, "/api/patching/configure",
           {{"experiment_name", "tidy"}, {"layers", {1}}}, &status);
  ASSERT_EQ(status, 200) << conf.dump();
  json tidy = body;
  tidy.erase("layers");
  tidy["experiment_id"] = conf["experiment_id"];
  ASSERT_EQ(Post(c, "/api/patching/run", tidy, &status)["status"], "completed");
  EXPECT_EQ(Get(c, "/api/patching/cache/status", &status)["num_caches"], 0);
}

// approximate: "atp": the grid from one backward (eval::RunAttribute): each
// cell's causal effect is the golden AtP of HF autograd within the goldens'
// atp rule, the true patch's metrics unchanged, no patched token; a bad
// method is a 400 naming the field.
TEST(ServePatchingTest, ApproximateAtpIsTheGoldenAttribution) {
  const std::string shared = loom::testing::SharedGoldenDir();
  const std::string dir = shared + "/attribution/llama__two_diffs";
  if (shared.empty() || !std::filesystem::exists(dir))
    GTEST_SKIP() << "SKIPPED LOUDLY: shared attribution goldens not found";
  const json m = loom::testing::ReadJson(dir + "/manifest.json");
  auto golden = loom::testing::GoldenFile::Open(dir + "/golden.safetensors");
  ASSERT_NE(golden, nullptr);
  Running s(Defaults(), shared + "/tiny/llama");
  auto c = s.Client();
  int status = 0;
  const json body = {{"clean_input", m["clean_input_ids"]},
                     {"corrupted_input", m["corrupted_input_ids"]},
                     {"layers", {0, 1, 2}},
                     {"components", {"resid_pre", "mlp_out"}},
                     {"approximate", "atp"}};
  const json run = Post(c, "/api/patching/run", body, &status);
  ASSERT_EQ(status, 200) << run.dump();
  const json& meta = run["metadata"];
  EXPECT_EQ(meta["approximate"], "atp");
  EXPECT_EQ(meta["answer_token_ids"]["A"], m["answer_token_ids"]["answer"]);
  EXPECT_EQ(meta["answer_token_ids"]["B"], m["answer_token_ids"]["wrong"]);
  EXPECT_NEAR(meta["corrupted_logit_diff"].get<double>(),
              golden->F32("metric.corrupted").front(), 1e-4);
  const int64_t T = m["T"];
  ASSERT_EQ(run["patched_results"].size(), static_cast<size_t>(6 * T));
  for (const json& cell : run["patched_results"]) {
    const std::string hook = cell["loom_hook"];
    const std::vector<float> atp = golden->F32("atp." + hook);
    double mx = 0;
    for (float v : atp) mx = std::max(mx, std::fabs(double{v}));
    const double want = atp[static_cast<size_t>(int64_t{cell["position"]})];
    EXPECT_NEAR(cell["causal_effect"].get<double>(), want,
                std::max(1e-4, 1e-3 * mx) + 1e-3 * std::fabs(want))
        << hook << " @" << cell["position"];
    EXPECT_TRUE(cell["patched_output"].is_null());
    EXPECT_TRUE(cell["patched_token_id"].is_null());
  }
  json bad = body;
  bad["approximate"] = "ig";
  const json refused = Post(c, "/api/patching/run", bad, &status);
  EXPECT_EQ(status, 400) << refused.dump();
  EXPECT_NE(refused.dump().find("field `approximate`"), std::string::npos)
      << refused.dump();
}

// The golden llama activation-patching grid (every layer's resid_pre at
// every position) through the route: recovery equals Hugging Face's.
TEST(ServePatchingTest, GoldenLlamaGrid) {
  const std::string shared = loom::testing::SharedGoldenDir();
  if (shared.empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: ../shared/golden is absent: the golden "
                    "activation-patching grid through /api/patching/run is "
                    "NOT checked";
  const std::string dir = shared + "/interventions/llama__activation_patch";
  const json spec = loom::testing::ReadJson(dir + "/spec.json");
  auto golden = loom::testing::GoldenFile::Open(dir + "/expected.safetensors");
  ASSERT_NE(golden, nullptr);
  Running s(Defaults(), shared + "/tiny/llama");
  auto c = s.Client();
  int status = 0;
  const json run = Post(c, "/api/patching/run",
                        {{"model", "llama"},
                         {"clean_input", spec["clean_input_ids"][0]},
                         {"corrupted_input", spec["corrupted_input_ids"][0]},
                         {"layers", {0, 1, 2}},
                         {"components", {"resid_pre"}}},
                        &status);
  ASSERT_EQ(status, 200) << run.dump();
  const json& meta = run["metadata"];
  EXPECT_EQ(meta["answer_token_ids"]["A"], spec["answer_token_ids"]["A"]);
  EXPECT_EQ(meta["answer_token_ids"]["B"], spec["answer_token_ids"]["B"]);
  EXPECT_NEAR(meta["clean_logit_diff"].get<double>(),
              spec["clean_logit_diff"].get<double>(), 1e-3);
  EXPECT_NEAR(meta["corrupted_logit_diff"].get<double>(),
              spec["corrupted_logit_diff"].get<double>(), 1e-3);
  Shape shape;
  const std::vector<float> want = golden->F32("recovery", &shape);
  ASSERT_EQ(shape.rank(), 2);
  const int64_t L = shape[0], T = shape[1];
  ASSERT_EQ(meta["recovery"].size(), static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l)
    for (int64_t t = 0; t < T; ++t)
      EXPECT_NEAR(meta["recovery"][l][t].get<double>(), want[l * T + t], 1e-3)
          << "layer " << l << " position " << t;
  const int64_t d = spec["differing_position"];
  const json res =
      Get(c, "/api/patching/results/" + run["experiment_id"].get<std::string>(),
          &status);
  ASSERT_EQ(status, 200);
  for (int64_t l = 0; l < L; ++l) {
    const json& ce = res["causal_effects"][l * T + d];
    EXPECT_EQ(ce["layer"], l);
    EXPECT_EQ(ce["position"], d);
    EXPECT_NEAR(ce["recovery_rate"].get<double>(),
                spec["recovery_at_differing_position"][l].get<double>(), 1e-3);
    EXPECT_GT(std::fabs(ce["causal_effect"].get<double>()), 0.05)
        << "TheLoom's placeholder gives 0; a real patch does not";
  }
}

// Hostile requests: 4xx naming the field; the server goes on answering.
TEST(ServePatchingTest, HostileRequestsGet4xxNamingTheField) {
  ServerOptions o = Defaults();
  o.patching.max_cells = 20;
  Running s(o);
  auto c = s.Client();
  const json ok = {{"clean_input", kClean},
                   {"corrupted_input", kCorrupted},
                   {"layers", {1}}};
  struct Case {
    json patch;  // merged into `ok` (null values remove the field)
    int status;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{{"clean_input", nullptr}}, 400, "clean_input"},
      {{{"corrupted_input", nullptr}}, 400, "corrupted_input"},
      {{{"corrupted_input", {1, 403, 407}}}, 400, "corrupted_input"},
      {{{"corrupted_input", "Once upon a time there was a"}},
       400,
       "corrupted_input"},
      {{{"clean_input", ""}}, 400, "clean_input"},
      {{{"clean_input", {1, 99999}}}, 400, "clean_input"},
      {{{"layers", {7}}}, 400, "layers"},
      {{{"layers", {-6}}}, 400, "layers"},
      {{{"layers", "all"}}, 400, "layers"},
      {{{"layers", {1.5}}}, 400, "layers"},
      {{{"components", {"bogus"}}}, 400, "components"},
      {{{"components", {"attn_q"}}}, 501, "components"},
      {{{"components", json::array()}}, 400, "components"},
      {{{"layers", {0, 1, 2, 3, 4}}}, 400, "cells"},  // 30 cells > 20
      {{{"positions", {99}}}, 400, "positions"},
      {{{"positions", "first"}}, 400, "positions"},
      {{{"metric_type", "token_diff"}}, 501, "metric_type"},
      {{{"metric_type", "kl"}}, 400, "metric_type"},
      {{{"answer_token_ids", {{"A", 100000}}}}, 400, "answer_token_ids"},
      {{{"answer_token_ids", 3}}, 400, "answer_token_ids"},
      {{{"max_tokens", 0}}, 400, "max_tokens"},
      {{{"temperature", 3}}, 400, "temperature"},
      {{{"model", "nope"}}, 404, "nope"},
  };
  for (const Case& k : cases) {
    json body = ok;
    for (const auto& [key, value] : k.patch.items()) {
      if (value.is_null())
        body.erase(key);
      else
        body[key] = value;
    }
    int status = 0;
    const json out = Post(c, "/api/patching/run", body, &status);
    EXPECT_EQ(status, k.status) << body.dump() << " -> " << out.dump();
    EXPECT_NE(out.value("detail", "").find(k.needle), std::string::npos)
        << body.dump() << " -> " << out.dump();
  }
  int status = 0;
  json out =
      Send(c, "POST", "/api/patching/run", "{\"clean_input\": [1,", &status);
  EXPECT_EQ(status, 400) << out.dump();
  out = Send(c, "POST", "/api/patching/run", "[1, 2]", &status);
  EXPECT_EQ(status, 400) << out.dump();
  out = Post(c, "/api/patching/configure", {{"layers", {1}}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(out["detail"].get<std::string>().find("experiment_name"),
            std::string::npos);
  out = Post(c, "/api/patching/configure",
             {{"experiment_name", "x"}, {"components", {"nope"}}}, &status);
  EXPECT_EQ(status, 400);
  out = Get(c, "/api/patching/results/nope?metric_type=token_diff", &status);
  EXPECT_EQ(status, 501) << out.dump();
  out = Get(c, "/api/patching/results/nope", &status);
  EXPECT_EQ(status, 404);
  EXPECT_EQ(out["detail"], "Experiment not found: nope");
  // Still serving.
  out = Post(c, "/api/patching/run", ok, &status);
  EXPECT_EQ(status, 200) << out.dump();
}

// A run past patching.max_seconds stops before its next forward: 503.
TEST(ServePatchingTest, TimeLimitStopsTheRun) {
  ServerOptions o = Defaults();
  o.patching.max_seconds = 0;
  Running s(o);
  auto c = s.Client();
  int status = 0;
  const json out =
      Post(c, "/api/patching/run",
           {{"clean_input", kClean}, {"corrupted_input", kCorrupted}}, &status);
  EXPECT_EQ(status, 503) << out.dump();
  EXPECT_NE(out["detail"].get<std::string>().find("limit of 0"),
            std::string::npos)
      << out.dump();
  EXPECT_EQ(
      Get(c, "/api/patching/experiments", &status)["experiments"][0]["status"],
      "failed");
}

// Experiments kept are bounded: the least recently used is evicted.
TEST(ServePatchingTest, ExperimentsAreBounded) {
  ServerOptions o = Defaults();
  o.patching.max_experiments = 2;
  Running s(o);
  auto c = s.Client();
  int status = 0;
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i)
    ids.push_back(Post(c, "/api/patching/configure",
                       {{"experiment_name", "e" + std::to_string(i)}},
                       &status)["experiment_id"]);
  const json list = Get(c, "/api/patching/experiments", &status);
  ASSERT_EQ(list["total_count"], 2);
  EXPECT_EQ(list["experiments"][0]["experiment_id"], ids[2]);
  EXPECT_EQ(list["experiments"][1]["experiment_id"], ids[1]);
}

// A patching run beside greedy generations: they run on separate executors
// and backends, so the generations equal those of a quiet server.
TEST(ServePatchingTest, RunBesideGenerationLeavesItUnchanged) {
  Running s(Defaults());
  auto c = s.Client();
  const json gen = {{"prompt", "Once upon a time"},
                    {"max_tokens", 12},
                    {"temperature", 0},
                    {"return_hidden_states", false}};
  int status = 0;
  const json quiet = Post(c, "/generate", gen, &status);
  ASSERT_EQ(status, 200);
  std::thread patcher([&] {
    auto pc = s.Client();
    int st = 0;
    for (int i = 0; i < 3; ++i) {
      const json r = Post(pc, "/api/patching/run",
                          {{"clean_input", kClean},
                           {"corrupted_input", kCorrupted},
                           {"layers", {0, 1, 2, 3, 4}},
                           {"components", {"resid_pre", "attn", "mlp_post"}}},
                          &st);
      // 503 only when another run holds the one patching slot.
      EXPECT_TRUE(st == 200 || st == 503) << r.dump();
    }
  });
  for (int i = 0; i < 6; ++i) {
    const json out = Post(c, "/generate", gen, &status);
    ASSERT_EQ(status, 200);
    EXPECT_EQ(out["token_ids"], quiet["token_ids"]);
  }
  patcher.join();
}

}  // namespace
}  // namespace loom::serve
