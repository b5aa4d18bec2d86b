// Tests only: one HTTP exchange on a raw TCP connection, for requests whose
// exact bytes matter (captured client requests, chunked bodies).
#ifndef LOOM_SERVE_RAW_HTTP_TEST_UTIL_H_
#define LOOM_SERVE_RAW_HTTP_TEST_UTIL_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace loom::serve {

// A reply read off a raw connection.
struct RawReply {
  int status = 0;             // 0: no HTTP reply
  std::string headers, body;  // the head without its blank line; body as sent
  double seconds = 0;  // from connect to the server's close (or the reply)
};

// The reply is whole when its head and Content-Length bytes of body came.
inline bool WholeReply(const std::string& reply) {
  const size_t end = reply.find("\r\n\r\n");
  if (end == std::string::npos) return false;
  const size_t at = reply.find("Content-Length: ");
  if (at == std::string::npos || at > end) return false;
  return reply.size() - end - 4 >=
         std::stoull(reply.substr(at + 16, reply.find("\r\n", at) - at - 16));
}

// Sends `request` to 127.0.0.1:`port` byte for byte (it should say
// "Connection: close") and reads the reply until the server closes the
// connection (or, with `until_reply`, until the reply is whole: a client
// that reads the reply and goes), waiting `timeout_s` at most for each
// read.
inline RawReply RawExchange(int port, const std::string& request, int timeout_s,
                            bool until_reply = false) {
  RawReply out;
  const auto t0 = std::chrono::steady_clock::now();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  timeval tv{timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return out;
  }
  for (size_t at = 0; at < request.size();) {
    const ssize_t n = send(fd, request.data() + at, request.size() - at, 0);
    if (n <= 0) break;
    at += static_cast<size_t>(n);
  }
  std::string reply;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) {
    reply.append(buf, static_cast<size_t>(n));
    if (until_reply && WholeReply(reply)) break;
  }
  close(fd);
  out.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  const size_t end = reply.find("\r\n\r\n");
  if (reply.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos) return out;
  out.status = std::stoi(reply.substr(9, 3));
  out.headers = reply.substr(0, end);
  out.body = reply.substr(end + 4);
  return out;
}

}  // namespace loom::serve

#endif  // LOOM_SERVE_RAW_HTTP_TEST_UTIL_H_
