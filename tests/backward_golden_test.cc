// The backward (src/runtime/backward.h) against the shared attribution
// goldens (golden/attribution/README.md: HF transformers + torch autograd,
// f32): d metric / d activation at every hook of every case, for both
// metrics (logit_diff, seq_logprob), exact and linearized (llama, gemma2,
// gpt_neox, and qwen3_moe: routed experts and q/k norms; linearized:
// attention probabilities and norm scales frozen), within the README's f32 rule
// |loom - golden| <= max(atol_abs, atol_rel max|golden|) + rtol |golden|;
// the metric values within its metric bounds. Also: the gradients do not
// depend on the thread count (bytes), and models whose layers the backward
// does not cover yet are refused by name before anything runs. Quantized
// checkpoints (FP8 block, NVFP4): the gradients through the stored codes
// equal those through the dequantized twin (the goldens' dequantized
// weights in a checkpoint of their own) within f32 rounding.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "src/backend/cpu/kernels.h"
#include "src/io/safetensors.h"
#include "src/io/safetensors_writer.h"
#include "src/runtime/backward.h"
#include "src/runtime/model.h"
#include "tests/golden_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string AttributionRoot() {
  const std::string shared = testing::SharedGoldenDir();
  return shared.empty() || !fs::exists(shared + "/attribution")
             ? ""
             : shared + "/attribution";
}

#define SKIP_WITHOUT_ATTRIBUTION_GOLDENS(root)                  \
  if ((root).empty())                                           \
  GTEST_SKIP() << "SKIPPED LOUDLY: shared attribution goldens " \
                  "(golden/attribution) not found"

class GradCapture : public GradientSink {
 public:
  Status OnGradient(const HookPoint& hook, const float* rows, int64_t tokens,
                    int64_t width) override {
    got[hook].assign(rows, rows + tokens * width);
    return Status();
  }
  std::map<HookPoint, std::vector<float>> got;
};

struct Case {
  std::string dir;
  nlohmann::json manifest;
  std::unique_ptr<testing::GoldenFile> golden;
  std::vector<std::pair<std::string, HookPoint>> hooks;  // golden name, hook
};

Case OpenCase(const std::string& root, const std::string& name,
              int64_t layers) {
  Case c;
  c.dir = root + "/" + name;
  c.manifest = testing::ReadJson(c.dir + "/manifest.json");
  c.golden = testing::GoldenFile::Open(c.dir + "/golden.safetensors");
  std::vector<std::string> names = c.manifest["hooks"];
  for (const auto& e : c.manifest["extra_hooks"]) names.push_back(e);
  for (const std::string& n : names) {
    StatusOr<std::vector<HookPoint>> h = ParseHookPattern(n, layers);
    EXPECT_TRUE(h.ok() && h->size() == 1) << n;
    if (h.ok() && h->size() == 1) c.hooks.push_back({n, h->front()});
  }
  return c;
}

struct Tolerance {
  double atol_abs, atol_rel, rtol;
};

void ExpectWithin(const std::vector<float>& got, const std::vector<float>& want,
                  const Tolerance& t, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_ref = 0;
  for (float v : want) max_ref = std::max(max_ref, std::fabs(double{v}));
  const double atol = std::max(t.atol_abs, t.atol_rel * max_ref);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(double{got[i]} - want[i]),
              atol + t.rtol * std::fabs(double{want[i]}))
        << what << " element " << i << ": loom " << got[i] << ", HF " << want[i]
        << " (max |HF| " << max_ref << ")";
}

class BackwardGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BackwardGoldenTest, GradientsMatchAutograd) {
  const std::string root = AttributionRoot();
  SKIP_WITHOUT_ATTRIBUTION_GOLDENS(root);
  const std::string name = GetParam();
  const std::string model_name = name.substr(0, name.find("__"));
  auto model = Model::Load(testing::SharedGoldenDir() + "/tiny/" + model_name,
                           Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const ModelConfig& c = (*model)->config();
  Case cs = OpenCase(root, name, c.num_layers);
  const std::vector<int32_t> ids = cs.golden->Ids("corrupted.input_ids");
  const Tolerance grad_tol{1e-7, 1e-4, 1e-3};
  for (const bool linear : {false, true}) {
    for (const bool logprob : {false, true}) {
      BackwardOptions o;
      o.max_tokens = static_cast<int64_t>(ids.size());
      o.freeze_attn_pattern = o.freeze_norm_scale = linear;
      for (const auto& [n, h] : cs.hooks) o.grad_hooks.Add(h);
      auto bw = Backward::Create(**model, o);
      ASSERT_TRUE(bw.ok()) << bw.status().ToString();
      GradMetric m;
      m.kind = logprob ? GradMetricKind::kLogProb : GradMetricKind::kLogitDiff;
      m.answer = cs.manifest["answer_token_ids"]["answer"];
      m.wrong = cs.manifest["answer_token_ids"]["wrong"];
      GradCapture cap;
      StatusOr<double> value = (*bw)->Run(ids, m, &cap, nullptr);
      ASSERT_TRUE(value.ok()) << value.status().ToString();
      const std::string p = logprob ? "seq_logprob." : "";
      const double want_metric = cs.golden->F32(p + "metric.corrupted").front();
      EXPECT_NEAR(*value, want_metric, logprob ? 3e-4 : 1e-4)
          << name << " " << p << "metric";
      for (const auto& [n, h] : cs.hooks) {
        SCOPED_TRACE(name + " " + p + (linear ? "lin_grad." : "grad.") + n);
        ASSERT_TRUE(cap.got.count(h)) << "no gradient delivered at " << n;
        ExpectWithin(cap.got[h],
                     cs.golden->F32(p + (linear ? "lin_grad." : "grad.") + n),
                     grad_tol, n);
      }
    }
  }
}

// The gradients of a run at 1 thread and at every core are the same bytes.
TEST_P(BackwardGoldenTest, GradientsDoNotDependOnTheThreadCount) {
  const std::string root = AttributionRoot();
  SKIP_WITHOUT_ATTRIBUTION_GOLDENS(root);
  const std::string name = GetParam();
  const std::string model_name = name.substr(0, name.find("__"));
  auto model = Model::Load(testing::SharedGoldenDir() + "/tiny/" + model_name,
                           Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Case cs = OpenCase(root, name, (*model)->config().num_layers);
  const std::vector<int32_t> ids = cs.golden->Ids("corrupted.input_ids");
  auto run = [&](int threads) {
    const int before = cpu::SetNumThreads(threads);
    BackwardOptions o;
    o.max_tokens = static_cast<int64_t>(ids.size());
    for (const auto& [n, h] : cs.hooks) o.grad_hooks.Add(h);
    auto bw = Backward::Create(**model, o);
    EXPECT_TRUE(bw.ok()) << bw.status().ToString();
    GradCapture cap;
    GradMetric m;
    m.kind = GradMetricKind::kLogProb;
    EXPECT_TRUE((*bw)->Run(ids, m, &cap, nullptr).ok());
    cpu::SetNumThreads(before);
    return cap.got;
  };
  const auto one = run(1), all = run(0);
  ASSERT_EQ(one.size(), all.size());
  for (const auto& [h, v] : one)
    EXPECT_EQ(0, std::memcmp(v.data(), all.at(h).data(), v.size() * 4))
        << HookName(h);
}

// AtP*'s GradDrop (Run's drop_layer l): hooks after layer l keep their
// gradients byte for byte, d resid_pre of layer l is the undropped d
// resid_post of layer l (the skip path alone), and the branch hooks of
// layer l receive zeros; sequential, post-norm, parallel and MoE blocks.
// A golden case's model, its backward at every golden hook, the logit-diff
// metric and its gradients on the corrupted prompt (`full`).
class GradDropTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUpCase(const std::string& root) {
    const std::string name = GetParam();
    auto loaded = Model::Load(
        testing::SharedGoldenDir() + "/tiny/" + name.substr(0, name.find("__")),
        Precision::kF32);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    model = std::move(loaded).value();
    L = model->config().num_layers;
    cs = OpenCase(root, name, L);
    ids = cs.golden->Ids("corrupted.input_ids");
    BackwardOptions o;
    o.max_tokens = static_cast<int64_t>(ids.size());
    for (const auto& [n, h] : cs.hooks) o.grad_hooks.Add(h);
    auto created = Backward::Create(*model, o);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    bw = std::move(created).value();
    m.answer = cs.manifest["answer_token_ids"]["answer"];
    m.wrong = cs.manifest["answer_token_ids"]["wrong"];
    ASSERT_TRUE(bw->Run(ids, m, &full, nullptr).ok());
  }
  std::unique_ptr<Model> model;
  int64_t L = 0;
  Case cs;
  std::vector<int32_t> ids;
  std::unique_ptr<Backward> bw;
  GradMetric m;
  GradCapture full;
};

TEST_P(GradDropTest, TakesOnlyTheSkipPath) {
  const std::string root = AttributionRoot();
  SKIP_WITHOUT_ATTRIBUTION_GOLDENS(root);
  ASSERT_NO_FATAL_FAILURE(SetUpCase(root));
  for (int64_t l = 0; l < L; ++l) {
    SCOPED_TRACE("drop layer " + std::to_string(l));
    GradCapture drop;
    ASSERT_TRUE(bw->Run(ids, m, &drop, nullptr, l).ok());
    for (const auto& [h, v] : drop.got) {
      const bool after = h.layer > l || h.site == HookSite::kFinalNorm ||
                         (h.layer == l && h.site == HookSite::kResidPost);
      if (after) {
        EXPECT_EQ(0, std::memcmp(v.data(), full.got.at(h).data(), v.size() * 4))
            << HookName(h);
      } else if (h.layer == l && h.site == HookSite::kResidPre) {
        EXPECT_EQ(v, full.got.at(HookPoint{HookSite::kResidPost, l}))
            << HookName(h);
      } else if (h.layer == l &&
                 (h.site == HookSite::kAttnOut || h.site == HookSite::kMlpOut ||
                  h.site == HookSite::kZ)) {
        EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) {
          return x == 0.0f;
        })) << HookName(h);
      }
    }
  }
  EXPECT_FALSE(bw->Run(ids, m, nullptr, nullptr, L).ok());
}

