// Parity with Hugging Face transformers, hook by hook: every stored hidden
// state, module output, final norm, logits, next-token log-prob and layer-0
// attention pattern, for every stored sequence and the padded batch, in f32
// (atol/rtol 1e-4) and bf16 (atol 5 % of max|x|; log-probs 0.25 — the bounds
// the golden README derives from HF's own bf16-vs-f32 spread). MoE models in
// bf16 are compared where their routing matches HF's (routing flips on
// near-tied router logits; see CheckMoeBf16WhereRoutingMatches).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>

#include "src/backend/cpu/reference/reference_moe.h"
#include "src/model/registry.h"
#include "src/runtime/executor.h"
#include "src/runtime/model.h"
#include "tests/golden_util.h"

namespace loom::testing {
namespace {

struct ModelCase {
  std::string name;
  std::string model_dir;  // relative to its root
  bool bundled;           // model and goldens inside the repository
  // Model and reference in tests/data/constructed (make_goldens.py: our own
  // float64 forward from HF's modeling file, for types without HF goldens;
  // its f32 reference is also the bf16 comparison's).
  bool constructed = false;
};

std::string ModelDir(const ModelCase& c) {
  if (c.constructed) return ConstructedModelDir(c.model_dir);
  return c.bundled ? std::string(LOOM_MODELS_DIR) + "/" + c.model_dir
                   : SharedGoldenDir() + "/tiny/" + c.model_dir;
}
std::string GoldenDir(const ModelCase& c) {
  if (c.constructed) return ConstructedModelDir(c.model_dir);
  return c.bundled ? BundledGoldenDir() + "/" + c.name
                   : SharedGoldenDir() + "/tiny/" + c.model_dir;
}

// Collects comparisons in forward order; reports the first divergence.
class Checker {
 public:
  void Check(const std::string& what, const float* actual,
             const std::vector<float>& expected, double atol, double rtol) {
    CompareResult r =
        Compare(actual, expected.data(), static_cast<int64_t>(expected.size()),
                atol, rtol);
    ++count_;
    if (!r.ok && first_.empty())
      first_ = what + ": " + r.message + "; max |err| " +
               std::to_string(r.max_abs_err);
    if (!r.ok) ++failures_;
  }
  // False when something failed (or nothing was compared).
  bool Finish(const std::string& context) {
    EXPECT_GT(count_, 0) << context << ": nothing was compared";
    EXPECT_EQ(failures_, 0)
        << context << ": " << failures_ << " of " << count_
        << " comparisons failed; first divergence at " << first_;
    return count_ > 0 && failures_ == 0;
  }

 private:
  int count_ = 0, failures_ = 0;
  std::string first_;
};

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

// The measured errors behind docs/models.md: with LOOM_MODEL_MATRIX=DIR in
// the environment, a parity run writes DIR/<model>.<f32|bf16>.json holding,
// per hook (layers folded into "blocks.*"), the worst |Loom - HF| and the
// largest |HF| over every stored sequence, and whether every comparison
// passed. scripts/models_matrix.py renders the table from these files.
class MatrixLog {
 public:
  void Add(const std::string& hook, const float* actual,
           const std::vector<float>& expected) {
    static const std::regex kLayer("blocks\\.[0-9]+\\.");
    auto& [err, mag] = worst_[std::regex_replace(hook, kLayer, "blocks.*.")];
    for (size_t i = 0; i < expected.size(); ++i) {
      err = std::max(err, std::fabs(static_cast<double>(actual[i]) -
                                    static_cast<double>(expected[i])));
      mag = std::max(mag, std::fabs(static_cast<double>(expected[i])));
    }
  }
  void Fail() { passed_ = false; }
  void Write(const std::string& model, const char* dtype) const {
    const char* dir = std::getenv("LOOM_MODEL_MATRIX");
    if (dir == nullptr || *dir == '\0') return;
    nlohmann::json j = {{"model", model},
                        {"dtype", dtype},
                        {"passed", passed_ && !worst_.empty()}};
    for (const auto& [hook, v] : worst_)
      j["hooks"][hook] = {{"max_abs_err", v.first}, {"max_abs_hf", v.second}};
    std::ofstream(std::string(dir) + "/" + model + "." + dtype + ".json")
        << j.dump(1) << "\n";
  }

