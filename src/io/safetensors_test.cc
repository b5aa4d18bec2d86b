#include "src/io/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "src/io/test_util.h"

namespace loom {
namespace {

using ::loom::testing::ReadBytes;
using ::loom::testing::SafetensorsBytes;
using ::loom::testing::TempDir;
using ::loom::testing::WriteBytes;

// Writes a safetensors file with the given header JSON and `data_bytes`
// bytes of data (values i % 251).
std::string WriteFile(const TempDir& dir, const std::string& name,
                      const std::string& header, size_t data_bytes) {
  std::string data(data_bytes, '\0');
  for (size_t i = 0; i < data_bytes; ++i) data[i] = static_cast<char>(i % 251);
  std::string path = dir.File(name);
  WriteBytes(path, SafetensorsBytes(header, data));
  return path;
}

// Expects `header` (with `data_bytes` of data) to fail with `code` and a
// message containing the path and every string in `parts`.
void ExpectBad(const std::string& header, size_t data_bytes, StatusCode code,
               const std::vector<std::string>& parts) {
  TempDir dir;
  std::string path = WriteFile(dir, "bad.safetensors", header, data_bytes);
  for (int via_mmap = 0; via_mmap < 2; ++via_mmap) {
    Status s = via_mmap ? SafetensorsFile::Open(path).status()
                        : ReadSafetensorsHeader(path).status();
    ASSERT_FALSE(s.ok()) << header;
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_CONTAINS(s.message(), path);
    for (const auto& p : parts) EXPECT_CONTAINS(s.message(), p) << header;
  }
}

TEST(SafetensorsHeaderTest, ParsesValidFile) {
  TempDir dir;
  std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},)"
      R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("e":{"dtype":"I64","shape":[0,5],"data_offsets":[22,22]}})";
  std::string path = WriteFile(dir, "ok.safetensors", header, 22);
  auto h = ReadSafetensorsHeader(path);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->path, path);
  EXPECT_EQ(h->data_start, 8 + static_cast<int64_t>(header.size()));
  EXPECT_EQ(h->file_size, h->data_start + 22);
  ASSERT_EQ(h->tensors.size(), 3u);
  EXPECT_EQ(h->tensors[0].name, "a");  // offset order
  EXPECT_EQ(h->tensors[0].dtype, DType::kF32);
  EXPECT_EQ(h->tensors[0].shape, Shape({2, 2}));
  EXPECT_EQ(h->tensors[1].name, "b");
  EXPECT_EQ(h->tensors[1].bytes(), 6);
  EXPECT_EQ(h->tensors[2].name, "e");
  EXPECT_EQ(h->tensors[2].bytes(), 0);
  EXPECT_EQ(h->metadata.at("format"), "pt");
  ASSERT_NE(h->Find("b"), nullptr);
  EXPECT_EQ(h->Find("zz"), nullptr);

  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const TensorInfo* b = (*f)->Find("b");
  ASSERT_NE(b, nullptr);
  TensorView v = (*f)->View(*b);
  EXPECT_EQ(v.dtype, DType::kBF16);
  EXPECT_EQ(v.shape, Shape({3}));
  const auto* bytes = static_cast<const uint8_t*>(v.data);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(bytes[i], 16 + i);
  TensorView e = (*f)->View(*(*f)->Find("e"));
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.bytes(), 0);
  (*f)->Prefetch(*b);  // hints only: must not crash
  (*f)->Release(*b);
  EXPECT_EQ(bytes[5], 21);  // still readable after Release
  EXPECT_EQ((*f)->Find("nope"), nullptr);
}

TEST(SafetensorsHeaderTest, AcceptsSpacePaddingAndHolesAndTrailingBytes) {
  std::string header =
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})";
  while ((header.size() + 8) % 8) header += ' ';
  TempDir dir;
  std::string path = WriteFile(dir, "pad.safetensors", header, 10);
  auto h = ReadSafetensorsHeader(path);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->data_start % 8, 0);
}

TEST(SafetensorsHeaderTest, EmptyTensorsInsideOtherRangesDoNotOverlap) {
  TempDir dir;
  std::string path =
      WriteFile(dir, "e.safetensors",
                R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                8);
  EXPECT_TRUE(ReadSafetensorsHeader(path).ok());
}

