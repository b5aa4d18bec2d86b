// The serving engine: concurrent requests batched into shared forwards give
// each request exactly what it gets alone (tokens bit for bit, hidden states
// equal to a one-pass forward to f32 round-off), admission refuses what can
// never fit and queues what does not fit now, cancellation frees the slot.
#include "src/serve/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "src/runtime/executor.h"
#include "tests/host_as_device.h"

namespace loom::serve {
namespace {

std::string Stories() { return std::string(LOOM_MODELS_DIR) + "/stories260K"; }

std::vector<int32_t> RandomPrompt(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& t : ids)
    t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return ids;
}

// Every row of every hooked activation of a plain one-pass forward.
class AllRows : public HookSink {
 public:
  Status OnActivation(const HookPoint& hook, const Batch&, int64_t,
                      int64_t row_begin, const ActivationView& view) override {
    std::vector<float>& dst = rows[hook];
    dst.resize(static_cast<size_t>((row_begin + view.rows) * view.cols));
    for (int64_t r = 0; r < view.rows; ++r)
      std::copy(view.f32() + r * view.ld, view.f32() + r * view.ld + view.cols,
                dst.begin() + (row_begin + r) * view.cols);
    return Status();
  }
  std::map<HookPoint, std::vector<float>> rows;
};

TEST(ServeEngineTest, BatchedGreedyEqualsOneAtATime) {
  EngineOptions o;
  o.precision = Precision::kF32;
  o.slots = 4;
  o.context = 96;
  o.prefill_chunk = 7;  // prompts span several forwards, mixed with decodes
  auto engine = Engine::Create("stories", Stories(), o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Engine& e = **engine;
  const int64_t V = e.model().config().vocab_size;
  // Reference: the same prompts through the Generator one at a time.
  eval::Generator::Options go;
  go.context = 96;
  auto gen = eval::Generator::Create(e.model(), go);
  ASSERT_TRUE(gen.ok());
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 10; ++i)
    prompts.push_back(RandomPrompt(3 + 5 * i, V, 100 + i));
  std::vector<std::shared_ptr<Ticket>> tickets;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenRequest r;
    r.prompt = prompts[i];
    r.max_new_tokens = 12 + static_cast<int64_t>(i % 4) * 5;
    auto t = e.Submit(r);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tickets.push_back(*t);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto got = tickets[i]->Wait();
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    eval::GenerateOptions g;
    g.max_new_tokens = 12 + static_cast<int64_t>(i % 4) * 5;
    auto want = (*gen)->Generate({prompts[i]}, g);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(got->token_ids, (*want)[0].token_ids) << "prompt " << i;
    EXPECT_EQ(got->stop_reason, "max_tokens");
  }
  const EngineStats st = e.Stats();
  EXPECT_EQ(st.requests_completed, 10);
  EXPECT_GT(st.max_forward_seqs, 1) << "requests were never batched";
  EXPECT_EQ(st.capture_reserved, 0);
}

