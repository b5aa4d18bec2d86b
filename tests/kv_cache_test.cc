// The KV cache against the planner and against the one-pass forward:
//   - KvCache's bytes are exactly the planner's `kv` term (one sizing
//     function, src/plan/kv_layout.h);
//   - a prompt prefilled in chunks carrying the cache (down to one-token
//     decode steps) gives the hidden states of one full pass, on the bundled
//     stories260K and every shared tiny golden model (f32).
#include "src/runtime/kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "src/backend/registry.h"
#include "src/plan/kv_layout.h"
#include "src/plan/planner.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"
#include "tests/golden_util.h"

namespace loom {
namespace {

using testing::RunnableTinyModels;
using testing::SharedGoldenDir;

// stories260K, then every shared tiny model (none when ../shared is absent;
// reported loudly).
std::vector<std::string> ModelDirs() {
  std::vector<std::string> dirs = {std::string(LOOM_MODELS_DIR) +
                                   "/stories260K"};
  const std::string shared = SharedGoldenDir();
  if (shared.empty()) {
    std::fprintf(stderr,
                 "SKIPPED LOUDLY: shared golden directory not found; only "
                 "stories260K is checked\n");
    return dirs;
  }
  for (const std::string& name : RunnableTinyModels(shared))
    dirs.push_back(shared + "/tiny/" + name);
  return dirs;
}

std::string Name(const std::string& dir) {
  return std::filesystem::path(dir).filename().string();
}

// Appends every token-major hook's rows, per hook point, in call order.
class RowSink : public HookSink {
 public:
  Status OnActivation(const HookPoint& hook, const Batch&, int64_t, int64_t,
                      const ActivationView& view) override {
    std::vector<float>& out = rows_[hook];
    const float* p = view.f32();
    for (int64_t r = 0; r < view.rows; ++r)
      out.insert(out.end(), p + r * view.ld, p + r * view.ld + view.cols);
    return Status();
  }
  const std::map<HookPoint, std::vector<float>>& rows() const { return rows_; }