TEST(SafetensorsHeaderTest, AllKnownDTypes) {
  const std::vector<std::pair<std::string, int>> dtypes = {
      {"F64", 8}, {"F32", 4},  {"F16", 2},     {"BF16", 2},
      {"I64", 8}, {"I32", 4},  {"I16", 2},     {"I8", 1},
      {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  std::string header = "{";
  int64_t off = 0;
  for (const auto& [name, size] : dtypes) {
    if (off) header += ",";
    header += "\"t_" + name + "\":{\"dtype\":\"" + name +
              "\",\"shape\":[3],\"data_offsets\":[" + std::to_string(off) +
              "," + std::to_string(off + 3 * size) + "]}";
    off += 3 * size;
  }
  header += "}";
  TempDir dir;
  auto h =
      ReadSafetensorsHeader(WriteFile(dir, "all.safetensors", header, off));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  for (const auto& [name, size] : dtypes) {
    const TensorInfo* t = h->Find("t_" + name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(DTypeName(t->dtype), name);
    EXPECT_EQ(DTypeSize(t->dtype), size);
  }
}

TEST(SafetensorsErrorTest, MissingFile) {
  TempDir dir;
  Status s = ReadSafetensorsHeader(dir.File("absent.safetensors")).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_CONTAINS(s.message(), "absent.safetensors");
  EXPECT_EQ(
      SafetensorsFile::Open(dir.File("absent.safetensors")).status().code(),
      StatusCode::kNotFound);
}

TEST(SafetensorsErrorTest, DirectoryIsNotAFile) {
  TempDir dir;
  Status s = SafetensorsFile::Open(dir.path()).status();
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_CONTAINS(s.message(), dir.path() + ": read: " + std::strerror(EISDIR));
  s = ReadSafetensorsHeader(dir.path()).status();
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_CONTAINS(s.message(), dir.path() + ": read: " + std::strerror(EISDIR));
}

TEST(SafetensorsErrorTest, TruncatedBelowLengthPrefix) {
  TempDir dir;
  for (std::string bytes : {std::string(), std::string("\x10\x00\x00", 3)}) {
    std::string path = dir.File("short.safetensors");
    WriteBytes(path, bytes);
    Status s = ReadSafetensorsHeader(path).status();
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_CONTAINS(s.message(), path);
    EXPECT_CONTAINS(s.message(), std::to_string(bytes.size()) + " bytes");
    EXPECT_EQ(SafetensorsFile::Open(path).status().code(),
              StatusCode::kDataLoss);
  }
}

TEST(SafetensorsErrorTest, HeaderLengthPastEof) {
  TempDir dir;
  std::string header =
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  std::string path = dir.File("eof.safetensors");
  WriteBytes(path, SafetensorsBytes(header, "x", header.size() + 100, true));
  Status s = SafetensorsFile::Open(path).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_CONTAINS(s.message(), path);
  EXPECT_CONTAINS(s.message(), std::to_string(header.size() + 100));
  EXPECT_CONTAINS(s.message(), "past the end of the file");
}

TEST(SafetensorsErrorTest, HeaderLengthAbsurd) {
  TempDir dir;
  std::string path = dir.File("huge.safetensors");
  WriteBytes(path, SafetensorsBytes("{}", "", uint64_t{1} << 62, true));
  Status s = ReadSafetensorsHeader(path).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_CONTAINS(s.message(), std::to_string(uint64_t{1} << 62));
  EXPECT_CONTAINS(s.message(), "exceeds the limit");
  // Also the maximum uint64 (a file that starts with 0xff bytes).
  WriteBytes(path, std::string(64, '\xff'));
  s = ReadSafetensorsHeader(path).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_CONTAINS(s.message(), "18446744073709551615");
}

TEST(SafetensorsErrorTest, HeaderLengthTooSmall) {
  TempDir dir;
  std::string path = dir.File("tiny.safetensors");
  WriteBytes(path, SafetensorsBytes("{}", "", 1, true));
  Status s = ReadSafetensorsHeader(path).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_CONTAINS(s.message(), "header length 1");
}

TEST(SafetensorsErrorTest, EmptyObjectHeaderIsValid) {
  TempDir dir;
  auto h = ReadSafetensorsHeader(WriteFile(dir, "empty.safetensors", "{}", 0));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_TRUE(h->tensors.empty());
}

TEST(SafetensorsErrorTest, BadJson) {
  ExpectBad(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})", 4,
            StatusCode::kDataLoss, {"not valid JSON"});
  ExpectBad("not json at all", 4, StatusCode::kDataLoss, {"not valid JSON"});
}

TEST(SafetensorsErrorTest, NonObjectHeader) {
  ExpectBad("[1, 2, 3]", 0, StatusCode::kDataLoss,
            {"header is a JSON array, expected an object"});
  ExpectBad("42", 0, StatusCode::kDataLoss,
            {"header is a JSON integer, expected an object"});
}

TEST(SafetensorsErrorTest, DuplicateTensorName) {
  ExpectBad(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
            R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
            2, StatusCode::kDataLoss, {"\"a\" twice"});
}

TEST(SafetensorsErrorTest, EntryNotObject) {
  ExpectBad(R"({"w":[1,2]})", 0, StatusCode::kDataLoss,
            {"tensor w", "entry is a JSON array"});
}

TEST(SafetensorsErrorTest, MissingKeys) {
  ExpectBad(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4,
            StatusCode::kDataLoss, {"tensor w", "missing \"dtype\""});
  ExpectBad(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4,
            StatusCode::kDataLoss, {"tensor w", "missing \"shape\""});
  ExpectBad(R"({"w":{"dtype":"F32","shape":[1]}})", 4, StatusCode::kDataLoss,
            {"tensor w", "missing \"data_offsets\""});
}

TEST(SafetensorsErrorTest, WrongJsonTypes) {
  ExpectBad(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4,
            StatusCode::kDataLoss,
            {"tensor w", "dtype is a JSON integer, expected a string"});
  ExpectBad(R"({"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", 4,
            StatusCode::kDataLoss, {"tensor w", "shape is a JSON string"});
  ExpectBad(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4,
            StatusCode::kDataLoss,
            {"tensor w", "shape [1.5] has a JSON number element"});
  ExpectBad(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4,
            StatusCode::kDataLoss,
            {"tensor w", "data_offsets is an array of 1 elements"});
  ExpectBad(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":{"a":1}}})", 4,
            StatusCode::kDataLoss,
            {"tensor w", "data_offsets is a JSON object"});
  ExpectBad(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}})", 4,
            StatusCode::kDataLoss,
            {"tensor w", "data_offsets [0, \"4\"] has a JSON string element"});
  ExpectBad(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4,
            StatusCode::kDataLoss, {"tensor w", "negative offset"});
  ExpectBad(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4,
            StatusCode::kDataLoss, {"tensor w", "[4, 0] are reversed"});
  ExpectBad(R"({"__metadata__":{"k":1}})", 0, StatusCode::kDataLoss,
            {"__metadata__ key k", "expected a string"});
  ExpectBad(R"({"__metadata__":[]})", 0, StatusCode::kDataLoss,
            {"__metadata__ is a JSON array"});
}

