#include "src/io/npy.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "src/base/float16.h"
#include "src/io/test_util.h"

namespace loom {
namespace {

using ::loom::testing::ReadBytes;
using ::loom::testing::TempDir;
using ::loom::testing::WriteBytes;

std::vector<float> Rows(int64_t first_row, int64_t n, int64_t cols) {
  std::vector<float> v(static_cast<size_t>(n * cols));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < cols; ++c)
      v[r * cols + c] = static_cast<float>((first_row + r) * 1000 + c);
  return v;
}

void AppendRaw(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::app);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(NpyWriterTest, HeaderIsValidNpy) {
  TempDir dir;
  const std::string path = dir.File("a.npy");
  auto w = NpyWriter::Create(path, DType::kF32, {4, 8});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::string raw = ReadBytes(path);
  ASSERT_EQ(raw.size() % 64, 0u);
  EXPECT_EQ(raw.substr(0, 6), "\x93NUMPY");
  EXPECT_EQ(raw[6], 1);
  EXPECT_EQ(raw[7], 0);
  const size_t header_len =
      static_cast<uint8_t>(raw[8]) | (static_cast<uint8_t>(raw[9]) << 8);
  EXPECT_EQ(10 + header_len, raw.size());
  EXPECT_EQ(raw.back(), '\n');
  EXPECT_EQ(raw.substr(10, raw.find('}') - 9),
            "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4, 8), }");
  // Room for a 16-digit row count.
  EXPECT_GE(header_len, std::string("{'descr': '<f4', 'fortran_order': False, "
                                    "'shape': (1000000000000000, 4, 8), }\n")
                            .size());

  auto h = ReadNpyHeader(path);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->descr, "<f4");
  EXPECT_EQ(h->dtype, DType::kF32);
  EXPECT_FALSE(h->fortran_order);
  EXPECT_EQ(h->shape, (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(h->data_offset, static_cast<int64_t>(raw.size()));
  EXPECT_EQ((*w)->row_bytes(), 128);
}

// NpyBytes: a whole .npy in memory that ReadNpy reads back (1-D and 2-D,
// f32 and bf16), with a 64-aligned header; bad input refused.
TEST(NpyBytesTest, ReadsBackAsAFile) {
  TempDir dir;
  const std::vector<float> v = Rows(0, 2, 3);
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{6}, std::vector<int64_t>{2, 3}}) {
    auto bytes = NpyBytes(DType::kF32, shape, v.data(), 24);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    WriteBytes(dir.File("m.npy"), *bytes);
    auto a = ReadNpy(dir.File("m.npy"));
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(a->header.shape, shape);
    EXPECT_EQ(a->header.descr, "<f4");
    EXPECT_EQ(a->header.data_offset % 64, 0);
    EXPECT_EQ(static_cast<int64_t>(bytes->size()), a->header.data_offset + 24);
    EXPECT_EQ(std::memcmp(a->data.data(), v.data(), 24), 0);
  }
  const uint16_t h[2] = {F32ToBf16(1.5f), F32ToBf16(-2.0f)};
  auto bf = NpyBytes(DType::kBF16, {2}, h, 4);
  ASSERT_TRUE(bf.ok());
  WriteBytes(dir.File("b.npy"), *bf);
  auto b = ReadNpy(dir.File("b.npy"));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->header.descr, "<u2");
  EXPECT_FALSE(NpyBytes(DType::kF32, {}, v.data(), 0).ok());
  EXPECT_FALSE(NpyBytes(DType::kF32, {5}, v.data(), 24).ok());
  EXPECT_FALSE(NpyBytes(DType::kF32, {-1}, v.data(), 0).ok());
}

