// Quantized weights bound in their stored format decode exactly to the
// effective weights HF ran: bit for bit against `dequantized_weights.
// safetensors` (FP8 block, NVFP4 ModelOpt and compressed-tensors), and for
// MXFP4 (gpt-oss experts, no dequantized file) against an independent
// decode of the golden README's rule written out in this test.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "src/backend/backend.h"
#include "src/backend/cpu/quant_decode.h"
#include "src/core/quant_codes.h"
#include "src/io/safetensors.h"
#include "src/model/bind.h"
#include "src/model/config.h"
#include "src/model/registry.h"
#include "src/runtime/model.h"
#include "tests/golden_util.h"

namespace loom {
namespace {

using testing::GoldenFile;
using testing::SharedGoldenDir;

std::string TinyDir(const std::string& name) {
  const std::string root = SharedGoldenDir();
  return root.empty() ? "" : root + "/tiny/" + name;
}

class DequantizedWeightsTest : public ::testing::TestWithParam<const char*> {};

TEST_P(DequantizedWeightsTest, DecodeIsBitExact) {
  const std::string dir = TinyDir(GetParam());
  if (dir.empty())
    GTEST_SKIP() << "SKIPPED: shared golden directory not found (expected "
                    "beside the repository)";
  auto model = Model::Load(dir, Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const Model& m = **model;
  auto golden = GoldenFile::Open(dir + "/dequantized_weights.safetensors");
  ASSERT_TRUE(golden);
  int checked = 0;
  for (const WeightSpec& spec : m.declaration().specs) {
    if (!golden->Has(spec.name)) continue;
    Shape shape;
    const std::vector<float> want = golden->F32(spec.name, &shape);
    const WeightOperand op =
        WeightOperandOf(m.weights(), spec.role, spec.layer);
    ASSERT_TRUE(op.quantized()) << spec.name;
    ASSERT_EQ(op.n, shape[0]) << spec.name;
    ASSERT_EQ(op.k, shape[1]) << spec.name;
    const QuantMatrix q = QuantMatrixOf(op);
    std::vector<float> ref(want.size()), fast(want.size());
    DecodeRowsReference(q, 0, q.n, ref.data());
    cpu::DecodeRows(q, 0, q.n, DType::kF32, fast.data());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(ref[i]),
                std::bit_cast<uint32_t>(want[i]))
          << spec.name << " element " << i << ": reference " << ref[i]
          << " vs golden " << want[i];
      ASSERT_EQ(std::bit_cast<uint32_t>(fast[i]),
                std::bit_cast<uint32_t>(want[i]))
          << spec.name << " element " << i << ": fast " << fast[i]
          << " vs golden " << want[i];
    }
    ++checked;
  }
  // Every quantized linear: 7 per layer, 2 layers.
  EXPECT_EQ(checked, 14);
}

INSTANTIATE_TEST_SUITE_P(Tiny, DequantizedWeightsTest,
                         ::testing::Values("qwen3_fp8_block",
                                           "llama_nvfp4_modelopt",
                                           "llama_nvfp4_ct"));

// E2M1 from its bit fields (s.ee.m, bias 1), independent of the library's
// table.
float E2M1FromBits(int nibble) {
  const int s = nibble >> 3, e = (nibble >> 1) & 3, m = nibble & 1;
  const float mag =
      e == 0 ? 0.5f * static_cast<float>(m)
             : static_cast<float>(std::pow(2.0, e - 1)) * (1.0f + 0.5f * m);
  return s ? -mag : mag;
}

TEST(Mxfp4ExpertsTest, DecodeMatchesTheReadmeRule) {
  const std::string dir = TinyDir("gpt_oss_mxfp4");
  if (dir.empty())
    GTEST_SKIP() << "SKIPPED: shared golden directory not found (expected "
                    "beside the repository)";
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const ArchWeights decl = FindArch("gpt_oss")->declare_weights(*config);
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  for (DType compute : {DType::kF32, DType::kBF16}) {
    auto bound = BoundWeights::Bind(*config, decl, **ckpt, compute);
    ASSERT_TRUE(bound.ok()) << bound.status().ToString();
    const int64_t E = config->moe.num_experts;
    int checked = 0;
    for (const WeightSpec& spec : decl.specs) {
      if (spec.expert != kAllExperts || !spec.linear) continue;
      const std::string base = spec.name;  // "...experts.gate_up_proj"
      const Checkpoint::Entry* blocks = (*ckpt)->Find(base + "_blocks");
      const Checkpoint::Entry* scales = (*ckpt)->Find(base + "_scales");
      ASSERT_TRUE(blocks && scales) << base;
      const TensorView bv = (*ckpt)->View(*blocks);  // [E, out, G, 16] U8
      const TensorView sv = (*ckpt)->View(*scales);  // [E, out, G] U8
      const int64_t out = bv.shape[1], G = bv.shape[2], in = G * 32;
      const auto* b = static_cast<const uint8_t*>(bv.data);
      const auto* sc = static_cast<const uint8_t*>(sv.data);
      for (int64_t e = 0; e < E; ++e) {
        const WeightOperand op =
            WeightOperandOf(*bound, spec.role, spec.layer, e);
        ASSERT_EQ(op.format.kind, FormatKind::kMxfp4);
        ASSERT_EQ(op.format.layout, MatrixLayout::kOutIn);
        ASSERT_EQ(op.n, out);
        ASSERT_EQ(op.k, in);
        ASSERT_EQ(op.decode_dtype, compute);
        std::vector<float> got(out * in);
        cpu::DecodeRows(QuantMatrixOf(op), 0, out, DType::kF32, got.data());
        for (int64_t o = 0; o < out; ++o)
          for (int64_t g = 0; g < G; ++g)
            for (int64_t j = 0; j < 16; ++j) {
              const uint8_t byte = b[((e * out + o) * G + g) * 16 + j];
              const float x = std::ldexp(1.0f, sc[(e * out + o) * G + g] - 127);
              const float lo = E2M1FromBits(byte & 0x0F) * x;
              const float hi = E2M1FromBits(byte >> 4) * x;
              const int64_t c = 32 * g + 2 * j;
              ASSERT_EQ(std::bit_cast<uint32_t>(got[o * in + c]),
                        std::bit_cast<uint32_t>(lo))
                  << base << " expert " << e << " [" << o << ", " << c << "]";
              ASSERT_EQ(std::bit_cast<uint32_t>(got[o * in + c + 1]),
                        std::bit_cast<uint32_t>(hi))
                  << base << " expert " << e << " [" << o << ", " << c + 1
                  << "]";
            }
      }
      ++checked;
    }
    EXPECT_EQ(checked, 2 * config->num_layers);  // gate_up and down per layer
  }
}

}  // namespace
}  // namespace loom