TEST(SafetensorsErrorTest, UnknownDType) {
  ExpectBad(R"({"model.w":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})",
            4, StatusCode::kDataLoss,
            {"tensor model.w", "unknown dtype \"F31\""});
  // Long names are not safetensors spellings.
  ExpectBad(
      R"({"model.w":{"dtype":"float32","shape":[1],"data_offsets":[0,4]}})", 4,
      StatusCode::kDataLoss, {"tensor model.w", "unknown dtype \"float32\""});
  // Defined by safetensors, not supported by Loom.
  ExpectBad(R"({"model.w":{"dtype":"U32","shape":[1],"data_offsets":[0,4]}})",
            4, StatusCode::kUnimplemented,
            {"tensor model.w", "dtype U32 is not supported"});
}

TEST(SafetensorsErrorTest, NegativeShapeDim) {
  ExpectBad(R"({"w":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,4]}})", 4,
            StatusCode::kDataLoss,
            {"tensor w", "shape [2, -1] has negative dimension -1"});
}

TEST(SafetensorsErrorTest, ShapeSizeMismatch) {
  ExpectBad(
      R"({"model.layers.0.mlp.up_proj.weight":{"dtype":"F32","shape":[128,64],"data_offsets":[0,32000]}})",
      32000, StatusCode::kDataLoss,
      {"tensor model.layers.0.mlp.up_proj.weight: shape [128, 64] x F32 = "
       "32768 bytes, but data_offsets "
       "span 32000 bytes"});
}

TEST(SafetensorsErrorTest, ShapeOverflow) {
  ExpectBad(
      R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})",
      4, StatusCode::kDataLoss, {"tensor w", "overflows"});
  ExpectBad(
      R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}})",
      4, StatusCode::kDataLoss, {"tensor w", "beyond 2^63"});
}