 private:
  std::map<HookPoint, std::vector<float>> rows_;
};

TEST(KvCacheTest, BytesEqualThePlannersKvTerm) {
  auto backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  for (const std::string& dir : ModelDirs()) {
    SCOPED_TRACE(Name(dir));
    auto model = Model::Load(dir, Precision::kF32);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    const ModelConfig& c = (*model)->config();
    // MLA caches what HF caches per position and layer: key_states [heads,
    // qk_nope + qk_rope] and value_states [heads, v_head_dim], v unpadded.
    if (c.attention == AttentionKind::kMla) {
      EXPECT_EQ(KvLayerBytes(c, 0, 1, 1, DType::kF32),
                4 * c.num_heads * (c.mla.qk_head_dim() + c.mla.v_head_dim));
    }
    for (int64_t context : {1, 20, 100}) {
      const int64_t slots = 3;
      auto cache = KvCache::Create(c, slots, context, **backend);
      ASSERT_TRUE(cache.ok()) << cache.status().ToString();
      JobSpec job;
      job.mode = JobMode::kGeneration;
      job.batch_tokens = context;
      job.context = context;
      job.kv_seqs = slots;
      // No kv_dtype: the planner's default must be what KvCache allocates.
      auto cpu = ParseDevice("cpu=64GiB", int64_t{64} << 30);
      ASSERT_TRUE(cpu.ok());
      auto plan = PlanModelDir(dir, job, {*cpu}, int64_t{64} << 30,
                               (*backend)->Costs());
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      int64_t planned = 0;
      for (const DevicePlan& d : plan->devices) planned += d.kv;
      EXPECT_EQ((*cache)->storage_bytes(), planned) << "context " << context;
      for (int64_t l = 0; l < c.num_layers; ++l) {
        EXPECT_EQ((*cache)->positions(l), KvPositions(c, l, context));
        EXPECT_LE((*cache)->positions(l), context);
      }
      // Paged: global layers hold the page pool, window layers their rings.
      for (const KvPaging paging : {KvPaging{16, 5}, KvPaging{7, 1}}) {
        auto paged = KvCache::Create(c, slots, context, **backend, paging);
        ASSERT_TRUE(paged.ok()) << paged.status().ToString();
        JobSpec pjob = job;
        pjob.kv_page_size = paging.page_size;
        pjob.kv_pages = paging.num_pages;
        auto pplan = PlanModelDir(dir, pjob, {*cpu}, int64_t{64} << 30,
                                  (*backend)->Costs());
        ASSERT_TRUE(pplan.ok()) << pplan.status().ToString();
        int64_t pplanned = 0, want = 0;
        for (const DevicePlan& d : pplan->devices) pplanned += d.kv;
        for (int64_t l = 0; l < c.num_layers; ++l) {
          const bool global =
              c.sliding_window.empty() || c.sliding_window[l] <= 0;
          EXPECT_EQ((*paged)->layer_paged(l), global);
          // K rows of kv_dim, V rows of kv_v_dim (MLA: narrower v heads).
          want += global ? paging.num_pages * paging.page_size *
                               (c.kv_dim() + c.kv_v_dim()) * 4
                         : KvLayerBytes(c, l, context, slots, DType::kF32);
        }
        EXPECT_EQ((*paged)->storage_bytes(), pplanned)
            << "context " << context << " page size " << paging.page_size;
        EXPECT_EQ((*paged)->storage_bytes(), want);
      }
    }
  }
}

TEST(KvCacheTest, ReserveAndReset) {
  auto backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok());
  auto model = Model::Load(std::string(LOOM_MODELS_DIR) + "/stories260K",
                           Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const ModelConfig& c = (*model)->config();
  // 3 slots of 50 positions, 8 pages of 16 positions.
  auto made = KvCache::Create(c, 3, 50, **backend, {16, 8});
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  KvCache& kv = **made;
  EXPECT_TRUE(kv.paged());
  EXPECT_EQ(kv.page_size(), 16);
  EXPECT_EQ(kv.pages_per_seq(), 4);
  EXPECT_EQ(kv.free_pages(), 8);
  EXPECT_EQ(kv.PagesFor(0), 0);
  EXPECT_EQ(kv.PagesFor(1), 1);
  EXPECT_EQ(kv.PagesFor(16), 1);
  EXPECT_EQ(kv.PagesFor(17), 2);
  EXPECT_EQ(kv.PagesFor(50), 4);

  ASSERT_TRUE(kv.Reserve(0, 17).ok());
  EXPECT_EQ(kv.reserved_pages(0), 2);
  EXPECT_EQ(kv.reserved_positions(0), 32);
  EXPECT_EQ(kv.free_pages(), 6);
  ASSERT_TRUE(kv.Reserve(0, 10).ok());  // already covered: nothing taken
  EXPECT_EQ(kv.free_pages(), 6);
  ASSERT_TRUE(kv.Reserve(1, 50).ok());  // grows to the whole context
  EXPECT_EQ(kv.reserved_positions(1), 50);
  EXPECT_EQ(kv.free_pages(), 2);
  // All or nothing: 3 pages needed, 2 free.
  Status st = kv.Reserve(2, 40);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find("3 more pages"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("2 of 8 pages are free"), std::string::npos)
      << st.message();
  EXPECT_EQ(kv.free_pages(), 2);
  EXPECT_EQ(kv.reserved_pages(2), 0);
  st = kv.Reserve(2, 51);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
  EXPECT_EQ(kv.Reserve(3, 1).code(), StatusCode::kOutOfRange);
  // The tables hold distinct pages; Reset returns them.
  std::vector<int32_t> seen;
  for (int64_t slot : {0, 1})
    for (int64_t i = 0; i < kv.reserved_pages(slot); ++i)
      seen.push_back(kv.page_table(slot)[i]);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end());
  EXPECT_EQ(kv.page_table(0)[2], -1);
  kv.Reset(1);
  EXPECT_EQ(kv.free_pages(), 6);
  EXPECT_EQ(kv.reserved_pages(1), 0);
  EXPECT_EQ(kv.page_table(1)[0], -1);
  ASSERT_TRUE(kv.Reserve(2, 40).ok());
  EXPECT_EQ(kv.free_pages(), 3);

