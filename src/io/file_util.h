// Small POSIX file utilities. Those in io_internal are shared by the io module
// (internal to src/io); the durable writes at the end (namespace loom) are
// public: every "replace a file so that a crash leaves the old or the new one"
// in Loom goes through ReplaceFileDurably, and FileLock is the exclusive lock
// a job takes on the directory it writes. Every failure is a Status whose
// message names the path, the operation and strerror(errno). The functions keep
// no state and are thread-safe.
#ifndef LOOM_IO_FILE_UTIL_H_
#define LOOM_IO_FILE_UTIL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "src/base/status.h"

namespace loom::io_internal {

// Status for a failed system call: NotFound for ENOENT, IoError otherwise.
// Message: "<path>: <op>: <strerror>".
Status ErrnoStatus(const std::string& path, const char* op, int err);

// Owns a file descriptor; closes it on destruction. Movable, not copyable.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.Release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = o.Release();
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset();

 private:
  int fd_ = -1;
};

// Opens `path` with `flags` (O_CLOEXEC is added) and `mode`.
StatusOr<UniqueFd> OpenFile(const std::string& path, int flags,
                            int mode = 0644);
// Size of an open regular file. IoError when it is none: for a directory
// "<path>: read: Is a directory", as ReadFileToString says it.
StatusOr<int64_t> RegularFileSize(int fd, const std::string& path);
// Reads exactly `n` bytes at `offset` (retrying short reads and EINTR);
// DataLoss if the file ends first.
Status PreadFully(int fd, const std::string& path, void* buf, int64_t n,
                  int64_t offset);
// Writes exactly `n` bytes at `offset` (retrying short writes and EINTR).
Status PwriteFully(int fd, const std::string& path, const void* buf, int64_t n,
                   int64_t offset);
// fsync / fdatasync with a Status.
Status Fsync(int fd, const std::string& path);
Status Fdatasync(int fd, const std::string& path);
// fsyncs the directory containing `path` (makes a rename durable).
Status FsyncParentDir(const std::string& path);
// rename(2) with a Status.
Status RenameFile(const std::string& from, const std::string& to);
// True if `path` exists (any type). `is_dir` receives whether it is a
// directory.
bool PathExists(const std::string& path, bool* is_dir = nullptr);
// "dir/name" (no doubled '/').
std::string JoinPath(const std::string& dir, const std::string& name);

// Writes the content of a file being created: `fd` is open O_RDWR on
// `tmp_path`, empty.
using FileFiller = std::function<Status(int fd, const std::string& tmp_path)>;

// The one durable replace: creates `path + ".tmp"`, lets `fill` write it,
// fsyncs it, renames it over `path` and fsyncs the directory, so `path` is
// either the old file or the complete new one after a crash. On failure the
// temporary file is removed and `path` is untouched. Returns the descriptor
// of the new file, still open (callers that hold a lock or keep writing use
// it; others let it close).
StatusOr<UniqueFd> ReplaceFileDurably(const std::string& path,
                                      const FileFiller& fill);

}  // namespace loom::io_internal

namespace loom {

// The size in bytes of the file `path`: NotFound when it does not exist,
// IoError for any other failure (both naming the path).
StatusOr<int64_t> FileSize(const std::string& path);

// Replaces `path` with `content` durably (see
// io_internal::ReplaceFileDurably).
Status WriteFileDurably(const std::string& path, std::string_view content);

// Replaces `to` with a copy of the file `from`, durably (see
// io_internal::ReplaceFileDurably); NotFound if `from` does not exist.
Status CopyFileDurably(const std::string& from, const std::string& to);

// Appends `content` at the end of the existing file `path` and fdatasyncs it.
// NotFound if the file does not exist (it is never created here).
Status AppendFileDurably(const std::string& path, std::string_view content);

// Renames `from` to `to` (replacing it) and fsyncs the directory.
Status RenameDurably(const std::string& from, const std::string& to);

// Cuts the existing file `path` to `size` bytes and fdatasyncs it. NotFound if
// it does not exist; DataLoss if it is shorter than `size` (nothing changes).
Status TruncateFileDurably(const std::string& path, int64_t size);

// An exclusive advisory lock (flock LOCK_EX | LOCK_NB) on the file `path`,
// held until the object is destroyed or the process ends (the kernel drops it
// when the descriptor closes, SIGKILL included). The file is created empty
// if absent and is never written or removed: removing it on release would let
// a process that opened the old file and one that creates a new one both
// hold "the" lock. flock locks an open file description, so a second Acquire
// of the same path fails in the same process too. Movable, not copyable.
class FileLock {
 public:
  // FailedPrecondition "<path>: locked by another process" when another open
  // file description holds it (never waits); NotFound when the directory
  // does not exist; IoError for any other failure (naming path, operation
  // and strerror).
  static StatusOr<FileLock> Acquire(const std::string& path);

  FileLock(FileLock&&) = default;
  FileLock& operator=(FileLock&&) = default;

  const std::string& path() const { return path_; }

 private:
  FileLock(std::string path, io_internal::UniqueFd fd)
      : path_(std::move(path)), fd_(std::move(fd)) {}

  std::string path_;
  io_internal::UniqueFd fd_;
};

}  // namespace loom

#endif  // LOOM_IO_FILE_UTIL_H_
