// HTTP plumbing of the route families (common.h).
#include "src/serve/routes/common.h"

#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>

#include "src/serve/routes/neuronpedia.h"

namespace loom::serve::routes {

namespace {

// A body's bytes against its route's limit. Past the limit the rest is
// still read (and dropped) for up to 5 s: closing with unread bytes makes
// the kernel send a reset, which can discard the 413 before a client that
// is still sending reads it.
struct BodyBudget {
  uint64_t limit;
  uint64_t seen = 0;
  std::chrono::steady_clock::time_point drain_end{};
  bool over() const { return seen > limit; }
  // Counts n more bytes; false when reading should stop.
  bool Take(size_t n) {
    seen += n;
    if (!over()) return true;
    const auto now = std::chrono::steady_clock::now();
    if (drain_end == std::chrono::steady_clock::time_point{})
      drain_end = now + std::chrono::seconds(5);
    return now < drain_end;
  }
};

}  // namespace

std::string Dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The error body of a reply on `path`: OpenAI's error object on the OpenAI
// routes (/v1/...), else FastAPI's detail with the OpenAI fields beside.
json ErrorJson(std::string_view path, int status, std::string_view message) {
  // Neuronpedia's routes answer {"error": message}, as its server does.
  if (IsNeuronpediaPath(path)) return json{{"error", message}};
  return path.rfind("/v1/", 0) == 0 ? OpenAiErrorBody(status, message)
                                    : ErrorBody(status, message);
}

// Host memory in bytes (the device of a CPU engine).
int64_t HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<int64_t>(pages) * size : 0;
}

void Reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(Dump(body), "application/json");
}
// An error reply on `path` (OpenAI's error object on /v1/ routes).
void ReplyError(httplib::Response& res, const Status& s,
                std::string_view path) {
  const int code = HttpStatusOf(s);
  if (s.code() == StatusCode::kResourceExhausted)
    res.set_header("Retry-After", "1");
  Reply(res, code, ErrorJson(path, code, s.message()));
}

// The body format the request's Accept header asks for (binary replies of
// /generate, /embed, /v1/embeddings); when it asks for none this route
// answers, replies 406 and returns nullopt.
std::optional<BodyFormat> Accepted(const httplib::Request& req,
                                   httplib::Response& res) {
  StatusOr<BodyFormat> f = NegotiateBody(req.get_header_value("Accept"));
  if (f.ok()) return *f;
  NotAcceptable(req, res, f.status().message()).IgnoreError();
  return std::nullopt;
}
Status NotAcceptable(const httplib::Request& req, httplib::Response& res,
                     std::string_view message) {
  Reply(res, 406, ErrorJson(req.path, 406, message));
  return Status();
}
// A binary reply (binary_response.h): npy or safetensors of `arrays` in
// `dtype`, `rest` in the safetensors metadata; 406 when npy cannot hold
// the arrays.
Status ReplyBinary(const httplib::Request& req, httplib::Response& res,
                   BodyFormat format, const std::vector<BinaryArray>& arrays,
                   DType dtype, const json& rest) {
  StatusOr<std::string> body = BinaryBody(format, arrays, dtype, rest);
  if (!body.ok() && body.status().code() == StatusCode::kInvalidArgument)
    return NotAcceptable(req, res, body.status().message());
  if (!body.ok()) return body.status();
  res.status = 200;
  res.set_content(std::move(body).value(), std::string(ContentTypeOf(format)));
  return Status();
}
// The dtype of a binary embedding reply: `hidden_state_dtype`, else
// hidden_states.precision.
StatusOr<DType> BinaryDType(const ServerOptions& o, const json& b) {
  ASSIGN_OR_RETURN(std::string name, GetString(b, "hidden_state_dtype", ""));
  if (name.empty()) return o.hidden_dtype;
  return ParseReturnDType(name);
}

// Wraps a route: errors become JSON error replies, every reply is counted.
httplib::Server::Handler Route(ServerContext& ctx, const std::string& name,
                               Handler h) {
  return [&ctx, name, h](const httplib::Request& req, httplib::Response& res) {
    Status s;
    try {
      s = h(req, res);
    } catch (const std::exception& e) {
      s = InternalError(std::string("unexpected exception: ") + e.what());
    } catch (...) {
      s = InternalError("unexpected exception");
    }
    if (!s.ok()) ReplyError(res, s, name);
    ctx.requests.Count(name, res.status);
  };
}

// Why a body was too large: the limit that fired, and the size when the
// request declared it.
std::string TooLarge(const ServerOptions& o, const httplib::Request& req) {
  const auto [bytes, key] = BodyLimit(o, req.path);
  const std::string limit = key + " = " + std::to_string(bytes);
  if (!req.has_header("Content-Length"))
    return "request body larger than " + limit +
           " (a chunked body; reading stopped at the limit)";
  const std::string length = req.get_header_value("Content-Length");
  if (std::strtoull(length.c_str(), nullptr, 10) > static_cast<uint64_t>(bytes))
    return "request body of " + length + " bytes is larger than " + limit;
  // Only where the library reads the body itself (a route that is not
  // one of the JSON routes): it caps form bodies on its own.
  if (req.get_header_value("Content-Type")
          .rfind("application/x-www-form-urlencoded", 0) == 0)
    return "request body of " + length +
           " bytes is larger than the HTTP library's limit of " +
           std::to_string(CPPHTTPLIB_FORM_URL_ENCODED_PAYLOAD_MAX_LENGTH) +
           " bytes for application/x-www-form-urlencoded bodies on " +
           req.method + " " + req.path;
  return "request body of " + length + " bytes is too large";
}

