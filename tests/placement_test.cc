// An executor that runs a placement: the layers split across two devices
// (two CpuBackend instances standing in for two GPUs), the residual stream,
// positions and RoPE tables copied at the boundary through the Backend
// interface. Every hook must be bit-identical to the one-device run, and each
// device's arenas must be exactly the bytes the planner gives that device
// for the same split.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "src/backend/registry.h"
#include "src/model/registry.h"
#include "src/plan/planner.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"
#include "tests/golden_util.h"

namespace loom::testing {
namespace {

using Case = ModelCase;

class PlacementTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!GetParam().bundled && SharedGoldenDir().empty())
      GTEST_SKIP() << "SKIPPED LOUDLY: shared golden directory "
                   << LOOM_SHARED_DIR << "/golden not found; "
                   << GetParam().name << " is not checked";
  }
};

TEST_P(PlacementTest, TwoDevicesBitIdenticalAndArenasAsPlanned) {
  const Case& m = GetParam();
  std::vector<Precision> precisions = {Precision::kF32};
  if (CpuSupportsComputeDType(DType::kBF16))
    precisions.push_back(Precision::kBF16);
  else
    std::fprintf(stderr, "SKIPPED LOUDLY: no bf16 compute on this CPU\n");
  for (Precision precision : precisions) {
    SCOPED_TRACE(precision == Precision::kF32 ? "f32" : "bf16");
    auto model = Model::Load(ModelCaseDir(m), precision);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    const ModelConfig& c = (*model)->config();
    ASSERT_GE(c.num_layers, 2) << "a split needs two layers";
    const HookSet hooks = EveryHookOf(c, /*with_pattern=*/true);
    // Three packed sequences of different lengths.
    const std::vector<int64_t> starts = {0, 13, 20, 41};
    std::vector<int32_t> ids(41);
    for (size_t t = 0; t < ids.size(); ++t)
      ids[t] = static_cast<int32_t>((t * 17 + 3) % c.vocab_size);
    const Batch batch{ids, starts};

    ExecutorOptions base;
    base.max_tokens = 48;
    base.max_seq_len = 24;
    base.logits_chunk_rows = 16;
    base.hf_bf16_activations = precision == Precision::kBF16;

    auto one_backend = CreateBackend("cpu");
    ASSERT_TRUE(one_backend.ok());
    ExecutorOptions one = base;
    one.backend = one_backend->get();
    auto single = Executor::Create(**model, hooks, one);
    ASSERT_TRUE(single.ok()) << single.status().ToString();
    CaptureSink want;
    ASSERT_TRUE((*single)->Forward(batch, &want).ok());

    auto dev0 = CreateBackend("cpu");
    auto dev1 = CreateBackend("cpu");
    ASSERT_TRUE(dev0.ok() && dev1.ok());
    const int64_t split = c.num_layers / 2;
    ExecutorOptions two = base;
    two.segments = {{dev0->get(), 0, split - 1},
                    {dev1->get(), split, c.num_layers - 1}};
    auto placed = Executor::Create(**model, hooks, two);
    ASSERT_TRUE(placed.ok()) << placed.status().ToString();
    ASSERT_EQ((*placed)->num_devices(), 2);
    CaptureSink got;
    ASSERT_TRUE((*placed)->Forward(batch, &got).ok());

    // Every hook, bit for bit (patterns per sequence).
    int compared = 0;
    for (const HookPoint& h : hooks.hooks()) {
      const int64_t seqs = h.site == HookSite::kPattern ? 3 : 1;
      for (int64_t s = 0; s < seqs; ++s) {
        const int64_t seq = h.site == HookSite::kPattern ? s : -1;
        const auto& a = want.Get(h, seq);
        const auto& b = got.Get(h, seq);
        ASSERT_EQ(a.data.size(), b.data.size()) << HookName(h);
        EXPECT_EQ(std::memcmp(a.data.data(), b.data.data(),
                              a.data.size() * sizeof(float)),
                  0)
            << HookName(h) << " differs between one and two devices";
        ++compared;
      }
    }
    EXPECT_GT(compared, 10);

    // Each device's arenas are its planned bytes for the same split.
    auto arch = FindArch(c.model_type);
    ASSERT_NE(arch, nullptr);
    const ArchWeights decl = arch->declare_weights(c);
    auto table = BuildWeightTable(ModelCaseDir(m), c, decl, {});
    ASSERT_TRUE(table.ok()) << table.status().ToString();
    auto devices = DevicesFromFlags({"cuda:0=64GiB", "cuda:1=64GiB"}, "", "",
                                    int64_t{64} << 30);
    ASSERT_TRUE(devices.ok()) << devices.status().ToString();
    PlanInput in;
    in.config = &c;
    in.weights = &*table;
    in.job = Executor::MakeJob(**model, hooks, two);
    in.devices = *devices;
    in.strategy = Strategy::kManual;
    in.layers_per_device = {split, c.num_layers - split};
    in.costs = (*dev0)->Costs();
    in.suggest = false;
    auto plan = MakePlan(in);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    for (int i = 0; i < 2; ++i) {
      const std::string name = "cuda:" + std::to_string(i);
      const DevicePlan* dp = nullptr;
      for (const DevicePlan& d : plan->devices)
        if (d.device.name == name) dp = &d;
      ASSERT_NE(dp, nullptr) << name;
      const Executor::Device& d = (*placed)->device(i);
      SCOPED_TRACE(name);
      EXPECT_EQ(d.first_layer, dp->layers.front());
      EXPECT_EQ(d.last_layer, dp->layers.back());
      EXPECT_EQ(d.activations.bytes(), dp->activations);
      EXPECT_EQ(d.workspace.bytes(), dp->workspace);
      EXPECT_EQ(d.logits.bytes(), dp->logits);
      EXPECT_GT(d.activations.bytes(), 0);
    }
    EXPECT_EQ(
        (*placed)->arena_bytes(),
        2 * (*single)->arena_bytes() - (*single)->device(0).logits.bytes());
  }
}

