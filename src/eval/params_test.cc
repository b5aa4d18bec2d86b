// The parameter table: names, flags, ranges and the fields a group binds.
#include "src/eval/params.h"

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <set>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "src/eval/job_plan.h"

namespace loom::eval {
namespace {

TEST(ParamsTest, FlagsAndRanges) {
  const ParamSpec top_p{"top_p", ParamKind::kFloat, 0, 1, true, ""};
  EXPECT_EQ(ParamFlag(top_p), "--top-p");
  ParamField f{&top_p, static_cast<float*>(nullptr), std::nullopt};
  EXPECT_EQ(ParamRangeText(f), "a number in (0, 1]");
  EXPECT_FALSE(InParamRange(f, 0));
  EXPECT_TRUE(InParamRange(f, 1e-9));
  EXPECT_TRUE(InParamRange(f, 1));
  EXPECT_FALSE(InParamRange(f, 1.5));
  EXPECT_FALSE(InParamRange(f, std::numeric_limits<double>::quiet_NaN()));
  const ParamSpec tokens{"max_tokens", ParamKind::kInt, 0, 1 << 30, false, ""};
  ParamField t{&tokens, static_cast<int64_t*>(nullptr), std::nullopt};
  EXPECT_EQ(ParamRangeText(t), "an integer in [0, 1073741824]");
  t.hi = 8192;  // a surface's narrower cap
  EXPECT_EQ(ParamRangeText(t), "an integer in [0, 8192]");
  EXPECT_FALSE(InParamRange(t, 8193));
  const ParamSpec temperature{
      "temperature", ParamKind::kFloat, 0, 2, false, ""};
  EXPECT_EQ(ParamRangeText({&temperature, static_cast<float*>(nullptr), {}}),
            "a number in [0, 2]");
  const ParamSpec seed{"seed", ParamKind::kSeed, 0, 0, false, ""};
  ParamField s{&seed, static_cast<uint64_t*>(nullptr), std::nullopt};
  EXPECT_EQ(ParamRangeText(s), "an integer in [0, 18446744073709551615]");
  EXPECT_TRUE(InParamRange(s, 1e19));
  EXPECT_FALSE(InParamRange(s, -1));
}

// Every spec of the group is bound, once, to the field of its kind, at the
// address given; the ranges are the generator's (ValidateSampling).
TEST(ParamsTest, GenerationParamsBindEverySpecToItsField) {
  int64_t max_tokens = 32;
  SamplingOptions sampling;
  std::vector<std::string> stop;
  std::vector<ParamField> fields =
      GenerationParams(&max_tokens, &sampling, &stop);
  ASSERT_EQ(fields.size(), GenerationParamSpecs().size());
  std::set<std::string_view> names;
  for (size_t i = 0; i < fields.size(); ++i) {
    const ParamField& f = fields[i];
    SCOPED_TRACE(std::string(f.spec->name));
    EXPECT_EQ(f.spec, &GenerationParamSpecs()[i]);
    EXPECT_TRUE(names.insert(f.spec->name).second);
    EXPECT_FALSE(f.spec->help.empty());
    switch (f.spec->kind) {
      case ParamKind::kInt:
        EXPECT_TRUE(std::holds_alternative<int64_t*>(f.target));
        break;
      case ParamKind::kSeed:
        EXPECT_TRUE(std::holds_alternative<uint64_t*>(f.target));
        break;
      case ParamKind::kFloat:
        EXPECT_TRUE(std::holds_alternative<float*>(f.target));
        break;
      case ParamKind::kString:
        EXPECT_TRUE(std::holds_alternative<std::string*>(f.target));
        break;
      case ParamKind::kStrings:
        EXPECT_TRUE(
            std::holds_alternative<std::vector<std::string>*>(f.target));
        break;
      case ParamKind::kBool:
        EXPECT_TRUE(std::holds_alternative<bool*>(f.target));
        break;
    }
  }
  EXPECT_EQ(std::get<int64_t*>(FindParam(fields, "max_tokens")->target),
            &max_tokens);
  EXPECT_EQ(std::get<float*>(FindParam(fields, "temperature")->target),
            &sampling.temperature);
  EXPECT_EQ(std::get<int64_t*>(FindParam(fields, "top_k")->target),
            &sampling.top_k);
  EXPECT_EQ(std::get<float*>(FindParam(fields, "top_p")->target),
            &sampling.top_p);
  EXPECT_EQ(std::get<uint64_t*>(FindParam(fields, "seed")->target),
            &sampling.seed);
  EXPECT_EQ(
      std::get<std::vector<std::string>*>(FindParam(fields, "stop")->target),
      &stop);
  EXPECT_EQ(FindParam(fields, "nope"), nullptr);
  // The table's ranges are the ones the generator enforces.
  for (double t : {-0.5, 0.0, 1.0, double{kMaxTemperature}, 2.5}) {
    SamplingOptions o;
    o.temperature = static_cast<float>(t);
    EXPECT_EQ(InParamRange(*FindParam(fields, "temperature"), t),
              ValidateSampling(o).ok())
        << t;
  }
  for (double p : {0.0, 0.25, 1.0, 1.5}) {
    SamplingOptions o;
    o.top_p = static_cast<float>(p);
    EXPECT_EQ(InParamRange(*FindParam(fields, "top_p"), p),
              ValidateSampling(o).ok())
        << p;
  }
}

// The window group: 0 asks for the computed default where the spec says so
// (an open upper bound), the names and fields of WindowParams.
TEST(ParamsTest, WindowParamsZeroIsTheDefault) {
  WindowParams w;
  std::vector<ParamField> fields = WindowParamFields(&w);
  ASSERT_EQ(fields.size(), WindowParamSpecs().size());
  const ParamField& ctx = *FindParam(fields, "ctx");
  EXPECT_EQ(std::get<int64_t*>(ctx.target), &w.ctx);
  EXPECT_EQ(ParamRangeText(ctx), "an integer >= 2, or 0 (the default)");
  EXPECT_TRUE(InParamRange(ctx, 0));
  EXPECT_FALSE(InParamRange(ctx, 1));
  EXPECT_TRUE(InParamRange(ctx, 1e12));
  const ParamField& chunk = *FindParam(fields, "chunk_rows");
  EXPECT_EQ(ParamRangeText(chunk), "an integer >= 1");
  EXPECT_FALSE(InParamRange(chunk, 0));
  EXPECT_EQ(std::get<std::string*>(FindParam(fields, "protocol")->target),
            &w.protocol);
  EXPECT_EQ(std::get<std::string*>(FindParam(fields, "add_bos")->target),
            &w.add_bos);
  EXPECT_EQ(ParamFlag(*FindParam(fields, "max_windows")->spec),
            "--max-windows");
}

// The extract-rows group; an option of two groups (add_bos) is one
// declaration: the same name, kind and help in both.
TEST(ParamsTest, ExtractRowParamsAndSharedOptions) {
  ExtractRowParams x;
  std::vector<ParamField> fields = ExtractRowParamFields(&x);
  ASSERT_EQ(fields.size(), ExtractRowParamSpecs().size());
  EXPECT_TRUE(InParamRange(*FindParam(fields, "batch_tokens"), 0));
  EXPECT_TRUE(InParamRange(*FindParam(fields, "streaming_chunk_size"), 0));
  EXPECT_FALSE(InParamRange(*FindParam(fields, "commit_every"), 0));
  EXPECT_EQ(std::get<int64_t*>(FindParam(fields, "max_row_tokens")->target),
            &x.max_row_tokens);
  WindowParams w;
  std::vector<ParamField> windows = WindowParamFields(&w);
  const ParamSpec& a = *FindParam(fields, "add_bos")->spec;
  const ParamSpec& b = *FindParam(windows, "add_bos")->spec;
  EXPECT_EQ(a.help, b.help);
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(x.add_bos, w.add_bos);
}

TEST(ParamsTest, PlacementParamsBindJobPlanOptions) {
  JobPlanOptions p;
  std::vector<ParamField> fields = PlacementParamFields(&p);
  ASSERT_EQ(fields.size(), PlacementParamSpecs().size());
  EXPECT_EQ(ParamFlag(*FindParam(fields, "max_memory")->spec), "--max-memory");
  EXPECT_EQ(
      std::get<std::vector<std::string>*>(FindParam(fields, "device")->target),
      &p.devices);
  EXPECT_EQ(std::get<bool*>(FindParam(fields, "offload")->target), &p.offload);
  EXPECT_EQ(std::get<bool*>(FindParam(fields, "verify_plan")->target),
            &p.verify_plan);
  EXPECT_EQ(ParamRangeText(*FindParam(fields, "show_plan")), "true or false");
  EXPECT_EQ(CaptureParam("hooks").kind, ParamKind::kStrings);
  EXPECT_TRUE(CaptureParam("hooks").comma_list);
  EXPECT_TRUE(CaptureParam("layers").comma_list);
  EXPECT_FALSE(CaptureParam("select").comma_list);
  EXPECT_EQ(ParamFlag(CaptureParam("precision")), "--precision");
}

TEST(ParamsTest, ModelAndInterventionGroups) {
  int threads = 0;
  const ParamField t{&ModelParam("threads"), &threads, {}};
  EXPECT_EQ(ParamFlag(*t.spec), "--threads");
  EXPECT_EQ(ParamRangeText(t), "an integer in [0, 4096]");
  EXPECT_TRUE(InParamRange(t, 0));
  EXPECT_FALSE(InParamRange(t, kMaxThreads + 1));
  EXPECT_EQ(ModelParam("hf_bf16").kind, ParamKind::kBool);
  EXPECT_EQ(ParamFlag(ModelParam("hf_bf16")), "--hf-bf16");
  EXPECT_EQ(ParamFlag(InterventionParam("ablate_direction")),
            "--ablate-direction");
  EXPECT_EQ(ParamFlag(InterventionParam("control_vector_layer_range")),
            "--control-vector-layer-range");
  EXPECT_EQ(InterventionParam("steer").kind, ParamKind::kStrings);
}

// Across the groups a name means one option: where two groups share one
// (add_bos), it is the same declaration; every option says what it does.
TEST(ParamsTest, ANameIsOneOptionAcrossGroups) {
  const std::span<const ParamSpec> groups[] = {
      GenerationParamSpecs(),  WindowParamSpecs(),  ExtractRowParamSpecs(),
      PlacementParamSpecs(),   CaptureParamSpecs(), ModelParamSpecs(),
      InterventionParamSpecs(), AnalysisParamSpecs(),  LensGridParamSpecs()};
  std::map<std::string_view, const ParamSpec*> seen;
  for (std::span<const ParamSpec> g : groups)
    for (const ParamSpec& s : g) {
      SCOPED_TRACE(std::string(s.name));
      EXPECT_FALSE(s.help.empty());
      auto [it, fresh] = seen.emplace(s.name, &s);
      if (fresh) continue;
      EXPECT_EQ(it->second->help, s.help);
      EXPECT_EQ(it->second->kind, s.kind);
    }
  EXPECT_GE(seen.size(), 30u);
}

}  // namespace
}  // namespace loom::eval
