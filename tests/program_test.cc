// The planner and the executor walk the same forward program: for every
// golden architecture and several jobs, the executor's arenas (bytes, and the
// address of every region relative to its arena) equal what the planner
// decides for the same job from config.json and the safetensors headers.
// Also: the program declares the MoE steps and buffers (the routed rows are
// exactly T * k) and per-layer facts come from LayerConfig.
#include "src/plan/program.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "src/backend/registry.h"
#include "src/model/layer_config.h"
#include "src/model/registry.h"
#include "src/plan/planner.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"
#include "tests/golden_util.h"

namespace loom::testing {
namespace {

struct ModelCase {
  std::string name;
  bool bundled;  // inside the repository (else under the shared goldens)
};

// The architectures tests/golden_parity_test.cc checks against HF.
std::vector<ModelCase> GoldenModels() {
  return {{"stories260K", true},
          {"llama", false},
          {"llama3rope_bf16", false},
          {"mistral_sw16_sharded", false},
          {"qwen2", false},
          {"qwen3", false},
          {"gemma", false},
          {"gemma2", false},
          {"phi3", false},
          {"gpt2", false},
          {"gpt_neo", false},
          {"opt", false},
          {"gpt_bigcode", false},
          {"gptj", false},
          {"codegen", false},
          {"falcon", false},
          {"olmo", false},
          {"olmo2", false},
          {"gpt_neox", false},
          {"phi", false},
          {"granite", false},
          {"starcoder2", false},
          {"qwen3_fp8_block", false},
          {"llama_nvfp4_modelopt", false},
          {"llama_nvfp4_ct", false},
          {"mixtral", false},
          {"qwen2_moe", false},
          {"qwen3_moe", false},
          {"gpt_oss", false},
          {"gpt_oss_mxfp4", false},
          {"olmoe", false},
          {"deepseek_v3", false},
          {"stablelm", false},
          {"nemotron", false},
          {"persimmon", false},
          {"granitemoe", false},
          {"gemma3", false}};
}

std::string ModelDir(const ModelCase& m) {
  return m.bundled ? std::string(LOOM_MODELS_DIR) + "/" + m.name
                   : SharedGoldenDir() + "/tiny/" + m.name;
}

struct JobCase {
  std::string name;
  int64_t max_tokens, max_seq_len, chunk_rows;
  HookSet (*hooks)(const ModelConfig& c);
};

HookSet MidResidual(const ModelConfig& c) {
  HookSet h;
  h.Add({HookSite::kResidPost, c.num_layers / 2});
  return h;
}
HookSet EveryHookAndLogits(const ModelConfig& c) {
  HookSet h;
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (HookSite s :
         {HookSite::kResidPre, HookSite::kQ, HookSite::kZ, HookSite::kPattern,
          HookSite::kAttnOut, HookSite::kMlpPre, HookSite::kMlpPost,
          HookSite::kRouterLogits, HookSite::kExpertIds,
          HookSite::kExpertWeights, HookSite::kMlpOut, HookSite::kResidPost})
      // MLP hooks on dense layers, router hooks on MoE layers.
      if (CheckHookExists({s, l}, c).ok()) h.Add({s, l});
  h.Add({HookSite::kEmbed, -1});
  h.Add({HookSite::kFinalNorm, -1});
  h.Add({HookSite::kLogits, -1});
  return h;
}
HookSet FinalNormOnly(const ModelConfig&) {
  HookSet h;
  h.Add({HookSite::kFinalNorm, -1});
  return h;
}
HookSet EmbedOnly(const ModelConfig&) {
  HookSet h;
  h.Add({HookSite::kEmbed, -1});
  return h;
}

std::vector<JobCase> Jobs() {
  return {{"mid_residual_batch64", 64, 32, 256, MidResidual},
          {"every_hook_logits_batch96", 96, 48, 32, EveryHookAndLogits},
          {"final_norm_batch128", 128, 128, 256, FinalNormOnly},
          {"logits_odd_batch17", 17, 17, 5, EveryHookAndLogits},
          {"embed_only_batch40", 40, 20, 256, EmbedOnly}};
}

// Every region of `plan` is where `arena` put it, and the bytes agree.
void ExpectArenaIsPlan(const std::string& what, const Arena& arena,
                       const ArenaPlan& plan, int64_t planned_device_bytes) {
  EXPECT_EQ(arena.bytes(), plan.total_bytes) << what;
  EXPECT_EQ(arena.bytes(), planned_device_bytes) << what;
  ASSERT_EQ(arena.plan().regions.size(), plan.regions.size()) << what;
  for (size_t i = 0; i < plan.regions.size(); ++i) {
    const PlannedRegion& r = plan.regions[i];
    SCOPED_TRACE(what + " region " + r.name);
    EXPECT_EQ(arena.plan().regions[i].id, r.id);
    EXPECT_EQ(arena.plan().regions[i].bytes, r.bytes);
    ASSERT_NE(arena.region(r.id), nullptr);
    EXPECT_EQ(static_cast<const uint8_t*>(arena.region(r.id)) -
                  static_cast<const uint8_t*>(arena.base()),
              r.offset);
    EXPECT_LE(r.offset + r.bytes, arena.bytes());
  }
}

TEST(ProgramTest, ExecutorArenasEqualThePlanForEveryGoldenArchitecture) {
  int checked = 0;
  for (const ModelCase& m : GoldenModels()) {
    if (!m.bundled && SharedGoldenDir().empty()) {
      std::fprintf(stderr,
                   "SKIPPED LOUDLY: shared golden directory %s/golden not "
                   "found; %s is not checked\n",
                   LOOM_SHARED_DIR, m.name.c_str());
      continue;
    }
    auto model = Model::Load(ModelDir(m), Precision::kF32);
    ASSERT_TRUE(model.ok()) << m.name << ": " << model.status().ToString();
    const ModelConfig& c = (*model)->config();
    auto backend = CreateBackend("cpu");
    ASSERT_TRUE(backend.ok());
    auto cpu = ParseDevice("cpu=64GiB", int64_t{64} << 30);
    ASSERT_TRUE(cpu.ok());
    for (const JobCase& j : Jobs()) {
      const std::string what = m.name + " / " + j.name;
      SCOPED_TRACE(what);
      const HookSet hooks = j.hooks(c);
      ExecutorOptions o;
      o.max_tokens = j.max_tokens;
      o.max_seq_len = j.max_seq_len;
      o.logits_chunk_rows = j.chunk_rows;
      auto ex = Executor::Create(**model, hooks, o);
      ASSERT_TRUE(ex.ok()) << ex.status().ToString();
      // The planner, as `loom plan` / --show-plan call it: from the model
      // directory's metadata, on the host, with the backend's costs.
      const JobSpec job = Executor::MakeJob(**model, hooks, o);
      auto plan = PlanModelDir(ModelDir(m), job, {*cpu}, int64_t{64} << 30,
                               (*backend)->Costs());
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      ASSERT_EQ((*ex)->num_devices(), 1);
      const DevicePlan* host = nullptr;
      for (const DevicePlan& d : plan->devices)
        if (d.device.kind == DeviceKind::kCpu) host = &d;
      ASSERT_NE(host, nullptr);
      const Executor::Device& d = (*ex)->device(0);
      ExpectArenaIsPlan(what + " activations", d.activations,
                        plan->layout.activations, host->activations);
      ExpectArenaIsPlan(what + " workspace", d.workspace,
                        plan->layout.workspace, host->workspace);
      if (job.NeedsLogits()) {
        ExpectArenaIsPlan(what + " logits", d.logits, plan->layout.logits,
                          host->logits);
      } else {
        EXPECT_TRUE(plan->layout.logits.regions.empty());
        EXPECT_EQ(host->logits, 0);
      }
      EXPECT_EQ((*ex)->layout().step_ids, plan->layout.step_ids);
      // The regions the executor touches are the ones the plan holds.
      EXPECT_EQ(d.activations.region(BufferId::kPattern) != nullptr,
                hooks.Contains(HookSite::kPattern, 0));
      EXPECT_EQ(d.activations.region(BufferId::kFinalNorm) != nullptr,
                job.NeedsFinalNorm());
      // The CPU GEMM decodes quantized weights inside its own workspace
      // (one packing slot per thread, the GEMM term): no separate region.
      EXPECT_EQ(d.workspace.region(BufferId::kWeightDecode), nullptr);
      EXPECT_NE(d.workspace.region(BufferId::kGemmInputCopy), nullptr);
      // And a forward runs in them.
      std::vector<int32_t> ids(static_cast<size_t>(j.max_tokens));
      for (size_t t = 0; t < ids.size(); ++t)
        ids[t] = static_cast<int32_t>((t * 31 + 7) % c.vocab_size);
      std::vector<int64_t> starts = {0};
      for (int64_t s = j.max_seq_len; s < j.max_tokens; s += j.max_seq_len)
        starts.push_back(s);
      starts.push_back(j.max_tokens);
      CaptureSink sink;
      EXPECT_TRUE((*ex)->Forward(Batch{ids, starts}, &sink).ok());
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(ProgramTest, MoeStepsAndBuffersAreDeclaredAndPlanned) {
  for (const char* name :
       {"Qwen3-30B-A3B", "Mixtral-8x7B-v0.1", "gpt-oss-20b"}) {
    SCOPED_TRACE(name);
    auto c =
        LoadModelConfig(std::string(LOOM_TESTDATA_DIR) + "/configs/" + name);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    const Program p = BuildProgram(*c);
    ASSERT_EQ(p.blocks.size(), 1u);
    ASSERT_EQ(p.layer_block.size(), static_cast<size_t>(c->num_layers));
    std::vector<StepId> ids;
    for (const ProgramStep& s : p.blocks[0]) ids.push_back(s.id);
    const std::vector<StepId> moe = {
        StepId::kRouter,       StepId::kExpertGather,
        StepId::kExpertGateUp, StepId::kExpertActivation,
        StepId::kExpertDown,   StepId::kExpertScatterAdd};
    auto at = std::search(ids.begin(), ids.end(), moe.begin(), moe.end());
    EXPECT_NE(at, ids.end()) << "the routed-expert steps, in order";
    EXPECT_EQ(std::count(ids.begin(), ids.end(), StepId::kUpProj), 0);

    JobSpec job;
    job.batch_tokens = 256;
    job.context = 128;
    job.hooks.Add({HookSite::kResidPost, 1});
    const ActivationLayout l =
        PlanActivations(*c, job, (*CreateBackend("cpu"))->Costs());
    const int64_t T = 256, k = c->moe.experts_per_token;
    auto region = [&](BufferId id) -> const PlannedRegion* {
      const int i = l.activations.Find(id);
      return i < 0 ? nullptr : &l.activations.regions[static_cast<size_t>(i)];
    };
    ASSERT_NE(region(BufferId::kRouteIds), nullptr);
    // Routed rows: exactly T * k (expert id, weight) pairs per layer.
    EXPECT_EQ(region(BufferId::kRouteIds)->bytes, T * k * 4);
    EXPECT_EQ(region(BufferId::kRouteWeights)->bytes, T * k * 4);
    // The routed rows grouped by expert: exactly T * k of them.
    EXPECT_EQ(region(BufferId::kExpertRows)->bytes, T * k * 4);
    EXPECT_EQ(region(BufferId::kExpertRowWeights)->bytes, T * k * 4);
    EXPECT_EQ(region(BufferId::kExpertOffsets)->bytes,
              (c->moe.num_experts + 1) * 4);
    EXPECT_EQ(region(BufferId::kExpertIn)->bytes, T * k * c->hidden_size * 4);
    EXPECT_EQ(region(BufferId::kExpertOut)->bytes, T * k * c->hidden_size * 4);
    EXPECT_EQ(region(BufferId::kExpertGateUp)->bytes,
              T * k * 2 * c->moe.expert_intermediate_size * 4);
    EXPECT_EQ(region(BufferId::kExpertAct)->bytes,
              T * k * c->moe.expert_intermediate_size * 4);
    EXPECT_EQ(region(BufferId::kMlpGateUp), nullptr);
    // Live over their steps only: router logits die at the router.
    EXPECT_EQ(region(BufferId::kRouterLogits)->first_step,
              region(BufferId::kRouterLogits)->last_step);
    EXPECT_EQ(
        l.steps[static_cast<size_t>(region(BufferId::kRouteIds)->last_step)],
        "experts: group + gather routed rows");
    EXPECT_EQ(
        l.steps[static_cast<size_t>(region(BufferId::kExpertRows)->last_step)],
        "experts: weighted scatter-add");
  }
}

TEST(ProgramTest, LayerConfigCarriesPerLayerFacts) {
  ModelConfig c;
  c.num_layers = 4;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.attn_scale = 0.5f;
  c.attn_scale_by_inverse_layer = true;
  c.sliding_window = {16, 0, 16, 0};
  c.rope.type = RopeConfig::Type::kDefault;
  c.rope.rotary_dim = 8;
  const std::vector<LayerConfig> ls = MakeLayerConfigs(c);
  ASSERT_EQ(ls.size(), 4u);
  EXPECT_EQ(ls[0].window, 16);
  EXPECT_EQ(ls[1].window, 0);
  EXPECT_FLOAT_EQ(ls[0].attn_scale, 0.5f);
  EXPECT_FLOAT_EQ(ls[3].attn_scale, 0.5f / 4);
  EXPECT_EQ(ls[2].rope_half, 4);
  // Windows and scales are data: one block serves every layer.
  const Program p = BuildProgram(c);
  EXPECT_EQ(p.blocks.size(), 1u);
  for (int b = 0; b < kNumBuffers; ++b)
    EXPECT_NE(BufferName(static_cast<BufferId>(b)), "?");
}

// The block kind wires the residual: sequential (attention add, ln2 of the
// updated residual, MLP add), parallel (ln2 of the block input, one add of
// both branches) and parallel with a shared norm (the MLP reads ln1's
// output, no ln2); the planner keeps attention out alive until the parallel
// add and a per-head fused q/k/v buffer within its step.
TEST(ProgramTest, BlockKindsWireTheResidual) {
  ModelConfig c;
  c.num_layers = 2;
  c.num_heads = c.num_kv_heads = 2;
  c.head_dim = 8;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.vocab_size = 64;
  c.norm = NormKind::kLayer;
  c.mlp = MlpKind::kPlain;
  c.fused_qkv = true;
  using S = StepId;
  using B = BufferId;
  struct Case {
    BlockKind block;
    std::vector<StepId> steps;
    BufferId mlp_in;
  };
  for (const Case& k :
       {Case{BlockKind::kSequential,
             {S::kLn1, S::kQkvProj, S::kAttention, S::kOProj,
              S::kAttnResidualAdd, S::kLn2, S::kUpProj, S::kActivation,
              S::kDownProj, S::kMlpResidualAdd},
             B::kMlpIn},
        Case{
            BlockKind::kParallel,
            {S::kLn1, S::kQkvProj, S::kAttention, S::kOProj, S::kLn2,
             S::kUpProj, S::kActivation, S::kDownProj, S::kParallelResidualAdd},
            B::kMlpIn},
        Case{BlockKind::kParallelSharedNorm,
             {S::kLn1, S::kQkvProj, S::kAttention, S::kOProj, S::kUpProj,
              S::kActivation, S::kDownProj, S::kParallelResidualAdd},
             B::kAttnIn}}) {
    SCOPED_TRACE(static_cast<int>(k.block));
    c.block = k.block;
    c.pre_mlp_norm = k.block != BlockKind::kParallelSharedNorm;
    const Program p = BuildProgram(c);
    ASSERT_EQ(p.blocks.size(), 1u);
    std::vector<StepId> ids;
    for (const ProgramStep& s : p.blocks[0]) {
      ids.push_back(s.id);
      if (s.id == S::kUpProj) {
        EXPECT_EQ(s.reads, std::vector<B>{k.mlp_in});
      }
      if (s.id == S::kLn2) {
        EXPECT_EQ(s.reads, std::vector<B>{B::kResidual});
      }
      if (s.id == S::kParallelResidualAdd) {
        EXPECT_EQ(s.reads,
                  (std::vector<B>{B::kAttnOut, B::kMlpOut, B::kResidual}));
        ASSERT_EQ(s.hooks.size(), 1u);
        EXPECT_EQ(s.hooks[0].site, HookSite::kResidPost);
      }
    }
    EXPECT_EQ(ids, k.steps);
    // hook_resid_mid exists in sequential blocks only; ln2 wherever a pre-MLP
    // norm of its own exists.
    EXPECT_EQ(CheckHookExists({HookSite::kResidMid, 1}, c).ok(),
              k.block == BlockKind::kSequential);
    EXPECT_EQ(CheckHookExists({HookSite::kLn2, 1}, c).ok(),
              k.block != BlockKind::kParallelSharedNorm);

    JobSpec job;
    job.batch_tokens = 32;
    job.context = 32;
    job.hooks.Add({HookSite::kResidPost, 1});
    const ActivationLayout l =
        PlanActivations(c, job, (*CreateBackend("cpu"))->Costs());
    const PlannedRegion& out =
        l.activations
            .regions[static_cast<size_t>(l.activations.Find(B::kAttnOut))];
    EXPECT_EQ(l.steps[static_cast<size_t>(out.last_step)],
              k.block == BlockKind::kSequential ? "attention residual add"
                                                : "parallel residual add");
    EXPECT_EQ(l.activations.Find(B::kMlpIn) >= 0, c.pre_mlp_norm);
    EXPECT_LT(l.activations.Find(B::kQkvPerHead), 0);  // concat layout
  }
  // GPT-NeoX's per-head fused projection: its own buffer, live in the q/k/v
  // step only.
  c.qkv_layout = QkvLayout::kPerHead;
  JobSpec job;
  job.batch_tokens = 32;
  job.context = 32;
  job.hooks.Add({HookSite::kResidPost, 1});
  const ActivationLayout l =
      PlanActivations(c, job, (*CreateBackend("cpu"))->Costs());
  const int i = l.activations.Find(BufferId::kQkvPerHead);
  ASSERT_GE(i, 0);
  const PlannedRegion& r = l.activations.regions[static_cast<size_t>(i)];
  EXPECT_EQ(r.first_step, r.last_step);
  EXPECT_EQ(l.steps[static_cast<size_t>(r.first_step)], "qkv proj");
  EXPECT_EQ(r.bytes, 32 * 3 * 16 * 4);
}

TEST(ProgramTest, QwenMoeDenseLayersKeepAGatedMlp) {
  // mlp_only_layers and decoder_sparse_step make some layers dense: two
  // blocks, the dense one with the gated MLP of intermediate_size.
  ModelConfig c;
  c.num_layers = 4;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.mlp = MlpKind::kMoE;
  c.moe.num_experts = 4;
  c.moe.experts_per_token = 2;
  c.moe.expert_intermediate_size = 8;
  c.moe.decoder_sparse_step = 2;  // layers 1, 3 sparse
  c.moe.mlp_only_layers = {3};    // ... but 3 dense
  const std::vector<LayerConfig> ls = MakeLayerConfigs(c);
  EXPECT_FALSE(ls[0].moe());
  EXPECT_TRUE(ls[1].moe());
  EXPECT_FALSE(ls[2].moe());
  EXPECT_FALSE(ls[3].moe());
  EXPECT_EQ(ls[0].mlp, MlpKind::kGated);
  EXPECT_EQ(ls[1].num_experts, 4);
  const Program p = BuildProgram(c);
  EXPECT_EQ(p.blocks.size(), 2u);
  EXPECT_EQ(p.layer_block, (std::vector<int>{0, 1, 0, 0}));
}

}  // namespace
}  // namespace loom::testing
