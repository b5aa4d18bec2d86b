// Planner properties on synthetic models: live tensors never overlap, hooked
// tensors survive until copied, plans are deterministic, the packed arena is
// never larger than the naive sum; placement and disk behaviour.
#include "src/plan/planner.h"

#include <gtest/gtest.h>

#include <random>

#include "src/base/units.h"
#include "src/model/registry.h"
#include "src/plan/kv_layout.h"
#include "src/plan/test_util.h"

namespace loom {
namespace {

ModelConfig Synthetic(MlpKind mlp = MlpKind::kGated, int64_t layers = 8) {
  ModelConfig c;
  c.model_type = mlp == MlpKind::kMoE ? "qwen3_moe" : "llama";
  c.torch_dtype = DType::kBF16;
  c.vocab_size = 1000;
  c.hidden_size = 256;
  c.num_layers = layers;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.intermediate_size = 704;
  c.max_position_embeddings = 4096;
  c.mlp = mlp;
  c.rope.type = RopeConfig::Type::kDefault;
  c.rope.rotary_dim = 32;
  c.sliding_window.assign(layers, 0);
  if (mlp == MlpKind::kMoE) {
    c.qk_norm = QkNormKind::kPerHead;
    c.moe.num_experts = 8;
    c.moe.experts_per_token = 2;
    c.moe.expert_intermediate_size = 128;
  }
  return c;
}

struct Model {
  ModelConfig config;
  WeightTable table;
};

Model Make(MlpKind mlp = MlpKind::kGated, int64_t layers = 8) {
  Model m;
  m.config = Synthetic(mlp, layers);
  const ArchWeights decl =
      FindArch(m.config.model_type)->declare_weights(m.config);
  auto t =
      WeightTableFromNames(m.config, decl, nullptr, DType::kBF16, "synthetic");
  EXPECT_TRUE(t.ok()) << t.status().message();
  m.table = *t;
  return m;
}

HookSet RandomHooks(std::mt19937& rng, int64_t layers, bool moe) {
  static const HookSite kSites[] = {
      HookSite::kResidPre, HookSite::kLn1,    HookSite::kQ,
      HookSite::kK,        HookSite::kV,      HookSite::kRotQ,
      HookSite::kPattern,  HookSite::kZ,      HookSite::kAttnOut,
      HookSite::kResidMid, HookSite::kLn2,    HookSite::kMlpPre,
      HookSite::kMlpPost,  HookSite::kMlpOut, HookSite::kResidPost};
  HookSet set;
  const int n = static_cast<int>(rng() % 6);
  for (int i = 0; i < n; ++i) {
    const HookSite s = kSites[rng() % std::size(kSites)];
    if (moe && (s == HookSite::kMlpPre || s == HookSite::kMlpPost)) continue;
    set.Add(HookPoint{s, static_cast<int64_t>(rng() % layers)});
  }
  if (rng() % 3 == 0) set.Add(HookPoint{HookSite::kLogits, -1});
  return set;
}

bool Overlap(const PlannedRegion& a, const PlannedRegion& b) {
  const bool time = !(a.last_step < b.first_step || b.last_step < a.first_step);
  const bool space =
      a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
  return time && space && a.bytes > 0 && b.bytes > 0;
}

TEST(PlanProperties, LiveRegionsNeverOverlapAndPeakIsAtMostTheSum) {
  std::mt19937 rng(1234);
  for (MlpKind mlp : {MlpKind::kGated, MlpKind::kMoE}) {
    const ModelConfig c = Synthetic(mlp);
    for (int trial = 0; trial < 200; ++trial) {
      JobSpec job;
      job.batch_tokens = 1 + static_cast<int64_t>(rng() % 3000);
      job.context = 1 + static_cast<int64_t>(rng() % 3000);
      job.hooks = RandomHooks(rng, c.num_layers, mlp == MlpKind::kMoE);
      job.async_capture = rng() % 2;
      const ActivationLayout l =
          PlanActivations(c, job, plan_test::FakeCosts());
      const auto& rs = l.activations.regions;
      int64_t sum = 0;
      for (size_t i = 0; i < rs.size(); ++i) {
        EXPECT_EQ(rs[i].offset % ArenaPlan::kAlign, 0);
        EXPECT_LE(rs[i].offset + rs[i].bytes, l.activations.total_bytes);
        sum += AlignUp(rs[i].bytes, ArenaPlan::kAlign);
        for (size_t j = i + 1; j < rs.size(); ++j)
          EXPECT_FALSE(Overlap(rs[i], rs[j]))
              << rs[i].name << " and " << rs[j].name << " trial " << trial;
      }
      EXPECT_EQ(sum, l.activations.naive_bytes);
      EXPECT_LE(l.activations.total_bytes, l.activations.naive_bytes);
    }
  }
}

TEST(PlanProperties, HookedTensorsSurviveUntilCopied) {
  const ModelConfig c = Synthetic();
  for (HookSite site :
       {HookSite::kLn1, HookSite::kQ, HookSite::kZ, HookSite::kAttnOut,
        HookSite::kLn2, HookSite::kMlpPre, HookSite::kMlpPost,
        HookSite::kMlpOut, HookSite::kPattern}) {
    JobSpec job;
    job.batch_tokens = 512;
    job.hooks.Add(HookPoint{site, 3});
    job.async_capture = true;  // copied when the block ends
    const ActivationLayout l = PlanActivations(c, job, plan_test::FakeCosts());
    bool found = false;
    for (const PlannedRegion& r : l.activations.regions) {
      if (std::find(r.hooks.begin(), r.hooks.end(), site) == r.hooks.end())
        continue;
      found = true;
      EXPECT_GE(r.last_step, l.block_last_step)
          << r.name << " holds " << HookSiteName(site);
    }
    EXPECT_TRUE(found) << HookSiteName(site);
    // Synchronous capture copies at the hook: the region is not extended, so
    // the arena is no larger.
    job.async_capture = false;
    const ActivationLayout sync =
        PlanActivations(c, job, plan_test::FakeCosts());
    EXPECT_LE(sync.activations.total_bytes, l.activations.total_bytes);
  }
}

TEST(PlanProperties, Deterministic) {
  const Model m = Make(MlpKind::kMoE);
  PlanInput in;
  in.config = &m.config;
  in.weights = &m.table;
  in.devices = {plan_test::Gpu(0, 6 * kMiB), plan_test::Gpu(1, 9 * kMiB),
                plan_test::Host(kGiB, false)};
  in.costs = plan_test::FakeCosts();
  in.job.batch_tokens = 256;
  in.job.logits = true;
  in.job.hooks.Add(HookPoint{HookSite::kResidPost, 2});
  auto a = MakePlan(in), b = MakePlan(in);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(PlanToJson(*a).dump(), PlanToJson(*b).dump());
}

TEST(PlanProperties, LivenessBeatsTheExecutorsSumOfRegions) {
  const ModelConfig c = Synthetic();
  JobSpec job;
  job.batch_tokens = 2048;
  const ActivationLayout l = PlanActivations(c, job, plan_test::FakeCosts());
  EXPECT_LT(l.activations.total_bytes, l.activations.naive_bytes);
  // The residual stream is live over the whole program.
  const PlannedRegion& x =
      l.activations.regions[l.activations.Find(BufferId::kResidual)];
  EXPECT_EQ(x.first_step, 0);
  EXPECT_EQ(x.last_step, static_cast<int>(l.steps.size()) - 1);
}

TEST(Placement, BalancedEqualisesPeaksSequentialFillsInOrder) {
  const Model m = Make(MlpKind::kGated, 16);
  PlanInput in;
  in.config = &m.config;
  in.weights = &m.table;
  in.devices = {plan_test::Gpu(0, 64 * kMiB), plan_test::Gpu(1, 64 * kMiB),
                plan_test::Host(kGiB, false)};
  in.costs = plan_test::FakeCosts();
  in.job.batch_tokens = 128;
  in.job.logits = true;
  auto bal = MakePlan(in);
  ASSERT_TRUE(bal.ok());
  ASSERT_TRUE(bal->fits) << FormatPlanTable(*bal);
  EXPECT_LT(std::abs(bal->devices[0].total() - bal->devices[1].total()),
            m.table.layer_bytes[0] + 1)
      << FormatPlanTable(*bal);
  in.strategy = Strategy::kSequential;
  auto seq = MakePlan(in);
  ASSERT_TRUE(seq.ok());
  EXPECT_TRUE(seq->fits) << FormatPlanTable(*seq);
  EXPECT_EQ(seq->devices[0].layers.size(),
            16u);  // everything fits on the first
  in.strategy = Strategy::kManual;
  in.layers_per_device = {5, 11};
  auto man = MakePlan(in);
  ASSERT_TRUE(man.ok());
  EXPECT_EQ(man->devices[0].layers.size(), 5u);
  EXPECT_EQ(man->devices[1].layers.size(), 11u);
  in.layers_per_device = {5, 10};
  EXPECT_FALSE(MakePlan(in).ok());  // 15 of 16 layers, no disk
}

TEST(Placement, DiskTierStreamsTheLayersThatDoNotFit) {
  const Model m = Make(MlpKind::kGated, 16);
  PlanInput in;
  in.config = &m.config;
  in.weights = &m.table;
  in.devices = {plan_test::Gpu(0, 12 * kMiB), plan_test::Host(kGiB, false)};
  in.costs = plan_test::FakeCosts();
  in.job.batch_tokens = 64;
  in.job.logits = true;
  auto over = MakePlan(in);
  ASSERT_TRUE(over.ok());
  ASSERT_FALSE(over->fits);
  EXPECT_FALSE(over->suggestions.empty()) << FormatPlanTable(*over);
  Status s = CheckFits(*over);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("cuda:0"), std::string::npos);
  in.devices.push_back(plan_test::Disk());
  auto disk = MakePlan(in);
  ASSERT_TRUE(disk.ok());
  EXPECT_TRUE(disk->fits) << FormatPlanTable(*disk);
  const DevicePlan& d = disk->devices.back();
  EXPECT_EQ(d.device.kind, DeviceKind::kDisk);
  EXPECT_GT(d.layers.size(), 0u);
  EXPECT_EQ(disk->devices[0].streamed_layers,
            static_cast<int64_t>(d.layers.size()));
  EXPECT_GT(disk->devices[0].stream, 0);
}

// --offload: the host's layers keep their weights on the host; their compute
// (activations, workspace, kv, staging, the head) moves to the last GPU,
// which gets two buffers of the largest offloaded layer (stream).
TEST(Offload, HostLayersComputeOnTheLastGpuByteExact) {
  const Model m = Make(MlpKind::kGated, 16);
  PlanInput in;
  in.config = &m.config;
  in.weights = &m.table;
  in.devices = {plan_test::Gpu(0, 64 * kMiB), plan_test::Host(kGiB, true)};
  in.costs = plan_test::FakeCosts();
  in.job.mode = JobMode::kGeneration;
  in.job.batch_tokens = 64;
  in.job.context = 64;
  in.job.logits = true;
  in.strategy = Strategy::kManual;
  in.layers_per_device = {10, 6};
  in.suggest = false;
  auto res = MakePlan(in);  // the host computes layers 10..15
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  in.offload = true;
  in.layers_per_device = {10};  // the GPUs' counts; the rest is offloaded
  auto off = MakePlan(in);
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  ASSERT_TRUE(off->fits) << FormatPlanTable(*off);
  EXPECT_TRUE(off->offload);
  const DevicePlan &rg = res->devices[0], &rh = res->devices[1];
  const DevicePlan &og = off->devices[0], &oh = off->devices[1];
  ASSERT_EQ(oh.device.kind, DeviceKind::kCpu);
  // Offloaded layers as the executor lays them out: 64-byte aligned tensors.
  std::vector<int64_t> aligned(16, 0);
  for (const PlannedTensor& t : m.table.tensors)
    if (t.layer >= 0) aligned[t.layer] += AlignUp(t.bytes, 64);
  int64_t host_layers = 0, largest = 0, unaligned = 0;
  for (int64_t l = 10; l < 16; ++l) {
    host_layers += aligned[l];
    unaligned += m.table.layer_bytes[l];
    largest = std::max(largest, aligned[l]);
    EXPECT_EQ(off->layer_device[l], 1) << l;  // held by the host
    EXPECT_EQ(ComputeDeviceOf(*off, l), 0) << l;
    EXPECT_TRUE(IsOffloaded(*off, l));
  }
  EXPECT_EQ(ComputeDeviceOf(*off, 3), 0);
  EXPECT_FALSE(IsOffloaded(*off, 3));
  EXPECT_FALSE(IsOffloaded(*res, 12));
  EXPECT_EQ(ComputeDeviceOf(*res, 12), 1);
  // The host holds the offloaded layers' weights and computes nothing.
  EXPECT_EQ(oh.layers, rh.layers);
  EXPECT_EQ(oh.weights, host_layers);
  EXPECT_TRUE(oh.weights_only);
  EXPECT_FALSE(oh.computes());
  EXPECT_EQ(oh.activations + oh.workspace + oh.kv + oh.logits + oh.stream, 0);
  // No captures staged on the host here: the GPU's edit stage only.
  EXPECT_EQ(oh.staging, AlignUp(EditStageBytes(m.config), 64));
  // The GPU computes every layer: the host's kv, the head, two buffers.
  EXPECT_EQ(og.offloaded_layers, 6);
  EXPECT_EQ(og.stream, 2 * largest);
  EXPECT_EQ(og.kv, rg.kv + rh.kv);
  EXPECT_GT(rh.kv, 0);
  EXPECT_EQ(og.logits, rh.logits);
  EXPECT_EQ(og.activations, rg.activations);
  EXPECT_EQ(og.workspace, rg.workspace);
  const int64_t head = rh.weights - unaligned;  // final norm, lm_head
  EXPECT_GT(head, 0);
  EXPECT_EQ(og.weights, rg.weights + head);
  EXPECT_EQ(og.total(), rg.total() +
                            (rh.total() - rh.activations - rh.workspace -
                             rh.staging - unaligned) +
                            2 * largest);
  EXPECT_TRUE(og.holds_head && !oh.holds_head);
  // Shown in the table and the JSON.
  EXPECT_NE(FormatPlanTable(*off).find("6 offloaded from host"),
            std::string::npos)
      << FormatPlanTable(*off);
  EXPECT_EQ(PlanToJson(*off)["devices"][0]["offloaded_layers"], 6);
}

TEST(Offload, BalancedOffloadsTheTrailingLayersThatDoNotFit) {
  const Model m = Make(MlpKind::kGated, 16);
  PlanInput in;
  in.config = &m.config;
  in.weights = &m.table;
  in.devices = {plan_test::Gpu(0, 12 * kMiB), plan_test::Host(kGiB, false)};
  in.costs = plan_test::FakeCosts();
  in.job.batch_tokens = 64;
  in.job.logits = true;
  auto over = MakePlan(in);
  ASSERT_TRUE(over.ok());
  ASSERT_FALSE(over->fits);
  bool suggested = false;
  for (const std::string& s : over->suggestions)
    suggested |= s.rfind("--offload", 0) == 0;
  EXPECT_TRUE(suggested) << FormatPlanTable(*over);
  in.offload = true;
  auto off = MakePlan(in);
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  ASSERT_TRUE(off->fits) << FormatPlanTable(*off);
  const DevicePlan &g = off->devices[0], &h = off->devices[1];
  ASSERT_GT(h.layers.size(), 0u);
  ASSERT_LT(h.layers.size(), 16u);
  EXPECT_EQ(h.layers.back(), 15);  // the trailing layers
  EXPECT_EQ(g.offloaded_layers, static_cast<int64_t>(h.layers.size()));
  std::vector<int64_t> aligned(16, 0);
  for (const PlannedTensor& t : m.table.tensors)
    if (t.layer >= 0) aligned[t.layer] += AlignUp(t.bytes, 64);
  int64_t largest = 0, held = 0;
  for (int64_t l : h.layers) {
    largest = std::max(largest, aligned[l]);
    held += aligned[l];
  }
  EXPECT_EQ(g.stream, 2 * largest);
  EXPECT_EQ(h.weights, held);
  EXPECT_EQ(h.activations, 0);
  // Fewest offloaded: one layer more on the GPU does not fit.
  in.strategy = Strategy::kManual;
  in.layers_per_device = {static_cast<int64_t>(g.layers.size()) + 1};
  auto more = MakePlan(in);
  ASSERT_TRUE(more.ok());
  EXPECT_FALSE(more->fits) << FormatPlanTable(*more);
}

TEST(Offload, NeedsAGpuAndNoDisk) {
  const Model m = Make(MlpKind::kGated, 4);
  PlanInput in;
  in.config = &m.config;
  in.weights = &m.table;
  in.devices = {plan_test::Host(kGiB, true)};
  in.costs = plan_test::FakeCosts();
  in.job.batch_tokens = 16;
  in.job.logits = true;
  in.offload = true;
  auto p = MakePlan(in);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("--offload"), std::string::npos);
  EXPECT_NE(p.status().message().find("GPU"), std::string::npos);
  in.devices = {plan_test::Gpu(0, kGiB), plan_test::Host(kGiB, false),
                plan_test::Disk()};
  p = MakePlan(in);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("--device disk"), std::string::npos);
  // Everything fits on the GPU: nothing is offloaded.
  in.devices.pop_back();
  p = MakePlan(in);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->devices[0].offloaded_layers, 0);
  EXPECT_EQ(p->devices[0].stream, 0);
  EXPECT_EQ(p->devices[0].layers.size(), 4u);
}

