#include "src/io/safetensors_writer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "src/base/float16.h"
#include "src/io/safetensors.h"
#include "src/io/test_util.h"

namespace loom {
namespace {

using ::loom::testing::ReadBytes;
using ::loom::testing::TempDir;
using ::loom::testing::WriteBytes;

TEST(SafetensorsWriterTest, RoundTrip) {
  TempDir dir;
  std::vector<float> f32 = {1.f, -2.f, 3.5f, 4.f, 5.f, 6.f};
  std::vector<uint8_t> i64_bytes(3 * 8);
  for (int i = 0; i < 3; ++i) {
    int64_t v = int64_t{1} << (40 + i);
    std::memcpy(i64_bytes.data() + 8 * i, &v, 8);
  }
  SafetensorsWriter w;
  w.SetMetadata("format", "pt");
  w.SetMetadata("note", "x");
  w.SetMetadata("note", "replaced");
  ASSERT_TRUE(
      w.Add("layer.weight", DType::kF32, Shape({2, 3}), f32.data(), 24).ok());
  ASSERT_TRUE(w.AddOwned("ids", DType::kI64, Shape({3}), i64_bytes).ok());
  ASSERT_TRUE(
      w.AddFill("odd.u8", DType::kU8, Shape({3}), [](uint8_t* dst, int64_t n) {
         for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(7 + i);
         return Status::Ok();
       }).ok());
  ASSERT_TRUE(
      w.AddFill("half", DType::kBF16, Shape({4}), [](uint8_t* dst, int64_t n) {
         EXPECT_EQ(n, 8);
         for (int i = 0; i < 4; ++i) {
           uint16_t bits = static_cast<uint16_t>(0x3f80 + i);
           std::memcpy(dst + 2 * i, &bits, 2);
         }
         return Status::Ok();
       }).ok());
  ASSERT_TRUE(w.Add("empty", DType::kF32, Shape({0, 7}), nullptr, 0).ok());
  EXPECT_EQ(w.num_tensors(), 5);
  EXPECT_EQ(w.data_bytes(), 24 + 24 + 3 + 8);

  const std::string path = dir.File("out.safetensors");
  ASSERT_TRUE(w.Write(path).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const SafetensorsHeader& h = (*f)->header();
  EXPECT_EQ(h.data_start % 8, 0);
  EXPECT_EQ(h.file_size,
            h.data_start + w.data_bytes());  // no holes, no trailing bytes
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.metadata.at("note"), "replaced");
  // Layout: element size descending, then name; each tensor aligned to its
  // size.
  ASSERT_EQ(h.tensors.size(), 5u);
  EXPECT_EQ(h.tensors[0].name, "ids");
  EXPECT_EQ(h.tensors[1].name, "empty");
  EXPECT_EQ(h.tensors[2].name, "layer.weight");
  EXPECT_EQ(h.tensors[3].name, "half");
  EXPECT_EQ(h.tensors[4].name, "odd.u8");
  for (const TensorInfo& t : h.tensors) {
    EXPECT_EQ(t.begin % DTypeSize(t.dtype), 0) << t.name;
    TensorView v = (*f)->View(t);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % DTypeSize(t.dtype), 0u)
        << t.name;
  }
  TensorView wv = (*f)->View(*(*f)->Find("layer.weight"));
  EXPECT_EQ(wv.shape, Shape({2, 3}));
  EXPECT_EQ(std::memcmp(wv.data, f32.data(), 24), 0);
  TensorView iv = (*f)->View(*(*f)->Find("ids"));
  EXPECT_EQ(std::memcmp(iv.data, i64_bytes.data(), 24), 0);
  TensorView bv = (*f)->View(*(*f)->Find("half"));
  EXPECT_EQ(bv.dtype, DType::kBF16);
  EXPECT_EQ(bv.as<uint16_t>()[3], 0x3f83);
  TensorView uv = (*f)->View(*(*f)->Find("odd.u8"));
  EXPECT_EQ(uv.as<uint8_t>()[2], 9);
  EXPECT_EQ((*f)->Find("empty")->shape, Shape({0, 7}));

