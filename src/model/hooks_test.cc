// The hook resolver (--hooks / --layers) and hook widths, on configs of real
// checkpoints. Expected numbers come from their config.json: Llama-3.1-8B has
// 32 layers, hidden 4096, 32 heads and 8 KV heads of 128, intermediate 14336,
// vocab 128256; Qwen3-30B-A3B has 48 layers, every one an MoE layer.
#include "src/model/hooks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "src/model/registry.h"

namespace loom {
namespace {

ModelConfig Config(const std::string& name) {
  StatusOr<ModelConfig> c =
      LoadModelConfig(std::string(LOOM_TESTDATA_DIR) + "/configs/" + name);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : ModelConfig();
}

std::vector<std::string> Names(const HookSet& set) {
  std::vector<std::string> out;
  for (const HookPoint& h : set.hooks()) out.push_back(HookName(h));
  return out;
}

// Resolves and returns the names, or the error message prefixed by "error: ".
std::vector<std::string> Resolve(const std::vector<std::string>& hooks,
                                 const std::vector<std::string>& layers,
                                 const ModelConfig& c) {
  StatusOr<HookSet> set = ResolveHooks(hooks, layers, c);
  if (!set.ok()) return {"error: " + set.status().message()};
  return Names(*set);
}

class ResolveHooksTest : public ::testing::Test {
 protected:
  ModelConfig llama_ = Config("Llama-3.1-8B");
};

TEST_F(ResolveHooksTest, FullNamesWithIndexNegativeStarAndFraction) {
  ASSERT_EQ(llama_.num_layers, 32);
  EXPECT_EQ(Resolve({"blocks.3.hook_resid_post"}, {}, llama_),
            std::vector<std::string>{"blocks.3.hook_resid_post"});
  EXPECT_EQ(Resolve({"blocks.-1.attn.hook_q"}, {}, llama_),
            std::vector<std::string>{"blocks.31.attn.hook_q"});
  // floor(0.5 x 32) = 16; {1.0} is the last layer, {1} too.
  EXPECT_EQ(Resolve({"blocks.{0.5}.attn.hook_z", "blocks.{1.0}.attn.hook_z"},
                    {}, llama_),
            (std::vector<std::string>{"blocks.16.attn.hook_z",
                                      "blocks.31.attn.hook_z"}));
  EXPECT_EQ(Resolve({"blocks.{1}.hook_mlp_out"}, {}, llama_),
            std::vector<std::string>{"blocks.31.hook_mlp_out"});
  const std::vector<std::string> star =
      Resolve({"blocks.*.hook_resid_pre"}, {}, llama_);
  ASSERT_EQ(star.size(), 32u);
  EXPECT_EQ(star.front(), "blocks.0.hook_resid_pre");
  EXPECT_EQ(star.back(), "blocks.31.hook_resid_pre");
}

TEST_F(ResolveHooksTest, BareSitesTakeEveryLayerOfLayers) {
  // Indices, negatives and fractions, given as separate entries or one
  // comma-separated entry (the CLI may hand either).
  const std::vector<std::string> want = {
      "blocks.0.hook_resid_post", "blocks.8.hook_resid_post",
      "blocks.30.hook_resid_post", "blocks.31.hook_resid_post"};
  EXPECT_EQ(Resolve({"hook_resid_post"}, {"0", "0.25", "-2", "1.0"}, llama_),
            want);
  EXPECT_EQ(Resolve({"hook_resid_post"}, {"0,0.25,-2,1.0"}, llama_), want);
  EXPECT_EQ(Resolve({"hook_resid_post"}, {"*"}, llama_).size(), 32u);
}

TEST_F(ResolveHooksTest, CommaListsModelLevelNamesAndDeduplication) {
  // Model-level names ignore --layers; duplicates collapse; the set is in
  // layer order (model-level hooks before the blocks).
  EXPECT_EQ(Resolve({"hook_embed,blocks.1.hook_resid_post",
                     "hook_resid_post,ln_final.hook_normalized", "logits"},
                    {"1", "-31"}, llama_),
            (std::vector<std::string>{"hook_embed", "ln_final.hook_normalized",
                                      "logits", "blocks.1.hook_resid_post"}));
  // Empty items are skipped; nothing requested is an empty set, not an error.
  EXPECT_EQ(Resolve({",,"}, {}, llama_), std::vector<std::string>{});
}

TEST_F(ResolveHooksTest, ClearErrors) {
  auto error = [&](const std::vector<std::string>& hooks,
                   const std::vector<std::string>& layers) {
    const std::vector<std::string> r = Resolve(hooks, layers, llama_);
    return r.size() == 1 && r[0].rfind("error: ", 0) == 0 ? r[0] : "";
  };
  EXPECT_NE(error({"hook_resid_post"}, {})
                .find("needs a layer: write blocks.{L}.hook_resid_post or give "
                      "--layers"),
            std::string::npos);
  EXPECT_NE(error({"hook_resid_psot"}, {"0"}).find("unknown hook"),
            std::string::npos);
  EXPECT_NE(error({"blocks.2.hook_nope"}, {}).find("unknown site 'hook_nope'"),
            std::string::npos);
  const std::string range = error({"blocks.32.hook_resid_post"}, {});
  EXPECT_NE(range.find("out of range"), std::string::npos) << range;
  EXPECT_NE(range.find("32 layers"), std::string::npos) << range;
  EXPECT_NE(error({"hook_resid_post"}, {"-33"}).find("out of range"),
            std::string::npos);
  EXPECT_NE(error({"hook_resid_post"}, {"1.5"}).find("outside [0, 1]"),
            std::string::npos);
  EXPECT_NE(error({"hook_resid_post"}, {"x"}).find("not an integer"),
            std::string::npos);
  // Llama has no learned positions and no post-norms.
  EXPECT_NE(error({"hook_pos_embed"}, {}).find("does not exist in llama"),
            std::string::npos);
  EXPECT_NE(error({"ln1_post.hook_normalized"}, {"0"})
                .find("does not exist in llama"),
            std::string::npos);
}

// The site table: names unique and round-tripping through the parser, the
// editable, integer and per-token columns as the engine relies on them.
TEST(HookSiteTableTest, OneRowPerSiteReadByEveryConsumer) {
  std::vector<std::string_view> names;
  for (const HookSiteInfo& info : kHookSites) {
    SCOPED_TRACE(std::string(info.name));
    EXPECT_EQ(HookSiteName(info.site), info.name);
    EXPECT_EQ(std::count(names.begin(), names.end(), info.name), 0);
    names.push_back(info.name);
    // Layer sites parse as blocks.2.<name>, the others as the bare name.
    const std::string full = info.per_layer
                                 ? "blocks.2." + std::string(info.name)
                                 : std::string(info.name);
    StatusOr<std::vector<HookPoint>> parsed = ParseHookPattern(full, 4);
    ASSERT_TRUE(parsed.ok()) << parsed.status().message();
    ASSERT_EQ(parsed->size(), 1u);
    EXPECT_EQ((*parsed)[0].site, info.site);
    EXPECT_EQ((*parsed)[0].layer, info.per_layer ? 2 : -1);
    // Only the pattern has no rows per token, only the expert ids are
    // integers; both are what generation cannot stream.
    EXPECT_EQ(info.token_major, info.site != HookSite::kPattern);
    EXPECT_EQ(IsIntegerSite(info.site), info.site == HookSite::kExpertIds);
    EXPECT_EQ(IsFloatRowSite(info.site), info.site != HookSite::kPattern &&
                                             info.site != HookSite::kExpertIds);
    // Editable sites are residual-width or per-head/MLP rows of floats.
    if (info.editable) {
      EXPECT_TRUE(IsFloatRowSite(info.site));
    }
  }
  // Model-level sites first in the enum's layer order (ModelHooks walks the
  // layer sites from kResidPre on).
  for (const HookSiteInfo& info : kHookSites)
    EXPECT_EQ(info.per_layer, info.site >= HookSite::kResidPre) << info.name;
}

TEST(HookWidthTest, EverySiteOfADenseModel) {
  const ModelConfig c = Config("Llama-3.1-8B");
  auto width = [&](HookSite site, int64_t layer) -> int64_t {
    StatusOr<int64_t> w = HookWidth({site, layer}, c);
    EXPECT_TRUE(w.ok()) << HookName({site, layer}) << ": "
                        << w.status().message();
    return w.ok() ? *w : -1;
  };
  for (HookSite s : {HookSite::kResidPre, HookSite::kLn1, HookSite::kAttnOut,
                     HookSite::kResidMid, HookSite::kLn2, HookSite::kMlpOut,
                     HookSite::kResidPost})
    EXPECT_EQ(width(s, 5), 4096) << HookSiteName(s);
  EXPECT_EQ(width(HookSite::kEmbed, -1), 4096);
  EXPECT_EQ(width(HookSite::kFinalNorm, -1), 4096);
  for (HookSite s : {HookSite::kQ, HookSite::kRotQ, HookSite::kZ})
    EXPECT_EQ(width(s, 0), 32 * 128) << HookSiteName(s);
  for (HookSite s : {HookSite::kK, HookSite::kV, HookSite::kRotK})
    EXPECT_EQ(width(s, 31), 8 * 128) << HookSiteName(s);
  EXPECT_EQ(width(HookSite::kMlpPre, 1), 14336);
  EXPECT_EQ(width(HookSite::kMlpPost, 1), 14336);
  EXPECT_EQ(width(HookSite::kLogits, -1), 128256);
}

TEST(HookWidthTest, HooksWithoutARowWidthAreErrors) {
  const ModelConfig llama = Config("Llama-3.1-8B");
  // The pattern is [heads, L, L] per sequence.
  StatusOr<int64_t> pattern = HookWidth({HookSite::kPattern, 0}, llama);
  ASSERT_FALSE(pattern.ok());
  EXPECT_NE(pattern.status().message().find("blocks.0.attn.hook_pattern"),
            std::string::npos);
  // Given the key positions, each query token's row is [heads, keys].
  EXPECT_EQ(*HookWidth({HookSite::kPattern, 0}, llama, 100),
            llama.num_heads * 100);
  EXPECT_EQ(HookWidth({HookSite::kResidPost, 32}, llama).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_FALSE(HookWidth({HookSite::kPosEmbed, -1}, llama).ok());

  // MoE layers have no single gate pre-activation.
  const ModelConfig moe = Config("Qwen3-30B-A3B");
  ASSERT_EQ(moe.mlp, MlpKind::kMoE);
  StatusOr<int64_t> pre = HookWidth({HookSite::kMlpPre, 0}, moe);
  ASSERT_FALSE(pre.ok());
  EXPECT_NE(pre.status().message().find("MoE"), std::string::npos);
  EXPECT_EQ(*HookWidth({HookSite::kMlpOut, 47}, moe), 2048);
  EXPECT_EQ(*HookWidth({HookSite::kQ, 47}, moe), 32 * 128);
  EXPECT_EQ(*HookWidth({HookSite::kK, 47}, moe), 4 * 128);
  // The resolver refuses it too.
  EXPECT_FALSE(ResolveHooks({"mlp.hook_post"}, {"*"}, moe).ok());

  // The router hooks: [T, E] logits, [T, k] ids and weights, on MoE layers
  // only (config: 128 experts, 8 per token).
  EXPECT_EQ(*HookWidth({HookSite::kRouterLogits, 47}, moe), 128);
  EXPECT_EQ(*HookWidth({HookSite::kExpertIds, 0}, moe), 8);
  EXPECT_EQ(*HookWidth({HookSite::kExpertWeights, 3}, moe), 8);
  StatusOr<HookSet> routed = ResolveHooks(
      {"mlp.hook_router_logits,blocks.-1.mlp.hook_expert_ids"}, {"0"}, moe);
  ASSERT_TRUE(routed.ok()) << routed.status().ToString();
  EXPECT_TRUE(routed->Contains(HookSite::kRouterLogits, 0));
  EXPECT_TRUE(routed->Contains(HookSite::kExpertIds, 47));
  StatusOr<int64_t> dense = HookWidth({HookSite::kRouterLogits, 0}, llama);
  ASSERT_FALSE(dense.ok());
  EXPECT_NE(dense.status().message().find("blocks.0.mlp.hook_router_logits"),
            std::string::npos)
      << dense.status().ToString();
  // A Qwen-MoE layer made dense by mlp_only_layers has mlp.hook_pre and no
  // router.
  ModelConfig mixed = moe;
  mixed.moe.mlp_only_layers = {0};
  EXPECT_TRUE(HookWidth({HookSite::kMlpPre, 0}, mixed).ok());
  EXPECT_FALSE(HookWidth({HookSite::kExpertIds, 0}, mixed).ok());
  EXPECT_FALSE(HookWidth({HookSite::kMlpPre, 1}, mixed).ok());
}

// A wildcard layer means every layer that has the site (deepseek_v3's dense
// first layers have no router); a layer named explicitly must have it, and a
// site no layer has stays an error.
TEST(ResolveHooksWildcardTest, EveryLayerThatHasTheSite) {
  ModelConfig mixed = Config("Qwen3-30B-A3B");
  ASSERT_EQ(mixed.mlp, MlpKind::kMoE);
  mixed.moe.mlp_only_layers = {0, 1};
  StatusOr<HookSet> r =
      ResolveHooks({"blocks.*.mlp.hook_router_logits"}, {}, mixed);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->hooks().size(), static_cast<size_t>(mixed.num_layers - 2));
  EXPECT_FALSE(r->Contains(HookSite::kRouterLogits, 0));
  EXPECT_TRUE(r->Contains(HookSite::kRouterLogits, 2));
  r = ResolveHooks({"mlp.hook_router_logits"}, {"*"}, mixed);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->hooks().size(), static_cast<size_t>(mixed.num_layers - 2));
  // The dense layers' own hooks, the other way round.
  r = ResolveHooks({"blocks.*.mlp.hook_pre"}, {}, mixed);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->hooks().size(), 2u);
  EXPECT_FALSE(
      ResolveHooks({"blocks.0.mlp.hook_router_logits"}, {}, mixed).ok());
  EXPECT_FALSE(ResolveHooks({"mlp.hook_router_logits"}, {"0"}, mixed).ok());
  const StatusOr<HookSet> none = ResolveHooks(
      {"blocks.*.mlp.hook_router_logits"}, {}, Config("Llama-3.1-8B"));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no layer of"), std::string::npos)
      << none.status().ToString();
}

