// Byte counts of every storage format against numbers derived by hand from
// the layouts (the README of the shared goldens and the real checkpoints'
// headers), not from the code.
#include "src/core/format.h"

#include <gtest/gtest.h>

namespace loom {
namespace {

WeightFormat Dense(DType d) {
  WeightFormat f;
  f.dtype = d;
  return f;
}

WeightFormat Of(FormatKind k) {
  WeightFormat f;
  f.kind = k;
  return f;
}

WeightFormat Fp8Block(int64_t bo, int64_t bi, DType scale) {
  WeightFormat f;
  f.kind = FormatKind::kFp8Block;
  f.block_out = bo;
  f.block_in = bi;
  f.scale_dtype = scale;
  return f;
}

int64_t Bytes(const WeightFormat& f, const Shape& s) {
  auto b = StorageBytes(f, s);
  EXPECT_TRUE(b.ok()) << b.status().message();
  return b.ok() ? *b : -1;
}

TEST(DTypeBits, SubByteAndScaleTypes) {
  EXPECT_EQ(DTypeBits(DType::kF4E2M1), 4);
  EXPECT_EQ(DTypeBits(DType::kF8E8M0), 8);
  EXPECT_EQ(DTypeBits(DType::kF8E4M3), 8);
  EXPECT_EQ(DTypeBits(DType::kBF16), 16);
  EXPECT_EQ(DTypeSize(DType::kF8E8M0), 1);
  EXPECT_EQ(DTypeBytes(DType::kF4E2M1, 32), 16);
  EXPECT_EQ(DTypeBytes(DType::kF4E2M1, 7), 4);  // rounded up to a whole byte
  EXPECT_EQ(DTypeBytes(DType::kBF16, 7), 14);
  EXPECT_EQ(ParseDType("F4"), DType::kF4E2M1);
  EXPECT_EQ(ParseDType("F8_E8M0"), DType::kF8E8M0);
  EXPECT_EQ(DTypeName(DType::kF4E2M1), "F4");
}

TEST(DTypeBitsDeathTest, ByteSizeOfSubByteTypeAborts) {
  EXPECT_DEATH(DTypeSize(DType::kF4E2M1), "sub-byte");
}

TEST(FormatTable, OneRowPerKindInOrder) {
  const auto& t = AllFormats();
  ASSERT_EQ(t.size(), 6u);
  for (size_t i = 0; i < t.size(); ++i)
    EXPECT_EQ(static_cast<size_t>(t[i].kind), i) << t[i].name;
  EXPECT_EQ(GetFormatInfo(FormatKind::kMxfp4).value_bits, 4);
  EXPECT_EQ(GetFormatInfo(FormatKind::kMxfp4).block_in, 32);
  EXPECT_EQ(GetFormatInfo(FormatKind::kNvfp4ModelOpt).block_in, 16);
  EXPECT_EQ(GetFormatInfo(FormatKind::kFp8Block).value_bits, 8);
}

TEST(StorageBytes, Dense) {
  EXPECT_EQ(Bytes(Dense(DType::kBF16), {4096, 4096}), 33'554'432);
  EXPECT_EQ(Bytes(Dense(DType::kF32), {7}), 28);
}

// gpt-oss-20b gate_up: [E=32, out=5760, in=2880]. Its index lists
// gate_up_proj_blocks U8 [32, 5760, 90, 16] and _scales U8 [32, 5760, 90].
TEST(StorageBytes, Mxfp4GptOss20bGateUp) {
  // 32 x 5760 x 90 x 16 = 265,420,800 plus 32 x 5760 x 90 = 16,588,800.
  EXPECT_EQ(Bytes(Of(FormatKind::kMxfp4), {32, 5760, 2880}), 282'009'600);
  auto t = ExpandWeight(Of(FormatKind::kMxfp4),
                        "model.layers.0.mlp.experts.gate_up_proj",
                        Shape({32, 5760, 2880}));
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].name, "model.layers.0.mlp.experts.gate_up_proj_blocks");
  EXPECT_EQ((*t)[0].shape, Shape({32, 5760, 90, 16}));
  EXPECT_EQ((*t)[0].dtype, DType::kU8);
  EXPECT_EQ((*t)[0].element, DType::kF4E2M1);
  EXPECT_EQ((*t)[1].name, "model.layers.0.mlp.experts.gate_up_proj_scales");
  EXPECT_EQ((*t)[1].shape, Shape({32, 5760, 90}));
  EXPECT_EQ((*t)[1].element, DType::kF8E8M0);
}