TEST(ServeEngineTest, HiddenStatesEqualOnePassForward) {
  EngineOptions o;
  o.precision = Precision::kF32;
  o.slots = 3;
  o.context = 128;
  o.prefill_chunk = 5;
  o.extra_hooks = {"blocks.*.hook_mlp_out"};
  auto engine = Engine::Create("stories", Stories(), o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Engine& e = **engine;
  const ModelConfig& c = e.model().config();
  std::vector<HookPoint> hooks;
  for (int64_t i = 0; i <= c.num_layers; ++i) {
    auto h = e.LayerHook(i);
    ASSERT_TRUE(h.ok());
    hooks.push_back(*h);
  }
  hooks.push_back({HookSite::kMlpOut, 1});
  // Three prompts at once: every row (prefill only), the last row, and a
  // generation whose rows cover the generated tokens fed back.
  const std::vector<int32_t> p0 = RandomPrompt(23, c.vocab_size, 7);
  const std::vector<int32_t> p1 = RandomPrompt(11, c.vocab_size, 8);
  const std::vector<int32_t> p2 = RandomPrompt(9, c.vocab_size, 9);
  GenRequest r0, r1, r2;
  r0.prompt = p0;
  r0.hooks = hooks;
  r0.rows = CaptureRows::kAll;
  r1.prompt = p1;
  r1.hooks = hooks;
  r1.rows = CaptureRows::kLast;
  r2.prompt = p2;
  r2.hooks = hooks;
  r2.rows = CaptureRows::kAll;
  r2.max_new_tokens = 6;
  auto t0 = e.Submit(r0), t1 = e.Submit(r1), t2 = e.Submit(r2);
  ASSERT_TRUE(t0.ok() && t1.ok() && t2.ok());
  auto g0 = (*t0)->Wait(), g1 = (*t1)->Wait(), g2 = (*t2)->Wait();
  ASSERT_TRUE(g0.ok() && g1.ok() && g2.ok());
  EXPECT_EQ(g0->stop_reason, "prompt");
  EXPECT_EQ(g0->rows, 23);
  EXPECT_EQ(g1->rows, 1);
  ASSERT_EQ(g2->token_ids.size(), 6u);
  EXPECT_EQ(g2->rows, 9 + 5);  // the last generated token is never fed

  // One pass over each full sequence.
  auto check = [&](const std::vector<int32_t>& ids, const GenResult& got,
                   int64_t first_row) {
    HookSet set;
    for (const HookPoint& h : hooks) set.Add(h);
    ExecutorOptions eo;
    eo.max_tokens = static_cast<int64_t>(ids.size());
    auto ex = Executor::Create(e.model(), set, eo);
    ASSERT_TRUE(ex.ok()) << ex.status().ToString();
    const std::vector<int64_t> starts = {0, static_cast<int64_t>(ids.size())};
    AllRows sink;
    ASSERT_TRUE((*ex)->Forward({ids, starts}, &sink).ok());
    // Chunked prefill, decode steps and other requests in the batch: the
    // bytes of one pass (batch invariance).
    for (size_t h = 0; h < hooks.size(); ++h) {
      SCOPED_TRACE(HookName(hooks[h]));
      const std::vector<float>& want = sink.rows[hooks[h]];
      const int64_t w = got.widths[h];
      ASSERT_EQ(0,
                std::memcmp(got.captures[h].data(), want.data() + first_row * w,
                            4 * static_cast<size_t>(got.rows * w)));
    }
  };
  check(p0, *g0, 0);
  check(p1, *g1, 10);
  std::vector<int32_t> full = p2;
  full.insert(full.end(), g2->token_ids.begin(), g2->token_ids.end() - 1);
  check(full, *g2, 0);
}

// A request's hidden states and tokens alone, and under 15 other concurrent
// requests (prompts of other lengths, some generating) in a bf16 engine:
// the same bytes (batch invariance; the engine batches whatever is running).
TEST(ServeEngineTest, RequestAloneEqualsUnderSixteenConcurrent) {
  EngineOptions o;
  o.precision = Precision::kBF16;
  o.slots = 16;
  o.context = 160;
  o.prefill_chunk = 24;
  o.extra_hooks = {"blocks.*.hook_mlp_out"};
  auto run = [&](bool crowded, GenResult* out) {
    auto engine = Engine::Create("stories", Stories(), o);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    Engine& e = **engine;
    const ModelConfig& c = e.model().config();
    GenRequest target;
    target.prompt = RandomPrompt(41, c.vocab_size, 5);
    target.max_new_tokens = 9;
    target.rows = CaptureRows::kAll;
    for (int64_t l = 0; l <= c.num_layers; ++l) {
      auto h = e.LayerHook(l);
      ASSERT_TRUE(h.ok());
      target.hooks.push_back(*h);
    }
    target.hooks.push_back({HookSite::kMlpOut, 1});
    std::vector<std::shared_ptr<Ticket>> others;
    auto submit_others = [&](int first, int last) {
      for (int i = first; i < last; ++i) {
        GenRequest r;
        r.prompt = RandomPrompt(3 + 9 * i, c.vocab_size, 300 + i);
        r.max_new_tokens = i % 3 == 0 ? 0 : 4 + i;
        auto t = e.Submit(r);
        ASSERT_TRUE(t.ok()) << t.status().ToString();
        others.push_back(*t);
      }
    };
    if (crowded) submit_others(0, 8);
    auto t = e.Submit(target);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    if (crowded) submit_others(8, 15);
    auto got = (*t)->Wait();
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    *out = *got;
    for (auto& other : others) ASSERT_TRUE(other->Wait().ok());
    if (crowded) {
      EXPECT_GT(e.Stats().max_forward_seqs, 1);
    }
  };
  GenResult alone, crowded;
  run(false, &alone);
  run(true, &crowded);
  EXPECT_EQ(alone.token_ids, crowded.token_ids);
  ASSERT_EQ(alone.rows, crowded.rows);
  ASSERT_EQ(alone.captures.size(), crowded.captures.size());
  for (size_t h = 0; h < alone.captures.size(); ++h) {
    ASSERT_EQ(alone.captures[h].size(), crowded.captures[h].size());
    EXPECT_EQ(0,
              std::memcmp(alone.captures[h].data(), crowded.captures[h].data(),
                          4 * alone.captures[h].size()))
        << "hook " << h;
  }
}

TEST(ServeEngineTest, AdmissionRefusesWhatCanNeverFitAndQueuesTheRest) {
  EngineOptions o;
  o.precision = Precision::kF32;
  o.slots = 1;
  o.context = 32;
  o.max_queue = 2;
  o.capture_bytes = 64 * 4 * 40;  // 40 rows of one 64-wide hook
  auto engine = Engine::Create("stories", Stories(), o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Engine& e = **engine;
  ASSERT_EQ(e.model().config().hidden_size, 64);
  GenRequest too_long;
  too_long.prompt.assign(33, 5);
  auto s = e.Submit(too_long);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.status().message().find("33"), std::string::npos);
  EXPECT_NE(s.status().message().find("32"), std::string::npos);

  GenRequest big;  // 30 + 19 rows x 3 hooks > budget
  big.prompt.assign(30, 5);
  big.max_new_tokens = 20;
  big.rows = CaptureRows::kAll;
  big.hooks = {{HookSite::kResidPre, 0},
               {HookSite::kResidPre, 1},
               {HookSite::kFinalNorm, -1}};
  s = e.Submit(big);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.status().message().find("capture budget"), std::string::npos);

  GenRequest bad_tok;
  bad_tok.prompt = {1, 100000};
  EXPECT_EQ(e.Submit(bad_tok).status().code(), StatusCode::kInvalidArgument);
  GenRequest bad_hook;
  bad_hook.prompt = {1, 2};
  bad_hook.hooks = {{HookSite::kMlpOut, 0}};
  EXPECT_EQ(e.Submit(bad_hook).status().code(), StatusCode::kInvalidArgument);

  // One slot, a queue of two: a burst of ten gets some accepted, the rest
  // ResourceExhausted; everything accepted finishes.
  std::vector<std::shared_ptr<Ticket>> ok;
  int rejected = 0;
  for (int i = 0; i < 10; ++i) {
    GenRequest r;
    r.prompt = {1, 2, 3};
    r.max_new_tokens = 20;
    auto t = e.Submit(r);
    if (t.ok()) {
      ok.push_back(*t);
    } else {
      EXPECT_EQ(t.status().code(), StatusCode::kResourceExhausted);
      ++rejected;
    }
  }
  EXPECT_GE(rejected, 10 - 3);
  for (auto& t : ok) EXPECT_TRUE(t->Wait().ok());
  EXPECT_EQ(e.Stats().requests_rejected, rejected);
  EXPECT_EQ(e.Memory().capture_used, 0);
  EXPECT_EQ(e.Memory().kv_used, 0);
}