TEST(Placement, GenerationAddsKvPerLayerCappedBySlidingWindow) {
  Model m = Make(MlpKind::kGated, 4);
  m.config.sliding_window = {0, 100, 0, 100};
  PlanInput in;
  in.config = &m.config;
  in.weights = &m.table;
  in.devices = {plan_test::Host(kGiB, true)};
  in.costs = plan_test::FakeCosts();
  in.job.mode = JobMode::kGeneration;
  in.job.batch_tokens = 1000;
  in.job.context = 1000;
  auto p = MakePlan(in);
  ASSERT_TRUE(p.ok());
  // 2 (k, v) x kv_dim 64 x (1000 + 100 + 1000 + 100) tokens x 1 sequence x
  // the KV cache's dtype (KvCacheDType: the backend's activation dtype, f32,
  // as KvCache allocates it; no longer the checkpoint's bf16).
  EXPECT_EQ(KvCacheDType(in.costs), DType::kF32);
  EXPECT_EQ(p->devices[0].kv, 2 * 64 * 2200 * 4);
}

int64_t FakeKvWorkspace(int64_t context, int64_t, int64_t, int64_t, int64_t,
                        int) {
  return context * 1000;
}

// An analysis job with kv_context (extract's streamed long rows): one
// sequence of kv_context positions of the layers run (here 0-1 of 4), in the
// activation dtype; the cache's attention workspace joins the workspace of
// the device that computes layer 0.
TEST(Placement, AnalysisKvContextHoldsOneSequenceOfTheLayersRun) {
  Model m = Make(MlpKind::kGated, 4);
  m.config.sliding_window = {0, 100, 0, 100};
  PlanInput in;
  in.config = &m.config;
  in.weights = &m.table;
  in.devices = {plan_test::Host(kGiB, true)};
  in.costs = plan_test::FakeCosts();
  in.costs.kv_attention_workspace = FakeKvWorkspace;
  in.job.batch_tokens = 64;
  in.job.context = 64;
  in.job.hooks.Add(HookPoint{HookSite::kResidPost, 1});
  auto off = MakePlan(in);
  ASSERT_TRUE(off.ok()) << off.status().message();
  EXPECT_EQ(off->devices[0].kv, 0);
  in.job.kv_context = 1000;
  auto p = MakePlan(in);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->layers_run, 2);
  // 2 (k, v) x kv_dim 64 x (1000 + 100) positions x 1 sequence x f32.
  EXPECT_EQ(p->devices[0].kv, 2 * 64 * 1100 * 4);
  EXPECT_EQ(p->devices[0].workspace - off->devices[0].workspace, 1000 * 1000);
  EXPECT_NE(FormatPlanTable(*p).find("KV cache of 1 x 1000 positions"),
            std::string::npos)
      << FormatPlanTable(*p);
  EXPECT_EQ(PlanToJson(*p)["job"]["kv_context"], 1000);
  in.job.kv_seqs = 3;
  in.job.kv_dtype = DType::kBF16;
  EXPECT_EQ(MakePlan(in)->devices[0].kv, 2 * 64 * 1100 * 3 * 2);
  // Too small a host: the refusal suggests the longest row that fits.
  in.job.kv_seqs = 0;
  in.job.kv_dtype.reset();
  in.devices = {plan_test::Host(
      off->devices[0].total() + 2 * 64 * 600 * 4 + 600 * 1000, true)};
  auto small = MakePlan(in);
  ASSERT_TRUE(small.ok()) << small.status().message();
  EXPECT_FALSE(small->fits);
  bool suggested = false;
  for (const std::string& s : small->suggestions)
    suggested |= s.rfind("--max-row-tokens ", 0) == 0;
  EXPECT_TRUE(suggested) << FormatPlanTable(*small);
  // Bad values.
  in.job.kv_context = -1;
  EXPECT_FALSE(MakePlan(in).ok());
  in.job.kv_context = 10'000;  // > max_position_embeddings
  EXPECT_FALSE(MakePlan(in).ok());
  in.job.kv_context = 16;
  in.job.mode = JobMode::kGeneration;
  EXPECT_FALSE(MakePlan(in).ok());
}