// The declared Content-Length judged on the header alone, before any of the
// body is read. A length that is not a plain decimal count of bytes (a
// negative one, a sign, spaces) is a 400. A length over the
// largest route limit is a 413 at once: the HTTP library would otherwise
// read and drop every declared byte first, and a client that declared
// 10 GB and sent nothing would wait out the read timeout. A length over
// the route's own limit is refused at once when the client waits for
// "100 Continue" (curl does for bodies over 1 MiB), else by ReadBody,
// which drains what a still-sending client sends so that it gets the 413.
// Returns 0 when the header passes, else the status, with *message.
int DeclaredLengthRefusal(const ServerOptions& o, const httplib::Request& req,
                          bool expects_continue, std::string* message) {
  if (!req.has_header("Content-Length")) return 0;
  const std::string length = req.get_header_value("Content-Length");
  if (length.empty() ||
      length.find_first_not_of("0123456789") != std::string::npos) {
    *message = "invalid Content-Length `" + length +
               "`: expected a count of bytes (the digits 0-9 only)";
    return 400;
  }
  errno = 0;
  uint64_t declared = std::strtoull(length.c_str(), nullptr, 10);
  if (errno == ERANGE) declared = UINT64_MAX;  // more digits than 2^64 - 1
  const int64_t route_limit = BodyLimit(o, req.path).first;
  const uint64_t largest = static_cast<uint64_t>(
      std::max(o.max_body_bytes, o.max_analysis_body_bytes));
  if (declared > largest ||
      (expects_continue && declared > static_cast<uint64_t>(route_limit))) {
    *message = TooLarge(o, req);
    return 413;
  }
  return 0;
}

// The body limit of a route and its configuration key: the analysis routes
// of many vectors (TheLoom's /analyze/geometry and /analyze/bilateral)
// have their own, server.max_analysis_body_bytes.
std::pair<int64_t, std::string> BodyLimit(const ServerOptions& o,
                                          const std::string& path) {
  if (path == "/analyze/geometry" || path == "/analyze/bilateral")
    return {o.max_analysis_body_bytes, "server.max_analysis_body_bytes"};
  return {o.max_body_bytes, "server.max_body_bytes"};
}

// Reads the body of a JSON route into *body through the library's content
// reader, whatever the Content-Type (curl -d sends
// application/x-www-form-urlencoded, which the library's own reading caps
// at 8 KiB and parses as a form); the route's BodyLimit is the one limit.
// On failure replies (413, 415 or 400, JSON) and returns false.
bool ReadBody(const ServerOptions& o, const httplib::Request& req,
              const httplib::ContentReader& reader, httplib::Response& res,
              std::string* body) {
  const uint64_t limit = static_cast<uint64_t>(BodyLimit(o, req.path).first);
  BodyBudget budget{limit};
  auto refuse = [&](int status, const std::string& message) {
    // The rest of the body may be unread: end the connection after this.
    res.set_header("Connection", "close");
    Reply(res, status, ErrorJson(req.path, status, message));
    return false;
  };
  if (req.is_multipart_form_data()) {
    // Drained (not kept) so that the reply reaches the client; the
    // library's multipart parser needs both callbacks.
    reader([](const httplib::MultipartFormData&) { return true; },
           [&](const char*, size_t n) { return budget.Take(n); });
    if (budget.over() || res.status == 413)
      return refuse(413, TooLarge(o, req));
    return refuse(415,
                  "multipart/form-data bodies are not accepted: the body "
                  "must be a JSON object (Content-Type: application/json)");
  }
  const std::string encoding = req.get_header_value("Transfer-Encoding");
  const bool chunked = strcasecmp(encoding.c_str(), "chunked") == 0;
  // No Content-Length and not chunked: an HTTP/1.1 request has no body
  // (the library would wait for the client to close the connection).
  if (!chunked && !req.has_header("Content-Length")) return true;
  // One allocation for a declared length within the limit (an 80 MB
  // analysis body is not regrown as it arrives).
  if (!chunked) {
    const uint64_t declared = std::strtoull(
        req.get_header_value("Content-Length").c_str(), nullptr, 10);
    if (declared <= limit) body->reserve(static_cast<size_t>(declared));
  }
  const bool read = reader([&](const char* data, size_t n) {
    if (!budget.Take(n)) return false;
    if (!budget.over()) {
      body->append(data, n);
    } else if (body->capacity() > 0) {
      std::string().swap(*body);  // dropped: only the 413 follows
    }
    return true;
  });
  if (budget.over() || res.status == 413) return refuse(413, TooLarge(o, req));
  if (read) return true;
  return refuse(400,
                "the request body could not be read (the connection "
                "closed or timed out, or a malformed chunked encoding)");
}

// A POST route whose body is JSON: read by ReadBody, then `h` runs on a
// copy of the request holding it.
httplib::Server::HandlerWithContentReader JsonRoute(ServerContext& ctx,
                                                    const std::string& name,
                                                    Handler h) {
  httplib::Server::Handler route = Route(ctx, name, std::move(h));
  return
      [&ctx, name, route](const httplib::Request& req, httplib::Response& res,
                          const httplib::ContentReader& reader) {
        httplib::Request with_body = req;
        if (!ReadBody(ctx.options, req, reader, res, &with_body.body)) {
          ctx.requests.Count(name, res.status);
          return;
        }
        route(with_body, res);
      };
}

}  // namespace loom::serve::routes