// A paged cache of 8 pages of 8 positions for 4 slots of 96: concurrent
// requests wait for pages as well as slots, and every one gets the tokens of
// the contiguous engine; a request needing more pages than the pool is
// refused at Submit; kv_used returns to 0.
TEST(ServeEngineTest, PagedKvWaitsForPagesAndEqualsContiguous) {
  EngineOptions o;
  o.precision = Precision::kF32;
  o.slots = 4;
  o.context = 96;
  o.prefill_chunk = 7;
  o.page_size = 0;  // contiguous: every slot holds its 96 positions
  auto flat = Engine::Create("stories", Stories(), o);
  ASSERT_TRUE(flat.ok()) << flat.status().ToString();
  o.kv_tokens = 64;
  o.page_size = 8;
  auto paged = Engine::Create("stories", Stories(), o);
  ASSERT_TRUE(paged.ok()) << paged.status().ToString();
  Engine& e = **paged;
  EXPECT_LT(e.Memory().kv, (*flat)->Memory().kv);
  const int64_t V = e.model().config().vocab_size;

  GenRequest huge;  // min(60 + 20, 96) = 80 positions: 10 pages > 8
  huge.prompt = RandomPrompt(60, V, 7);
  huge.max_new_tokens = 20;
  auto refused = e.Submit(huge);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(refused.status().message().find("10 KV pages"), std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("server's 8"), std::string::npos)
      << refused.status().message();

  std::vector<GenRequest> requests;
  for (int i = 0; i < 8; ++i) {  // 2 to 6 pages each
    GenRequest r;
    r.prompt = RandomPrompt(3 + 4 * i, V, 200 + i);
    r.max_new_tokens = 8 + static_cast<int64_t>(i % 4) * 3;
    requests.push_back(r);
  }
  std::vector<std::shared_ptr<Ticket>> got, want;
  for (const GenRequest& r : requests) {
    auto t = e.Submit(r);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    got.push_back(*t);
    auto w = (*flat)->Submit(r);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    want.push_back(*w);
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    auto g = got[i]->Wait();
    auto w = want[i]->Wait();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ(g->token_ids, w->token_ids) << "request " << i;
    EXPECT_EQ(g->stop_reason, w->stop_reason) << "request " << i;
  }
  EXPECT_EQ(e.Stats().requests_completed, 8);
  EXPECT_EQ(e.Memory().kv_used, 0);
  EXPECT_EQ((*flat)->Memory().kv_used, 0);
}