// Parallel blocks (the tiny GPT-NeoX and Phi configs of the shared goldens):
// no residual between attention and MLP, so hook_resid_mid is refused with
// the reason; Phi's one norm has no ln2 of its own.
TEST(CheckHookExistsTest, ParallelBlocksRefuseTheHooksTheyLack) {
  const std::string tiny = std::string(LOOM_SHARED_DIR) + "/golden/tiny/";
  StatusOr<ModelConfig> neox = LoadModelConfig(tiny + "gpt_neox");
  StatusOr<ModelConfig> phi = LoadModelConfig(tiny + "phi");
  if (!neox.ok() || !phi.ok())
    GTEST_SKIP() << "SKIPPED LOUDLY: " << tiny
                 << "{gpt_neox,phi} not found; parallel-block hooks unchecked";
  ASSERT_EQ(neox->block, BlockKind::kParallel);
  ASSERT_EQ(phi->block, BlockKind::kParallelSharedNorm);
  const Status mid = CheckHookExists({HookSite::kResidMid, 1}, *neox);
  ASSERT_FALSE(mid.ok());
  EXPECT_NE(mid.message().find("blocks.1.hook_resid_mid does not exist in "
                               "gpt_neox (a parallel block"),
            std::string::npos)
      << mid.message();
  EXPECT_TRUE(CheckHookExists({HookSite::kLn2, 1}, *neox).ok());
  const Status ln2 = CheckHookExists({HookSite::kLn2, 2}, *phi);
  ASSERT_FALSE(ln2.ok());
  EXPECT_NE(ln2.message().find("blocks.2.ln1.hook_normalized is the MLP's "
                               "input too"),
            std::string::npos)
      << ln2.message();
  EXPECT_FALSE(CheckHookExists({HookSite::kResidMid, 0}, *phi).ok());
  for (const ModelConfig* c : {&*neox, &*phi}) {
    // '*' lists none of them; asking by name is an error.
    for (const HookPoint& h : ModelHooks(*c)) {
      EXPECT_NE(h.site, HookSite::kResidMid) << c->model_type;
      if (c == &*phi) {
        EXPECT_NE(h.site, HookSite::kLn2);
      }
    }
    EXPECT_FALSE(ResolveHooks({"hook_resid_mid"}, {"0"}, *c).ok());
    EXPECT_TRUE(ResolveHooks({"hook_resid_pre,hook_attn_out,hook_mlp_out,"
                              "hook_resid_post,ln1.hook_normalized"},
                             {"*"}, *c)
                    .ok());
  }
  // use_parallel_residual = false: a sequential block with hook_resid_mid.
  ModelConfig seq = *neox;
  seq.block = BlockKind::kSequential;
  EXPECT_TRUE(CheckHookExists({HookSite::kResidMid, 1}, seq).ok());
}

}  // namespace
}  // namespace loom
