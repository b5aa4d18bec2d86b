// The Session (src/eval/session.h): one precision for the plan and the
// load, interventions checked before planning, and the jobs that used to
// bypass the planner (generate, patch) run on any placement with the same
// bytes as on the host: generation and patching on a second "device" (the
// host-as-device backend), across two devices, across a device + offload
// and across the host + disk streaming, with and without interventions.
#include "src/eval/session.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/backend/registry.h"
#include "src/eval/generate.h"
#include "src/eval/job_plan.h"
#include "src/eval/patch.h"
#include "src/model/interventions.h"
#include "src/runtime/kv_cache.h"
#include "tests/golden_util.h"
#include "tests/host_as_device.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string Stories() { return std::string(LOOM_MODELS_DIR) + "/stories260K"; }

SessionParams StoriesParams() {
  SessionParams p;
  p.command = "test";
  p.model_dir = Stories();
  p.quiet = true;
  return p;
}

Session::JobShape EvalShape() {
  return [](const Session& s) -> StatusOr<JobSpec> {
    return EvalJobOf(s.config(), 64, 64);
  };
}

// config.json's torch_dtype says bf16 but the weights are stored in f32: the
// load computes in f32 (the stored dtype), and the plan counts the same f32
// bytes (it used to count bf16 from config.json: half the weights).
TEST(Session, PlanAndLoadShareOneComputeDType) {
  const fs::path dir = fs::temp_directory_path() /
                       ("loom_session_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(Stories()))
    if (e.is_regular_file()) fs::copy_file(e.path(), dir / e.path().filename());
  nlohmann::json c;
  std::ifstream(dir / "config.json") >> c;
  c["torch_dtype"] = "bfloat16";
  std::ofstream(dir / "config.json") << c.dump(2);

  SessionParams p = StoriesParams();
  p.model_dir = dir.string();
  auto s = Session::Open(p, EvalShape());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->compute_dtype(), DType::kF32);
  EXPECT_EQ((*s)->model().compute_dtype(), DType::kF32);
  ASSERT_TRUE((*s)->job().weight_compute_dtype.has_value());
  EXPECT_EQ(*(*s)->job().weight_compute_dtype, DType::kF32);
  int64_t planned_weights = 0;
  for (const DevicePlan& d : (*s)->plan().devices) planned_weights += d.weights;
  EXPECT_EQ(planned_weights, (*s)->model().checkpoint().total_bytes());
  fs::remove_all(dir);
}

// Interventions are read against config.json before anything is planned:
// a hook the model lacks is refused, naming it.
TEST(Session, InterventionsCheckedBeforePlanning) {
  SessionParams p = StoriesParams();
  p.interventions.json =
      R"({"interventions": [{"hook": "blocks.99.hook_resid_post",
                             "mode": "add", "vector": [1.0]}]})";
  bool shaped = false;
  auto s = Session::Open(p, [&](const Session& s) -> StatusOr<JobSpec> {
    shaped = true;
    return EvalJobOf(s.config(), 64, 64);
  });
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("blocks.99"), std::string::npos)
      << s.status().ToString();
  EXPECT_FALSE(shaped) << "planned before the interventions were checked";
}

// Greedy generation, then one more prefill from a fresh slot: the generated
// ids and the prompt's last logits, on `segments` (empty: `backend`, every
// layer).
struct GenerationRun {
  std::vector<int32_t> ids;
  std::vector<float> logits;
};

StatusOr<GenerationRun> Generate(const Model& model, Backend* backend,
                                 const std::vector<ExecutorSegment>& segments,
                                 const std::vector<Intervention>* edits) {
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 127, 13};
  eval::Generator::Options go;
  go.context = 64;
  go.prefill_chunk = 4;  // the prompt in two chunks through the cache
  go.backend = backend;
  go.segments = segments;
  ASSIGN_OR_RETURN(std::unique_ptr<eval::Generator> gen,
                   eval::Generator::Create(model, go));
  eval::GenerateOptions o;
  o.max_new_tokens = 12;
  o.interventions = edits;
  ASSIGN_OR_RETURN(std::vector<eval::Generation> out,
                   gen->Generate({prompt}, o));
  GenerationRun run;
  run.ids = out.front().token_ids;
  gen->cache().Reset(0);
  const std::vector<int64_t> starts = {0, 4}, slot = {0}, pos0 = {0};
  const Batch b{std::span<const int32_t>(prompt.data(), 4), starts};
  std::vector<SequenceEdit> step_edits;
  if (edits != nullptr) AddSequenceEdits(*edits, 0, 0, 4, &step_edits);
  ASSIGN_OR_RETURN(const float* l,
                   gen->StepLogits(b, KvBatch{&gen->cache(), slot, pos0},
                                   nullptr, step_edits));
  run.logits.assign(l, l + model.config().vocab_size);
  return run;
}