TEST(SafetensorsErrorTest, OffsetsOutOfRange) {
  ExpectBad(
      R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12,
      StatusCode::kDataLoss,
      {"tensor w",
       "data_offsets [0, 16] run past the end of the data section (12 bytes)"});
}

TEST(SafetensorsErrorTest, TruncatedData) {
  // A valid file cut short in its data section.
  TempDir dir;
  std::string header =
      R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  std::string path = dir.File("cut.safetensors");
  WriteBytes(path, SafetensorsBytes(header, std::string(16, 'x'))
                       .substr(0, 8 + header.size() + 10));
  Status s = SafetensorsFile::Open(path).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_CONTAINS(s.message(), "tensor w");
  EXPECT_CONTAINS(s.message(), "(10 bytes)");
}

TEST(SafetensorsErrorTest, OverlappingOffsets) {
  ExpectBad(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            12, StatusCode::kDataLoss,
            {"tensor b: data_offsets [4, 12] overlap tensor a [0, 8]"});
  // Identical ranges.
  ExpectBad(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
            8, StatusCode::kDataLoss, {"overlap"});
}

TEST(SafetensorsParseTest, ParseFromMemoryBuffer) {
  std::string header =
      R"({"w":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})";
  std::string bytes = SafetensorsBytes(header, "abcd");
  auto h = ParseSafetensorsHeader(
      "mem", reinterpret_cast<const uint8_t*>(bytes.data()),
      static_cast<int64_t>(bytes.size()));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->tensors[0].dtype, DType::kI32);
  // Every prefix of a valid file either parses or fails cleanly.
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto r = ParseSafetensorsHeader(
        "mem", reinterpret_cast<const uint8_t*>(bytes.data()),
        static_cast<int64_t>(n));
    EXPECT_FALSE(r.ok()) << n;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << n;
  }
}

// ---------------------------------------------------------------- real files

TEST(SafetensorsRealTest, Stories260K) {
  const std::string path = LOOM_MODELS_DIR "/stories260K/model.safetensors";
  auto h = ReadSafetensorsHeader(path);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_FALSE(h->tensors.empty());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->header().tensors.size(), h->tensors.size());
  int64_t end = 0;
  for (const TensorInfo& t : (*f)->header().tensors) {
    EXPECT_GE(t.begin, end) << t.name;  // offset order
    end = t.end;
    TensorView v = (*f)->View(t);
    EXPECT_EQ(v.bytes(), t.bytes());
    EXPECT_EQ(v.shape, t.shape);
  }
  EXPECT_LE(end, (*f)->header().data_size());
  auto c = Checkpoint::Open(LOOM_MODELS_DIR "/stories260K");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->files().size(), 1u);
  EXPECT_EQ((*c)->entries().size(), h->tensors.size());
  for (size_t i = 1; i < (*c)->entries().size(); ++i) {
    EXPECT_LT((*c)->entries()[i - 1].info.name, (*c)->entries()[i].info.name);
  }
  const auto* e = (*c)->Find(h->tensors[0].name);
  ASSERT_NE(e, nullptr);
  TensorView cv = (*c)->View(*e);
  TensorView fv = (*f)->View(h->tensors[0]);
  ASSERT_EQ(cv.bytes(), fv.bytes());
  EXPECT_EQ(std::memcmp(cv.data, fv.data, static_cast<size_t>(cv.bytes())), 0);
  int64_t total = 0;
  for (const auto& t : h->tensors) total += t.bytes();
  EXPECT_EQ((*c)->total_bytes(), total);
}

const char kShardedDir[] = LOOM_SHARED_DIR "/golden/tiny/mistral_sw16_sharded";