TEST(NpyWriterTest, AppendCommitRead) {
  TempDir dir;
  const std::string path = dir.File("a.npy");
  auto w = NpyWriter::Create(path, DType::kF32, {3});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const int64_t offset = ReadNpyHeader(path)->data_offset;
  auto rows = Rows(0, 5, 3);
  ASSERT_TRUE((*w)->Append(rows.data(), 2 * 12).ok());
  EXPECT_EQ((*w)->rows(), 2);
  EXPECT_EQ((*w)->committed_rows(), 0);
  EXPECT_EQ(ReadNpyHeader(path)->shape[0], 0);  // not committed yet
  ASSERT_TRUE((*w)->Commit().ok());
  EXPECT_EQ((*w)->committed_rows(), 2);
  ASSERT_TRUE((*w)->AppendRows(rows.data() + 6, 3).ok());
  ASSERT_TRUE((*w)->Commit().ok());
  ASSERT_TRUE((*w)->Commit().ok());  // nothing new: no-op
  auto a = ReadNpy(path);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->header.shape, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(a->header.data_offset, offset);  // the header never grows
  ASSERT_EQ(a->data.size(), 60u);
  EXPECT_EQ(std::memcmp(a->data.data(), rows.data(), 60), 0);
  EXPECT_EQ(std::filesystem::file_size(path),
            static_cast<uintmax_t>(offset + 60));
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_EQ((*w)->Append(rows.data(), 12).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ((*w)->Commit().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*w)->Close().code(), StatusCode::kFailedPrecondition);
}

TEST(NpyWriterTest, AppendRejectsPartialRows) {
  TempDir dir;
  auto w = NpyWriter::Create(dir.File("a.npy"), DType::kI32, {2});
  ASSERT_TRUE(w.ok());
  int32_t x[3] = {1, 2, 3};
  Status s = (*w)->Append(x, 12);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_CONTAINS(s.message(), "12 bytes is not a whole number of 8-byte rows");
  EXPECT_EQ((*w)->rows(), 0);
  EXPECT_TRUE((*w)->Append(x, 0).ok());
}

TEST(NpyWriterTest, ReopenTruncatesUncommittedRows) {
  TempDir dir;
  const std::string path = dir.File("a.npy");
  auto rows = Rows(0, 10, 4);
  int64_t offset = 0;
  {
    auto w = NpyWriter::Create(path, DType::kF32, {4});
    ASSERT_TRUE(w.ok());
    offset = ReadNpyHeader(path)->data_offset;
    ASSERT_TRUE((*w)->AppendRows(rows.data(), 3).ok());
    ASSERT_TRUE((*w)->Commit().ok());
    ASSERT_TRUE((*w)->AppendRows(rows.data() + 12, 2).ok());  // never committed
  }  // "crash": destroyed without Commit
  // A torn write after the uncommitted rows too.
  AppendRaw(path, "xyz");
  EXPECT_EQ(std::filesystem::file_size(path),
            static_cast<uintmax_t>(offset + 5 * 16 + 3));
  // Readers see exactly the committed rows meanwhile.
  auto a = ReadNpy(path);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->header.shape[0], 3);

  auto w = NpyWriter::OpenForAppend(path);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)->committed_rows(), 3);
  EXPECT_EQ((*w)->rows(), 3);
  EXPECT_EQ((*w)->dtype(), DType::kF32);
  EXPECT_EQ((*w)->row_shape(), (std::vector<int64_t>{4}));
  EXPECT_EQ(std::filesystem::file_size(path),
            static_cast<uintmax_t>(offset + 3 * 16));
  ASSERT_TRUE((*w)->AppendRows(rows.data() + 12, 7).ok());
  ASSERT_TRUE((*w)->Close().ok());
  a = ReadNpy(path);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->header.shape, (std::vector<int64_t>{10, 4}));
  EXPECT_EQ(std::memcmp(a->data.data(), rows.data(), rows.size() * 4), 0);
}