  // The header is HF-style: compact JSON, __metadata__ first, space padding.
  std::string raw = ReadBytes(path);
  std::string header = raw.substr(8, h.data_start - 8);
  EXPECT_EQ(header.rfind("{\"__metadata__\":{\"format\":\"pt\"", 0), 0u)
      << header;
  size_t close = header.find_last_of('}');
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos)
      << header;
  EXPECT_LT(header.size() - close - 1, 8u);
}

// Serialize() gives the bytes Write() puts in the file.
TEST(SafetensorsWriterTest, SerializeEqualsTheFile) {
  TempDir dir;
  std::vector<float> f32 = {1.f, -2.f, 3.5f, 4.f, 5.f, 6.f};
  SafetensorsWriter w;
  w.SetMetadata("format", "loom");
  ASSERT_TRUE(w.Add("a", DType::kF32, Shape({2, 3}), f32.data(), 24).ok());
  ASSERT_TRUE(
      w.AddFill("b", DType::kU8, Shape({3}), [](uint8_t* dst, int64_t n) {
         for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(9 + i);
         return Status::Ok();
       }).ok());
  ASSERT_TRUE(w.Write(dir.File("w.safetensors")).ok());
  auto bytes = w.Serialize();
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(*bytes, ReadBytes(dir.File("w.safetensors")));
  auto h = ParseSafetensorsHeader(
      "mem", reinterpret_cast<const uint8_t*>(bytes->data()),
      static_cast<int64_t>(bytes->size()));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->metadata["format"], "loom");
  EXPECT_EQ(h->tensors.size(), 2u);
  // A failing fill fails Serialize too, naming the tensor.
  SafetensorsWriter bad;
  ASSERT_TRUE(
      bad.AddFill("c", DType::kU8, Shape({1}),
                  [](uint8_t*, int64_t) { return InvalidArgumentError("no"); })
          .ok());
  EXPECT_FALSE(bad.Serialize().ok());
}

TEST(SafetensorsWriterTest, NoTensorsNoMetadata) {
  TempDir dir;
  SafetensorsWriter w;
  ASSERT_TRUE(w.Write(dir.File("e.safetensors")).ok());
  auto h = ReadSafetensorsHeader(dir.File("e.safetensors"));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_TRUE(h->tensors.empty());
  EXPECT_EQ(h->file_size, 16);  // "{}" padded to 8 bytes
}

TEST(SafetensorsWriterTest, AddRejectsBadInput) {
  SafetensorsWriter w;
  float x[4] = {};
  ASSERT_TRUE(w.Add("a", DType::kF32, Shape({4}), x, 16).ok());
  struct Case {
    Status s;
    std::string expect;
  };
  std::vector<Case> cases;
  cases.push_back(
      {w.Add("a", DType::kF32, Shape({4}), x, 16), "tensor a added twice"});
  cases.push_back(
      {w.Add("", DType::kF32, Shape({4}), x, 16), "empty tensor name"});
  cases.push_back(
      {w.Add("__metadata__", DType::kF32, Shape({4}), x, 16), "reserved"});
  cases.push_back({w.Add("b", DType::kF32, Shape({4}), x, 12),
                   "shape [4] x F32 = 16 bytes, but 12 given"});
  cases.push_back(
      {w.Add("c", DType::kF32, Shape({-1, 4}), x, 16), "negative dimension"});
  cases.push_back(
      {w.Add("d", DType::kF32, Shape({4}), nullptr, 16), "null data"});
  cases.push_back(
      {w.AddFill("e", DType::kF32, Shape({int64_t{1} << 40, int64_t{1} << 40}),
                 nullptr),
       "overflows"});
  cases.push_back({w.AddFill("f", DType::kF32, Shape({4}), nullptr),
                   "empty fill callback"});
  cases.push_back(
      {w.AddOwned("g", DType::kF32, Shape({4}), std::vector<uint8_t>(3)),
       "3 given"});
  for (const Case& c : cases) {
    EXPECT_EQ(c.s.code(), StatusCode::kInvalidArgument) << c.s.ToString();
    EXPECT_CONTAINS(c.s.message(), c.expect);
  }
  EXPECT_EQ(w.num_tensors(), 1);
}