// The custom-gradient backward (Backward::Inject): seeding the residual
// stream after the last layer (or the final norm's output) with the
// metric's own gradient there gives every earlier hook the metric's
// gradients byte for byte (both hooks cut the graph); a batch of two seeds
// (s and 2 s) gives exactly twice the gradients from one forward; hooks
// above a seed receive zeros; bad seeds are refused naming them.
TEST_P(GradDropTest, InjectedGradientsAreTheMetricsBelowACut) {
  const std::string root = AttributionRoot();
  SKIP_WITHOUT_ATTRIBUTION_GOLDENS(root);
  ASSERT_NO_FATAL_FAILURE(SetUpCase(root));
  const HookPoint top{HookSite::kResidPost, L - 1};
  const HookPoint final_norm{HookSite::kFinalNorm, -1};
  for (const HookPoint& cut : {top, final_norm}) {
    SCOPED_TRACE(HookName(cut));
    std::vector<float> twice = full.got.at(cut);
    for (float& v : twice) v *= 2.0f;
    const std::vector<std::vector<GradInjection>> batches = {
        {{cut, full.got.at(cut)}}, {{cut, twice}}};
    GradCapture one, two;
    GradientSink* sinks[] = {&one, &two};
    ASSERT_TRUE(bw->Inject(ids, batches, sinks).ok());
    for (const auto& [h, v] : full.got) {
      if (h == final_norm && cut == top) continue;  // above the seed
      EXPECT_EQ(0, std::memcmp(v.data(), one.got.at(h).data(), v.size() * 4))
          << HookName(h);
      std::vector<float> doubled = one.got.at(h);
      for (float& x : doubled) x *= 2.0f;
      EXPECT_EQ(doubled, two.got.at(h)) << HookName(h);
    }
  }
  // A seed inside layer 0's MLP: every hook after it gets zeros.
  const HookPoint mlp{HookSite::kMlpOut, 0};
  GradCapture mid;
  GradientSink* one_sink[] = {&mid};
  ASSERT_TRUE(bw->Inject(ids, {{{mlp, full.got.at(mlp)}}}, one_sink).ok());
  for (const auto& [h, v] : mid.got)
    if (h.layer > 0 || h.site == HookSite::kFinalNorm ||
        (h.layer == 0 && h.site == HookSite::kResidPost))
      EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) {
        return x == 0.0f;
      })) << HookName(h);
  EXPECT_EQ(mid.got.at(mlp), full.got.at(mlp));
  // Refused: a hook without a gradient, a seed of the wrong size.
  GradCapture unused;
  GradientSink* sink[] = {&unused};
  const Status pattern =
      bw->Inject(ids, {{{HookPoint{HookSite::kPattern, 0}, {}}}}, sink);
  EXPECT_EQ(pattern.code(), StatusCode::kInvalidArgument);
  const Status small = bw->Inject(ids, {{{top, {1.0f, 2.0f}}}}, sink);
  EXPECT_EQ(small.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(small.message().find("2 values, expected"), std::string::npos)
      << small.message();
}

