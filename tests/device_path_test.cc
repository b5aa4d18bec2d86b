// The runtime's device paths, run where there is no GPU: a backend that
// computes with the CPU kernels in host memory but reports itself as a GPU
// (tests/host_as_device.h). The executor then copies the weights into the
// device's allocation, copies batch metadata over, brings expert offsets
// back, and delivers device views, which extraction selects "on the device"
// (GatherRowsConvert / SegmentReduce into pinned staging). With the same
// kernels underneath, every result must equal the host run bit for bit —
// what a real GPU is then checked against is only its kernels
// (tests/cuda/).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "src/eval/compare.h"
#include "src/eval/extract.h"
#include "src/eval/perplexity.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"
#include "tests/golden_util.h"
#include "tests/host_as_device.h"

namespace loom::testing {
namespace {

namespace fs = std::filesystem;

// Forwards device views as host views (their memory is the host's here).
class AsHostSink : public HookSink {
 public:
  Status OnActivation(const HookPoint& hook, const Batch& batch, int64_t seq,
                      int64_t row_begin, const ActivationView& view) override {
    EXPECT_EQ(view.device.kind, DeviceKind::kCuda) << HookName(hook);
    ActivationView h = view;
    h.device = DeviceRef{};
    if (view.dtype == DType::kI32) {
      ints_.assign(static_cast<size_t>(view.rows * view.cols), 0.0f);
      const int32_t* v = static_cast<const int32_t*>(view.data);
      for (int64_t r = 0; r < view.rows; ++r)
        for (int64_t j = 0; j < view.cols; ++j)
          ints_[r * view.cols + j] = static_cast<float>(v[r * view.ld + j]);
      h.data = ints_.data();
      h.dtype = DType::kF32;
      h.ld = view.cols;
    }
    return inner.OnActivation(hook, batch, seq, row_begin, h);
  }
  CaptureSink inner;

 private:
  std::vector<float> ints_;
};

using Case = ModelCase;

class DevicePathTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!GetParam().bundled && SharedGoldenDir().empty())
      GTEST_SKIP() << "SKIPPED LOUDLY: shared golden directory not found; "
                   << GetParam().name << " is not checked";
  }
};