void ExpectSameRun(const GenerationRun& want, const GenerationRun& got) {
  EXPECT_EQ(want.ids, got.ids);
  ASSERT_EQ(want.logits.size(), got.logits.size());
  EXPECT_EQ(std::memcmp(want.logits.data(), got.logits.data(),
                        want.logits.size() * sizeof(float)),
            0);
}

// Greedy generation with every layer on a device backend (the host-as-device
// stand-in: weights and KV cache in "device" memory) equals the host's,
// logits bit for bit.
TEST(Session, GenerationOnADeviceEqualsTheHost) {
  auto model = Model::Load(Stories(), Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto host = CreateBackend("cpu");
  ASSERT_TRUE(host.ok());
  testing::HostAsDevice device;
  auto want = Generate(**model, host->get(), {}, nullptr);
  auto got = Generate(**model, &device, {}, nullptr);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameRun(*want, *got);
  EXPECT_GT(device.copies(), 0) << "nothing went through the device path";
}

// Steering and ablation on every layer while generating.
StatusOr<std::vector<Intervention>> GenerationEdits(const ModelConfig& c) {
  const std::string v = "[" + [&] {
    std::string x;
    for (int64_t i = 0; i < c.hidden_size; ++i)
      x += (i ? "," : "") + std::to_string(0.01 * (i % 7) - 0.03);
    return x;
  }() + "]";
  return ParseInterventions(
      R"({"interventions": [
        {"hook": "blocks.*.hook_resid_post", "mode": "add", "scale": 2.0,
         "vector": )" +
          v + R"(},
        {"hook": "blocks.0.attn.hook_z", "mode": "zero_head", "head": 1},
        {"hook": "blocks.1.hook_mlp_out", "mode": "add", "norm_match": true,
         "vector": )" +
          v + R"(, "positions": "all"}]})",
      ".", c);
}

// The KV cache follows the placement: generation with the layers split
// across two devices (host-as-device stand-ins, and two CPU backends), and
// across a device and an offloaded segment, equals one device's, with and
// without interventions (a device's edited rows go through the host stage).
TEST(Session, GenerationOnTwoDevicesAndOffloadEqualsOneDevice) {
  auto model = Model::Load(Stories(), Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const int64_t n = (*model)->config().num_layers;
  ASSERT_GE(n, 2);
  auto edits = GenerationEdits((*model)->config());
  ASSERT_TRUE(edits.ok()) << edits.status().ToString();
  auto host = CreateBackend("cpu");
  auto cpu1 = CreateBackend("cpu");
  ASSERT_TRUE(host.ok() && cpu1.ok());
  testing::HostAsDevice dev0(0), dev1(1);
  const int64_t split = n / 2;
  const std::vector<std::pair<std::string, std::vector<ExecutorSegment>>>
      placements = {
          {"two devices", {{&dev0, 0, split - 1}, {&dev1, split, n - 1}}},
          {"device + offload",
           {{&dev0, 0, split - 1}, {&dev0, split, n - 1, true}}},
          {"two CPU backends",
           {{host->get(), 0, split - 1}, {cpu1->get(), split, n - 1}}},
      };
  const std::vector<Intervention>* none = nullptr;
  const std::vector<Intervention>* some = &*edits;
  std::vector<float> plain_logits;
  for (const std::vector<Intervention>* iv : {none, some}) {
    auto want = Generate(**model, host->get(), {}, iv);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    if (iv == nullptr) plain_logits = want->logits;
    if (iv != nullptr) {
      EXPECT_NE(want->logits, plain_logits) << "the edits changed nothing";
    }
    for (const auto& [name, segments] : placements) {
      SCOPED_TRACE(name + (iv ? ", with interventions" : ""));
      const int64_t copies = dev0.copies() + dev1.copies();
      auto got = Generate(**model, nullptr, segments, iv);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ExpectSameRun(*want, *got);
      if (segments.front().backend == &dev0) {
        EXPECT_GT(dev0.copies() + dev1.copies(), copies);
      }
    }
  }
}

// A Session's plan that streams some layers from disk places the generator
// (its cache on the host beside the streamed layers): the same tokens and
// logits as one device.
TEST(Session, GenerationOnAPlannedSplitEqualsOneDevice) {
  auto shape = [](const Session& s) -> StatusOr<JobSpec> {
    eval::Generator::Options go;
    go.context = 64;
    go.prefill_chunk = 4;
    ASSIGN_OR_RETURN(go, eval::Generator::Resolve(s.config(), go));
    return eval::Generator::Job(s.config(), go);
  };
  auto one = Session::Open(StoriesParams(), shape);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  auto want = Generate((*one)->model(), nullptr, (*one)->segments(), nullptr);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  // The largest host cap under which the plan streams layers from disk
  // (the plan's bytes differ by ISA level: the caps are tried in turn).
  bool split = false;
  for (int kib = 2000; kib >= 800 && !split; kib -= 50) {
    SessionParams p = StoriesParams();
    p.plan.devices = {"cpu=" + std::to_string(kib) + "KiB", "disk"};
    auto s = Session::Open(p, shape);
    if (!s.ok()) continue;  // does not fit even streamed
    for (const ExecutorSegment& seg : (*s)->segments()) split |= seg.from_disk;
    if (!split) continue;
    SCOPED_TRACE("cpu=" + std::to_string(kib) + "KiB");
    auto got = Generate((*s)->model(), nullptr, (*s)->segments(), nullptr);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ExpectSameRun(*want, *got);
  }
  EXPECT_TRUE(split) << "no host cap streamed layers from disk";
}

// A cache that holds a layer on another device than the one computing it is
// refused by the executor, naming the layer and both devices.
TEST(Session, CacheOnTheWrongDeviceIsRefused) {
  auto model = Model::Load(Stories(), Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const ModelConfig& c = (*model)->config();
  testing::HostAsDevice dev0(0), dev1(1);
  ExecutorOptions eo;
  eo.max_tokens = 8;
  eo.segments = {{&dev0, 0, c.num_layers - 1}};
  HookSet hooks;
  hooks.Add({HookSite::kFinalNorm, -1});
  auto ex = Executor::Create(**model, hooks, eo);
  ASSERT_TRUE(ex.ok()) << ex.status().ToString();
  auto cache = KvCache::Create(c, 1, 16, dev1);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  const std::vector<int32_t> ids = {1, 403};
  const std::vector<int64_t> starts = {0, 2}, slot = {0}, pos0 = {0};
  const Batch b{ids, starts};
  Status st = (*ex)->Forward(b, nullptr, KvBatch{cache->get(), slot, pos0});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("layer 0 runs on cuda:0, its KV cache is on "
                              "cuda:1"),
            std::string::npos)
      << st.message();
}

// The patching grid with its layers split across two devices, and across a
// device and an offloaded (streamed) segment, equals the one-device grid
// byte for byte (the placements a Session's plan gives RunPatch).
TEST(Session, PatchOnTwoDevicesAndOffloadEqualsOneDevice) {
  auto model = Model::Load(Stories(), Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const int64_t n = (*model)->config().num_layers;
  ASSERT_GE(n, 2);
  const std::vector<int32_t> clean = {1, 403, 407, 261, 378, 127};
  const std::vector<int32_t> corrupted = {1, 403, 407, 261, 378, 312};
  eval::PatchOptions o;
  o.hooks = {"blocks.*.hook_resid_pre", "blocks.0.attn.hook_z"};
  o.per_head = true;
  o.batch_tokens = 30;  // several forwards, one grid
  auto one = eval::RunPatch(**model, clean, corrupted, o);
  ASSERT_TRUE(one.ok()) << one.status().ToString();

  auto cpu0 = CreateBackend("cpu");
  auto cpu1 = CreateBackend("cpu");
  ASSERT_TRUE(cpu0.ok() && cpu1.ok());
  // Two CPU backends, and host-as-device stand-ins for GPUs (their patched
  // rows go through the executor's host stage). The offloaded segment
  // streams its weights into two layer buffers.
  testing::HostAsDevice dev0(0), dev1(1);
  const int64_t split = n / 2;
  const std::vector<std::pair<std::string, std::vector<ExecutorSegment>>>
      placements = {
          {"two CPU backends",
           {{cpu0->get(), 0, split - 1}, {cpu1->get(), split, n - 1}}},
          {"CPU + offload",
           {{cpu0->get(), 0, split - 1}, {cpu0->get(), split, n - 1, true}}},
          {"two devices", {{&dev0, 0, split - 1}, {&dev1, split, n - 1}}},
          {"device + offload",
           {{&dev0, 0, split - 1}, {&dev0, split, n - 1, true}}},
      };
  for (const auto& [name, segments] : placements) {
    SCOPED_TRACE(name);
    eval::PatchOptions po = o;
    po.segments = segments;
    auto got = eval::RunPatch(**model, clean, corrupted, po);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->patched_logits_last.size(), one->patched_logits_last.size());
    EXPECT_EQ(std::memcmp(got->patched_logits_last.data(),
                          one->patched_logits_last.data(),
                          one->patched_logits_last.size() * sizeof(float)),
              0);
    EXPECT_EQ(got->recovery, one->recovery);
    EXPECT_EQ(got->clean_logits_last, one->clean_logits_last);
  }
}

}  // namespace
}  // namespace loom
