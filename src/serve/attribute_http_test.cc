// POST /v1/attribute over real HTTP: the AtP grid (exact and linearized,
// both metrics, per head) of the golden llama cases equals HF autograd's
// within the README's atp rule and the checked cells' true patches equal
// the goldens'; integrated gradients are complete on the bundled model; bad
// requests get 400 naming the field, a model served at bf16 gets 501 naming
// the precision.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "src/serve/running_server.h"
#include "src/serve/server.h"
#include "tests/golden_util.h"

namespace loom::serve {
namespace {

using nlohmann::json;

ServerOptions Defaults(Precision p = Precision::kF32) {
  ServerOptions o;
  o.engine.precision = p;
  o.engine.slots = 2;
  o.engine.context = 256;
  return o;
}

json Post(httplib::Client& c, const json& body, int* status) {
  httplib::Result r = c.Post("/v1/attribute", body.dump(), "application/json");
  EXPECT_TRUE(r) << "no response";
  if (!r) return json();
  *status = r->status;
  return json::parse(r->body, nullptr, false);
}

// The goldens' atp rule (golden/attribution/README.md).
void ExpectRule(const std::vector<double>& got, const std::vector<float>& want,
                const std::string& what) {
  loom::testing::ExpectWithinAttributionRule(got, want, 1e-4, 1e-3, 1e-3, what);
}

TEST(ServeAttributeTest, GoldenGridsThroughTheRoute) {
  const std::string shared = loom::testing::SharedGoldenDir();
  const std::string dir = shared + "/attribution/llama__two_diffs";
  if (shared.empty() || !std::filesystem::exists(dir))
    GTEST_SKIP() << "SKIPPED LOUDLY: shared attribution goldens not found";
  const json m = loom::testing::ReadJson(dir + "/manifest.json");
  auto golden = loom::testing::GoldenFile::Open(dir + "/golden.safetensors");
  ASSERT_NE(golden, nullptr);
  std::vector<std::string> hooks = m["hooks"];
  Running s(Defaults(), shared + "/tiny/llama");
  auto c = s.Client();
  for (const bool linear : {false, true}) {
    for (const bool logprob : {false, true}) {
      json body = {{"clean", m["clean_input_ids"]},
                   {"corrupted", m["corrupted_input_ids"]},
                   {"hooks", hooks},
                   {"positions", "all"},
                   {"per_head", true},
                   {"add_special_tokens", false}};
      if (linear) body["freeze"] = {"attn_pattern", "norm_scale"};
      if (logprob) body["metric"] = "logprob";
      if (!logprob) body["check_top"] = 2;
      int status = 0;
      const json j = Post(c, body, &status);
      ASSERT_EQ(status, 200) << j.dump();
      const std::string p = logprob ? "seq_logprob." : "";
      const std::string kind = linear ? "lin_atp" : "atp";
      SCOPED_TRACE(p + kind);
      EXPECT_EQ(j["clean_input_ids"], m["clean_input_ids"]);
      ASSERT_EQ(j["hooks"].size(), hooks.size());
      EXPECT_NEAR(j["metric_corrupted"].get<double>(),
                  golden->F32(p + "metric.corrupted").front(),
                  logprob ? 3e-4 : 1e-4);
      for (size_t i = 0; i < hooks.size(); ++i) {
        const std::string h = j["hooks"][i];
        ExpectRule(j["atp"][i].get<std::vector<double>>(),
                   golden->F32(p + kind + "." + h), h);
        if (h.find("attn.hook_z") == std::string::npos) continue;
        std::vector<double> heads;
        for (const auto& row : j["atp_head"][i])
          for (double v : row) heads.push_back(v);
        ExpectRule(heads, golden->F32(p + kind + "_head." + h), h + " heads");
      }
      for (const auto& cell : j["checks"]) {
        const std::vector<float> tp =
            golden->F32("true_patch." + std::string(cell["hook"]));
        const double want = tp[static_cast<size_t>(int64_t{cell["position"]})];
        EXPECT_NEAR(cell["true_patch"].get<double>(), want,
                    1e-4 + 1e-3 * std::fabs(want));
      }
      if (!logprob) {
        EXPECT_EQ(j["checks"].size(), 2u);
      }
    }
  }
}

TEST(ServeAttributeTest, IntegratedGradientsAndRefusals) {
  Running s(Defaults());
  auto c = s.Client();
  int status = 0;
  const json ig = Post(c,
                       {{"method", "ig"},
                        {"clean", {1, 403, 407, 261, 378, 286}},
                        {"steps", 64}},
                       &status);
  ASSERT_EQ(status, 200) << ig.dump();
  EXPECT_EQ(ig["ig"].size(), 6u);
  const double change =
      ig["metric_input"].get<double>() - ig["metric_baseline"].get<double>();
  EXPECT_LE(std::fabs(ig["completeness_error"].get<double>()),
            1e-3 + 1e-3 * std::fabs(change))
      << ig.dump();
  struct Bad {
    json body;
    std::string says;
  };
  const json clean = {1, 403, 407, 261};
  const json corrupted = {1, 403, 407, 300};
  const Bad bad[] = {
      {{{"corrupted", corrupted}}, "field `clean`"},
      {{{"clean", clean}}, "field `corrupted`"},
      {{{"clean", clean}, {"corrupted", corrupted}, {"metric", "kl"}},
       "field `metric`"},
      {{{"clean", clean}, {"corrupted", corrupted}, {"freeze", {"mlp"}}},
       "field `freeze`"},
      {{{"clean", clean}, {"corrupted", corrupted}, {"method", "atp*"}},
       "field `method`"},
      {{{"clean", clean}, {"corrupted", corrupted}, {"answer", 1 << 30}},
       "field `answer`"},
      {{{"clean", clean},
        {"corrupted", corrupted},
        {"hooks", {"blocks.0.attn.hook_pattern"}}},
       "gradient"},
      {{{"clean", clean}, {"corrupted", {1, 403}}}, "one length"},
      {{{"clean", clean}, {"corrupted", corrupted}, {"positions", {1.5}}},
       "field `positions`"},
  };
  // AtP*: the GradDrop estimate beside AtP; at the last layer's output no
  // drop changes the gradient, so atp_star = |atp| L / (L - 1) there.
  const json star = Post(c,
                         {{"clean", clean},
                          {"corrupted", corrupted},
                          {"method", "atp-star"},
                          {"hooks", {"blocks.*.hook_resid_post"}}},
                         &status);
  ASSERT_EQ(status, 200) << star.dump();
  EXPECT_EQ(star["method"], "atp-star");
  const size_t L = star["hooks"].size();
  ASSERT_EQ(L, 5u);
  for (size_t p = 0; p < 4; ++p) {
    const double atp = star["atp"][L - 1][p], s4 = star["atp_star"][L - 1][p];
    EXPECT_NEAR(s4, std::fabs(atp) * L / (L - 1), 1e-9 * (1 + std::fabs(atp)));
  }
  for (const Bad& b : bad) {
    const json j = Post(c, b.body, &status);
    EXPECT_EQ(status, 400) << b.body.dump() << " -> " << j.dump();
    EXPECT_NE(j.dump().find(b.says), std::string::npos)
        << b.body.dump() << " -> " << j.dump();
  }
}

TEST(ServeAttributeTest, AModelServedAtBf16IsRefusedNamingThePrecision) {
  Running s(Defaults(Precision::kBF16));
  auto c = s.Client();
  int status = 0;
  const json j =
      Post(c, {{"clean", {1, 403, 407}}, {"corrupted", {1, 403, 9}}}, &status);
  EXPECT_EQ(status, 501) << j.dump();
  EXPECT_NE(j.dump().find("served at bf16; gradients run at f32"),
            std::string::npos)
      << j.dump();
}

}  // namespace
}  // namespace loom::serve