TEST(SafetensorsRealTest, ShardedGoldenModel) {
  if (!std::filesystem::exists(kShardedDir)) {
    GTEST_SKIP() << "SKIPPED: shared golden model " << kShardedDir
                 << " not found";
  }
  auto c = Checkpoint::Open(kShardedDir);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->files().size(), 3u);
  auto index = ReadSafetensorsIndex(std::string(kShardedDir) +
                                    "/model.safetensors.index.json");
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ((*c)->entries().size(), index->weight_map.size());
  ASSERT_TRUE(index->total_size.has_value());
  EXPECT_EQ((*c)->total_bytes(), *index->total_size);
  // The golden files beside the shards are not weights.
  for (const auto& e : (*c)->entries())
    EXPECT_EQ(e.info.name.find("golden"), std::string::npos);
  for (const auto& f : (*c)->files())
    EXPECT_EQ(f->path().find("goldens_"), std::string::npos);
  const auto* e = (*c)->Find("model.embed_tokens.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(
      (*c)->files()[e->file]->path(),
      std::string(kShardedDir) + "/" + index->weight_map.at(e->info.name));
  auto shards = ReadIndexShards(std::string(kShardedDir) +
                                "/model.safetensors.index.json");
  ASSERT_TRUE(shards.ok());
  EXPECT_EQ(shards->size(), 3u);
  auto headers = ReadCheckpointHeaders(kShardedDir);
  ASSERT_TRUE(headers.ok()) << headers.status().ToString();
  EXPECT_EQ(headers->headers.size(), 3u);
}

// ---------------------------------------------------------------- sharded

// A 3-tensor model in two shards.
class ShardedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteFile(dir_, "s1.safetensors",
              R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
              R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]}})",
              14);
    WriteFile(dir_, "s2.safetensors",
              R"({"c":{"dtype":"I8","shape":[5],"data_offsets":[0,5]}})", 5);
    // Decoys that must never be opened.
    WriteBytes(dir_.File("goldens.safetensors"), "garbage");
    WriteBytes(dir_.File("model.safetensors"), "garbage");
  }
  void WriteIndex(
      const std::string& weight_map,
      const std::string& extra = R"("metadata":{"total_size":19},)") {
    WriteBytes(dir_.File("model.safetensors.index.json"),
               "{" + extra + R"("weight_map":)" + weight_map + "}");
  }
  Status OpenStatus() {
    Status s = Checkpoint::Open(dir_.path()).status();
    // Header-only planning gives the same answer.
    Status h = ReadCheckpointHeaders(dir_.path()).status();
    EXPECT_EQ(s.code(), h.code()) << s.ToString() << " vs " << h.ToString();
    return s;
  }
  std::string index_path() const {
    return dir_.File("model.safetensors.index.json");
  }
  TempDir dir_;
};

TEST_F(ShardedTest, Good) {
  WriteIndex(
      R"({"c":"s2.safetensors","a":"s1.safetensors","b":"s1.safetensors"})");
  auto c = Checkpoint::Open(dir_.path());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ((*c)->entries().size(), 3u);
  EXPECT_EQ((*c)->entries()[0].info.name, "a");
  EXPECT_EQ((*c)->entries()[2].info.name, "c");
  EXPECT_EQ((*c)->total_bytes(), 19);
  ASSERT_EQ((*c)->files().size(), 2u);
  EXPECT_EQ((*c)->files()[0]->path(),
            dir_.File("s2.safetensors"));  // index order
  const auto* b = (*c)->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ((*c)->files()[b->file]->path(), dir_.File("s1.safetensors"));
  TensorView v = (*c)->View(*b);
  EXPECT_EQ(static_cast<const uint8_t*>(v.data)[0], 8);
  EXPECT_EQ((*c)->Find("d"), nullptr);

  auto index = ReadSafetensorsIndex(index_path());
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->total_size, 19);
  EXPECT_EQ(index->weight_map.at("c"), "s2.safetensors");
  EXPECT_EQ(index->shards,
            (std::vector<std::string>{"s2.safetensors", "s1.safetensors"}));
  auto shards = ReadIndexShards(index_path());
  ASSERT_TRUE(shards.ok());
  EXPECT_EQ(*shards, index->shards);
}

TEST_F(ShardedTest, NoMetadataIsFine) {
  WriteIndex(
      R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"})",
      "");
  auto index = ReadSafetensorsIndex(index_path());
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_FALSE(index->total_size.has_value());
  EXPECT_TRUE(OpenStatus().ok());
}

TEST_F(ShardedTest, MissingShard) {
  WriteIndex(
      R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s3.safetensors"})");
  Status s = OpenStatus();
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_CONTAINS(s.message(), "shard s3.safetensors");
  EXPECT_CONTAINS(s.message(), index_path());
}

TEST_F(ShardedTest, TensorMissingFromShard) {
  WriteIndex(
      R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors","d":"s2.safetensors"})");
  Status s = OpenStatus();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_CONTAINS(s.message(), "tensor d is mapped to shard s2.safetensors");
  EXPECT_CONTAINS(s.message(), dir_.File("s2.safetensors"));
}