TEST(ServeEngineTest, CancelFreesTheSlot) {
  EngineOptions o;
  o.precision = Precision::kF32;
  o.slots = 1;
  o.context = 256;
  auto engine = Engine::Create("stories", Stories(), o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Engine& e = **engine;
  std::atomic<int> seen{0};
  std::shared_ptr<Ticket> first;
  GenRequest r;
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 250;
  r.on_token = [&](int32_t, const std::string&) {
    if (++seen == 3) first->Cancel();
  };
  auto t = e.Submit(r);
  ASSERT_TRUE(t.ok());
  first = *t;
  auto got = first->Wait();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->stop_reason, "cancelled");
  EXPECT_LT(got->token_ids.size(), 10u);
  GenRequest next;
  next.prompt = {1, 2};
  next.max_new_tokens = 2;
  auto t2 = e.Submit(next);
  ASSERT_TRUE(t2.ok());
  EXPECT_TRUE((*t2)->Wait().ok());
}

TEST(ServeEngineTest, LayerIndicesFollowTheLoom) {
  EngineOptions o;
  o.precision = Precision::kF32;
  o.slots = 1;
  o.context = 16;
  auto engine = Engine::Create("stories", Stories(), o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const int64_t n = (*engine)->model().config().num_layers;
  EXPECT_EQ(*(*engine)->LayerHook(-1), (HookPoint{HookSite::kFinalNorm, -1}));
  EXPECT_EQ(*(*engine)->LayerHook(n), (HookPoint{HookSite::kFinalNorm, -1}));
  EXPECT_EQ(*(*engine)->LayerHook(0), (HookPoint{HookSite::kResidPre, 0}));
  EXPECT_EQ(*(*engine)->LayerHook(-(n + 1)),
            (HookPoint{HookSite::kResidPre, 0}));
  EXPECT_EQ(*(*engine)->LayerHook(-2), (HookPoint{HookSite::kResidPre, n - 1}));
  auto bad = (*engine)->LayerHook(n + 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(std::to_string(n + 1)),
            std::string::npos);
}

// A unit vector of `width` random values.
std::vector<float> RandomUnit(int64_t width, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(static_cast<size_t>(width));
  double n2 = 0;
  for (float& x : v) {
    x = d(rng);
    n2 += double{x} * x;
  }
  for (float& x : v) x = static_cast<float>(x / std::sqrt(n2));
  return v;
}

// Within atol + rtol * |want| (1e-4 each), naming the first index that is
// not.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::abs(got[i] - want[i]), 1e-4f + 1e-4f * std::abs(want[i]))
        << what << " index " << i;
}

