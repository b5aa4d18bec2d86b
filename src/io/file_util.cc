#include "src/io/file_util.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace loom::io_internal {

Status ErrnoStatus(const std::string& path, const char* op, int err) {
  std::string message = path + ": " + op + ": " + std::strerror(err);
  if (err == ENOENT) return NotFoundError(std::move(message));
  return IoError(std::move(message));
}

void UniqueFd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

StatusOr<UniqueFd> OpenFile(const std::string& path, int flags, int mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoStatus(path, "open", errno);
  return UniqueFd(fd);
}

StatusOr<int64_t> RegularFileSize(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(path, "fstat", errno);
  // A directory reads as ReadFileToString reports it (the read(2) that
  // would follow fails with EISDIR).
  if (S_ISDIR(st.st_mode)) return ErrnoStatus(path, "read", EISDIR);
  if (!S_ISREG(st.st_mode))
    return IoError(path + ": not a regular file (a pipe, socket or device)");
  return static_cast<int64_t>(st.st_size);
}

Status PreadFully(int fd, const std::string& path, void* buf, int64_t n,
                  int64_t offset) {
  auto* p = static_cast<char*>(buf);
  int64_t done = 0;
  while (done < n) {
    ssize_t r =
        ::pread(fd, p + done, static_cast<size_t>(n - done), offset + done);
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(path, "read", errno);
    }
    if (r == 0) {
      return DataLossError(path + ": file ends at byte " +
                           std::to_string(offset + done) + ", expected " +
                           std::to_string(n) + " bytes at offset " +
                           std::to_string(offset));
    }
    done += r;
  }
  return Status::Ok();
}

Status PwriteFully(int fd, const std::string& path, const void* buf, int64_t n,
                   int64_t offset) {
  const auto* p = static_cast<const char*>(buf);
  int64_t done = 0;
  while (done < n) {
    // Linux caps one write at ~2 GiB; chunk to stay well below.
    size_t chunk =
        static_cast<size_t>(std::min<int64_t>(n - done, int64_t{1} << 30));
    ssize_t r = ::pwrite(fd, p + done, chunk, offset + done);
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(path, "write", errno);
    }
    if (r == 0) return IoError(path + ": write returned 0 bytes");
    done += r;
  }
  return Status::Ok();
}

Status Fsync(int fd, const std::string& path) {
  if (::fsync(fd) != 0) return ErrnoStatus(path, "fsync", errno);
  return Status::Ok();
}

Status Fdatasync(int fd, const std::string& path) {
  if (::fdatasync(fd) != 0) return ErrnoStatus(path, "fdatasync", errno);
  return Status::Ok();
}

Status FsyncParentDir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  std::string dir = slash == std::string::npos
                        ? "."
                        : (slash == 0 ? "/" : path.substr(0, slash));
  ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(dir, O_RDONLY | O_DIRECTORY));
  return Fsync(fd.get(), dir);
}

Status RenameFile(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoStatus(from, ("rename to " + to).c_str(), errno);
  }
  return Status::Ok();
}

bool PathExists(const std::string& path, bool* is_dir) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  if (is_dir) *is_dir = S_ISDIR(st.st_mode);
  return true;
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

StatusOr<UniqueFd> ReplaceFileDurably(const std::string& path,
                                      const FileFiller& fill) {
  const std::string tmp = path + ".tmp";
  ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(tmp, O_RDWR | O_CREAT | O_TRUNC));
  Status s = fill(fd.get(), tmp);
  if (s.ok()) s = Fsync(fd.get(), tmp);
  if (s.ok()) s = RenameFile(tmp, path);
  if (!s.ok()) {
    fd.Reset();
    ::unlink(tmp.c_str());
    return s;
  }
  RETURN_IF_ERROR(FsyncParentDir(path));
  return fd;
}

}  // namespace loom::io_internal

namespace loom {

using io_internal::UniqueFd;

StatusOr<int64_t> FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return io_internal::ErrnoStatus(path, "stat", errno);
  return static_cast<int64_t>(st.st_size);
}

Status WriteFileDurably(const std::string& path, std::string_view content) {
  return io_internal::ReplaceFileDurably(
             path,
             [&](int fd, const std::string& tmp) {
               return io_internal::PwriteFully(
                   fd, tmp, content.data(),
                   static_cast<int64_t>(content.size()), 0);
             })
      .status();
}

Status CopyFileDurably(const std::string& from, const std::string& to) {
  ASSIGN_OR_RETURN(UniqueFd src, io_internal::OpenFile(from, O_RDONLY));
  ASSIGN_OR_RETURN(int64_t size, io_internal::RegularFileSize(src.get(), from));
  std::vector<char> buf(static_cast<size_t>(
      std::min<int64_t>(size, int64_t{16} << 20)));  // [chunk]
  return io_internal::ReplaceFileDurably(
             to,
             [&](int fd, const std::string& tmp) -> Status {
               for (int64_t at = 0; at < size;) {
                 const int64_t n = std::min<int64_t>(
                     static_cast<int64_t>(buf.size()), size - at);
                 RETURN_IF_ERROR(
                     io_internal::PreadFully(src.get(), from, buf.data(), n, at));
                 RETURN_IF_ERROR(
                     io_internal::PwriteFully(fd, tmp, buf.data(), n, at));
                 at += n;
               }
               return Status();
             })
      .status();
}

Status AppendFileDurably(const std::string& path, std::string_view content) {
  ASSIGN_OR_RETURN(UniqueFd fd, io_internal::OpenFile(path, O_WRONLY));
  ASSIGN_OR_RETURN(int64_t size, io_internal::RegularFileSize(fd.get(), path));
  RETURN_IF_ERROR(io_internal::PwriteFully(fd.get(), path, content.data(),
                                           static_cast<int64_t>(content.size()),
                                           size));
  return io_internal::Fdatasync(fd.get(), path);
}

Status RenameDurably(const std::string& from, const std::string& to) {
  RETURN_IF_ERROR(io_internal::RenameFile(from, to));
  return io_internal::FsyncParentDir(to);
}

Status TruncateFileDurably(const std::string& path, int64_t size) {
  ASSIGN_OR_RETURN(UniqueFd fd, io_internal::OpenFile(path, O_WRONLY));
  ASSIGN_OR_RETURN(int64_t have, io_internal::RegularFileSize(fd.get(), path));
  if (have < size)
    return DataLossError(path + ": file has " + std::to_string(have) +
                         " bytes, expected at least " + std::to_string(size));
  if (have == size) return Status::Ok();
  if (::ftruncate(fd.get(), size) != 0)
    return io_internal::ErrnoStatus(path, "ftruncate", errno);
  return io_internal::Fdatasync(fd.get(), path);
}

StatusOr<FileLock> FileLock::Acquire(const std::string& path) {
  // Read-only: the file is never written (flock needs no write access).
  ASSIGN_OR_RETURN(UniqueFd fd,
                   io_internal::OpenFile(path, O_RDONLY | O_CREAT));
  int r;
  do {
    r = ::flock(fd.get(), LOCK_EX | LOCK_NB);
  } while (r != 0 && errno == EINTR);
  if (r != 0) {
    if (errno == EWOULDBLOCK)
      return FailedPreconditionError(path + ": locked by another process");
    return io_internal::ErrnoStatus(path, "flock", errno);
  }
  return FileLock(path, std::move(fd));
}

}  // namespace loom