 private:
  std::map<std::string, std::pair<double, double>> worst_;
  bool passed_ = true;
};

HookSet AllHooks(const ModelConfig& c) {
  HookSet hooks;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    hooks.Add({HookSite::kResidPre, l});
    hooks.Add({HookSite::kAttnOut, l});
    hooks.Add({HookSite::kMlpOut, l});
    if (c.mlp == MlpKind::kMoE && c.moe.IsSparseLayer(l))
      hooks.Add({HookSite::kRouterLogits, l});
  }
  hooks.Add({HookSite::kResidPost, c.num_layers - 1});
  hooks.Add({HookSite::kPattern, 0});
  hooks.Add({HookSite::kFinalNorm, -1});
  hooks.Add({HookSite::kLogits, -1});
  return hooks;
}

std::vector<std::string> SequenceNames(const nlohmann::json& manifest) {
  std::vector<std::string> names;
  const auto& list = manifest.contains("sequences") ? manifest["sequences"]
                                                    : manifest["prompts"];
  for (const auto& s : list) names.push_back(s["name"]);
  return names;
}

class GoldenParityTest : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    if (!GetParam().bundled && !GetParam().constructed &&
        SharedGoldenDir().empty())
      GTEST_SKIP() << "SKIPPED LOUDLY: shared golden directory "
                   << LOOM_SHARED_DIR
                   << "/golden not found; tiny-model parity is not checked on "
                      "this machine";
  }

  // MoE in bf16: near-tied router logits pick other experts for some tokens
  // (golden README: errors of tens of percent there), so the dense bf16
  // bounds cannot hold everywhere. Checked instead on seq4, the sequence whose
  // router logits are stored, layer by layer while the routing agrees: at a
  // sparse layer, the tokens whose bf16 expert choice equals HF's f32 top-k
  // must have the layer's output (hidden.{l+1}) within the dense bf16 bound of
  // HF's f32 value, and at least 3/4 of the tokens must route the same. Once
  // a token routes differently, attention carries the difference to other
  // tokens in later layers, so the layers after it are not compared.
  void CheckMoeBf16WhereRoutingMatches(const Model& model) {
    const ModelCase& mc = GetParam();
    const ModelConfig& c = model.config();
    const int64_t E = c.moe.num_experts, K = c.moe.experts_per_token,
                  H = c.hidden_size, L = c.num_layers;
    auto golden = GoldenFile::Open(GoldenDir(mc) + "/goldens_f32.safetensors");
    ASSERT_NE(golden, nullptr);
    const std::vector<int32_t> ids = golden->Ids("seq4.input_ids");
    const int64_t T = static_cast<int64_t>(ids.size());
    HookSet hooks;
    for (int64_t l = 0; l + 1 < L; ++l) {
      hooks.Add({HookSite::kResidPost, l});
      if (c.moe.IsSparseLayer(l)) hooks.Add({HookSite::kExpertIds, l});
    }
    auto ex = Executor::Create(model, hooks, {.max_tokens = T});
    ASSERT_TRUE(ex.ok()) << ex.status().ToString();
    const std::vector<int64_t> starts = {0, T};
    CaptureSink sink;
    ASSERT_TRUE((*ex)->Forward(Batch{ids, starts}, &sink).ok());
    int64_t sparse_checked = 0;
    for (int64_t l = 0; l + 1 < L; ++l) {
      const std::vector<float> out =
          golden->F32("seq4.hidden." + std::to_string(l + 1));  // [T, H]
      const float* ours = sink.Get({HookSite::kResidPost, l}).data.data();
      std::vector<bool> same(static_cast<size_t>(T), true);
      int64_t n_same = T;
      if (c.moe.IsSparseLayer(l)) {
        const std::vector<float> router =
            golden->F32("seq4.router_logits." + std::to_string(l));  // [T, E]
        ASSERT_EQ(static_cast<int64_t>(router.size()), T * E);
        const std::vector<float>& mine_ids =
            sink.Get({HookSite::kExpertIds, l}).data;  // [T, K] exact ints
        // DeepSeek's router: its f32 correction bias from the checkpoint.
        std::vector<float> bias;  // [E]
        if (c.moe.router == RouterKind::kSigmoidGroupTopK) {
          auto ckpt = GoldenFile::Open(GoldenDir(mc) + "/model.safetensors");
          ASSERT_NE(ckpt, nullptr);
          bias = ckpt->F32("model.layers." + std::to_string(l) +
                           ".mlp.gate.e_score_correction_bias");
        }
        n_same = 0;
        for (int64_t t = 0; t < T; ++t) {
          // HF's choice: the k largest f32 logits (softmax is monotonic, so
          // both softmax router kinds pick these); DeepSeek's group-limited
          // choice by the reference router.
          std::vector<int> order(static_cast<size_t>(E));
          for (int e = 0; e < E; ++e) order[static_cast<size_t>(e)] = e;
          std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
            return router[t * E + a] > router[t * E + b];
          });
          if (!bias.empty()) {
            std::vector<int32_t> ids_ref(static_cast<size_t>(K));
            std::vector<float> w_ref(static_cast<size_t>(K));
            cpu::ref::SigmoidGroupTopKRoute(
                router.data() + t * E, 1, E, E, K, bias.data(), c.moe.n_group,
                c.moe.topk_group, c.moe.norm_topk_prob,
                c.moe.routed_scaling_factor, ids_ref.data(), w_ref.data());
            order.assign(ids_ref.begin(), ids_ref.end());
          }
          std::vector<int> hf(order.begin(), order.begin() + K), mine;
          for (int64_t s = 0; s < K; ++s)
            mine.push_back(static_cast<int>(mine_ids[t * K + s]));
          std::sort(hf.begin(), hf.end());
          std::sort(mine.begin(), mine.end());
          same[static_cast<size_t>(t)] = hf == mine;
          n_same += hf == mine;
        }
        ++sparse_checked;
      }
      const double tol = 0.05 * MaxAbs(out);
      double worst = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; same[static_cast<size_t>(t)] && h < H; ++h)
          worst = std::max(
              worst,
              std::fabs(static_cast<double>(ours[t * H + h]) - out[t * H + h]));
      std::printf(
          "%s bf16 layer %lld: %lld of %lld tokens route as HF f32; "
          "their max |err| %.3g (bound %.3g)\n",
          mc.name.c_str(), static_cast<long long>(l),
          static_cast<long long>(n_same), static_cast<long long>(T), worst,
          tol);
      EXPECT_GE(n_same, (3 * T + 3) / 4)
          << mc.name << " layer " << l << ": too many routing flips";
      EXPECT_LE(worst, tol)
          << mc.name << " layer " << l << " output where the routing matches";
      if (n_same < T) break;
    }
    EXPECT_GT(sparse_checked, 0) << mc.name << ": no sparse layer compared";
  }

  // Runs every stored sequence through one executor and compares.
  void RunSequences(Precision precision) {
    const ModelCase& mc = GetParam();
    auto model = Model::Load(ModelDir(mc), precision);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    const ModelConfig& c = (*model)->config();
    const bool bf16 = (*model)->compute_dtype() == DType::kBF16;
    if (bf16 && c.mlp == MlpKind::kMoE) {
      CheckMoeBf16WhereRoutingMatches(**model);
      return;
    }
    auto golden = GoldenFile::Open(
        GoldenDir(mc) + (bf16 && !mc.constructed ? "/goldens_bf16.safetensors"
                                                 : "/goldens_f32.safetensors"));
    ASSERT_NE(golden, nullptr);
    auto ids_file =
        GoldenFile::Open(GoldenDir(mc) + "/goldens_f32.safetensors");
    const nlohmann::json manifest = ReadJson(GoldenDir(mc) + "/manifest.json");
    HookSet hooks = AllHooks(c);
    auto ex = Executor::Create(
        **model, hooks,
        {.max_tokens = 512, .max_seq_len = 512, .logits_chunk_rows = 64});
    ASSERT_TRUE(ex.ok()) << ex.status().ToString();
    const int64_t L = c.num_layers, H = c.hidden_size, V = c.vocab_size;
    MatrixLog log;
    for (const std::string& seq : SequenceNames(manifest)) {
      std::vector<int32_t> ids = ids_file->Ids(seq + ".input_ids");
      const int64_t T = static_cast<int64_t>(ids.size());
      std::vector<int64_t> starts = {0, T};
      Batch batch{ids, starts};
      CaptureSink sink;
      Status st = (*ex)->Forward(batch, &sink);
      ASSERT_TRUE(st.ok()) << st.ToString();
      Checker check;
      auto tol = [&](const std::vector<float>& e) {
        return bf16 ? 0.05 * MaxAbs(e) : 1e-4;
      };
      const double rtol = bf16 ? 0.0 : 1e-4;
      auto cmp = [&](const std::string& gname, const std::string& what,
                     const float* actual) {
        const std::string name = seq + "." + gname;
        if (!golden->Has(name)) return;
        std::vector<float> e = golden->F32(name);
        check.Check(what + " vs HF " + gname, actual, e, tol(e), rtol);
        log.Add(what, actual, e);
      };
      for (int64_t k = 0; k < L; ++k) {
        cmp("hidden." + std::to_string(k),
            "blocks." + std::to_string(k) + ".hook_resid_pre",
            sink.Get({HookSite::kResidPre, k}).data.data());
        cmp("attn_out." + std::to_string(k),
            "blocks." + std::to_string(k) + ".hook_attn_out",
            sink.Get({HookSite::kAttnOut, k}).data.data());
        cmp("mlp_out." + std::to_string(k),
            "blocks." + std::to_string(k) + ".hook_mlp_out",
            sink.Get({HookSite::kMlpOut, k}).data.data());
        if (hooks.Contains(HookSite::kRouterLogits, k))
          cmp("router_logits." + std::to_string(k),
              "blocks." + std::to_string(k) + ".mlp.hook_router_logits",
              sink.Get({HookSite::kRouterLogits, k}).data.data());
      }
      cmp("layer_out." + std::to_string(L - 1),
          "blocks." + std::to_string(L - 1) + ".hook_resid_post",
          sink.Get({HookSite::kResidPost, L - 1}).data.data());
      const float* fn = sink.Get({HookSite::kFinalNorm, -1}).data.data();
      cmp("hidden." + std::to_string(L), "ln_final.hook_normalized", fn);
      cmp("final_norm", "ln_final.hook_normalized", fn);
      const float* logits = sink.Get({HookSite::kLogits, -1}).data.data();
      cmp("logits", "logits", logits);
      cmp("logits_last", "logits[last]", logits + (T - 1) * V);
      if (golden->Has(seq + ".logprob_next") && T > 1) {
        std::vector<double> lp = LogprobNext(logits, T, V, ids.data());
        std::vector<float> lpf(lp.begin(), lp.end());
        const std::vector<float> e = golden->F32(seq + ".logprob_next");
        check.Check("logprob_next", lpf.data(), e, bf16 ? 0.25 : 1e-4, 0);
        log.Add("logprob_next", lpf.data(), e);
      }
      if (!bf16 && golden->Has(seq + ".attn_probs.0")) {
        const float* pattern = sink.Get({HookSite::kPattern, 0}, 0).data.data();
        const std::vector<float> e = golden->F32(seq + ".attn_probs.0");
        check.Check("blocks.0.attn.hook_pattern vs HF attn_probs.0", pattern, e,
                    1e-5, 0);
        log.Add("blocks.0.attn.hook_pattern", pattern, e);
      }
      if (!check.Finish(mc.name + " " + (bf16 ? "bf16 " : "f32 ") + seq +
                        " (T=" + std::to_string(T) +
                        ", H=" + std::to_string(H) + ")"))
        log.Fail();
    }
    log.Write(mc.name, bf16 ? "bf16" : "f32");
  }
};