// Requests with different interventions (a steering vector, none, a
// directional ablation at every layer at two positions) share forwards, with
// prompts split over several chunks, and each gets what it gets alone: its
// own edits and none of its neighbours'. The generated tokens also equal the
// Generator's own interventions path.
TEST(ServeEngineTest, InterventionsStayInTheirSequence) {
  EngineOptions o;
  o.precision = Precision::kF32;
  o.slots = 3;
  o.context = 96;
  o.prefill_chunk = 3;
  auto engine = Engine::Create("stories", Stories(), o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Engine& e = **engine;
  const ModelConfig& c = e.model().config();
  const int64_t H = c.hidden_size;
  std::vector<HookPoint> hooks;
  for (int64_t i = 0; i <= c.num_layers; ++i) hooks.push_back(*e.LayerHook(i));
  Intervention steer;
  steer.hook = {HookSite::kResidPost, 1};
  steer.mode = InterventionMode::kAdd;
  steer.scale = 6.0f;
  steer.vector = RandomUnit(H, 1);
  std::vector<Intervention> ablate;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    Intervention a;
    a.hook = {HookSite::kResidPre, l};
    a.mode = InterventionMode::kProjectOut;
    a.positions.kind = InterventionPositions::Kind::kList;
    a.positions.list = {1, -1};
    a.apply_to = InterventionApplyTo::kPrompt;
    a.vector = RandomUnit(H, 2);
    ablate.push_back(a);
  }
  std::vector<GenRequest> reqs(3);
  const uint32_t seeds[] = {11, 12, 13};
  const int64_t lens[] = {10, 8, 13};
  for (size_t i = 0; i < 3; ++i) {
    reqs[i].prompt = RandomPrompt(lens[i], c.vocab_size, seeds[i]);
    reqs[i].max_new_tokens = 6;
    reqs[i].hooks = hooks;
    reqs[i].rows = CaptureRows::kAll;
  }
  reqs[0].interventions = {steer};
  reqs[2].interventions = ablate;
  // Alone, one after the other.
  std::vector<GenResult> alone;
  for (const GenRequest& r : reqs) {
    auto t = e.Submit(r);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    auto g = (*t)->Wait();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    alone.push_back(std::move(g).value());
  }
  EXPECT_EQ(e.Stats().mixed_edit_forwards, 0);
  // Together.
  std::vector<std::shared_ptr<Ticket>> tickets;
  for (const GenRequest& r : reqs) {
    auto t = e.Submit(r);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tickets.push_back(*t);
  }
  for (size_t i = 0; i < 3; ++i) {
    auto g = tickets[i]->Wait();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(g->token_ids, alone[i].token_ids) << "request " << i;
    ASSERT_EQ(g->rows, alone[i].rows);
    for (size_t h = 0; h < hooks.size(); ++h)
      ExpectClose(g->captures[h], alone[i].captures[h],
                  "request " + std::to_string(i) + " " + HookName(hooks[h]));
  }
  const EngineStats st = e.Stats();
  EXPECT_GT(st.mixed_edit_forwards, 0) << "edited requests never shared";
  EXPECT_GT(st.max_forward_seqs, 1);
  EXPECT_EQ(st.capture_reserved, 0);
  // The edits did something, and the same as the Generator's path.
  GenRequest plain = reqs[0];
  plain.interventions.clear();
  auto t = e.Submit(plain);
  ASSERT_TRUE(t.ok());
  auto none = (*t)->Wait();
  ASSERT_TRUE(none.ok());
  EXPECT_NE(none->captures.back(), alone[0].captures.back());
  eval::Generator::Options go;
  go.context = 96;
  go.prefill_chunk = 4;
  auto gen = eval::Generator::Create(e.model(), go);
  ASSERT_TRUE(gen.ok());
  for (size_t i : {size_t{0}, size_t{2}}) {
    eval::GenerateOptions g;
    g.max_new_tokens = 6;
    g.interventions = &reqs[i].interventions;
    auto want = (*gen)->Generate({reqs[i].prompt}, g);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    EXPECT_EQ(alone[i].token_ids, (*want)[0].token_ids) << "request " << i;
  }
}

