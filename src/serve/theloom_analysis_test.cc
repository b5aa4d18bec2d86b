// TheLoom's analysis algorithms against the goldens computed by TheLoom's own
// code (shared/golden/theloom, see its README): every case of
// analyze_geometry.json, analyze_bilateral.json and analyze_hidden_state.json,
// every field by its "compare" rule, plus the intermediate values the goldens
// record (DBSCAN labels, eps, the Wolf ratios). Also the RNG recipe against
// numpy's known draws, Student's t, and the request-body parser.
#include "src/serve/theloom_analysis.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace loom::serve::theloom {
namespace {

std::string GoldenDir() {
  return std::string(LOOM_SHARED_DIR) + "/golden/theloom";
}

// The golden file, or null (the caller skips) when shared/ is absent.
json LoadGolden(const std::string& name) {
  std::ifstream in(GoldenDir() + "/" + name);
  if (!in) return json();
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

#define LOAD_OR_SKIP(var, name)                                           \
  const json var = LoadGolden(name);                                      \
  if (var.is_null())                                                      \
  GTEST_SKIP() << "SKIPPED: TheLoom goldens not found at " << GoldenDir() \
               << "/" << name << " (the shared/ folder beside the repo)"

const json* Dotted(const json& root, const std::string& dotted) {
  const json* j = &root;
  size_t start = 0;
  while (start <= dotted.size()) {
    size_t end = dotted.find('.', start);
    if (end == std::string::npos) end = dotted.size();
    const std::string key = dotted.substr(start, end - start);
    if (!j->is_object() || !j->contains(key)) return nullptr;
    j = &(*j)[key];
    start = end + 1;
  }
  return j;
}

// One field by its rule (README "Tolerances").
void CompareField(const std::string& field, const json& rule,
                  const json& actual_root, const json& expected_root) {
  SCOPED_TRACE("field " + field + " rule " + rule.dump());
  const json* a = Dotted(actual_root, field);
  const json* e = Dotted(expected_root, field);
  ASSERT_NE(a, nullptr) << "missing in the response";
  ASSERT_NE(e, nullptr) << "missing in the golden";
  const std::string kind = rule.at("kind");
  if (kind == "exact") {
    if (e->is_number_integer()) {
      EXPECT_TRUE(a->is_number_integer()) << "not a JSON integer: " << *a;
    }
    if (e->is_number() && a->is_number()) {
      EXPECT_EQ(a->get<double>(), e->get<double>());
    } else {
      EXPECT_EQ(*a, *e);
    }
    return;
  }
  ASSERT_TRUE(a->is_number()) << *a;
  const double av = a->get<double>(), ev = e->get<double>();
  if (kind == "exact_fraction") {
    EXPECT_LE(std::fabs(av - ev), rule.value("abs", 1e-9))
        << "actual " << av << " expected " << ev;
  } else if (kind == "close") {
    const double tol =
        rule.value("abs", 1e-6) + rule.value("rel", 1e-4) * std::fabs(ev);
    EXPECT_LE(std::fabs(av - ev), tol) << "actual " << av << " expected " << ev;
  } else if (kind == "loose") {
    EXPECT_TRUE(std::isfinite(av)) << av;
    EXPECT_GE(av, 0.0);
    if (field.find("aspect") != std::string::npos) {
      EXPECT_LE(av, 1.0);
    }
  } else {
    ADD_FAILURE() << "unknown rule kind " << kind;
  }
}

StatusOr<AnalysisBody> Parse(const json& input,
                             const std::vector<std::string>& fields) {
  return ParseAnalysisBody(input.dump(), fields, 3, kMaxVectors);
}

TEST(TheLoomGoldenTest, Geometry) {
  LOAD_OR_SKIP(golden, "analyze_geometry.json");
  ASSERT_EQ(golden["cases"].size(), 10u);
  for (const json& c : golden["cases"]) {
    SCOPED_TRACE("case " + c["id"].get<std::string>());
    auto body = Parse(c["input"], {"vectors"});
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    const GeometryResult g = AnalyzeGeometry(body->matrices[0], kDefaultSeed);
    const json out = GeometryJson(g);
    for (const auto& [field, rule] : c["compare"].items())
      CompareField(field, rule, out, c["expected"]);
    // The intermediate values, for debugging a mismatch.
    const json& in = c["internals"];
    EXPECT_EQ(json(g.labels), in["dbscan_labels"]);
    EXPECT_NEAR(g.grain_eps, in["grain_eps"].get<double>(),
                1e-4 * std::fabs(in["grain_eps"].get<double>()) + 1e-6);
    ASSERT_EQ(g.wolf.ratios.size(), in["wolf_density_ratios"].size());
    for (size_t i = 0; i < g.wolf.ratios.size(); ++i)
      EXPECT_NEAR(g.wolf.ratios[i], in["wolf_density_ratios"][i].get<double>(),
                  1e-9)
          << "region " << i;
    const bool rank_deficient = in["centered_rank"].get<int64_t>() <
                                in["pca_n_components"].get<int64_t>();
    if (!rank_deficient) {
      EXPECT_EQ(g.effective_dim_99, in["effective_dim_99"].get<int64_t>());
    }
    if (g.num_vectors <= 100) {
      EXPECT_NEAR(g.spherical_uniformity,
                  in["spherical_uniformity_all_pairs"].get<double>(), 1e-6);
    }
    EXPECT_EQ(g.has_structure, in["has_structure"].get<bool>());
    EXPECT_NEAR(g.mean_local_dim, in["mean_local_dim"].get<double>(), 1e-9);
  }
}

TEST(TheLoomGoldenTest, Bilateral) {
  LOAD_OR_SKIP(golden, "analyze_bilateral.json");
  ASSERT_EQ(golden["cases"].size(), 8u);
  for (const json& c : golden["cases"]) {
    SCOPED_TRACE("case " + c["id"].get<std::string>());
    auto body = Parse(c["input"], {"sender_vectors", "receiver_vectors"});
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    const BilateralResult b =
        AnalyzeBilateral(body->matrices[0], body->matrices[1], kDefaultSeed);
    const json out = BilateralJson(b);
    for (const auto& [field, rule] : c["compare"].items())
      CompareField(field, rule, out, c["expected"]);
    const json& in = c["internals"];
    EXPECT_EQ(b.subspace_components, in["subspace_n_comp"].get<int64_t>());
    for (const auto& [side, mine] :
         {std::pair<std::string, const BilateralResult::Side*>{"sender",
                                                               &b.sender},
          {"receiver", &b.receiver}}) {
      SCOPED_TRACE(side);
      const json& s = in[side];
      EXPECT_EQ(mine->num_grains, s["num_grains"].get<int64_t>());
      EXPECT_NEAR(mine->grain_coverage, s["grain_coverage"].get<double>(),
                  1e-9);
      EXPECT_NEAR(mine->mean_local_dim, s["mean_local_dim"].get<double>(),
                  1e-9);
      EXPECT_NEAR(mine->grain_eps, s["grain_eps"].get<double>(),
                  1e-4 * s["grain_eps"].get<double>() + 1e-6);
      EXPECT_NEAR(mine->wolf_mean_density_ratio,
                  s["wolf30_mean_density_ratio"].get<double>(), 1e-9);
      EXPECT_EQ(mine->effective_dim, s["effective_dim"].get<int64_t>());
    }
    if (c["id"] == "b03_disjoint_subspaces") {
      // 10 + 10 components in R^16 overlap in at least 4 dimensions.
      EXPECT_GE(b.subspace_overlap, 0.4 - 1e-6);
    }
  }
}

TEST(TheLoomGoldenTest, HiddenStateStatistics) {
  LOAD_OR_SKIP(golden, "analyze_hidden_state.json");
  ASSERT_EQ(golden["cases"].size(), 7u);
  for (const json& c : golden["cases"]) {
    SCOPED_TRACE("case " + c["id"].get<std::string>());
    std::vector<float> v;
    for (const json& x : c["input"]["vector"])
      v.push_back(static_cast<float>(x.get<double>()));
    const json out = HiddenStateStatistics(v);
    for (const auto& [field, rule] : c["compare"].items())
      CompareField(field, rule, out, c["expected"]);
    EXPECT_EQ(out.size(), c["expected"].size()) << out.dump();
  }
}

// Any seed gives a draw of TheLoom's distribution; seed 0 is the goldens'.
TEST(TheLoomAnalysisTest, SeedChangesOnlyTheRandomFields) {
  LOAD_OR_SKIP(golden, "analyze_geometry.json");
  const json& c = golden["cases"][1];  // g02: 20 x 64
  auto body = Parse(c["input"], {"vectors"});
  ASSERT_TRUE(body.ok());
  const GeometryResult a = AnalyzeGeometry(body->matrices[0], 0);
  const GeometryResult b = AnalyzeGeometry(body->matrices[0], 12345);
  EXPECT_NE(a.wolf.ratios, b.wolf.ratios);
  EXPECT_EQ(a.effective_dim, b.effective_dim);
  EXPECT_EQ(a.isotropy_score, b.isotropy_score);
  EXPECT_EQ(a.labels, b.labels);
  const GeometryResult again = AnalyzeGeometry(body->matrices[0], 12345);
  EXPECT_EQ(b.wolf.ratios, again.wolf.ratios);
  // Within TheLoom's unseeded envelope (README: +-50% of its range).
  const json& env = c["theloom_unseeded"]["wolf_axiom.mean_density_ratio"];
  const double lo = env["min"].get<double>(), hi = env["max"].get<double>();
  EXPECT_GE(b.wolf.mean_ratio, lo - 0.5 * (hi - lo));
  EXPECT_LE(b.wolf.mean_ratio, hi + 0.5 * (hi - lo));
}

// numpy 1.24: RandomState(0).random_sample(), .randn(3), .randint(0, 10, 5),
// .uniform(-0.5, 0.5).
TEST(TheLoomAnalysisTest, LegacyRandomMatchesNumpy) {
  {
    LegacyRandom r(0);
    EXPECT_DOUBLE_EQ(r.NextDouble(), 0.5488135039273248);
  }
  {
    LegacyRandom r(0);
    EXPECT_DOUBLE_EQ(r.Gauss(), 1.764052345967664);
    EXPECT_DOUBLE_EQ(r.Gauss(), 0.4001572083672233);
    EXPECT_DOUBLE_EQ(r.Gauss(), 0.9787379841057392);
  }
  {
    LegacyRandom r(0);
    std::vector<int64_t> got;
    for (int i = 0; i < 5; ++i) got.push_back(r.RandInt(10));
    EXPECT_EQ(got, (std::vector<int64_t>{5, 0, 3, 3, 7}));
  }
  {
    LegacyRandom r(0);
    EXPECT_DOUBLE_EQ(r.Uniform(-0.5, 0.5), 0.04881350392732475);
  }
}

TEST(TheLoomAnalysisTest, StudentT) {
  // scipy: 2 * t.sf(2, 10), 2 * t.sf(0.5, 49), 2 * t.sf(4, 3).
  EXPECT_NEAR(StudentTwoSidedP(2.0, 10), 0.07338803477074463, 1e-12);
  EXPECT_NEAR(StudentTwoSidedP(-2.0, 10), 0.07338803477074463, 1e-12);
  EXPECT_NEAR(StudentTwoSidedP(0.0, 29), 1.0, 1e-15);
  EXPECT_EQ(StudentTwoSidedP(INFINITY, 29), 0.0);
}

TEST(TheLoomAnalysisTest, ParsesGoFloatsAndOtherFields) {
  const std::string body =
      "{\"seed\": 7, \"ve\\u0063tors\": [[1.2345678901234567e-05, -2, 3.5],"
      " [0, 1E+2, -0.000001], [4.999999999999999, 6, 7]], \"x\": {\"y\": "
      "[1, \"]\"]}}";
  auto b = ParseAnalysisBody(body, {"vectors"}, 3, kMaxVectors);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const Matrix& m = b->matrices[0];
  EXPECT_EQ(m.rows, 3);
  EXPECT_EQ(m.cols, 3);
  EXPECT_EQ(m.values[0], static_cast<float>(1.2345678901234567e-05));
  EXPECT_EQ(m.values[4], 100.0f);
  EXPECT_EQ(m.values[6], static_cast<float>(4.999999999999999));
  EXPECT_EQ(b->rest["seed"], 7);
  EXPECT_EQ(b->rest["x"]["y"][1], "]");
  auto seed = SeedOf(b->rest);
  ASSERT_TRUE(seed.ok());
  EXPECT_EQ(*seed, 7u);
  EXPECT_EQ(*SeedOf(json::object()), kDefaultSeed);
  EXPECT_FALSE(SeedOf(json{{"seed", -1}}).ok());
  EXPECT_FALSE(SeedOf(json{{"seed", 4294967296LL}}).ok());
}

TEST(TheLoomAnalysisTest, BodyErrorsNameTheProblem) {
  auto err = [](const std::string& body) {
    auto b = ParseAnalysisBody(body, {"vectors"}, 3, 5);
    EXPECT_FALSE(b.ok()) << body;
    return b.ok() ? std::string() : b.status().ToString();
  };
  auto has = [](const std::string& s, const std::string& part) {
    EXPECT_NE(s.find(part), std::string::npos) << s;
  };
  has(err("{}"), "field `vectors` is required");
  has(err("{\"vectors\": null}"), "field `vectors` is required");
  has(err("{\"vectors\": [[1], [2]]}"), "need at least 3 vectors");
  has(err("{\"vectors\": [[1],[2],[3],[4],[5],[6]]}"), "at most 5 vectors");
  has(err("{\"vectors\": [[1, 2], [2], [3, 4]]}"),
      "row 1 has 1 values but row 0 has 2");
  has(err("{\"vectors\": [[1], [], [3]]}"), "row 1 is empty");
  has(err("{\"vectors\": [[1], [\"a\"], [3]]}"),
      "row 1, element 0: expected a number");
  has(err("{\"vectors\": [[1], [1e39], [3]]}"), "not finite as a float32");
  has(err("{\"vectors\": 5}"), "expected a list of lists");
  has(err("{\"vectors\": [[1], [2], [3]]"), "");  // malformed JSON
  has(err("[]"), "");
}

// A numeric-string element is refused (pydantic's lax mode would take it):
// the vectors are numbers in every client we know.
TEST(TheLoomAnalysisTest, HiddenStateEmptyAndShapes) {
  const json e = HiddenStateStatistics({});
  EXPECT_EQ(e["mean"], 0.0);
  EXPECT_FALSE(e.contains("percentile_50"));
  const json s = HiddenStateStatistics({1.0f, 2.0f});
  EXPECT_EQ(s["shape"], json::array({2}));
  EXPECT_EQ(s["embedding_shape"], json::array({2}));
  EXPECT_EQ(s["percentile_50"], 1.5);
}

}  // namespace
}  // namespace loom::serve::theloom