// A file cut below the rows to keep is refused before any byte changes (the
// header is not rolled back first).
TEST(NpyWriterTest, TruncatedFileIsRefusedUnchanged) {
  TempDir dir;
  const std::string path = dir.File("a.npy");
  auto rows = Rows(0, 6, 4);
  {
    auto w = NpyWriter::Create(path, DType::kF32, {4});
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->AppendRows(rows.data(), 6).ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  const int64_t offset = ReadNpyHeader(path)->data_offset;
  ASSERT_EQ(::truncate(path.c_str(), offset + 3 * 16 + 5), 0);
  const std::string before = ReadBytes(path);
  for (int64_t keep : {4, 5, 6}) {
    auto w = NpyWriter::OpenForAppend(path, keep);
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), StatusCode::kDataLoss);
    EXPECT_CONTAINS(w.status().message(),
                    "header commits " + std::to_string(keep) + " rows");
    EXPECT_EQ(ReadBytes(path), before) << "keep " << keep;
  }
  auto w = NpyWriter::OpenForAppend(path);
  EXPECT_EQ(w.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(ReadBytes(path), before);
  // Keeping what is there rolls back to it.
  auto ok = NpyWriter::OpenForAppend(path, 3);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)->committed_rows(), 3);
}

TEST(NpyWriterTest, CommittedBytesAreNeverRewritten) {
  TempDir dir;
  const std::string path = dir.File("a.npy");
  auto rows = Rows(0, 4, 2);
  {
    auto w = NpyWriter::Create(path, DType::kF32, {2});
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->AppendRows(rows.data(), 4).ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  // Scribble a marker into committed data: a reopen + append must keep it.
  const int64_t offset = ReadNpyHeader(path)->data_offset;
  {
    int fd = ::open(path.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, "MARK", 4, offset), 4);
    ::close(fd);
  }
  auto w = NpyWriter::OpenForAppend(path);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE((*w)->AppendRows(rows.data(), 1).ok());
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_EQ(ReadBytes(path).substr(offset, 4), "MARK");
}

TEST(NpyWriterTest, SecondWriterIsRefused) {
  TempDir dir;
  const std::string path = dir.File("a.npy");
  auto w = NpyWriter::Create(path, DType::kF32, {2});
  ASSERT_TRUE(w.ok());
  Status s = NpyWriter::OpenForAppend(path).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_CONTAINS(s.message(), "another NpyWriter");
  w->reset();
  EXPECT_TRUE(NpyWriter::OpenForAppend(path).ok());
}

TEST(NpyWriterTest, DTypes) {
  TempDir dir;
  const std::vector<std::pair<DType, std::string>> cases = {
      {DType::kF32, "<f4"}, {DType::kBF16, "<u2"}, {DType::kF16, "<f2"},
      {DType::kF64, "<f8"}, {DType::kI64, "<i8"},  {DType::kI32, "<i4"},
      {DType::kI16, "<i2"}, {DType::kI8, "|i1"},   {DType::kU8, "|u1"},
      {DType::kBool, "|b1"}};
  for (const auto& [dtype, descr] : cases) {
    const std::string path = dir.File(std::string(DTypeName(dtype)) + ".npy");
    auto w = NpyWriter::Create(path, dtype, {3});
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    std::vector<uint8_t> row(3 * DTypeSize(dtype), 1);
    ASSERT_TRUE(
        (*w)->Append(row.data(), static_cast<int64_t>(row.size())).ok());
    ASSERT_TRUE((*w)->Close().ok());
    auto h = ReadNpyHeader(path);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_EQ(h->descr, descr);
    EXPECT_EQ(h->dtype, dtype);
    EXPECT_EQ(NpyDescr(dtype), descr);
    EXPECT_EQ(h->shape, (std::vector<int64_t>{1, 3}));
  }
  Status s =
      NpyWriter::Create(dir.File("f8.npy"), DType::kF8E4M3, {3}).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_CONTAINS(s.message(), "F8_E4M3");
  s = NpyWriter::Create(dir.File("zero.npy"), DType::kF32, {3, 0}).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
}