TEST(SafetensorsWriterTest, FillErrorLeavesOldFileAndNoTmp) {
  TempDir dir;
  const std::string path = dir.File("m.safetensors");
  WriteBytes(path, "old contents");
  SafetensorsWriter w;
  ASSERT_TRUE(w.AddFill("bad", DType::kF32, Shape({2}), [](uint8_t*, int64_t) {
                 return InternalError("generator failed");
               }).ok());
  Status s = w.Write(path);
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  EXPECT_CONTAINS(s.message(), "tensor bad");
  EXPECT_CONTAINS(s.message(), "generator failed");
  EXPECT_EQ(ReadBytes(path), "old contents");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(SafetensorsWriterTest, MissingDirectory) {
  TempDir dir;
  SafetensorsWriter w;
  Status s = w.Write(dir.File("no/such/dir/x.safetensors"));
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_CONTAINS(s.message(), "x.safetensors.tmp");
}

TEST(SafetensorsWriterTest, OverwritesAndStreamsUnalignedLargeTensors) {
  TempDir dir;
  const std::string path = dir.File("big.safetensors");
  WriteBytes(path, "to be replaced");
  // Sizes that leave tensors at offsets that are not page multiples.
  const std::vector<int64_t> sizes = {(3 << 20) + 1, 4097, (5 << 20) + 3, 1};
  SafetensorsWriter w;
  auto name = [](size_t i) { return std::string("t") += std::to_string(i); };
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(w.AddFill(name(i), DType::kU8, Shape({sizes[i]}),
                          [i](uint8_t* dst, int64_t n) {
                            for (int64_t k = 0; k < n; ++k)
                              dst[k] =
                                  static_cast<uint8_t>((k * 31 + i) & 0xff);
                            return Status::Ok();
                          })
                    .ok());
  }
  ASSERT_TRUE(w.Write(path).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  for (size_t i = 0; i < sizes.size(); ++i) {
    TensorView v = (*f)->View(*(*f)->Find(name(i)));
    ASSERT_EQ(v.bytes(), sizes[i]);
    const auto* p = v.as<uint8_t>();
    int64_t bad = 0;
    for (int64_t k = 0; k < sizes[i]; ++k)
      bad += p[k] != static_cast<uint8_t>((k * 31 + i) & 0xff);
    EXPECT_EQ(bad, 0) << i;
  }
}

TEST(SafetensorsWriterTest, ViewsFromAnotherFile) {
  TempDir dir;
  auto src =
      SafetensorsFile::Open(LOOM_MODELS_DIR "/stories260K/model.safetensors");
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  SafetensorsWriter w;
  for (const TensorInfo& t : (*src)->header().tensors)
    ASSERT_TRUE(w.Add(t.name, (*src)->View(t)).ok());
  ASSERT_TRUE(w.Write(dir.File("copy.safetensors")).ok());
  auto dst = SafetensorsFile::Open(dir.File("copy.safetensors"));
  ASSERT_TRUE(dst.ok()) << dst.status().ToString();
  ASSERT_EQ((*dst)->header().tensors.size(), (*src)->header().tensors.size());
  for (const TensorInfo& t : (*src)->header().tensors) {
    const TensorInfo* d = (*dst)->Find(t.name);
    ASSERT_NE(d, nullptr) << t.name;
    EXPECT_EQ(d->shape, t.shape);
    EXPECT_EQ(d->dtype, t.dtype);
    EXPECT_EQ(std::memcmp((*dst)->View(*d).data, (*src)->View(t).data,
                          static_cast<size_t>(t.bytes())),
              0);
  }
}

}  // namespace
}  // namespace loom
