#include "src/io/gguf.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "src/base/float16.h"
#include "src/io/test_util.h"

namespace loom {
namespace {

using testing::TempDir;
using testing::WriteBytes;

// A minimal GGUF writer for the tests: metadata entries and tensors are
// appended as raw bytes; Bytes() lays the file out.
class GgufBuilder {
 public:
  explicit GgufBuilder(uint32_t version = 3) : version_(version) {}

  static void PutU(std::string& out, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out += static_cast<char>(v >> (8 * i));
  }
  static void PutStr(std::string& out, const std::string& s) {
    PutU(out, s.size(), 8);
    out += s;
  }
  // A scalar entry: key, type, the `n` low bytes of `bits`.
  GgufBuilder& Scalar(const std::string& key, GgufType type, uint64_t bits,
                      int n) {
    PutStr(kv_, key);
    PutU(kv_, static_cast<uint32_t>(type), 4);
    PutU(kv_, bits, n);
    ++n_kv_;
    return *this;
  }
  GgufBuilder& Str(const std::string& key, const std::string& value) {
    PutStr(kv_, key);
    PutU(kv_, static_cast<uint32_t>(GgufType::kString), 4);
    PutStr(kv_, value);
    ++n_kv_;
    return *this;
  }
  // An array entry whose elements are given as raw bytes.
  GgufBuilder& Array(const std::string& key, GgufType elem, uint64_t count,
                     const std::string& elements) {
    PutStr(kv_, key);
    PutU(kv_, static_cast<uint32_t>(GgufType::kArray), 4);
    PutU(kv_, static_cast<uint32_t>(elem), 4);
    PutU(kv_, count, 8);
    kv_ += elements;
    ++n_kv_;
    return *this;
  }
  // Raw bytes appended to the metadata (hostile entries).
  GgufBuilder& RawEntry(const std::string& bytes) {
    kv_ += bytes;
    ++n_kv_;
    return *this;
  }
  GgufBuilder& TensorF32(const std::string& name,
                         const std::vector<float>& values) {
    std::string data;
    for (float f : values) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      PutU(data, u, 4);
    }
    return Tensor(name, {static_cast<uint64_t>(values.size())}, kGgmlTypeF32,
                  data);
  }
  GgufBuilder& Tensor(const std::string& name, std::vector<uint64_t> dims,
                      uint32_t type, const std::string& data) {
    tensors_.push_back({name, std::move(dims), type, data});
    return *this;
  }
  GgufBuilder& Alignment(uint64_t a) {
    alignment_ = a;
    return Scalar("general.alignment", GgufType::kU32, a, 4);
  }

  std::string Bytes() const {
    std::string out = "GGUF";
    PutU(out, version_, 4);
    PutU(out, tensors_.size(), 8);
    PutU(out, n_kv_, 8);
    out += kv_;
    uint64_t offset = 0;
    for (const Entry& t : tensors_) {
      PutStr(out, t.name);
      PutU(out, t.dims.size(), 4);
      for (uint64_t d : t.dims) PutU(out, d, 8);
      PutU(out, t.type, 4);
      PutU(out, offset, 8);
      offset += Padded(t.data.size());
    }
    out.resize(Padded(out.size()), '\0');
    for (const Entry& t : tensors_) {
      out += t.data;
      out.resize(Padded(out.size()), '\0');
    }
    return out;
  }