  // A forward past the reserved pages is refused before anything is written.
  ExecutorOptions opts;
  opts.max_tokens = 40;
  HookSet hooks;
  hooks.Add({HookSite::kFinalNorm, -1});
  auto ex = Executor::Create(**model, hooks, opts);
  ASSERT_TRUE(ex.ok()) << ex.status().ToString();
  std::vector<int32_t> ids(33, 5);
  const std::vector<int64_t> seq = {0, 33};
  const std::vector<int64_t> slot = {0}, pos0 = {0};
  RowSink sink;
  st = (*ex)->Forward(Batch{ids, seq}, &sink, {&kv, slot, pos0});
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("cover only 32"), std::string::npos)
      << st.message();
  EXPECT_EQ(kv.length(0), 0);
  ASSERT_TRUE(kv.Reserve(0, 33).ok());
  st = (*ex)->Forward(Batch{ids, seq}, &sink, {&kv, slot, pos0});
  EXPECT_TRUE(st.ok()) << st.ToString();

  // Without paging: no pages, every position covered.
  auto flat = KvCache::Create(c, 2, 50, **backend);
  ASSERT_TRUE(flat.ok());
  EXPECT_FALSE((*flat)->paged());
  EXPECT_EQ((*flat)->PagesFor(50), 0);
  EXPECT_TRUE((*flat)->Reserve(1, 50).ok());
  EXPECT_EQ((*flat)->Reserve(1, 51).code(), StatusCode::kOutOfRange);
  EXPECT_EQ((*flat)->reserved_positions(0), 50);
  EXPECT_FALSE(KvCache::Create(c, 2, 50, **backend, {16, 0}).ok());
}

class KvCacheLayoutTest : public ::testing::TestWithParam<bool> {};

// GetParam(): a paged cache (pages of 4 positions in a scrambled order) or
// the contiguous one.
TEST_P(KvCacheLayoutTest, ChunkedPrefillEqualsOnePass) {
  const bool paged = GetParam();
  for (const std::string& dir : ModelDirs()) {
    SCOPED_TRACE(Name(dir));
    auto model = Model::Load(dir, Precision::kF32);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    const ModelConfig& c = (*model)->config();
    HookSet hooks;
    for (int64_t l = 0; l < c.num_layers; ++l)
      hooks.Add({HookSite::kResidPost, l});
    hooks.Add({HookSite::kFinalNorm, -1});
    // A prompt long enough to wrap every sliding-window ring of the tiny
    // models (windows of 16 and below).
    const int64_t n = std::min<int64_t>(70, c.max_position_embeddings);
    std::mt19937 rng(7);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int32_t& id : ids)
      id = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.vocab_size));

    ExecutorOptions full_opts;
    full_opts.max_tokens = n;
    auto full = Executor::Create(**model, hooks, full_opts);
    ASSERT_TRUE(full.ok()) << full.status().ToString();
    RowSink want;
    const std::vector<int64_t> one = {0, n};
    ASSERT_TRUE((*full)->Forward(Batch{ids, one}, &want).ok());

    // Chunks of 23, 1, 9, 1, 17, ... tokens, then one-token steps.
    const std::vector<int64_t> chunks = {23, 1, 9, 1, 17, 5, 1, 1, 13};
    ExecutorOptions kv_opts;
    kv_opts.max_tokens = 23;
    auto chunked = Executor::Create(**model, hooks, kv_opts);
    ASSERT_TRUE(chunked.ok()) << chunked.status().ToString();
    auto backend = CreateBackend("cpu");
    ASSERT_TRUE(backend.ok());
    // Paged: pages of 4 positions; slot 0 grabs and drops pages as slot 1
    // grows, so slot 1's pages come in a scrambled order.
    const KvPaging paging =
        paged ? KvPaging{4, (2 * n + 3) / 4 + 2} : KvPaging{};
    auto cache =
        KvCache::Create(c, /*slots=*/2, /*context=*/n, **backend, paging);
    ASSERT_TRUE(cache.ok()) << cache.status().ToString();
    RowSink got;
    const std::vector<int64_t> slot = {1};
    for (int64_t p0 = 0, i = 0; p0 < n; ++i) {
      const int64_t len =
          std::min(i < static_cast<int64_t>(chunks.size()) ? chunks[i] : 1,
                   n - p0);
      if (paged) {
        ASSERT_TRUE((*cache)->Reserve(0, std::min(n, 4 * (i % 5))).ok());
        ASSERT_TRUE((*cache)->Reserve(1, p0 + len).ok());
        if (i % 3 == 2) (*cache)->Reset(0);
      }
      const std::vector<int64_t> seq = {0, len};
      const std::vector<int64_t> pos0 = {p0};
      const Batch b{std::span<const int32_t>(ids).subspan(p0, len), seq};
      const Status st =
          (*chunked)->Forward(b, &got, {cache->get(), slot, pos0});
      ASSERT_TRUE(st.ok()) << st.ToString();
      p0 += len;
      EXPECT_EQ((*cache)->length(1), p0);
    }
    if (paged) {
      // Not in order: the test would not scramble anything otherwise.
      const int32_t* table = (*cache)->page_table(1);
      EXPECT_FALSE(std::is_sorted(table, table + (*cache)->reserved_pages(1)));
    }
    // A row's GEMMs give the same bytes whatever shares their batch, and
    // attention over the cache visits the same keys in the same order as
    // one pass: the chunks give one pass's bytes (batch invariance).
    for (const auto& [hook, rows] : want.rows()) {
      SCOPED_TRACE(HookName(hook));
      const std::vector<float>& g = got.rows().at(hook);
      ASSERT_EQ(g.size(), rows.size());
      EXPECT_EQ(0, std::memcmp(g.data(), rows.data(), 4 * rows.size()))
          << Name(dir) << (paged ? " (paged)" : "")
          << ": chunked prefill differs from one pass";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, KvCacheLayoutTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Paged"
                                                         : "Contiguous");
                         });