TEST(ServeEngineTest, InterventionsAreCheckedAndCountedAtSubmit) {
  EngineOptions o;
  o.precision = Precision::kF32;
  o.slots = 2;
  o.context = 64;
  o.capture_bytes = 1024;
  auto engine = Engine::Create("stories", Stories(), o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Engine& e = **engine;
  const int64_t H = e.model().config().hidden_size;
  GenRequest r;
  r.prompt = RandomPrompt(5, e.model().config().vocab_size, 3);
  Intervention iv;
  iv.hook = {HookSite::kResidPost, 0};
  iv.vector.assign(static_cast<size_t>(H - 1), 0.5f);
  r.interventions = {iv};
  auto s = e.Submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("needs 64 values, got 63"),
            std::string::npos)
      << s.status().message();
  r.interventions[0].vector.assign(static_cast<size_t>(H), 0.5f);
  r.interventions[0].positions.kind = InterventionPositions::Kind::kList;
  r.interventions[0].positions.list = {5};
  s = e.Submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("position 5"), std::string::npos)
      << s.status().message();
  // 5 interventions x 64 floats x 4 bytes = 1280 bytes > the 1024 budget.
  r.interventions[0].positions = {};
  r.interventions.assign(5, r.interventions[0]);
  s = e.Submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.status().message().find("intervention vectors (1280 bytes)"),
            std::string::npos)
      << s.status().message();
  r.interventions.resize(3);  // 768 bytes: admitted, then freed
  s = e.Submit(r);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE((*s)->Wait().ok());
  EXPECT_EQ(e.Stats().capture_reserved, 0);
}