// Quantized weights are held as stored when the job converts weights to a
// compute dtype; dense ones are converted (numel x 4, 64-byte aligned).
TEST(Weights, QuantizedPartsAreNotConverted) {
  Model m = Make(MlpKind::kGated, 2);
  m.config.quant.method = "modelopt";
  m.config.quant.format.kind = FormatKind::kNvfp4ModelOpt;
  m.config.quant.excluded = {"lm_head"};
  const ArchWeights decl = FindArch("llama")->declare_weights(m.config);
  auto t =
      WeightTableFromNames(m.config, decl, nullptr, DType::kBF16, "synthetic");
  ASSERT_TRUE(t.ok()) << t.status().message();
  // Per layer: q [256, 256], k/v [64, 256], o [256, 256], gate/up [704, 256],
  // down [256, 704], each as U8 values (out x in / 2), E4M3 scales
  // (out x in / 16) and two F32 scalars: 9/16 byte per value + 8 bytes.
  const int64_t values = 2 * 256 * 256 + 2 * 64 * 256 + 3 * 704 * 256;
  const int64_t norms = 2 * 256 * 2;  // two bf16 RMSNorm weights
  EXPECT_EQ(t->layer_bytes[0], values * 9 / 16 + 7 * 8 + norms);
  PlanInput in;
  in.config = &m.config;
  in.weights = &*t;
  in.devices = {plan_test::Host(kGiB, true)};
  in.costs = plan_test::FakeCosts();
  in.job.batch_tokens = 16;
  in.job.context = 16;
  in.job.logits = true;
  in.job.weight_compute_dtype = DType::kF32;
  auto p = MakePlan(in);
  ASSERT_TRUE(p.ok()) << p.status().message();
  // Embedding, lm_head [1000, 256] and the norms become f32; the quantized
  // projections stay as stored.
  const int64_t f32_dense = 2 * 1000 * 256 * 4 + (2 * 2 + 1) * 256 * 4;
  EXPECT_EQ(p->devices[0].weights, f32_dense + 2 * (values * 9 / 16 + 7 * 8));
}

TEST(Weights, SubByteJobDtypesAreErrors) {
  Model m = Make(MlpKind::kGated, 2);
  PlanInput in;
  in.config = &m.config;
  in.weights = &m.table;
  in.devices = {plan_test::Host(kGiB, true)};
  in.costs = plan_test::FakeCosts();
  in.job.kv_dtype = DType::kF4E2M1;
  auto p = MakePlan(in);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("kv dtype F4 is a sub-byte type"),
            std::string::npos)
      << p.status().message();
}

}  // namespace
}  // namespace loom