TEST_P(GoldenParityTest, F32EveryHookMatches) { RunSequences(Precision::kF32); }

TEST_P(GoldenParityTest, Bf16WithinDtypeBounds) {
  if (!CpuSupportsComputeDType(DType::kBF16))
    GTEST_SKIP() << "SKIPPED LOUDLY: no bf16 compute on this CPU";
  RunSequences(Precision::kBF16);
}

// The padded HF batch, packed without padding: positions with mask == 1 match,
// and each packed row equals its single-sequence run.
// The tiny models' goldens hold a padded batch (stories260K's do not).
class PackedBatchTest : public GoldenParityTest {};

TEST_P(PackedBatchTest, PackedBatchMatchesPaddedBatchAndSingleRuns) {
  const ModelCase& mc = GetParam();
  const std::string gpath = GoldenDir(mc) + "/goldens_f32.safetensors";
  auto golden = GoldenFile::Open(gpath);
  ASSERT_NE(golden, nullptr);
  ASSERT_TRUE(golden->Has("batch.input_ids")) << "no batch in " << gpath;
  auto model = Model::Load(ModelDir(mc), Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const ModelConfig& c = (*model)->config();
  Shape shape;
  std::vector<int32_t> padded = golden->Ids("batch.input_ids", &shape);
  std::vector<int32_t> mask = golden->Ids("batch.attention_mask");
  const int64_t B = shape[0], Tp = shape[1], H = c.hidden_size,
                V = c.vocab_size, L = c.num_layers;
  std::vector<int32_t> ids;
  std::vector<int64_t> starts = {0};
  std::vector<std::pair<int64_t, int64_t>> where;  // packed row -> (b, t)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tp; ++t)
      if (mask[b * Tp + t]) {
        ids.push_back(padded[b * Tp + t]);
        where.push_back({b, t});
      }
    starts.push_back(static_cast<int64_t>(ids.size()));
  }
  HookSet hooks = AllHooks(c);
  auto ex = Executor::Create(
      **model, hooks,
      {.max_tokens = 64, .max_seq_len = 64, .logits_chunk_rows = 7});
  ASSERT_TRUE(ex.ok()) << ex.status().ToString();
  CaptureSink sink;
  ASSERT_TRUE((*ex)->Forward(Batch{ids, starts}, &sink).ok());
  Checker check;
  auto gather = [&](const std::string& name, int64_t cols) {
    std::vector<float> full = golden->F32(name), out;
    for (auto [b, t] : where)
      out.insert(out.end(), &full[(b * Tp + t) * cols],
                 &full[(b * Tp + t + 1) * cols]);
    return out;
  };
  for (int64_t k = 0; k < L; ++k)
    check.Check("blocks." + std::to_string(k) +
                    ".hook_resid_pre vs HF batch.hidden." + std::to_string(k),
                sink.Get({HookSite::kResidPre, k}).data.data(),
                gather("batch.hidden." + std::to_string(k), H), 1e-4, 1e-4);
  check.Check(
      "ln_final.hook_normalized vs HF batch.hidden." + std::to_string(L),
      sink.Get({HookSite::kFinalNorm, -1}).data.data(),
      gather("batch.hidden." + std::to_string(L), H), 1e-4, 1e-4);
  check.Check("logits vs HF batch.logits",
              sink.Get({HookSite::kLogits, -1}).data.data(),
              gather("batch.logits", V), 1e-4, 1e-4);
  check.Finish(mc.name + " packed batch");

  // Each row alone gives the same numbers as inside the packed batch.
  Checker rows;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int32_t> one(ids.begin() + starts[b],
                             ids.begin() + starts[b + 1]);
    std::vector<int64_t> s1 = {0, static_cast<int64_t>(one.size())};
    CaptureSink single;
    ASSERT_TRUE((*ex)->Forward(Batch{one, s1}, &single).ok());
    const auto& all = sink.Get({HookSite::kLogits, -1}).data;
    std::vector<float> packed_rows(all.begin() + starts[b] * V,
                                   all.begin() + starts[b + 1] * V);
    rows.Check("row " + std::to_string(b) + " logits single vs packed",
               single.Get({HookSite::kLogits, -1}).data.data(), packed_rows,
               1e-5, 1e-5);
  }
  rows.Finish(mc.name + " rows vs single runs");
}