 private:
  struct Entry {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::string data;
  };
  uint64_t Padded(uint64_t n) const {
    return (n + alignment_ - 1) / alignment_ * alignment_;
  }
  uint32_t version_;
  uint64_t alignment_ = 32;
  uint64_t n_kv_ = 0;
  std::string kv_;
  std::vector<Entry> tensors_;
};

StatusOr<GgufHeader> Parse(const std::string& bytes) {
  return ParseGgufHeader("t.gguf",
                         reinterpret_cast<const uint8_t*>(bytes.data()),
                         static_cast<int64_t>(bytes.size()));
}

StatusOr<std::vector<float>> ReadAll(const std::string& bytes,
                                     const std::string& name) {
  ASSIGN_OR_RETURN(GgufHeader h, Parse(bytes));
  const GgufTensorInfo* t = h.Find(name);
  if (t == nullptr) return NotFoundError(name);
  return GgufTensorToF32(h, *t, reinterpret_cast<const uint8_t*>(bytes.data()));
}

uint64_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

uint64_t DoubleBits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

TEST(Gguf, ReadsF32TensorsOfVersions2And3FromAFile) {
  for (uint32_t version : {2u, 3u}) {
    const std::string bytes = GgufBuilder(version)
                                  .Str("general.architecture", "controlvector")
                                  .TensorF32("direction.1", {1.5f, -2.0f, 3.0f})
                                  .TensorF32("direction.2", {4.0f, 5.0f, 6.0f})
                                  .Bytes();
    TempDir dir;
    WriteBytes(dir.File("cv.gguf"), bytes);
    auto f = GgufFile::Open(dir.File("cv.gguf"));
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    const GgufHeader& h = (*f)->header();
    EXPECT_EQ(h.version, version);
    EXPECT_EQ(h.data_start % 32, 0);
    ASSERT_EQ(h.tensors.size(), 2u);
    EXPECT_EQ(h.tensors[1].name, "direction.2");
    EXPECT_EQ(h.tensors[1].dims, std::vector<int64_t>{3});
    EXPECT_EQ(
        std::get<std::string>(h.metadata.at("general.architecture").value),
        "controlvector");
    auto v = (*f)->ReadF32(*h.Find("direction.1"));
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(*v, (std::vector<float>{1.5f, -2.0f, 3.0f}));
  }
}

TEST(Gguf, ConvertsF16AndBf16) {
  std::string f16, bf16;
  for (float x : {0.5f, -1.25f, 65504.0f}) {
    GgufBuilder::PutU(f16, F32ToF16(x), 2);
    GgufBuilder::PutU(bf16, F32ToBf16(x), 2);
  }
  const std::string bytes = GgufBuilder()
                                .Tensor("h", {3}, kGgmlTypeF16, f16)
                                .Tensor("b", {3}, kGgmlTypeBF16, bf16)
                                .Bytes();
  auto h = ReadAll(bytes, "h");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(*h, (std::vector<float>{0.5f, -1.25f, 65504.0f}));
  auto b = ReadAll(bytes, "b");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)[1], -1.25f);
}

TEST(Gguf, KeepsScalarsAndStringsAndSkipsArraysOfEveryType) {
  std::string strings;
  GgufBuilder::PutStr(strings, "a");
  GgufBuilder::PutStr(strings, "bc");
  const std::string bytes =
      GgufBuilder()
          .Scalar("u8", GgufType::kU8, 200, 1)
          .Scalar("i8", GgufType::kI8, 0xff, 1)
          .Scalar("u16", GgufType::kU16, 60000, 2)
          .Scalar("i16", GgufType::kI16, 0xfffe, 2)
          .Scalar("u32", GgufType::kU32, 4000000000u, 4)
          .Scalar("i32", GgufType::kI32, 0xfffffffd, 4)
          .Scalar("f32", GgufType::kF32, FloatBits(0.25f), 4)
          .Scalar("bool", GgufType::kBool, 1, 1)
          .Scalar("u64", GgufType::kU64, 1ull << 40, 8)
          .Scalar("i64", GgufType::kI64, static_cast<uint64_t>(-5), 8)
          .Scalar("f64", GgufType::kF64, DoubleBits(-2.5), 8)
          .Str("s", "text")
          .Array("au8", GgufType::kU8, 3, "abc")
          .Array("af64", GgufType::kF64, 2, std::string(16, '\0'))
          .Array("astr", GgufType::kString, 2, strings)
          .Array("empty", GgufType::kI32, 0, "")
          .TensorF32("x", {7.0f})
          .Bytes();
  auto h = Parse(bytes);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  const auto& m = h->metadata;
  EXPECT_EQ(std::get<uint64_t>(m.at("u8").value), 200u);
  EXPECT_EQ(std::get<int64_t>(m.at("i8").value), -1);
  EXPECT_EQ(std::get<uint64_t>(m.at("u16").value), 60000u);
  EXPECT_EQ(std::get<int64_t>(m.at("i16").value), -2);
  EXPECT_EQ(std::get<uint64_t>(m.at("u32").value), 4000000000u);
  EXPECT_EQ(std::get<int64_t>(m.at("i32").value), -3);
  EXPECT_EQ(std::get<double>(m.at("f32").value), 0.25);
  EXPECT_TRUE(std::get<bool>(m.at("bool").value));
  EXPECT_EQ(std::get<uint64_t>(m.at("u64").value), 1ull << 40);
  EXPECT_EQ(std::get<int64_t>(m.at("i64").value), -5);
  EXPECT_EQ(std::get<double>(m.at("f64").value), -2.5);
  EXPECT_EQ(std::get<std::string>(m.at("s").value), "text");
  EXPECT_EQ(m.at("astr").type, GgufType::kArray);
  EXPECT_EQ(m.at("astr").array_type, GgufType::kString);
  EXPECT_EQ(m.at("astr").array_size, 2u);
  EXPECT_EQ(m.at("af64").array_size, 2u);
  auto x = ReadAll(bytes, "x");
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  EXPECT_EQ(*x, std::vector<float>{7.0f});
}

