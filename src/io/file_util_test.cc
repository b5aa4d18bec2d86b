// The durable-write helpers: whole-file replace (temp + write + fsync +
// rename + fsync dir), append and truncate, and their failure modes; the
// exclusive file lock, within a process and across processes.
#include "src/io/file_util.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>
#include <utility>

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

TEST(FileLockTest, ExclusiveWithinAProcessAndReleasedOnDestruction) {
  TempDir dir;
  const std::string path = dir.File(".lock");
  std::optional<FileLock> held;
  {
    auto lock = FileLock::Acquire(path);
    ASSERT_TRUE(lock.ok()) << lock.status().ToString();
    EXPECT_EQ(lock->path(), path);
    EXPECT_TRUE(std::filesystem::exists(path));
    // A second open file description of the same file is refused at once.
    const auto second = FileLock::Acquire(path);
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(second.status().message(), path + ": locked by another process");
    held.emplace(*std::move(lock));  // moved: still held
  }
  EXPECT_EQ(FileLock::Acquire(path).status().code(),
            StatusCode::kFailedPrecondition);
  held.reset();
  EXPECT_TRUE(FileLock::Acquire(path).ok());
  // Never written nor removed.
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(ReadBytes(path), "");
}

TEST(FileLockTest, ExistingFileIsLockedAsIsAndMissingDirIsNotFound) {
  TempDir dir;
  const std::string path = dir.File("held");
  WriteBytes(path, "someone's bytes");
  ASSERT_TRUE(FileLock::Acquire(path).ok());
  EXPECT_EQ(ReadBytes(path), "someone's bytes");
  const auto missing = FileLock::Acquire(dir.File("no/such/dir/.lock"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(missing.status().message(), "no/such/dir/.lock");
}

// Another process holding the lock refuses this one; its death, even by
// SIGKILL, releases it.
TEST(FileLockTest, HeldByAnotherProcessUntilItIsKilled) {
  TempDir dir;
  const std::string path = dir.File(".lock");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    const auto lock = FileLock::Acquire(path);
    const char c = lock.ok() ? 'y' : 'n';
    if (::write(ready[1], &c, 1) != 1) ::_exit(2);
    for (;;) ::pause();  // holds the lock until killed
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(c, 'y') << "the child could not take the lock";
  const auto refused = FileLock::Acquire(path);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition)
      << refused.status().ToString();
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  const auto after = FileLock::Acquire(path);
  EXPECT_TRUE(after.ok()) << after.status().ToString();
}

}  // namespace
}  // namespace loom
