// Whole models on the GPU (label `cuda`): every hook of every bundled and
// shared tiny model computed by the CUDA backend against the CPU backend
// (itself checked against Hugging Face's goldens by golden_parity_test), a
// two-segment placement on one GPU bit-identical to one segment, offloaded
// layers (streamed from pinned host memory) bit-identical to resident ones,
// and the device memory an executor takes equal to its planned arenas and
// uploaded weights. Skipped, loudly, without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "src/backend/registry.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/golden_util.h"

namespace loom::testing {
namespace {

// Copies every delivered view to the host (device views through their
// backend) and keeps it as CaptureSink does.
class HostCopySink : public HookSink {
 public:
  explicit HostCopySink(std::vector<Backend*> devices)
      : devices_(std::move(devices)) {}
  Status OnActivation(const HookPoint& hook, const Batch& batch, int64_t seq,
                      int64_t row_begin, const ActivationView& view) override {
    if (view.device.kind == DeviceKind::kCpu)
      return inner_.OnActivation(hook, batch, seq, row_begin, view);
    Backend* be = nullptr;
    for (Backend* b : devices_)
      if (b->device() == view.device) be = b;
    if (be == nullptr) return InternalError("view of an unknown device");
    const int64_t esize = DTypeSize(view.dtype);
    const int64_t bytes = ((view.rows - 1) * view.ld + view.cols) * esize;
    host_.resize(static_cast<size_t>(bytes));
    RETURN_IF_ERROR(
        be->Copy(host_.data(), DeviceRef{}, view.data, view.device, bytes));
    ActivationView h = view;
    h.data = host_.data();
    h.device = DeviceRef{};
    if (view.dtype == DType::kI32) {
      // Integer hooks (expert ids) as f32, as the CPU path delivers them
      // to CaptureSink's comparisons.
      floats_.resize(static_cast<size_t>(view.rows * view.cols));
      const int32_t* v = reinterpret_cast<const int32_t*>(host_.data());
      for (int64_t r = 0; r < view.rows; ++r)
        for (int64_t j = 0; j < view.cols; ++j)
          floats_[r * view.cols + j] = static_cast<float>(v[r * view.ld + j]);
      h.data = floats_.data();
      h.dtype = DType::kF32;
      h.ld = view.cols;
    }
    return inner_.OnActivation(hook, batch, seq, row_begin, h);
  }
  const CaptureSink& captured() const { return inner_; }

 private:
  std::vector<Backend*> devices_;
  std::vector<uint8_t> host_;
  std::vector<float> floats_;
  CaptureSink inner_;
};

using Case = ModelCase;

// Three sequences of 13, 7 and 21 tokens. The Batch views `ids` and the
// static row starts (a Batch holds spans: the starts must outlive it).
Batch ThreeSequences(const ModelConfig& c, std::vector<int32_t>* ids) {
  static const std::vector<int64_t> kStarts = {0, 13, 20, 41};
  ids->resize(static_cast<size_t>(kStarts.back()));
  for (size_t t = 0; t < ids->size(); ++t)
    (*ids)[t] = static_cast<int32_t>((t * 17 + 3) % c.vocab_size);
  return Batch{*ids, kStarts};
}

const std::vector<Case>& Cases() {
  static const std::vector<Case> k = {{"stories260K", true},
                                      {"llama", false},
                                      {"llama3rope_bf16", false},
                                      {"qwen2", false},
                                      {"qwen3", false},
                                      {"gemma", false},
                                      {"gemma2", false},
                                      {"gpt2", false},
                                      {"phi3", false},
                                      {"olmo", false},
                                      {"olmo2", false},
                                      {"granite", false},
                                      {"starcoder2", false},
                                      {"olmoe", false},
                                      {"mistral_sw16_sharded", false},
                                      {"mixtral", false},
                                      {"qwen2_moe", false},
                                      {"qwen3_moe", false},
                                      {"gpt_oss", false},
                                      {"gpt_oss_mxfp4", false},
                                      {"qwen3_fp8_block", false},
                                      {"llama_nvfp4_ct", false},
                                      {"llama_nvfp4_modelopt", false}};
  return k;
}

class CudaModelTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!GetParam().bundled && SharedGoldenDir().empty())
      GTEST_SKIP() << "SKIPPED LOUDLY: shared golden directory not found; "
                   << GetParam().name << " is not checked on the GPU";
    const std::string dir = ModelCaseDir(GetParam());
    if (!std::ifstream(dir + "/config.json"))
      GTEST_SKIP() << "SKIPPED LOUDLY: no model at " << dir;
  }
};