// Every hook through the device paths, one and two segments, equals the host
// run bit for bit.
TEST_P(DevicePathTest, EveryHookEqualsTheHostRun) {
  for (Precision precision : {Precision::kF32, Precision::kBF16}) {
    if (precision == Precision::kBF16 && !CpuSupportsComputeDType(DType::kBF16))
      continue;
    SCOPED_TRACE(precision == Precision::kF32 ? "f32" : "bf16");
    auto model = Model::Load(ModelCaseDir(GetParam()), precision);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    const ModelConfig& c = (*model)->config();
    const HookSet hooks = EveryHookOf(c, /*with_pattern=*/false);
    const std::vector<int64_t> starts = {0, 13, 20, 41};
    std::vector<int32_t> ids(41);
    for (size_t t = 0; t < ids.size(); ++t)
      ids[t] = static_cast<int32_t>((t * 17 + 3) % c.vocab_size);
    const Batch batch{ids, starts};
    ExecutorOptions o;
    o.max_tokens = 48;
    o.max_seq_len = 24;
    o.logits_chunk_rows = 16;
    o.hf_bf16_activations = precision == Precision::kBF16;
    auto host = Executor::Create(**model, hooks, o);
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    CaptureSink want;
    ASSERT_TRUE((*host)->Forward(batch, &want).ok());

    HostAsDevice gpu0(0), gpu1(1);
    ExecutorOptions on_device = o;
    const int64_t split = std::max<int64_t>(c.num_layers / 2, 1);
    on_device.segments = {{&gpu0, 0, split - 1}};
    if (split < c.num_layers)
      on_device.segments.push_back({&gpu1, split, c.num_layers - 1});
    auto dev = Executor::Create(**model, hooks, on_device);
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    EXPECT_GT((*dev)->uploaded_weight_bytes(), 0);
    AsHostSink got;
    // Twice: the second forward reuses every device buffer.
    for (int pass = 0; pass < 2; ++pass) {
      const Status st = (*dev)->Forward(batch, &got);
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    for (const HookPoint& h : hooks.hooks()) {
      const auto& a = want.Get(h);
      const auto& b = got.inner.Get(h);
      ASSERT_EQ(a.data.size(), b.data.size()) << HookName(h);
      EXPECT_EQ(std::memcmp(a.data.data(), b.data.data(),
                            a.data.size() * sizeof(float)),
                0)
          << HookName(h) << " differs through the device paths";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, DevicePathTest,
    ::testing::Values(Case{"stories260K", true}, Case{"llama", false},
                      Case{"gemma2", false}, Case{"gpt2", false},
                      Case{"qwen3_moe", false}, Case{"qwen2_moe", false},
                      Case{"gpt_oss_mxfp4", false},
                      Case{"qwen3_fp8_block", false},
                      // Per-head fused q/k/v regrouped on the device;
                      // parallel blocks.
                      Case{"gpt_neox", false}, Case{"phi", false},
                      // Local and global layers, learned positions.
                      Case{"gpt_neo", false},
                      // Learned positions at p + 2 (a device pointer into
                      // the table).
                      Case{"opt", false},
                      // Multi-query attention from a fused c_attn.
                      Case{"gpt_bigcode", false},
                      // Interleaved rotary (ApplyRopePairs) on the device.
                      Case{"gptj", false},
                      // [q | v | k] chunks regrouped on the device.
                      Case{"codegen", false},
                      // Per-kv-group q/k/v regrouped on the device.
                      Case{"falcon", false},
                      // q/k LayerNorms (each head's own; shared with a
                      // bias), LayerNorm1P, relu^2.
                      Case{"stablelm", false}, Case{"nemotron", false},
                      Case{"persimmon", false},
                      // 3-D experts, top-k softmax routing, multipliers.
                      Case{"granitemoe", false},
                      // Two RoPE tables (local and global bases).
                      Case{"gemma3", false}),
    [](const auto& info) { return info.param.name; });

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `loom extract` with every selector, rows selected on the "device" into
// pinned staging: every output file byte-identical to the host job's.
TEST(DevicePathExtract, EverySelectorByteIdenticalToTheHostJob) {
  const fs::path dir = fs::temp_directory_path() /
                       ("loom_device_path_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream in(dir / "in.jsonl");
    for (int r = 0; r < 7; ++r) {
      in << "{\"tokens\": [";
      for (int t = 0; t < 5 + 3 * r; ++t)
        in << (t ? ", " : "") << (1 + (t * 31 + r * 7) % 500);
      in << "]}\n";
    }
  }
  for (const char* dtype : {"f32", "bf16"}) {
    SCOPED_TRACE(dtype);
    ExtractOptions o;
    o.model_dir = std::string(LOOM_MODELS_DIR) + "/stories260K";
    o.input_path = (dir / "in.jsonl").string();
    o.hooks = {"blocks.*.hook_resid_post", "ln_final.hook_normalized"};
    o.selectors = {"last", "first",    "mean",    "max",
                   "all",  "pos:0,-2", "span:1:4"};
    o.precision = Precision::kF32;
    o.dtype = *ParseDType(dtype);
    o.batch_tokens = 40;  // several batches
    o.commit_every = 3;   // several windows
    o.out_dir = (dir / (std::string("host_") + dtype)).string();
    auto host = RunExtract(o);
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    HostAsDevice gpu;
    o.compute_backend_for_tests = &gpu;
    o.out_dir = (dir / (std::string("device_") + dtype)).string();
    auto device = RunExtract(o);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    EXPECT_GT(gpu.gathers(), 0) << "rows were not selected on the device";
    EXPECT_GT(gpu.reductions(), 0) << "mean/max were not reduced on the device";
    int files = 0;
    for (const auto& e :
         fs::directory_iterator(dir / (std::string("host_") + dtype))) {
      const std::string name = e.path().filename().string();
      if (name == "manifest.json") continue;  // holds times and paths
      ++files;
      EXPECT_EQ(ReadFile(e.path()),
                ReadFile(dir / (std::string("device_") + dtype) / name))
          << name << " differs when selected on the device";
    }
    EXPECT_GT(files, 10);
  }
  fs::remove_all(dir);
}

// Perplexity with the forward on the "device" and the head on a second
// instance of it (TargetLogProbs), and compare with both forwards there:
// every number equal to the host run.
TEST(DevicePathEval, PerplexityAndCompareEqualTheHostRun) {
  auto model = Model::Load(std::string(LOOM_MODELS_DIR) + "/stories260K",
                           Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const ModelConfig& c = (*model)->config();
  std::vector<int32_t> ids(300);
  for (size_t t = 0; t < ids.size(); ++t)
    ids[t] = static_cast<int32_t>(1 + (t * 37) % (c.vocab_size - 1));
  auto plan = eval::PlanWindows(
      static_cast<int64_t>(ids.size()),
      {.protocol = eval::Protocol::kHfStride, .ctx = 64, .stride = 32});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  eval::EvalOptions eo;
  eo.logits_chunk_rows = 16;
  eo.keep_token_logprobs = true;
  auto host = eval::EvaluatePerplexity(**model, ids, *plan, eo);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  HostAsDevice gpu;
  eo.segments = {{&gpu, 0, c.num_layers - 1}};
  auto dev = eval::EvaluatePerplexity(**model, ids, *plan, eo);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EXPECT_EQ(host->nll_sum, dev->nll_sum);
  EXPECT_EQ(host->token_logprob, dev->token_logprob);

  eval::CompareOptions co;
  co.logits_chunk_rows = 16;
  co.drift = true;
  auto cmp_host = eval::CompareModels(**model, **model, ids, *plan, co);
  ASSERT_TRUE(cmp_host.ok()) << cmp_host.status().ToString();
  HostAsDevice gpu_a(0), gpu_b(1);
  co.segments = {{&gpu_a, 0, c.num_layers - 1}};
  co.reference_segments = {{&gpu_b, 0, c.num_layers - 1}};
  auto cmp_dev = eval::CompareModels(**model, **model, ids, *plan, co);
  ASSERT_TRUE(cmp_dev.ok()) << cmp_dev.status().ToString();
  EXPECT_EQ(cmp_host->kl.value, cmp_dev->kl.value);
  EXPECT_EQ(cmp_host->ppl_a, cmp_dev->ppl_a);
  ASSERT_EQ(cmp_host->drift.size(), cmp_dev->drift.size());
  EXPECT_GT(gpu_a.copies(), 0);
}

}  // namespace
}  // namespace loom::testing