TEST(NpyWriterTest, OneDimensional) {
  TempDir dir;
  const std::string path = dir.File("v.npy");
  auto w = NpyWriter::Create(path, DType::kI64, {});
  ASSERT_TRUE(w.ok());
  int64_t v[3] = {5, 6, 7};
  ASSERT_TRUE((*w)->AppendRows(v, 3).ok());
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_CONTAINS(ReadBytes(path), "'shape': (3,), }");
  auto a = ReadNpy(path);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->header.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(std::memcmp(a->data.data(), v, 24), 0);
  EXPECT_TRUE(NpyWriter::OpenForAppend(path).ok());
}

// Builds an npy file by hand: version 1.0, `dict` padded to `total` bytes.
std::string HandNpy(const std::string& dict, size_t total,
                    const std::string& data) {
  std::string out("\x93NUMPY\x01\x00", 8);
  size_t header_len = total - 10;
  out += static_cast<char>(header_len & 0xff);
  out += static_cast<char>(header_len >> 8);
  out += dict;
  out.append(header_len - dict.size() - 1, ' ');
  out += '\n';
  return out + data;
}

TEST(NpyReaderTest, ForeignHeaders) {
  TempDir dir;
  const std::string path = dir.File("f.npy");
  // Compact spelling, double quotes, Python 2 long suffix.
  WriteBytes(path,
             HandNpy(R"({"descr":"<i4","shape":(2L,1),"fortran_order":False})",
                     64, std::string(8, '\1')));
  auto h = ReadNpyHeader(path);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->dtype, DType::kI32);
  EXPECT_EQ(h->shape, (std::vector<int64_t>{2, 1}));
  // A tight header has no room to grow: appending is refused up front.
  Status s = NpyWriter::OpenForAppend(path).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_CONTAINS(s.message(), "no room");

  // numpy's own layout (64-byte aligned, 128 bytes for this dict) has room.
  WriteBytes(
      path,
      HandNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
              128, std::string(24, 0)));
  auto w = NpyWriter::OpenForAppend(path);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)->committed_rows(), 2);
}

TEST(NpyReaderTest, BadFiles) {
  TempDir dir;
  const std::string path = dir.File("bad.npy");
  struct Case {
    std::string bytes;
    StatusCode code;
    std::string expect;
  };
  const std::string good_dict =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  const std::vector<Case> cases = {
      {"short", StatusCode::kDataLoss, "too short"},
      {std::string("\x93NUMPZ\x01\x00\x10\x00", 10) + std::string(16, ' '),
       StatusCode::kDataLoss, "bad magic"},
      {HandNpy(good_dict, 128, "").substr(0, 100), StatusCode::kDataLoss,
       "runs past the end"},
      {HandNpy("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 128,
               std::string(8, 0)),
       StatusCode::kUnimplemented, "'>f4'"},
      {HandNpy(
           "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }",
           128, ""),
       StatusCode::kDataLoss, "structured"},
      {HandNpy("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }", 128,
               ""),
       StatusCode::kDataLoss, "fortran_order"},
      {HandNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }",
               128, ""),
       StatusCode::kDataLoss, "non-integer"},
      {HandNpy("{'descr': '<f4', 'fortran_order': False}", 64, ""),
       StatusCode::kDataLoss, "missing"},
      {HandNpy(
           "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}",
           128, ""),
       StatusCode::kDataLoss, "unexpected key 'x'"},
  };
  for (const Case& c : cases) {
    WriteBytes(path, c.bytes);
    Status s = ReadNpyHeader(path).status();
    EXPECT_EQ(s.code(), c.code) << s.ToString();
    EXPECT_CONTAINS(s.message(), path);
    EXPECT_CONTAINS(s.message(), c.expect);
  }
  // Header fine, data short: ReadNpy and OpenForAppend report lost data.
  WriteBytes(path, HandNpy(good_dict, 128, std::string(4, 0)));
  EXPECT_TRUE(ReadNpyHeader(path).ok());
  Status s = ReadNpy(path).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  s = NpyWriter::OpenForAppend(path).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_CONTAINS(s.message(), "commits 2 rows");
  // Fortran order cannot be appended to.
  WriteBytes(
      path,
      HandNpy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 128,
              std::string(16, 0)));
  EXPECT_EQ(NpyWriter::OpenForAppend(path).status().code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(NpyWriter::OpenForAppend(dir.File("absent.npy")).status().code(),
            StatusCode::kNotFound);
}