// Served requests (tokens, every layer's hidden states, steering and
// ablation) give the host engine's bytes on a second "device" (the
// host-as-device stand-in: weights, KV cache and edits through device
// memory) and on a plan that streams some layers from disk.
TEST(ServeEngineTest, RequestsOnADeviceAndOnASplitPlanEqualTheHost) {
  EngineOptions o;
  o.precision = Precision::kF32;
  o.slots = 2;
  o.context = 64;
  o.prefill_chunk = 5;
  auto run = [&](const EngineOptions& opts, std::vector<GenResult>* out,
                 bool* streamed = nullptr) -> Status {
    ASSIGN_OR_RETURN(std::unique_ptr<Engine> e,
                     Engine::Create("stories", Stories(), opts));
    if (streamed != nullptr)
      for (const ExecutorSegment& seg : e->session().segments())
        *streamed |= seg.from_disk;
    const ModelConfig& c = e->model().config();
    std::vector<HookPoint> hooks;
    for (int64_t i = 0; i <= c.num_layers; ++i) {
      ASSIGN_OR_RETURN(HookPoint h, e->LayerHook(i));
      hooks.push_back(h);
    }
    std::vector<GenRequest> reqs(2);
    for (size_t i = 0; i < reqs.size(); ++i) {
      reqs[i].prompt = RandomPrompt(9 + 4 * static_cast<int64_t>(i),
                                    c.vocab_size, 30 + static_cast<int>(i));
      reqs[i].max_new_tokens = 6;
      reqs[i].hooks = hooks;
      reqs[i].rows = CaptureRows::kAll;
    }
    Intervention steer;
    steer.hook = {HookSite::kResidPost, 0};
    steer.mode = InterventionMode::kAdd;
    steer.scale = 4.0f;
    steer.vector = RandomUnit(c.hidden_size, 5);
    Intervention ablate;
    ablate.hook = {HookSite::kResidPre, c.num_layers - 1};
    ablate.mode = InterventionMode::kProjectOut;
    ablate.vector = RandomUnit(c.hidden_size, 6);
    reqs[1].interventions = {steer, ablate};
    std::vector<std::shared_ptr<Ticket>> tickets;
    for (const GenRequest& r : reqs) {
      ASSIGN_OR_RETURN(std::shared_ptr<Ticket> t, e->Submit(r));
      tickets.push_back(t);
    }
    for (const std::shared_ptr<Ticket>& t : tickets) {
      ASSIGN_OR_RETURN(GenResult g, t->Wait());
      out->push_back(std::move(g));
    }
    return Status();
  };
  auto same = [](const std::vector<GenResult>& want,
                 const std::vector<GenResult>& got) {
    ASSERT_EQ(want.size(), got.size());
    for (size_t i = 0; i < want.size(); ++i) {
      SCOPED_TRACE("request " + std::to_string(i));
      EXPECT_EQ(want[i].token_ids, got[i].token_ids);
      ASSERT_EQ(want[i].captures.size(), got[i].captures.size());
      for (size_t h = 0; h < want[i].captures.size(); ++h)
        EXPECT_EQ(want[i].captures[h], got[i].captures[h]) << "hook " << h;
    }
  };
  std::vector<GenResult> host;
  Status st = run(o, &host);
  ASSERT_TRUE(st.ok()) << st.ToString();

  testing::HostAsDevice device;
  EngineOptions on_device = o;
  on_device.compute_backend_for_tests = &device;
  std::vector<GenResult> got;
  st = run(on_device, &got);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_GT(device.copies(), 0) << "nothing went through the device path";
  {
    SCOPED_TRACE("on a device");
    same(host, got);
  }

  // The largest host cap under which the engine's plan streams layers from
  // disk (the plan's bytes differ by ISA level: the caps are tried in turn).
  bool split = false;
  for (int kib = 2400; kib >= 800 && !split; kib -= 50) {
    EngineOptions capped = o;
    capped.plan.devices = {"cpu=" + std::to_string(kib) + "KiB", "disk"};
    std::vector<GenResult> streamed;
    // A cap this large may still hold every layer: only a streamed plan
    // counts.
    if (!run(capped, &streamed, &split).ok() || !split) continue;
    SCOPED_TRACE("cpu=" + std::to_string(kib) + "KiB + disk");
    same(host, streamed);
  }
  EXPECT_TRUE(split) << "no host cap streamed layers from disk";
}

}  // namespace
}  // namespace loom::serve