// CPU offload on CPU backends: layers [split, n) are offloaded (their
// weights staged in pinned host memory, streamed into two buffers by a copier
// instance; Copy = memcpy, WaitFor a no-op). Every hook is bit-identical to
// the resident run, and the arenas, the two buffers and the staged bytes are
// the planner's numbers for the same split with --offload.
TEST_P(PlacementTest, OffloadedSegmentBitIdenticalAndBytesAsPlanned) {
  const Case& m = GetParam();
  std::vector<Precision> precisions = {Precision::kF32};
  if (CpuSupportsComputeDType(DType::kBF16))
    precisions.push_back(Precision::kBF16);
  else
    std::fprintf(stderr, "SKIPPED LOUDLY: no bf16 compute on this CPU\n");
  for (Precision precision : precisions) {
    SCOPED_TRACE(precision == Precision::kF32 ? "f32" : "bf16");
    auto model = Model::Load(ModelCaseDir(m), precision);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    const ModelConfig& c = (*model)->config();
    ASSERT_GE(c.num_layers, 2) << "a split needs two layers";
    const HookSet hooks = EveryHookOf(c, /*with_pattern=*/true);
    const std::vector<int64_t> starts = {0, 13, 20, 41};
    std::vector<int32_t> ids(41);
    for (size_t t = 0; t < ids.size(); ++t)
      ids[t] = static_cast<int32_t>((t * 17 + 3) % c.vocab_size);
    const Batch batch{ids, starts};

    ExecutorOptions base;
    base.max_tokens = 48;
    base.max_seq_len = 24;
    base.logits_chunk_rows = 16;
    base.hf_bf16_activations = precision == Precision::kBF16;

    auto one_backend = CreateBackend("cpu");
    ASSERT_TRUE(one_backend.ok());
    ExecutorOptions one = base;
    one.backend = one_backend->get();
    auto single = Executor::Create(**model, hooks, one);
    ASSERT_TRUE(single.ok()) << single.status().ToString();
    CaptureSink want;
    ASSERT_TRUE((*single)->Forward(batch, &want).ok());

    // Layers [0, split) resident, [split, n) offloaded, on one backend
    // instance (as on one GPU); with one layer only, the stream never
    // reuses a buffer, so split = 0 (all offloaded) is run too.
    auto dev = CreateBackend("cpu");
    ASSERT_TRUE(dev.ok());
    for (const int64_t split : {c.num_layers / 2, int64_t{0}}) {
      SCOPED_TRACE("split " + std::to_string(split));
      ExecutorOptions two = base;
      if (split > 0) two.segments.push_back({dev->get(), 0, split - 1});
      two.segments.push_back({dev->get(), split, c.num_layers - 1, true});
      auto placed = Executor::Create(**model, hooks, two);
      ASSERT_TRUE(placed.ok()) << placed.status().ToString();
      const int off = split > 0 ? 1 : 0;
      ASSERT_EQ((*placed)->num_devices(), off + 1);
      // Twice: the second forward restarts the stream over used buffers.
      for (int run = 0; run < 2; ++run) {
        CaptureSink got;
        ASSERT_TRUE((*placed)->Forward(batch, &got).ok());
        int compared = 0;
        for (const HookPoint& h : hooks.hooks()) {
          const int64_t seqs = h.site == HookSite::kPattern ? 3 : 1;
          for (int64_t s = 0; s < seqs; ++s) {
            const int64_t seq = h.site == HookSite::kPattern ? s : -1;
            const auto& a = want.Get(h, seq);
            const auto& b = got.Get(h, seq);
            ASSERT_EQ(a.data.size(), b.data.size()) << HookName(h);
            EXPECT_EQ(std::memcmp(a.data.data(), b.data.data(),
                                  a.data.size() * sizeof(float)),
                      0)
                << HookName(h) << " differs with offloaded layers (run " << run
                << ")";
            ++compared;
          }
        }
        EXPECT_GT(compared, 10);
      }

      // The planner, same split, --offload: cuda:0 computes everything.
      auto arch = FindArch(c.model_type);
      ASSERT_NE(arch, nullptr);
      const ArchWeights decl = arch->declare_weights(c);
      auto table = BuildWeightTable(ModelCaseDir(m), c, decl, {});
      ASSERT_TRUE(table.ok()) << table.status().ToString();
      auto devices =
          DevicesFromFlags({"cuda:0=64GiB"}, "", "", int64_t{64} << 30);
      ASSERT_TRUE(devices.ok()) << devices.status().ToString();
      PlanInput in;
      in.config = &c;
      in.weights = &*table;
      in.job = Executor::MakeJob(**model, hooks, two);
      in.devices = *devices;
      in.strategy = Strategy::kManual;
      in.layers_per_device = {split};
      in.costs = (*dev)->Costs();
      in.suggest = false;
      in.offload = true;
      auto plan = MakePlan(in);
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      ASSERT_EQ(plan->devices.size(), 2u);
      const DevicePlan& gpu = plan->devices[0];
      const DevicePlan& host = plan->devices[1];
      ASSERT_EQ(host.device.kind, DeviceKind::kCpu);
      EXPECT_EQ(gpu.offloaded_layers, c.num_layers - split);
      const Executor::Device& d = (*placed)->device(off);
      ASSERT_TRUE(d.offload && d.uploaded && d.uploaded->streamed());
      EXPECT_EQ(d.first_layer, split);
      EXPECT_EQ(d.last_layer, c.num_layers - 1);
      for (int64_t l = split; l < c.num_layers; ++l) {
        EXPECT_EQ(plan->layer_device[l], 1) << l;
        EXPECT_EQ(ComputeDeviceOf(*plan, l), 0) << l;
      }
      // Pinned host staging = the host's weights; two buffers = the stream.
      EXPECT_EQ((*placed)->staged_weight_bytes(), host.weights);
      EXPECT_EQ(d.uploaded->staged_bytes(), host.weights);
      EXPECT_EQ(2 * d.uploaded->stream_buffer_bytes(), gpu.stream);
      EXPECT_GT(gpu.stream, 0);
      EXPECT_EQ(d.activations.bytes(), gpu.activations);
      EXPECT_EQ(d.workspace.bytes(), gpu.workspace);
      EXPECT_EQ(d.logits.bytes(), gpu.logits);
      EXPECT_EQ(host.activations + host.workspace + host.logits, 0);
      // One backend instance: one set of arenas, as for the resident run.
      EXPECT_EQ(d.shares_arenas, split > 0);
      EXPECT_EQ((*placed)->arena_bytes(), (*single)->arena_bytes());
    }
  }
}

