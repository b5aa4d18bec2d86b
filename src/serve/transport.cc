#include "src/serve/transport.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace loom::serve {
namespace {

std::string Errno(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

bool FillAddress(const std::string& path, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr->sun_path) return false;
  std::memcpy(addr->sun_path, path.data(), path.size());
  return true;
}

// Whether a server accepts connections on the socket at `path`.
bool SomeoneListens(const sockaddr_un& addr) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool live =
      ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return live;
}

}  // namespace

Status UnixSocketFile::Listen(const std::string& path, mode_t mode) {
  const std::string where = "server.unix_socket " + path;
  sockaddr_un addr;
  if (!FillAddress(path, &addr))
    return InvalidArgumentError(where + ": a socket path holds 1 to " +
                                std::to_string(sizeof addr.sun_path - 1) +
                                " bytes");
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return FailedPreconditionError(
          where +
          ": the path exists and is not a socket; remove it or "
          "choose another path");
    if (SomeoneListens(addr))
      return FailedPreconditionError(
          where + ": another server is listening on this socket");
    // A stale socket file (its server is gone): replace it.
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      return IoError(Errno(where + ": removing the stale socket"));
  }
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return IoError(Errno(where + ": socket"));
  // Never wider than `mode`, not even between bind and chmod.
  const mode_t old_mask = ::umask(0777 & ~mode);
  const int bound =
      ::bind(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  const int bind_errno = errno;
  ::umask(old_mask);
  if (bound != 0) {
    errno = bind_errno;
    Status s = IoError(Errno(where + ": bind"));
    ::close(fd_);
    fd_ = -1;
    return s;
  }
  path_ = path;
  if (::lstat(path.c_str(), &st) == 0) {
    made_ = true;
    dev_ = st.st_dev;
    ino_ = st.st_ino;
  }
  if (!made_ || ::chmod(path.c_str(), mode) != 0) {
    Status s = IoError(Errno(where + ": chmod"));
    Remove();
    return s;
  }
  if (::listen(fd_, SOMAXCONN) != 0) {
    Status s = IoError(Errno(where + ": listen"));
    Remove();
    return s;
  }
  return Status();
}

Status UnixSocketFile::Attach(httplib::Server& server) {
  if (fd_ < 0) return FailedPreconditionError("unix socket: Listen() first");
  int placeholder = -1;
  server.set_socket_options([&placeholder](int sock) { placeholder = sock; });
  const int port = server.bind_to_any_port("127.0.0.1");
  server.set_socket_options([](int) {});
  if (port <= 0 || placeholder < 0)
    return IoError("server.unix_socket " + path_ +
                   ": cannot set up the HTTP listener (binding its "
                   "placeholder on 127.0.0.1 failed)");
  // The library now accepts on the unix socket; the TCP port is released.
  if (::dup2(fd_, placeholder) < 0)
    return IoError(Errno("server.unix_socket " + path_ + ": dup2"));
  ::close(fd_);
  fd_ = -1;
  return Status();
}

void UnixSocketFile::Remove() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!made_) return;
  made_ = false;
  struct stat st;
  if (::lstat(path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) &&
      st.st_dev == dev_ && st.st_ino == ino_)
    ::unlink(path_.c_str());
}

}  // namespace loom::serve
