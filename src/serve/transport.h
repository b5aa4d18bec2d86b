// The listeners of `loom serve` (server.transport: http | unix | both,
// docs/server.md "Transports"): one httplib::Server per transport, every
// route registered on each, so both transports share the handlers and the
// server's state.
//
// The unix socket: cpp-httplib 0.11 (Debian 12's) binds TCP only, so the
// socket is made here (socket, bind, listen), then put in the place of the
// listening socket the library bound on 127.0.0.1 (dup2 over its
// descriptor, which releases that TCP port): the library's accept loop,
// keep-alive, timeouts and shutdown then serve the socket unchanged.
//
// Safety of the socket file: created with mode 0600 (owner only; the umask is
// narrowed around bind so that it is never wider), an existing *socket* at
// the path is replaced only when no server answers on it (stale), anything
// else there (a file, a directory, a live server) is an error; the file is
// removed on shutdown if it is still the one this process made.
#ifndef LOOM_SERVE_TRANSPORT_H_
#define LOOM_SERVE_TRANSPORT_H_

#include <httplib.h>
#include <sys/types.h>

#include <string>

#include "src/base/status.h"

namespace loom::serve {

// Route registration on both servers (the same handler copied to each).
struct HttpListeners {
  httplib::Server tcp;
  httplib::Server unix_socket;

  template <typename H>
  HttpListeners& Get(const std::string& pattern, H h) {
    tcp.Get(pattern, h);
    unix_socket.Get(pattern, h);
    return *this;
  }
  template <typename H>
  HttpListeners& Post(const std::string& pattern, H h) {
    tcp.Post(pattern, h);
    unix_socket.Post(pattern, h);
    return *this;
  }
  template <typename H>
  HttpListeners& Delete(const std::string& pattern, H h) {
    tcp.Delete(pattern, h);
    unix_socket.Delete(pattern, h);
    return *this;
  }
};

// A unix socket listening at `path` with permissions `mode`.
class UnixSocketFile {
 public:
  UnixSocketFile() = default;
  ~UnixSocketFile() { Remove(); }
  UnixSocketFile(const UnixSocketFile&) = delete;
  UnixSocketFile& operator=(const UnixSocketFile&) = delete;

  // Creates the socket, binds and listens (see the safety notes above).
  Status Listen(const std::string& path, mode_t mode = 0600);
  // Puts the listening socket in the place of `server`'s: binds `server` to
  // a free 127.0.0.1 port (capturing its descriptor through
  // set_socket_options, which this replaces) and dup2s the unix socket over
  // it. After Listen().
  Status Attach(httplib::Server& server);
  // Unlinks the file if it is still the socket Listen() made.
  void Remove();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  bool made_ = false;
};

}  // namespace loom::serve

#endif  // LOOM_SERVE_TRANSPORT_H_
