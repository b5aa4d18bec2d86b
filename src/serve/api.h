// The JSON side of `loom serve`'s routes, apart from HTTP so that it can be
// tested alone: typed field readers whose errors name the field and the value,
// hidden-state arrays in TheLoom's {data, shape, dtype, encoding} form,
// pooling, row selectors over captured rows, /analyze statistics, and the
// status -> HTTP code mapping. See docs/server.md.
#ifndef LOOM_SERVE_API_H_
#define LOOM_SERVE_API_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"
#include "src/eval/params.h"
#include "src/eval/row_selector.h"
#include "src/model/config.h"
#include "src/model/interventions.h"

namespace loom::serve {

using nlohmann::json;

// Field readers: `j` must be an object (else InvalidArgument); a missing or
// null field gives the default; a wrong type or a value outside [lo, hi] is
// InvalidArgument "field `name`: expected ..., got ...".
StatusOr<int64_t> GetInt(const json& j, std::string_view name, int64_t def,
                         int64_t lo, int64_t hi);
StatusOr<double> GetNumber(const json& j, std::string_view name, double def,
                           double lo, double hi);
StatusOr<bool> GetBool(const json& j, std::string_view name, bool def);
StatusOr<std::string> GetString(const json& j, std::string_view name,
                                std::string_view def);
// A string or a list of strings ([] when missing).
StatusOr<std::vector<std::string>> GetStrings(const json& j,
                                              std::string_view name);
// The fields of a parameter group (src/eval/params.h) from `j`: each one
// present and not null sets its field; a missing one leaves the field's
// value (the route's default). Errors name the field, its range and the
// value: "field `top_p`: expected a number in (0, 1], got 0".
Status ReadParams(const json& j, std::span<const eval::ParamField> fields);
// The body of a request as a JSON object (InvalidArgument with the parser's
// position otherwise; an empty or blank body is InvalidArgument saying so).
StatusOr<json> ParseBody(std::string_view body);

// How arrays are returned: nested JSON lists, or base64 of the little-endian
// bytes (TheLoom's hidden_state_format "list" | "base64").
enum class ArrayFormat { kList, kBase64 };
StatusOr<ArrayFormat> ParseArrayFormat(std::string_view s);
// "float32" | "bfloat16" | "float16" (and f32, bf16, f16).
StatusOr<DType> ParseReturnDType(std::string_view s);
std::string_view ReturnDTypeName(DType d);  // "float32", ...

// {data, shape, dtype[, encoding: "base64"]}: `values` [rows, cols] f32
// (rows = 0: shape [cols], a vector), rounded to `dtype` (bf16/f16 values
// are what the dtype holds; base64 then carries 2-byte values).
json EncodeArray(const float* values, int64_t rows, int64_t cols, bool vector,
                 DType dtype, ArrayFormat format);
std::string Base64Encode(const void* data, size_t bytes);
StatusOr<std::string> Base64Decode(std::string_view text);

// The `interventions` field of a request (docs/server.md): a list of entries
// in the intervention file's schema (src/model/interventions.h), vectors
// inline (`vector`: numbers) or as `vector_b64` (base64 of little-endian
// f32). `list` holds them expanded (a hook pattern gives one per layer) and
// `entry[k]` is the index in the request of list[k].
struct RequestInterventions {
  std::vector<Intervention> list;
  std::vector<int64_t> entry;
  int64_t floats = 0;  // vector values over `list`
};
// Expanded interventions one request may carry (any mode).
inline constexpr int64_t kMaxRequestInterventions = 4096;
// Parses body["interventions"] (missing, null or [] = none) for a request of
// `prompts` prompts (`rows`, when given, index them). Errors name the entry
// and field ("interventions[2].vector: has 3 values but ... is 64 wide") and
// are InvalidArgument (400), except: `vector_file` is refused (no request can
// read server files), more than `max_floats` vector values after expanding
// hook patterns or more than kMaxRequestInterventions is OutOfRange (400),
// and mode "patch" stays Unimplemented (501).
StatusOr<RequestInterventions> ParseRequestInterventions(
    const json& body, const ModelConfig& config, int64_t prompts,
    int64_t max_floats);
// The interventions of prompt `row` (those whose `rows` hold it, `rows`
// cleared), after checking that their prompt positions fit its `length`
// tokens (InvalidArgument naming interventions[i].positions otherwise).
StatusOr<std::vector<Intervention>> InterventionsForPrompt(
    const RequestInterventions& r, int64_t row, int64_t length);

// Pooling of [rows, cols] for /embed: "last_token", "first_token", "mean"
// (sums in double); `normalize` divides by the L2 norm (a zero vector stays
// zero).
enum class Pooling { kLastToken, kFirstToken, kMean };
StatusOr<Pooling> ParsePooling(std::string_view s);
std::vector<float> Pool(const float* rows, int64_t n, int64_t cols,
                        Pooling pooling, bool normalize);

// /analyze: mean, std (population), min, max, l2_norm, sparsity (fraction of
// entries with |x| < 1e-6), quartiles q1/median/q3 (linear interpolation,
// numpy's default) of one vector. InvalidArgument for an empty vector or a
// non-finite value (naming its index).
StatusOr<json> AnalyzeVector(const std::vector<double>& v);

// The HTTP status of an error Status: InvalidArgument / OutOfRange 400,
// NotFound 404, ResourceExhausted 503 (with Retry-After), FailedPrecondition
// 503, Unimplemented 501, anything else 500.
int HttpStatusOf(const Status& s);
// {"detail": message, "error": {"message", "type", "code"}}: FastAPI's and
// OpenAI's error shapes in one object.
json ErrorBody(int http_status, std::string_view message);
// The error body of the OpenAI routes (/v1/...): OpenAI's error object
// {"error": {"message", "type", "param", "code"}} plus FastAPI's "detail".
// `type` as ErrorBody's; `param` the field a "field `name`" message names,
// else null; `code` a string for the statuses OpenAI names ("invalid_api_key"
// 401, "model_not_found" a 404 about a model, "request_too_large" 413,
// "unsupported" 501), else null.
json OpenAiErrorBody(int http_status, std::string_view message);

}  // namespace loom::serve

#endif  // LOOM_SERVE_API_H_
