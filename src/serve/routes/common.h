// HTTP plumbing shared by the route families: JSON and binary replies, the
// error bodies (OpenAI's on /v1/ routes), the Route and JsonRoute wrappers
// (errors become JSON error replies, every reply is counted) and the
// reading of JSON bodies under their route's size limit.
#ifndef LOOM_SERVE_ROUTES_COMMON_H_
#define LOOM_SERVE_ROUTES_COMMON_H_

#include <httplib.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"
#include "src/serve/api.h"
#include "src/serve/binary_response.h"
#include "src/serve/routes/context.h"
#include "src/serve/server.h"

namespace loom::serve::routes {

std::string Dump(const json& j);

// The error body of a reply on `path`: OpenAI's error object on the OpenAI
// routes (/v1/...), else FastAPI's detail with the OpenAI fields beside.
json ErrorJson(std::string_view path, int status, std::string_view message);

// Host memory in bytes (the device of a CPU engine).
int64_t HostMemoryBytes();

void Reply(httplib::Response& res, int status, const json& body);
// An error reply on `path` (OpenAI's error object on /v1/ routes).
void ReplyError(httplib::Response& res, const Status& s, std::string_view path);

// The body format the request's Accept header asks for (binary replies of
// /generate, /embed, /v1/embeddings); when it asks for none this route
// answers, replies 406 and returns nullopt.
std::optional<BodyFormat> Accepted(const httplib::Request& req,
                                   httplib::Response& res);
Status NotAcceptable(const httplib::Request& req, httplib::Response& res,
                     std::string_view message);
// A binary reply (binary_response.h): npy or safetensors of `arrays` in
// `dtype`, `rest` in the safetensors metadata; 406 when npy cannot hold
// the arrays.
Status ReplyBinary(const httplib::Request& req, httplib::Response& res,
                   BodyFormat format, const std::vector<BinaryArray>& arrays,
                   DType dtype, const json& rest);
// The dtype of a binary embedding reply: `hidden_state_dtype`, else
// hidden_states.precision.
StatusOr<DType> BinaryDType(const ServerOptions& o, const json& b);

using Handler =
    std::function<Status(const httplib::Request&, httplib::Response&)>;
// Wraps a route: errors become JSON error replies, every reply is counted.
httplib::Server::Handler Route(ServerContext& ctx, const std::string& name,
                               Handler h);
// A POST route whose body is JSON: read by ReadBody, then `h` runs on a
// copy of the request holding it.
httplib::Server::HandlerWithContentReader JsonRoute(ServerContext& ctx,
                                                    const std::string& name,
                                                    Handler h);

// Why a body was too large: the limit that fired, and the size when the
// request declared it.
std::string TooLarge(const ServerOptions& o, const httplib::Request& req);
// The declared Content-Length judged on the header alone: 0 when it
// passes, 400 when it is not a count of bytes, 413 when it is over the
// largest route limit (or the route's own, for a client waiting for
// "100 Continue"), with *message.
int DeclaredLengthRefusal(const ServerOptions& o, const httplib::Request& req,
                          bool expects_continue, std::string* message);
// The body limit of a route and its configuration key.
std::pair<int64_t, std::string> BodyLimit(const ServerOptions& o,
                                          const std::string& path);
// Reads the body of a JSON route into *body (whatever the Content-Type)
// under the route's BodyLimit; on failure replies (413, 415 or 400, JSON)
// and returns false.
bool ReadBody(const ServerOptions& o, const httplib::Request& req,
              const httplib::ContentReader& reader, httplib::Response& res,
              std::string* body);

}  // namespace loom::serve::routes

#endif  // LOOM_SERVE_ROUTES_COMMON_H_