// ---------------------------------------------------------------- numpy

// A Python interpreter with numpy: $LOOM_PYTHON, else python3, else the
// system one. Empty if none.
std::string PythonWithNumpy() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("LOOM_PYTHON"); env && *env)
    candidates.push_back(env);
  candidates.push_back("python3");
  candidates.push_back("/usr/bin/python3");
  for (const std::string& py : candidates) {
    if (std::system((py + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0)
      return py;
  }
  return {};
}

TEST(NpyNumpyTest, NumpyLoadsEveryCommittedState) {
  const std::string py = PythonWithNumpy();
  if (py.empty())
    GTEST_SKIP() << "SKIPPED: python3 with numpy not found (set LOOM_PYTHON); "
                    "npy files not checked by numpy";
  TempDir dir;
  const std::string path = dir.File("acts.npy");
  const std::string script = dir.File("check.py");
  {
    std::ofstream f(script);
    f << R"PY(
import sys, numpy as np
path, rows, cols = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for mm in ("r", None):
    a = np.load(path, mmap_mode=mm)
    assert a.dtype == np.float32, a.dtype
    assert a.shape == (rows, cols), a.shape
    want = (np.arange(rows)[:, None] * 1000 + np.arange(cols)[None, :]).astype(np.float32)
    assert np.array_equal(np.asarray(a), want), a
b = np.load(sys.argv[4], mmap_mode="r")
assert b.dtype == np.uint16 and b.shape == (2, 3), (b.dtype, b.shape)
f = (b.astype(np.uint32) << 16).view(np.float32)
assert np.array_equal(f, np.array([[1.0, 2.0, -3.0], [0.5, 0.0, 65536.0]], np.float32)), f
)PY";
  }
  // bf16 side file.
  const std::string bf16_path = dir.File("bf16.npy");
  {
    auto w = NpyWriter::Create(bf16_path, DType::kBF16, {3});
    ASSERT_TRUE(w.ok());
    std::vector<uint16_t> v;
    for (float x : {1.0f, 2.0f, -3.0f, 0.5f, 0.0f, 65536.0f})
      v.push_back(F32ToBf16(x));
    ASSERT_TRUE((*w)->AppendRows(v.data(), 2).ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  auto check = [&](int rows) {
    std::string cmd = py + " " + script + " " + path + " " +
                      std::to_string(rows) + " 5 " + bf16_path;
    EXPECT_EQ(std::system(cmd.c_str()), 0)
        << "numpy check failed at " << rows << " rows: " << cmd;
  };
  auto rows = Rows(0, 9, 5);
  auto w = NpyWriter::Create(path, DType::kF32, {5});
  ASSERT_TRUE(w.ok());
  check(0);
  ASSERT_TRUE((*w)->AppendRows(rows.data(), 4).ok());
  check(0);  // appended, not committed
  ASSERT_TRUE((*w)->Commit().ok());
  check(4);
  ASSERT_TRUE((*w)->AppendRows(rows.data() + 20, 2).ok());
  AppendRaw(path, "torn");  // garbage after uncommitted rows
  check(4);
  w->reset();
  auto w2 = NpyWriter::OpenForAppend(path);
  ASSERT_TRUE(w2.ok()) << w2.status().ToString();
  check(4);
  ASSERT_TRUE((*w2)->AppendRows(rows.data() + 20, 5).ok());
  ASSERT_TRUE((*w2)->Commit().ok());
  check(9);
}

}  // namespace
}  // namespace loom