std::vector<ModelCase> Cases() {
  return {
      {"stories260K", "stories260K", true},
      {"llama", "llama", false},
      {"llama3rope_bf16", "llama3rope_bf16", false},
      {"mistral_sw16_sharded", "mistral_sw16_sharded", false},
      {"qwen2", "qwen2", false},
      {"qwen3", "qwen3", false},
      {"gemma", "gemma", false},
      {"gemma2", "gemma2", false},
      {"phi3", "phi3", false},
      {"gpt2", "gpt2", false},
      // GPT-Neo: unscaled attention, alternating local/global layers.
      {"gpt_neo", "gpt_neo", false},
      // OPT: learned positions read at p + 2, ReLU, biases everywhere.
      {"opt", "opt", false},
      // GPTBigCode: multi-query attention through one fused c_attn.
      {"gpt_bigcode", "gpt_bigcode", false},
      // GPT-J: one shared norm (parallel), interleaved partial rotary.
      {"gptj", "gptj", false},
      // CodeGen: GPT-J's block, qkv_proj in 4 chunks of [q | v | k].
      {"codegen", "codegen", false},
      // Falcon (new decoder): two norms, per-kv-group fused q/k/v.
      {"falcon", "falcon", false},
      {"olmo", "olmo", false},
      {"olmo2", "olmo2", false},
      // Parallel blocks: two norms (GPT-NeoX, per-head fused q/k/v) and one
      // shared norm (Phi, lm_head bias); partial rotary in both.
      {"gpt_neox", "gpt_neox", false},
      {"phi", "phi", false},
      {"granite", "granite", false},
      {"starcoder2", "starcoder2", false},
      // Quantized weights, decoded as the GEMM runs (weight-only).
      {"qwen3_fp8_block", "qwen3_fp8_block", false},
      {"llama_nvfp4_modelopt", "llama_nvfp4_modelopt", false},
      {"llama_nvfp4_ct", "llama_nvfp4_ct", false},
      {"mixtral", "mixtral", false},
      {"qwen2_moe", "qwen2_moe", false},
      {"qwen3_moe", "qwen3_moe", false},
      {"gpt_oss", "gpt_oss", false},
      {"gpt_oss_mxfp4", "gpt_oss_mxfp4", false},
      {"olmoe", "olmoe", false},
      // Multi-head latent attention, group-limited sigmoid routing.
      {"deepseek_v3", "deepseek_v3", false},
      // StableLM: LayerNorms with bias, each head's own q/k LayerNorm,
      // rotary on 25 % of a head.
      {"stablelm", "stablelm", false},
      // Nemotron: LayerNorm1P (1 + w, with bias), relu^2 plain MLP.
      {"nemotron", "nemotron", false},
      // Persimmon: per-head fused q/k/v with bias, one q/k LayerNorm shared
      // by the heads, relu^2.
      {"persimmon", "persimmon", false},
      // GraniteMoE: experts as 3-D tensors, top-k logits softmaxed, Granite's
      // four multipliers.
      {"granitemoe", "granitemoe", false},
      // Gemma 3: (1 + w) q/k norms, sliding layers with their own RoPE base
      // (two tables), query_pre_attn_scalar.
      {"gemma3", "gemma3", false},
      // Constructed (no HF goldens): Cohere's bias-free LayerNorms, parallel
      // block, per-head q/k LayerNorm rows, interleaved rotary, logit_scale;
      // GLM's fused gate_up and partial interleaved rotary with q/k/v bias.
      {"cohere", "cohere", false, true},
      {"glm", "glm", false, true},
      // Falcon-7B's layout: multi-query [q | k | v], one LayerNorm feeding
      // the parallel attention and MLP.
      {"falcon_mq", "falcon_mq", false, true},
      // BLOOM: ALiBi over 6 heads (not a power of two), the embedding
      // LayerNorm, per-head fused q/k/v.
      {"bloom", "bloom", false, true},
  };
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenParityTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

std::vector<ModelCase> TinyCases() {
  std::vector<ModelCase> out;
  for (const ModelCase& c : Cases())
    if (!c.bundled && !c.constructed) out.push_back(c);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Models, PackedBatchTest,
                         ::testing::ValuesIn(TinyCases()),
                         [](const auto& info) { return info.param.name; });

// docs/models.md (scripts/models_matrix.sh renders it from these runs) is
// current: a row for every runnable model type and for every golden case.
TEST(ModelsMatrixDoc, ListsEveryRunnableModelTypeAndGoldenCase) {
  std::ifstream in(std::string(LOOM_SOURCE_DIR) + "/docs/models.md");
  ASSERT_TRUE(in.good()) << "docs/models.md is missing: run "
                            "scripts/models_matrix.sh";
  const std::string doc((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(doc.find("Generated by `scripts/models_matrix.sh`"),
            std::string::npos);
  for (const ArchDef& a : AllArchs())
    if (a.runnable)
      EXPECT_NE(doc.find("| `" + std::string(a.model_type) + "` |"),
                std::string::npos)
          << "docs/models.md has no row for model type " << a.model_type
          << ": run scripts/models_matrix.sh";
  const size_t measured = doc.find("## Measured error");
  ASSERT_NE(measured, std::string::npos);
  for (const ModelCase& c : Cases())
    EXPECT_NE(doc.find("| `" + c.name + "`", measured), std::string::npos)
        << "docs/models.md has no measured row for golden case " << c.name
        << ": run scripts/models_matrix.sh";
}

}  // namespace
}  // namespace loom::testing

namespace loom::testing {
namespace {

// Mean KL(f32 || bf16) over every position of the four stories260K prompts.
double MeanKl(const std::vector<float>& p_logits,
              const std::vector<float>& q_logits, int64_t V) {
  const int64_t T = static_cast<int64_t>(p_logits.size()) / V;
  double sum = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* p = &p_logits[t * V];
    const float* q = &q_logits[t * V];
    double mp = p[0], mq = q[0];
    for (int64_t v = 1; v < V; ++v)
      mp = std::max(mp, double(p[v])), mq = std::max(mq, double(q[v]));
    double zp = 0, zq = 0;
    for (int64_t v = 0; v < V; ++v)
      zp += std::exp(p[v] - mp), zq += std::exp(q[v] - mq);
    const double lzp = mp + std::log(zp), lzq = mq + std::log(zq);
    for (int64_t v = 0; v < V; ++v) {
      const double lp = p[v] - lzp, lq = q[v] - lzq;
      sum += std::exp(lp) * (lp - lq);
    }
  }
  return sum / T;
}

// With hf_bf16_activations, Loom's bf16 forward rounds activations where HF's
// does, so KL(f32 || bf16) reproduces the KL between HF's own f32 and bf16
// golden files (per prompt, within a factor derived from rounding noise);
// without it, Loom's bf16 is much closer to f32.
TEST(HfBf16Test, KlOfF32VsBf16MatchesHfGoldens) {
  if (!CpuSupportsComputeDType(DType::kBF16))
    GTEST_SKIP() << "SKIPPED LOUDLY: no bf16 compute on this CPU";
  const std::string dir = std::string(LOOM_MODELS_DIR) + "/stories260K";
  auto f32 = Model::Load(dir, Precision::kF32);
  auto bf16 = Model::Load(dir, Precision::kBF16);
  ASSERT_TRUE(f32.ok() && bf16.ok());
  auto gf = GoldenFile::Open(BundledGoldenDir() +
                             "/stories260K/goldens_f32.safetensors");
  auto gb = GoldenFile::Open(BundledGoldenDir() +
                             "/stories260K/goldens_bf16.safetensors");
  HookSet hooks;
  hooks.Add({HookSite::kLogits, -1});
  auto ex32 = Executor::Create(**f32, hooks, {.max_tokens = 64});
  auto exhf = Executor::Create(**bf16, hooks,
                               {.max_tokens = 64, .hf_bf16_activations = true});
  auto exlo = Executor::Create(**bf16, hooks, {.max_tokens = 64});
  ASSERT_TRUE(ex32.ok() && exhf.ok() && exlo.ok());
  const int64_t V = 512;
  double hf_total = 0, loom_hf_total = 0, loom_total = 0;
  for (const char* p : {"prompt0", "prompt1", "prompt2", "prompt3"}) {
    std::vector<int32_t> ids = gf->Ids(std::string(p) + ".input_ids");
    std::vector<int64_t> starts = {0, static_cast<int64_t>(ids.size())};
    CaptureSink s32, shf, slo;
    ASSERT_TRUE((*ex32)->Forward(Batch{ids, starts}, &s32).ok());
    ASSERT_TRUE((*exhf)->Forward(Batch{ids, starts}, &shf).ok());
    ASSERT_TRUE((*exlo)->Forward(Batch{ids, starts}, &slo).ok());
    const auto& l32 = s32.Get({HookSite::kLogits, -1}).data;
    const double hf = MeanKl(gf->F32(std::string(p) + ".logits"),
                             gb->F32(std::string(p) + ".logits"), V);
    const double loom_hf =
        MeanKl(l32, shf.Get({HookSite::kLogits, -1}).data, V);
    const double loom = MeanKl(l32, slo.Get({HookSite::kLogits, -1}).data, V);
    std::printf("%s: HF %.3g, Loom hf-bf16 %.3g, Loom bf16 %.3g\n", p, hf,
                loom_hf, loom);
    // Per prompt: the same order of magnitude (rounding noise differs with the
    // accumulation order and the roundings inside attention HF also makes).
    EXPECT_GT(loom_hf, hf / 2) << p;
    EXPECT_LT(loom_hf, hf * 2) << p;
    // Loom's default bf16 (f32 activations) is closer to f32 than HF's bf16.
    EXPECT_LT(loom, hf) << p;
    // And the emulated logits stay within the golden bf16 bound of HF's bf16.
    const std::vector<float> hf_logits = gb->F32(std::string(p) + ".logits");
    double max_abs = 0;
    for (float v : hf_logits)
      max_abs = std::max(max_abs, static_cast<double>(std::fabs(v)));
    EXPECT_TRUE(
        Compare(shf.Get({HookSite::kLogits, -1}).data.data(), hf_logits.data(),
                static_cast<int64_t>(hf_logits.size()), 0.05 * max_abs, 0)
            .ok)
        << p;
    hf_total += hf;
    loom_hf_total += loom_hf;
    loom_total += loom;
  }
  std::printf("mean: HF %.3g, Loom hf-bf16 %.3g, Loom bf16 %.3g\n",
              hf_total / 4, loom_hf_total / 4, loom_total / 4);
  // Over the four prompts: within 30 % of the KL between HF's golden files.
  EXPECT_NEAR(loom_hf_total / hf_total, 1.0, 0.3);
}

}  // namespace
}  // namespace loom::testing