// The tiny ModelOpt checkpoint's q_proj [64, 64]: weight U8 [64, 32] (2048),
// weight_scale F8_E4M3 [64, 4] (256), weight_scale_2 F32 [] (4), input_scale
// F32 [] (4).
TEST(StorageBytes, Nvfp4ModelOpt) {
  EXPECT_EQ(Bytes(Of(FormatKind::kNvfp4ModelOpt), {64, 64}), 2312);
  auto t =
      ExpandWeight(Of(FormatKind::kNvfp4ModelOpt),
                   "model.layers.0.self_attn.q_proj.weight", Shape({64, 64}));
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->size(), 4u);
  EXPECT_EQ((*t)[0].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ((*t)[0].shape, Shape({64, 32}));
  EXPECT_EQ((*t)[1].name, "model.layers.0.self_attn.q_proj.weight_scale");
  EXPECT_EQ((*t)[1].dtype, DType::kF8E4M3);
  EXPECT_EQ((*t)[1].shape, Shape({64, 4}));
  EXPECT_EQ((*t)[2].name, "model.layers.0.self_attn.q_proj.weight_scale_2");
  EXPECT_EQ((*t)[2].shape, Shape({}));
  EXPECT_EQ((*t)[3].name, "model.layers.0.self_attn.q_proj.input_scale");
  EXPECT_EQ((*t)[3].component, ComponentKind::kInputScale);
  // Stacked experts: every component gains the leading [E]; scalars become
  // [E]: 4 x 2312.
  EXPECT_EQ(Bytes(Of(FormatKind::kNvfp4ModelOpt), {4, 64, 64}), 9248);
}

// The compressed-tensors copy: weight_packed [64, 32], weight_scale [64, 4],
// weight_global_scale F32 [1], input_global_scale F32 [1].
TEST(StorageBytes, Nvfp4CompressedTensors) {
  EXPECT_EQ(Bytes(Of(FormatKind::kNvfp4CompressedTensors), {64, 64}), 2312);
  auto t = ExpandWeight(Of(FormatKind::kNvfp4CompressedTensors),
                        "m.down_proj.weight", Shape({64, 128}));
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->size(), 4u);
  EXPECT_EQ((*t)[0].name, "m.down_proj.weight_packed");
  EXPECT_EQ((*t)[0].shape, Shape({64, 64}));
  EXPECT_EQ((*t)[1].name, "m.down_proj.weight_scale");
  EXPECT_EQ((*t)[1].shape, Shape({64, 8}));
  EXPECT_EQ((*t)[2].name, "m.down_proj.weight_global_scale");
  EXPECT_EQ((*t)[2].shape, Shape({1}));
  EXPECT_EQ((*t)[3].name, "m.down_proj.input_global_scale");
  EXPECT_EQ((*t)[3].shape, Shape({1}));
}

// The tiny FP8 checkpoint's down_proj [64, 128], block [32, 32]: weight
// F8_E4M3 8192 bytes + weight_scale_inv BF16 [2, 4] (16 bytes).
TEST(StorageBytes, Fp8BlockScaled) {
  EXPECT_EQ(Bytes(Fp8Block(32, 32, DType::kBF16), {64, 128}), 8208);
  EXPECT_EQ(Bytes(Fp8Block(32, 32, DType::kF32), {64, 128}), 8224);
  // Ceil-sized grid: [100, 70] -> scales [4, 3] F32 = 48; values 7000.
  EXPECT_EQ(Bytes(Fp8Block(32, 32, DType::kF32), {100, 70}), 7048);
  // A Qwen3-30B-A3B-FP8 expert gate_proj [768, 2048], block 128:
  // 1,572,864 + [6, 16] x 2.
  EXPECT_EQ(Bytes(Fp8Block(128, 128, DType::kBF16), {768, 2048}), 1'573'056);
  auto t = ExpandWeight(Fp8Block(32, 32, DType::kBF16), "a.weight",
                        Shape({64, 128}));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)[1].name, "a.weight_scale_inv");
  EXPECT_EQ((*t)[1].shape, Shape({2, 4}));
  EXPECT_TRUE((*t)[1].dtype_varies);
}

// ModelOpt FP8 (nvidia/Llama-3.1-70B-Instruct-FP8): an 8192 x 8192 o_proj is
// 67,108,864 E4M3 bytes + weight_scale F32 [] + input_scale F32 [].
TEST(StorageBytes, Fp8PerTensor) {
  EXPECT_EQ(Bytes(Of(FormatKind::kFp8PerTensor), {8192, 8192}), 67'108'872);
  auto t = ExpandWeight(Of(FormatKind::kFp8PerTensor), "x.o_proj.weight",
                        Shape({8192, 8192}));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)[1].name, "x.o_proj.weight_scale");
  EXPECT_EQ((*t)[2].name, "x.o_proj.input_scale");
}

TEST(StorageBytes, ShapesThatDoNotFitTheBlockAreErrors) {
  auto a = StorageBytes(Of(FormatKind::kMxfp4), Shape({64, 33}));
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("not a multiple of the mxfp4 block 32"),
            std::string::npos)
      << a.status().message();
  EXPECT_FALSE(StorageBytes(Of(FormatKind::kNvfp4ModelOpt), {64, 24}).ok());
  EXPECT_FALSE(StorageBytes(Of(FormatKind::kMxfp4), {64}).ok());
  EXPECT_FALSE(StorageBytes(Fp8Block(0, 32, DType::kF32), {64, 64}).ok());
  EXPECT_FALSE(StorageBytes(WeightFormat{}, {64, 64}).ok());  // no dtype
}

}  // namespace
}  // namespace loom