TEST(Gguf, HonoursGeneralAlignment) {
  const std::string bytes = GgufBuilder()
                                .Alignment(64)
                                .TensorF32("a", {1.0f})
                                .TensorF32("b", {2.0f})
                                .Bytes();
  auto h = Parse(bytes);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->alignment, 64);
  EXPECT_EQ(h->data_start % 64, 0);
  EXPECT_EQ(h->Find("b")->offset, 64);
  auto b = ReadAll(bytes, "b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, std::vector<float>{2.0f});
}

TEST(Gguf, ListsButDoesNotReadQuantizedTensors) {
  const std::string bytes =
      GgufBuilder().Tensor("q", {32}, 2, std::string(18, '\0')).Bytes();
  auto h = Parse(bytes);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->tensors[0].bytes, -1);
  auto v = ReadAll(bytes, "q");
  EXPECT_EQ(v.status().code(), StatusCode::kUnimplemented);
  EXPECT_CONTAINS(v.status().message(), "tensor 'q' has ggml type 2");
}

void ExpectError(const std::string& bytes, StatusCode code,
                 const std::string& needle) {
  auto h = Parse(bytes);
  ASSERT_FALSE(h.ok()) << needle;
  EXPECT_EQ(h.status().code(), code) << h.status().ToString();
  EXPECT_CONTAINS(h.status().message(), "t.gguf");
  EXPECT_CONTAINS(h.status().message(), needle);
}

TEST(Gguf, RefusesBadMagicAndVersions) {
  std::string bytes = GgufBuilder().TensorF32("a", {1.0f}).Bytes();
  std::string bad = bytes;
  bad[0] = 'X';
  ExpectError(bad, StatusCode::kDataLoss, "magic 'XGUF', expected 'GGUF'");
  ExpectError(GgufBuilder(1).Bytes(), StatusCode::kUnimplemented,
              "GGUF version 1");
  ExpectError(GgufBuilder(4).Bytes(), StatusCode::kUnimplemented,
              "GGUF version 4");
  ExpectError(GgufBuilder(0x03000000).Bytes(), StatusCode::kUnimplemented,
              "big-endian");
  ExpectError("GGU", StatusCode::kDataLoss, "truncated");
}

TEST(Gguf, RefusesHostileCountsAndLengths) {
  std::string huge_count = GgufBuilder().Bytes();
  huge_count[8] = '\xff';  // tensor count's low byte
  huge_count[15] = '\x7f';
  ExpectError(huge_count, StatusCode::kDataLoss, "tensor count");
  std::string huge_kv = GgufBuilder().Bytes();
  huge_kv[23] = '\x7f';
  ExpectError(huge_kv, StatusCode::kDataLoss, "metadata count");
  // A string length beyond the file.
  std::string entry;
  GgufBuilder::PutU(entry, 1, 8);
  entry += "k";
  GgufBuilder::PutU(entry, static_cast<uint32_t>(GgufType::kString), 4);
  GgufBuilder::PutU(entry, 1ull << 62, 8);
  ExpectError(GgufBuilder().RawEntry(entry).Bytes(), StatusCode::kDataLoss,
              "metadata 'k' needs 4611686018427387904 bytes");
  // Arrays whose elements cannot fit.
  ExpectError(GgufBuilder().Array("a", GgufType::kU64, 1ull << 61, "").Bytes(),
              StatusCode::kDataLoss, "metadata 'a'");
  ExpectError(
      GgufBuilder().Array("s", GgufType::kString, 1ull << 40, "").Bytes(),
      StatusCode::kDataLoss, "metadata 's'");
  ExpectError(GgufBuilder().Array("n", GgufType::kArray, 1, "").Bytes(),
              StatusCode::kUnimplemented, "arrays of arrays");
  ExpectError(
      GgufBuilder().Array("n", static_cast<GgufType>(13), 1, "").Bytes(),
      StatusCode::kDataLoss, "unknown element type 13");
  ExpectError(
      GgufBuilder().Scalar("t", static_cast<GgufType>(99), 0, 1).Bytes(),
      StatusCode::kDataLoss, "metadata 't': unknown value type 99");
}