std::vector<Case> Cases() {
  return {{"stories260K", true}, {"llama", false},    {"gemma2", false},
          {"gpt2", false},       {"olmo2", false},    {"phi3", false},
          {"qwen2_moe", false},  {"gpt_neox", false}, {"phi", false}};
}

INSTANTIATE_TEST_SUITE_P(Models, PlacementTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

TEST(PlacementErrors, SegmentsMustCoverTheLayersContiguously) {
  auto model = Model::Load(std::string(LOOM_MODELS_DIR) + "/stories260K",
                           Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const int64_t n = (*model)->config().num_layers;
  auto b = CreateBackend("cpu");
  ASSERT_TRUE(b.ok());
  HookSet hooks;
  hooks.Add({HookSite::kResidPost, n - 1});
  ExecutorOptions o;
  o.max_tokens = 8;
  o.segments = {{b->get(), 0, 0}, {b->get(), 2, n - 1}};  // gap at layer 1
  auto ex = Executor::Create(**model, hooks, o);
  ASSERT_FALSE(ex.ok());
  EXPECT_EQ(ex.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ex.status().message().find("contiguous"), std::string::npos)
      << ex.status().ToString();
  o.segments = {{b->get(), 0, n - 2}};  // the last layer has no device
  ex = Executor::Create(**model, hooks, o);
  ASSERT_FALSE(ex.ok());
  EXPECT_NE(ex.status().message().find("cover"), std::string::npos)
      << ex.status().ToString();
  o.segments = {{nullptr, 0, n - 1}};
  ex = Executor::Create(**model, hooks, o);
  ASSERT_FALSE(ex.ok());
  EXPECT_NE(ex.status().message().find("no backend"), std::string::npos);
}

TEST(PlacementErrors, CpuBackendRefusesBadSinksAndDeviceCopies) {
  auto b = CreateBackend("cpu");
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE((*b)->Capabilities().attention_sinks);
  uint8_t sink = 0;
  AttentionOp op;
  op.sinks = &sink;
  op.sinks_dtype = DType::kU8;
  const Status s = (*b)->Attention(op);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("U8"), std::string::npos) << s.ToString();
  float x = 1.0f, y = 0.0f;
  const Status c = (*b)->Copy(&y, DeviceRef{DeviceKind::kCuda, 0}, &x,
                              DeviceRef{}, sizeof(float));
  EXPECT_EQ(c.code(), StatusCode::kUnimplemented) << c.ToString();
  EXPECT_TRUE((*b)->Copy(&y, DeviceRef{}, &x, DeviceRef{}, sizeof(float)).ok());
  EXPECT_EQ(y, 1.0f);
  EXPECT_FALSE(CreateBackend("no-such-backend").ok());
}

}  // namespace
}  // namespace loom::testing