TEST_F(ShardedTest, TensorNotInIndex) {
  WriteIndex(R"({"a":"s1.safetensors","c":"s2.safetensors"})");
  Status s = OpenStatus();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_CONTAINS(s.message(), "tensor b is in this shard but not in index");
  EXPECT_CONTAINS(s.message(), dir_.File("s1.safetensors"));
}

TEST_F(ShardedTest, TensorMappedToWrongShard) {
  WriteIndex(
      R"({"a":"s1.safetensors","b":"s2.safetensors","c":"s2.safetensors"})");
  Status s = OpenStatus();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_CONTAINS(s.message(), "tensor b");
  EXPECT_CONTAINS(s.message(), "maps it to s2.safetensors");
}

TEST_F(ShardedTest, TensorInTwoShards) {
  WriteFile(dir_, "s3.safetensors",
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  WriteIndex(
      R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors","x":"s3.safetensors"})");
  Status s = OpenStatus();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_CONTAINS(
      s.message(),
      "tensor a is in two shards, s1.safetensors and s3.safetensors");
}

TEST_F(ShardedTest, CorruptShardNamesFile) {
  WriteIndex(
      R"({"a":"s1.safetensors","b":"s1.safetensors","c":"goldens.safetensors"})");
  Status s = OpenStatus();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_CONTAINS(s.message(), dir_.File("goldens.safetensors"));
}

TEST_F(ShardedTest, BadIndexFiles) {
  struct Case {
    std::string text;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"{not json", "not valid JSON"},
      {"[]", "index is a JSON array"},
      {R"({"metadata":{}})", "no \"weight_map\""},
      {R"({"weight_map":[]})", "weight_map is a JSON array"},
      {R"({"weight_map":{"a":3}})", "entry for tensor a is a JSON number"},
      {R"({"weight_map":{"a":"s1.safetensors","a":"s1.safetensors"}})",
       "tensor a twice"},
      {R"({"weight_map":{"a":"../s1.safetensors"}})",
       "inside the model directory"},
      {R"({"weight_map":{"a":"/etc/passwd"}})", "inside the model directory"},
      {R"({"metadata":[],"weight_map":{}})", "metadata is a JSON array"},
      {R"({"metadata":{"total_size":-3},"weight_map":{}})", "total_size is -3"},
      {R"({"metadata":{"total_size":"12"},"weight_map":{}})",
       "total_size is \"12\""},
  };
  for (const Case& c : cases) {
    WriteBytes(index_path(), c.text);
    Status s = ReadSafetensorsIndex(index_path()).status();
    EXPECT_EQ(s.code(), StatusCode::kDataLoss)
        << c.text << " -> " << s.ToString();
    EXPECT_CONTAINS(s.message(), index_path()) << c.text;
    EXPECT_CONTAINS(s.message(), c.expect) << c.text;
    EXPECT_EQ(Checkpoint::Open(dir_.path()).status().code(),
              StatusCode::kDataLoss)
        << c.text;
  }
}

TEST_F(ShardedTest, TotalSizeAsIntegralFloat) {
  WriteIndex(
      R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"})",
      R"("metadata":{"total_size":19.0},)");
  auto index = ReadSafetensorsIndex(index_path());
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->total_size, 19);
}

TEST(CheckpointTest, SingleFileAndNotFound) {
  TempDir dir;
  Status s = Checkpoint::Open(dir.path()).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_CONTAINS(s.message(), "model.safetensors.index.json");
  EXPECT_CONTAINS(s.message(), "model.safetensors");
  EXPECT_CONTAINS(s.message(), dir.path());
  // Other safetensors files are never picked up.
  WriteFile(dir, "other.safetensors", "{}", 0);
  EXPECT_EQ(Checkpoint::Open(dir.path()).status().code(),
            StatusCode::kNotFound);

  WriteFile(dir, "model.safetensors",
            R"({"w":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]}})", 8);
  auto c = Checkpoint::Open(dir.path() + "/");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->entries().size(), 1u);
  EXPECT_EQ((*c)->total_bytes(), 8);
  EXPECT_EQ((*c)->files()[0]->path(), dir.File("model.safetensors"));

  s = Checkpoint::Open(dir.File("missing_dir")).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  s = Checkpoint::Open(dir.File("model.safetensors")).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
}

}  // namespace
}  // namespace loom