TEST(Gguf, RefusesBadKeysAlignmentAndTensors) {
  ExpectError(GgufBuilder().Str("k", "a").Str("k", "b").Bytes(),
              StatusCode::kDataLoss, "metadata 'k' appears twice");
  ExpectError(GgufBuilder().Str("", "a").Bytes(), StatusCode::kDataLoss,
              "empty key");
  ExpectError(GgufBuilder().Alignment(48).Bytes(), StatusCode::kDataLoss,
              "'general.alignment' is 48, not a power of two");
  ExpectError(
      GgufBuilder().Scalar("general.alignment", GgufType::kU64, 32, 8).Bytes(),
      StatusCode::kDataLoss, "has type uint64, expected uint32");
  ExpectError(
      GgufBuilder().TensorF32("a", {1.0f}).TensorF32("a", {2.0f}).Bytes(),
      StatusCode::kDataLoss, "tensor 'a' appears twice");
  ExpectError(
      GgufBuilder().Tensor("d", {1, 1, 1, 1, 1}, kGgmlTypeF32, "").Bytes(),
      StatusCode::kDataLoss, "tensor 'd': n_dims 5");
  ExpectError(GgufBuilder()
                  .Tensor("o", {1ull << 40, 1ull << 40}, kGgmlTypeF32, "")
                  .Bytes(),
              StatusCode::kDataLoss, "tensor 'o' dims[1]");
  // Data declared bigger than the file.
  ExpectError(GgufBuilder().Tensor("big", {1000}, kGgmlTypeF32, "abcd").Bytes(),
              StatusCode::kDataLoss,
              "tensor 'big': data [0, +4000) is outside");
}

TEST(Gguf, EveryTruncationIsAnErrorNeverACrash) {
  std::string strings;
  GgufBuilder::PutStr(strings, "xy");
  const std::string bytes = GgufBuilder()
                                .Str("general.name", "cv")
                                .Array("a", GgufType::kString, 1, strings)
                                .Scalar("f", GgufType::kF64, 0, 8)
                                .TensorF32("direction.1", {1.0f, 2.0f})
                                .Bytes();
  ASSERT_TRUE(Parse(bytes).ok());
  // The data (8 bytes) ends the file; any cut before its end fails.
  const size_t data_end = bytes.size() - 24;
  for (size_t n = 0; n < data_end; ++n) {
    auto h = Parse(bytes.substr(0, n));
    ASSERT_FALSE(h.ok()) << "cut at " << n;
    EXPECT_EQ(h.status().code(), StatusCode::kDataLoss) << n;
  }
  // Flipping any byte gives a header or an error, never a crash.
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string b = bytes;
    b[i] = static_cast<char>(b[i] ^ 0xa5);
    auto h = Parse(b);
    if (!h.ok()) continue;
    for (const GgufTensorInfo& t : h->tensors)
      GgufTensorToF32(*h, t, reinterpret_cast<const uint8_t*>(b.data()))
          .status()
          .IgnoreError();
  }
}

TEST(Gguf, OpenNamesMissingAndShortFiles) {
  TempDir dir;
  auto missing = GgufFile::Open(dir.File("none.gguf"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(missing.status().message(), "none.gguf");
  WriteBytes(dir.File("short.gguf"), "GGUF");
  auto s = GgufFile::Open(dir.File("short.gguf"));
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss);
  EXPECT_CONTAINS(s.status().message(), "short.gguf: truncated");
}

}  // namespace
}  // namespace loom