INSTANTIATE_TEST_SUITE_P(Cases, GradDropTest,
                         ::testing::Values("llama__two_diffs",
                                           "gemma2__two_diffs",
                                           "gpt_neox__two_diffs",
                                           "qwen3_moe__two_diffs"));

INSTANTIATE_TEST_SUITE_P(
    Cases, BackwardGoldenTest,
    ::testing::Values("llama__single_diff", "llama__two_diffs",
                      "gemma2__single_diff", "gemma2__two_diffs",
                      "gpt_neox__single_diff", "gpt_neox__two_diffs",
                      "qwen3_moe__single_diff", "qwen3_moe__two_diffs"));

TEST(BackwardSupportTest, UncoveredLayersAreRefusedByName) {
  const std::string shared = testing::SharedGoldenDir();
  if (shared.empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared goldens not found";
  // Qwen2-MoE: its shared expert has no backward yet.
  auto model = Model::Load(shared + "/tiny/qwen2_moe", Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  BackwardOptions o;
  o.max_tokens = 8;
  auto bw = Backward::Create(**model, o);
  ASSERT_FALSE(bw.ok());
  EXPECT_EQ(bw.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(bw.status().message().find("layer 0: the backward of this "
                                       "mixture-of-experts layer"),
            std::string::npos)
      << bw.status().message();
  // StableLM: its q/k LayerNorms have no backward yet.
  auto stablelm = Model::Load(shared + "/tiny/stablelm", Precision::kF32);
  ASSERT_TRUE(stablelm.ok()) << stablelm.status().ToString();
  auto refused = Backward::Create(**stablelm, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(refused.status().message().find("q/k LayerNorms"),
            std::string::npos)
      << refused.status().message();
}

TEST(BackwardSupportTest, BadRequestsAreRefused) {
  const std::string shared = testing::SharedGoldenDir();
  if (shared.empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared goldens not found";
  auto model = Model::Load(shared + "/tiny/llama", Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  BackwardOptions o;
  o.max_tokens = 4;
  o.grad_hooks.Add(HookPoint{HookSite::kPattern, 0});
  EXPECT_EQ(Backward::Create(**model, o).status().code(),
            StatusCode::kInvalidArgument);
  o.grad_hooks = HookSet();
  auto bw = Backward::Create(**model, o);
  ASSERT_TRUE(bw.ok());
  const std::vector<int32_t> five = {1, 2, 3, 4, 5};
  GradMetric m;
  m.answer = 1;
  m.wrong = 2;
  EXPECT_EQ((*bw)->Run(five, m, nullptr, nullptr).status().code(),
            StatusCode::kOutOfRange);
  m.answer = 1 << 20;
  const std::vector<int32_t> three = {1, 2, 3};
  EXPECT_EQ((*bw)->Run(three, m, nullptr, nullptr).status().code(),
            StatusCode::kOutOfRange);
}

// The buffers a Backward holds are the bytes the plan counts for it
// (PlannedBackwardBytes, JobSpec::backward_bytes), dense and MoE, for
// several lengths and chunk sizes.
TEST(BackwardSupportTest, BuffersAreThePlannedBytes) {
  const std::string shared = testing::SharedGoldenDir();
  if (shared.empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared goldens not found";
  for (const char* name : {"llama", "qwen3_moe", "gpt_oss", "gemma2"}) {
    auto model = Model::Load(shared + "/tiny/" + name, Precision::kF32);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    for (const auto& [tokens, chunk] :
         {std::pair<int64_t, int64_t>{1, 256}, {37, 16}, {300, 256}}) {
      BackwardOptions o;
      o.max_tokens = tokens;
      o.logits_chunk_rows = chunk;
      auto bw = Backward::Create(**model, o);
      ASSERT_TRUE(bw.ok()) << name << ": " << bw.status().ToString();
      EXPECT_EQ((*bw)->buffer_bytes(),
                PlannedBackwardBytes((*model)->config(), tokens, chunk))
          << name << " at " << tokens << " tokens, chunk " << chunk;
    }
  }
}

// A dense twin of a quantized tiny checkpoint in `dir`: config.json without
// its quantization_config, and every tensor of model.safetensors that is not
// part of a quantized linear, with the dequantized linears instead.
std::string DequantizedTwin(const std::string& src, const std::string& dir) {
  fs::create_directories(dir);
  nlohmann::json config = testing::ReadJson(src + "/config.json");
  config.erase("quantization_config");
  std::ofstream(dir + "/config.json") << config.dump();
  auto model = SafetensorsFile::Open(src + "/model.safetensors");
  auto deq = SafetensorsFile::Open(src + "/dequantized_weights.safetensors");
  EXPECT_TRUE(model.ok() && deq.ok());
  SafetensorsWriter w;
  std::vector<std::string> linears;  // "....q_proj."
  for (const TensorInfo& t : (*deq)->header().tensors) {
    linears.push_back(t.name.substr(0, t.name.size() - 6));  // - "weight"
    EXPECT_TRUE(w.Add(t.name, (*deq)->View(t)).ok()) << t.name;
  }
  for (const TensorInfo& t : (*model)->header().tensors) {
    bool quantized = false;
    for (const std::string& l : linears)
      quantized = quantized || t.name.rfind(l, 0) == 0;
    if (!quantized) {
      EXPECT_TRUE(w.Add(t.name, (*model)->View(t)).ok());
    }
  }
  EXPECT_TRUE(w.Write(dir + "/model.safetensors").ok());
  // Written before the models load (the writer borrows the views).
  return dir;
}

class QuantizedBackwardTest : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantizedBackwardTest, GradientsEqualTheDequantizedTwins) {
  const std::string shared = testing::SharedGoldenDir();
  if (shared.empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared goldens not found";
  const std::string src = shared + "/tiny/" + GetParam();
  const std::string twin = DequantizedTwin(
      src, (fs::temp_directory_path() /
            ("loom_twin_" + std::to_string(::getpid()) + "_" + GetParam()))
               .string());
  auto q = Model::Load(src, Precision::kF32);
  auto d = Model::Load(twin, Precision::kF32);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const ModelConfig& c = (*q)->config();
  const std::vector<int32_t> ids = {5, 17, 300, 42, 9, 77, 8, 123};
  BackwardOptions o;
  o.max_tokens = static_cast<int64_t>(ids.size());
  o.grad_hooks.Add(HookPoint{HookSite::kEmbed, -1});
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (HookSite site : {HookSite::kResidPre, HookSite::kZ, HookSite::kMlpPost,
                          HookSite::kResidPost})
      o.grad_hooks.Add(HookPoint{site, l});
  GradMetric m;
  m.kind = GradMetricKind::kLogProb;
  GradCapture gq, gd;
  auto bq = Backward::Create(**q, o);
  auto bd = Backward::Create(**d, o);
  ASSERT_TRUE(bq.ok() && bd.ok());
  ASSERT_TRUE((*bq)->Run(ids, m, &gq, nullptr).ok());
  ASSERT_TRUE((*bd)->Run(ids, m, &gd, nullptr).ok());
  ASSERT_EQ(gq.got.size(), o.grad_hooks.hooks().size());
  for (const auto& [h, v] : gq.got)
    ExpectWithin(v, gd.got.at(h), {1e-7, 1e-5, 1e-5}, HookName(h));
  fs::remove_all(twin);
}

INSTANTIATE_TEST_SUITE_P(Tiny, QuantizedBackwardTest,
                         ::testing::Values("qwen3_fp8_block", "llama_nvfp4_ct",
                                           "llama_nvfp4_modelopt"));

// Models without attribution goldens: the gradient at a hook along a random
// unit direction v at one position equals the central difference of the
// metric under the edit x[p] += eps v (an `add` intervention, through the
// executor's own forward), eps = 1e-2: within 2e-4 + 1 % (f32 forwards).
class FiniteDifferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FiniteDifferenceTest, DirectionalDerivativesMatch) {
  const std::string shared = testing::SharedGoldenDir();
  if (shared.empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared goldens not found";
  auto model = Model::Load(shared + "/tiny/" + GetParam(), Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const ModelConfig& c = (*model)->config();
  const std::vector<int32_t> ids = {5, 17, 300, 42, 9, 77, 8, 123};
  const int64_t T = static_cast<int64_t>(ids.size()), H = c.hidden_size;
  const std::vector<HookPoint> hooks = {{HookSite::kResidPre, 0},
                                        {HookSite::kAttnOut, c.num_layers - 1},
                                        {HookSite::kMlpOut, 0}};
  BackwardOptions o;
  o.max_tokens = T;
  for (const HookPoint& h : hooks) o.grad_hooks.Add(h);
  auto bw = Backward::Create(**model, o);
  ASSERT_TRUE(bw.ok()) << bw.status().ToString();
  GradMetric m;
  m.answer = 1;
  m.wrong = 2;
  GradCapture grads;
  ASSERT_TRUE((*bw)->Run(ids, m, &grads, nullptr).ok());
  HookSet logits;
  logits.Add(HookPoint{HookSite::kLogits, -1});
  ExecutorOptions eo;
  eo.max_tokens = T;
  auto ex = Executor::Create(**model, logits, eo);
  ASSERT_TRUE(ex.ok()) << ex.status().ToString();
  const int64_t seq_start[2] = {0, T};
  const Batch batch{ids, std::span<const int64_t>(seq_start, 2)};
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (const HookPoint& h : hooks) {
    // The last layer's attention reaches the metric at the last position
    // only.
    const int64_t p = h.layer == c.num_layers - 1 ? T - 1 : 5;
    Intervention iv;
    iv.hook = h;
    iv.positions.kind = InterventionPositions::Kind::kList;
    iv.positions.list = {p};
    iv.vector.resize(static_cast<size_t>(H));
    double norm = 0;
    for (float& x : iv.vector) {
      x = nd(rng);
      norm += double{x} * x;
    }
    for (float& x : iv.vector) x = static_cast<float>(x / std::sqrt(norm));
    const std::vector<float>& g = grads.got.at(h);
    double want = 0;
    for (int64_t j = 0; j < H; ++j) want += double{g[p * H + j]} * iv.vector[j];
    double metric[2];
    for (int k = 0; k < 2; ++k) {
      const float eps = 1e-2f;
      iv.scale = k == 0 ? eps : -eps;
      const SequenceEdit edit{0, T, &iv};
      testing::CaptureSink sink;
      ASSERT_TRUE((*ex)->Forward(batch, &sink, nullptr, {&edit, 1}).ok());
      const std::vector<float>& l =
          sink.Get(HookPoint{HookSite::kLogits, -1}).data;
      const float* last = l.data() + (T - 1) * c.vocab_size;
      metric[k] = double{last[1]} - last[2];
    }
    const double fd = (metric[0] - metric[1]) / 2e-2;
    EXPECT_GT(std::fabs(want), 1e-4) << HookName(h);  // not vacuous
    EXPECT_NEAR(fd, want, 2e-4 + 1e-2 * std::fabs(want))
        << GetParam() << " " << HookName(h);
  }
}

// gpt-oss (sinks, top-k softmax router, clamped SwiGLU experts; MXFP4 codes),
// OLMoE (softmax top-k without renormalisation), Mixtral, Qwen3 (q/k norms),
// OLMo2 (whole-row q/k norms, post-norms only), Phi-3 (fused qkv and
// gate_up), Gemma 3 ((1 + w) q/k norms, two RoPE tables), Nemotron
// (LayerNorm1P, relu^2). (GraniteMoE's multipliers, x 0.22 per branch and
// logits / 6, leave these directional derivatives below the 1e-4 the test
// needs to be meaningful.)
INSTANTIATE_TEST_SUITE_P(Tiny, FiniteDifferenceTest,
                         ::testing::Values("gpt_oss", "gpt_oss_mxfp4", "olmoe",
                                           "mixtral", "qwen3", "olmo2", "phi3",
                                           "gemma3", "nemotron"));

// Integrated gradients: completeness (the attributions sum to the metric's
// change from the baseline of token 0) with 32 Gauss-Legendre nodes, and more
// nodes only get closer.
class IntegratedGradientsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(IntegratedGradientsTest, AttributionsSumToTheMetricsChange) {
  const std::string shared = testing::SharedGoldenDir();
  if (shared.empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: shared goldens not found";
  auto model = Model::Load(shared + "/tiny/" + GetParam(), Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::vector<int32_t> ids = {5, 17, 300, 42, 9, 77, 8, 123};
  BackwardOptions o;
  o.max_tokens = static_cast<int64_t>(ids.size());
  auto bw = Backward::Create(**model, o);
  ASSERT_TRUE(bw.ok()) << bw.status().ToString();
  GradMetric m;
  m.answer = 1;
  m.wrong = 2;
  StatusOr<double> plain = (*bw)->Run(ids, m, nullptr, nullptr);
  ASSERT_TRUE(plain.ok());
  double previous = 1e300;
  for (const int64_t steps : {8, 32}) {
    auto ig = (*bw)->IntegratedGradients(ids, m, steps, 0);
    ASSERT_TRUE(ig.ok()) << ig.status().ToString();
    EXPECT_EQ(ig->metric_input, *plain);
    double sum = 0;
    for (double v : ig->per_token) sum += v;
    const double change = ig->metric_input - ig->metric_baseline;
    const double err = std::fabs(sum - change);
    if (steps == 32) {
      EXPECT_LE(err, 1e-4 + 1e-3 * std::fabs(change))
          << GetParam() << ": sum " << sum << ", change " << change;
    }
    EXPECT_LE(err, previous + 1e-6);
    previous = err;
  }
  EXPECT_EQ((*bw)->IntegratedGradients(ids, m, 0, 0).status().code(),
            StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Tiny, IntegratedGradientsTest,
                         ::testing::Values("llama", "gemma2", "gpt_neox",
                                           "qwen3"));

}  // namespace
}  // namespace loom