// A forward that stops early (the deepest hook above the last layer, as an
// extraction of early layers) runs with a cache of just the layers it runs:
// chunked equals one pass, and a cache of any other layer count is refused
// (a layer the forward skipped would keep stale rows).
TEST(KvCacheTest, CacheOfTheLayersRunWhenHooksStopEarly) {
  auto model = Model::Load(std::string(LOOM_MODELS_DIR) + "/stories260K",
                           Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const ModelConfig& c = (*model)->config();
  HookSet hooks;
  hooks.Add({HookSite::kResidPost, 0});
  hooks.Add({HookSite::kResidPost, 1});
  const int64_t n = 50;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    ids[static_cast<size_t>(i)] = static_cast<int32_t>(1 + (i * 37) % 500);
  ExecutorOptions opts;
  opts.max_tokens = n;
  auto ex = Executor::Create(**model, hooks, opts);
  ASSERT_TRUE(ex.ok()) << ex.status().ToString();
  ASSERT_EQ((*ex)->last_layer(), 1);
  RowSink want;
  const std::vector<int64_t> one = {0, n};
  ASSERT_TRUE((*ex)->Forward(Batch{ids, one}, &want).ok());
  auto backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok());
  const std::vector<int64_t> slot = {0};
  for (int64_t layers : {int64_t{1}, c.num_layers}) {
    auto wrong = KvCache::Create(c, 1, n, **backend, {}, layers);
    ASSERT_TRUE(wrong.ok()) << wrong.status().ToString();
    const std::vector<int64_t> seq = {0, 8}, pos0 = {0};
    const Status st =
        (*ex)->Forward(Batch{std::span<const int32_t>(ids).first(8), seq},
                       &want, {wrong->get(), slot, pos0});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find("holds layers [0, " + std::to_string(layers) +
                                "), this forward runs layers [0, 2)"),
              std::string::npos)
        << st.message();
  }
  EXPECT_FALSE(KvCache::Create(c, 1, n, **backend, {}, c.num_layers + 1).ok());
  auto cache = KvCache::Create(c, 1, n, **backend, {}, 2);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  EXPECT_EQ((*cache)->num_layers(), 2);
  int64_t bytes = 0;
  for (int64_t l = 0; l < 2; ++l)
    bytes += KvLayerBytes(c, l, n, 1, DType::kF32);
  EXPECT_EQ((*cache)->storage_bytes(), bytes);
  RowSink got;
  for (int64_t p0 = 0; p0 < n; p0 += 7) {
    const int64_t len = std::min<int64_t>(7, n - p0);
    const std::vector<int64_t> seq = {0, len}, pos0 = {p0};
    const Status st = (*ex)->Forward(
        Batch{std::span<const int32_t>(ids).subspan(p0, len), seq}, &got,
        {cache->get(), slot, pos0});
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  for (const auto& [hook, rows] : want.rows()) {
    SCOPED_TRACE(HookName(hook));
    const std::vector<float>& g = got.rows().at(hook);
    ASSERT_EQ(g.size(), rows.size());
    EXPECT_EQ(0, std::memcmp(g.data(), rows.data(), 4 * rows.size()));
  }
}

}  // namespace
}  // namespace loom
