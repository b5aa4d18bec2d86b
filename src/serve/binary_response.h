// Binary replies of `loom serve` (docs/server.md, "Binary hidden states"):
// /generate, /v1/generate, /embed, /embed/batch and /v1/embeddings answer
// with the request's arrays as one .npy array or a safetensors file when the
// request's Accept header asks for application/x-npy or
// application/safetensors; JSON stays the default.
//
// Bodies are built with the project's writers (src/io/npy.h NpyBytes,
// src/io/safetensors_writer.h Serialize): a .npy holds exactly one array; a
// safetensors file holds every array of the reply, one tensor each, and
// `__metadata__` {"format": "loom-serve", "response": the JSON reply without
// those arrays}.
#ifndef LOOM_SERVE_BINARY_RESPONSE_H_
#define LOOM_SERVE_BINARY_RESPONSE_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"

namespace loom::serve {

enum class BodyFormat { kJson, kNpy, kSafetensors };

inline constexpr std::string_view kNpyContentType = "application/x-npy";
inline constexpr std::string_view kSafetensorsContentType =
    "application/safetensors";

// The body format an Accept header asks for. Each comma-separated media
// range may carry a q parameter (q=0: not acceptable); the acceptable range
// of highest q wins, an exact type before a wildcard at equal q, then the
// order written. application/json, application/* and */* are JSON; an
// absent or blank header is JSON. InvalidArgument (the server's 406) when no
// range is one of those, application/x-npy or application/safetensors.
StatusOr<BodyFormat> NegotiateBody(std::string_view accept);

std::string_view ContentTypeOf(BodyFormat f);  // "application/json", ...

// One array of a binary reply: `values` (f32, borrowed until Serialize
// returns) of `shape`, row-major, stored in the reply's dtype.
struct BinaryArray {
  std::string name;
  std::vector<int64_t> shape;
  const float* values = nullptr;
};

// The body of a binary reply: kNpy needs exactly one array (else
// InvalidArgument naming the arrays, the server's 406); kSafetensors holds
// every array and `rest` (the JSON reply without the arrays) in its
// metadata. `dtype`: kF32, kBF16 (npy: '<u2' holding the bf16 bits, as
// NpyWriter stores it) or kF16.
StatusOr<std::string> BinaryBody(BodyFormat format,
                                 const std::vector<BinaryArray>& arrays,
                                 DType dtype, const nlohmann::json& rest);

// The 406 message when npy is asked for but the reply has `count` arrays
// (`names` lists them).
std::string NpyNeedsOneArray(int64_t count, const std::string& names);

}  // namespace loom::serve

#endif  // LOOM_SERVE_BINARY_RESPONSE_H_