// Every hook on the GPU against the CPU: f32 at 1e-4 (the ops run in f32;
// only summation orders differ), bf16 with HF's roundings at the bf16 bound
// the golden tests use (2^-7 relative to the activation scale, as rounding
// one ulp differently at one site propagates).
TEST_P(CudaModelTest, EveryHookMatchesTheCpu) {
  auto gpu = REQUIRE_GPU();
  for (Precision precision : {Precision::kF32, Precision::kBF16}) {
    SCOPED_TRACE(precision == Precision::kF32 ? "f32" : "bf16");
    auto model = Model::Load(ModelCaseDir(GetParam()), precision);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    const ModelConfig& c = (*model)->config();
    const HookSet hooks = EveryHookOf(c, /*with_pattern=*/false);
    std::vector<int32_t> ids;
    const Batch batch = ThreeSequences(c, &ids);
    ExecutorOptions o;
    o.max_tokens = 48;
    o.max_seq_len = 24;
    o.logits_chunk_rows = 16;
    o.hf_bf16_activations = precision == Precision::kBF16;
    auto cpu = CreateBackend("cpu");
    ASSERT_TRUE(cpu.ok());
    ExecutorOptions on_cpu = o;
    on_cpu.backend = cpu->get();
    auto ex_cpu = Executor::Create(**model, hooks, on_cpu);
    ASSERT_TRUE(ex_cpu.ok()) << ex_cpu.status().ToString();
    CaptureSink want;
    {
      const Status fwd = (*ex_cpu)->Forward(batch, &want);
      ASSERT_TRUE(fwd.ok()) << fwd.ToString();
    }

    ExecutorOptions on_gpu = o;
    on_gpu.backend = gpu.get();
    auto ex_gpu = Executor::Create(**model, hooks, on_gpu);
    ASSERT_TRUE(ex_gpu.ok()) << ex_gpu.status().ToString();
    HostCopySink got({gpu.get()});
    const Status st = (*ex_gpu)->Forward(batch, &got);
    ASSERT_TRUE(st.ok()) << st.ToString();

    const double tol = precision == Precision::kF32 ? 1e-4 : 1.0 / 128;
    for (const HookPoint& h : hooks.hooks()) {
      const auto& a = got.captured().Get(h);
      const auto& b = want.Get(h);
      ASSERT_EQ(a.data.size(), b.data.size()) << HookName(h);
      double scale = 0;
      for (float v : b.data) scale = std::max(scale, std::fabs(double{v}));
      const CompareResult r = Compare(a.data.data(), b.data.data(),
                                      static_cast<int64_t>(b.data.size()),
                                      tol * std::max(1.0, scale), tol);
      EXPECT_TRUE(r.ok) << HookName(h) << ": " << r.message;
    }
  }
}

