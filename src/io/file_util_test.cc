// The durable-write helpers: whole-file replace (temp + write + fsync +
// rename + fsync dir), append and truncate, and their failure modes.
#include "src/io/file_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "src/io/test_util.h"

namespace loom {
namespace {

using ::loom::testing::ReadBytes;
using ::loom::testing::TempDir;
using ::loom::testing::WriteBytes;

TEST(DurableWriteTest, CreatesAndReplacesWholeFile) {
  TempDir dir;
  const std::string path = dir.File("m.json");
  ASSERT_TRUE(WriteFileDurably(path, "first version\n").ok());
  EXPECT_EQ(ReadBytes(path), "first version\n");
  ASSERT_TRUE(WriteFileDurably(path, "v2").ok());
  EXPECT_EQ(ReadBytes(path), "v2");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  ASSERT_TRUE(WriteFileDurably(path, "").ok());
  EXPECT_EQ(ReadBytes(path), "");
}

TEST(DurableWriteTest, FailedFillLeavesOldFileAndNoTemp) {
  TempDir dir;
  const std::string path = dir.File("data.bin");
  WriteBytes(path, "old bytes");
  auto fd = io_internal::ReplaceFileDurably(
      path, [](int fd, const std::string& tmp) -> Status {
        const std::string part = "half of the new";
        RETURN_IF_ERROR(io_internal::PwriteFully(
            fd, tmp, part.data(), static_cast<int64_t>(part.size()), 0));
        return IoError(tmp + ": simulated failure");
      });
  ASSERT_FALSE(fd.ok());
  EXPECT_CONTAINS(fd.status().message(), "simulated failure");
  EXPECT_EQ(ReadBytes(path), "old bytes");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(DurableWriteTest, ReturnsOpenDescriptorOfNewFile) {
  TempDir dir;
  const std::string path = dir.File("k.bin");
  auto fd =
      io_internal::ReplaceFileDurably(path, [](int fd, const std::string& tmp) {
        return io_internal::PwriteFully(fd, tmp, "abc", 3, 0);
      });
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  ASSERT_TRUE(fd->valid());
  // The descriptor is the renamed file: writing through it changes `path`.
  ASSERT_TRUE(io_internal::PwriteFully(fd->get(), path, "d", 1, 3).ok());
  EXPECT_EQ(ReadBytes(path), "abcd");
}

TEST(DurableWriteTest, MissingDirectoryIsNotFound) {
  TempDir dir;
  const Status s = WriteFileDurably(dir.File("no/such/dir/f"), "x");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(s.message(), "no/such/dir/f.tmp");
}

TEST(DurableWriteTest, AppendAndTruncate) {
  TempDir dir;
  const std::string path = dir.File("rows.jsonl");
  EXPECT_EQ(AppendFileDurably(path, "x").code(), StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(path));  // never created
  WriteBytes(path, "a\n");
  ASSERT_TRUE(AppendFileDurably(path, "b\n").ok());
  ASSERT_TRUE(AppendFileDurably(path, "c\n").ok());
  EXPECT_EQ(ReadBytes(path), "a\nb\nc\n");
  ASSERT_TRUE(TruncateFileDurably(path, 4).ok());
  EXPECT_EQ(ReadBytes(path), "a\nb\n");
  ASSERT_TRUE(TruncateFileDurably(path, 4).ok());  // already that size
  const Status shorter = TruncateFileDurably(path, 10);
  EXPECT_EQ(shorter.code(), StatusCode::kDataLoss);
  EXPECT_CONTAINS(shorter.message(), "4 bytes, expected at least 10");
  EXPECT_EQ(ReadBytes(path), "a\nb\n");
  EXPECT_EQ(TruncateFileDurably(dir.File("absent"), 0).code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace loom
