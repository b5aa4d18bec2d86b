// The Session (src/eval/session.h): one precision for the plan and the
// load, interventions checked before planning, and the jobs that used to
// bypass the planner (generate, patch) run on any placement with the same
// bytes as on the host: generation on a second "device" (the host-as-device
// backend, every layer there), patching across two devices and across a
// device + CPU offload.
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

// Greedy generation with every layer on a device backend (the host-as-device
// stand-in: weights and KV cache in "device" memory) equals the host's,
// logits bit for bit.
TEST(Session, GenerationOnADeviceEqualsTheHost) {
  auto model = Model::Load(Stories(), Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 127, 13};
  auto run = [&](Backend* backend, std::vector<float>* logits,
                 std::vector<int32_t>* ids) {
    eval::Generator::Options go;
    go.context = 64;
    go.prefill_chunk = 4;  // the prompt in two chunks through the cache
    go.backend = backend;
    auto gen = eval::Generator::Create(**model, go);
    ASSERT_TRUE(gen.ok()) << gen.status().ToString();
    eval::GenerateOptions o;
    o.max_new_tokens = 12;
    auto out = (*gen)->Generate({prompt}, o);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    *ids = out->front().token_ids;
    // One more step from a fresh slot: the prompt's last logits.
    (*gen)->cache().Reset(0);
    const std::vector<int64_t> starts = {0, 4}, slot = {0}, pos0 = {0};
    const Batch b{std::span<const int32_t>(prompt.data(), 4), starts};
    auto l = (*gen)->StepLogits(b, KvBatch{&(*gen)->cache(), slot, pos0});
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    logits->assign(*l, *l + (*model)->config().vocab_size);
  };
  auto host = CreateBackend("cpu");
  ASSERT_TRUE(host.ok());
  testing::HostAsDevice device;
  std::vector<float> want_logits, got_logits;
  std::vector<int32_t> want_ids, got_ids;
  run(host->get(), &want_logits, &want_ids);
  run(&device, &got_logits, &got_ids);
  EXPECT_EQ(want_ids, got_ids);
  ASSERT_EQ(want_logits.size(), got_logits.size());
  EXPECT_EQ(std::memcmp(want_logits.data(), got_logits.data(),
                        want_logits.size() * sizeof(float)),
            0);
  EXPECT_GT(device.copies(), 0) << "nothing went through the device path";
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

  auto dev0 = CreateBackend("cpu");
  auto dev1 = CreateBackend("cpu");
  ASSERT_TRUE(dev0.ok() && dev1.ok());
  // (The offloaded segment streams its weights into two layer buffers; on a
  // device backend patching is refused for now: the executor applies
  // interventions on the CPU backend only.)
  const int64_t split = n / 2;
  const std::vector<std::vector<ExecutorSegment>> placements = {
      {{dev0->get(), 0, split - 1}, {dev1->get(), split, n - 1}},
      {{dev0->get(), 0, split - 1}, {dev0->get(), split, n - 1, true}},
  };
  for (size_t i = 0; i < placements.size(); ++i) {
    SCOPED_TRACE(i == 0 ? "two devices" : "device + offload");
    eval::PatchOptions po = o;
    po.segments = placements[i];
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

// Generation holds its KV cache on one device: a plan that splits the layers
// (here: some streamed from disk) is refused by name, before any forward.
TEST(Session, GenerationRefusesASplitPlacement) {
  auto shape = [](const Session& s) -> StatusOr<JobSpec> {
    eval::Generator::Options go;
    go.context = 64;
    ASSIGN_OR_RETURN(go, eval::Generator::Resolve(s.config(), go));
    return eval::Generator::Job(s.config(), go);
  };
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
    auto b = (*s)->OneBackend("generate");
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(b.status().message().find("KV cache on one device"),
              std::string::npos)
        << b.status().message();
  }
  EXPECT_TRUE(split) << "no host cap streamed layers from disk";
}

}  // namespace
}  // namespace loom