// Two CUDA segments on one GPU (the boundary copies the residual stream,
// positions, offsets and RoPE tables device to device) give every hook bit
// for bit as one segment.
TEST_P(CudaModelTest, TwoSegmentsBitIdenticalToOne) {
  auto gpu = REQUIRE_GPU();
  auto model = Model::Load(ModelCaseDir(GetParam()), Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const ModelConfig& c = (*model)->config();
  if (c.num_layers < 2) GTEST_SKIP() << "one layer: nothing to split";
  const HookSet hooks = EveryHookOf(c, /*with_pattern=*/false);
  std::vector<int32_t> ids;
  const Batch batch = ThreeSequences(c, &ids);
  ExecutorOptions o;
  o.max_tokens = 48;
  o.max_seq_len = 24;
  o.logits_chunk_rows = 16;
  ExecutorOptions one = o;
  one.backend = gpu.get();
  auto single = Executor::Create(**model, hooks, one);
  ASSERT_TRUE(single.ok()) << single.status().ToString();
  HostCopySink want({gpu.get()});
  {
    const Status fwd = (*single)->Forward(batch, &want);
    ASSERT_TRUE(fwd.ok()) << fwd.ToString();
  }

  auto second = CreateBackend("cuda:0");
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  const int64_t split = c.num_layers / 2;
  ExecutorOptions two = o;
  two.segments = {{gpu.get(), 0, split - 1},
                  {second->get(), split, c.num_layers - 1}};
  auto placed = Executor::Create(**model, hooks, two);
  ASSERT_TRUE(placed.ok()) << placed.status().ToString();
  HostCopySink got({gpu.get(), second->get()});
  // Both instances are cuda:0: the sink copies through the first, which
  // reaches all of the device's memory.
  {
    const Status fwd = (*placed)->Forward(batch, &got);
    ASSERT_TRUE(fwd.ok()) << fwd.ToString();
  }
  for (const HookPoint& h : hooks.hooks()) {
    const auto& a = want.captured().Get(h);
    const auto& b = got.captured().Get(h);
    ASSERT_EQ(a.data.size(), b.data.size()) << HookName(h);
    EXPECT_EQ(std::memcmp(a.data.data(), b.data.data(),
                          a.data.size() * sizeof(float)),
              0)
        << HookName(h) << " differs between one and two segments";
  }
}

// CPU offload on the GPU: layers [0, split) resident on cuda:0, [split, n)
// offloaded (weights in pinned host memory, streamed into two device buffers
// by a copier instance, ordered with WaitFor), on the same instance; also
// every layer offloaded. Every hook bit for bit as the resident run, twice
// (the second forward restarts the stream over used buffers).
TEST_P(CudaModelTest, OffloadedLayersBitIdenticalToResident) {
  auto gpu = REQUIRE_GPU();
  auto model = Model::Load(ModelCaseDir(GetParam()), Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const ModelConfig& c = (*model)->config();
  const HookSet hooks = EveryHookOf(c, /*with_pattern=*/false);
  std::vector<int32_t> ids;
  const Batch batch = ThreeSequences(c, &ids);
  ExecutorOptions o;
  o.max_tokens = 48;
  o.max_seq_len = 24;
  o.logits_chunk_rows = 16;
  ExecutorOptions one = o;
  one.backend = gpu.get();
  auto single = Executor::Create(**model, hooks, one);
  ASSERT_TRUE(single.ok()) << single.status().ToString();
  HostCopySink want({gpu.get()});
  {
    const Status fwd = (*single)->Forward(batch, &want);
    ASSERT_TRUE(fwd.ok()) << fwd.ToString();
  }

  for (const int64_t split : {c.num_layers / 2, int64_t{0}}) {
    SCOPED_TRACE("split " + std::to_string(split));
    ExecutorOptions off = o;
    if (split > 0) off.segments.push_back({gpu.get(), 0, split - 1});
    off.segments.push_back({gpu.get(), split, c.num_layers - 1, true});
    auto placed = Executor::Create(**model, hooks, off);
    ASSERT_TRUE(placed.ok()) << placed.status().ToString();
    const Executor::Device& d = (*placed)->device((*placed)->num_devices() - 1);
    ASSERT_TRUE(d.offload && d.uploaded && d.uploaded->streamed());
    EXPECT_GT((*placed)->staged_weight_bytes(), 0);
    for (int run = 0; run < 2; ++run) {
      HostCopySink got({gpu.get()});
      {
        const Status fwd = (*placed)->Forward(batch, &got);
        ASSERT_TRUE(fwd.ok()) << fwd.ToString();
      }
      for (const HookPoint& h : hooks.hooks()) {
        const auto& a = want.captured().Get(h);
        const auto& b = got.captured().Get(h);
        ASSERT_EQ(a.data.size(), b.data.size()) << HookName(h);
        EXPECT_EQ(std::memcmp(a.data.data(), b.data.data(),
                              a.data.size() * sizeof(float)),
                  0)
            << HookName(h) << " differs with offloaded layers (run " << run
            << ")";
      }
    }
  }
}

// Device memory taken by Executor::Create (cudaMemGetInfo's free bytes
// before and after) equals its arenas plus its uploaded weights within 1 %
// (plus the driver's 2 MiB allocation granularity per allocation).
TEST_P(CudaModelTest, DeviceMemoryEqualsThePlan) {
  auto gpu = REQUIRE_GPU();
  auto model = Model::Load(ModelCaseDir(GetParam()), Precision::kBF16);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const HookSet hooks = EveryHookOf((*model)->config(), /*with_pattern=*/false);
  ExecutorOptions o;
  o.max_tokens = 256;
  o.logits_chunk_rows = 64;
  o.backend = gpu.get();
  std::string why;
  const int64_t free_before = ListGpus(&why).at(0).free_bytes;
  auto ex = Executor::Create(**model, hooks, o);
  ASSERT_TRUE(ex.ok()) << ex.status().ToString();
  const int64_t free_after = ListGpus(&why).at(0).free_bytes;
  const int64_t planned = (*ex)->arena_bytes() + (*ex)->uploaded_weight_bytes();
  const int64_t measured = free_before - free_after;
  const int64_t allocations = 4;  // weights + activations, workspace, logits
  EXPECT_NEAR(static_cast<double>(measured), static_cast<double>(planned),
              0.01 * planned + allocations * (2 << 20))
      << "planned " << planned << " bytes, cudaMemGetInfo says " << measured;
}

// The runtime's own device memory (context, modules, cuBLASLt, streams,
// scratch) after a forward has loaded every kernel: total - free - (arenas +
// weights) on an otherwise idle GPU. It must stay within the planner's
// constant (KernelCosts::device_runtime_bytes); the measured value is printed
// so the constant can be set from it.
TEST(CudaRuntime, RuntimeOverheadWithinPlan) {
  auto gpu = REQUIRE_GPU();
  auto model = Model::Load(std::string(LOOM_MODELS_DIR) + "/stories260K",
                           Precision::kBF16);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const HookSet hooks = EveryHookOf((*model)->config(), /*with_pattern=*/false);
  ExecutorOptions o;
  o.max_tokens = 64;
  o.logits_chunk_rows = 16;
  o.backend = gpu.get();
  auto ex = Executor::Create(**model, hooks, o);
  ASSERT_TRUE(ex.ok()) << ex.status().ToString();
  std::vector<int32_t> ids;
  const Batch batch = ThreeSequences((*model)->config(), &ids);
  HostCopySink sink({gpu.get()});
  {
    const Status fwd = (*ex)->Forward(batch, &sink);
    ASSERT_TRUE(fwd.ok()) << fwd.ToString();
  }
  std::string why;
  const GpuDescription g = ListGpus(&why).at(0);
  const int64_t ours = (*ex)->arena_bytes() + (*ex)->uploaded_weight_bytes();
  const int64_t runtime = g.total_bytes - g.free_bytes - ours;
  const int64_t planned = BackendCosts(DeviceKind::kCuda).device_runtime_bytes;
  std::fprintf(stderr,
               "MEASURED: %s runtime overhead %lld bytes (%.1f MiB); planned "
               "constant %lld bytes\n",
               g.name.c_str(), static_cast<long long>(runtime),
               runtime / 1048576.0, static_cast<long long>(planned));
  EXPECT_LE(runtime, planned) << "raise kDeviceRuntimeBytes (costs.h)";
}

INSTANTIATE_TEST_SUITE_P(Models, CudaModelTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace loom::testing
