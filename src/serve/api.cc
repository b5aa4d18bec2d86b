#include "src/serve/api.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <variant>

#include "src/base/float16.h"
#include "src/core/json_error.h"

namespace loom::serve {
namespace {

std::string Shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

Status FieldError(std::string_view name, std::string_view expected,
                  const json& got) {
  return InvalidArgumentError("field `" + std::string(name) + "`: expected " +
                              std::string(expected) + ", got " + Shown(got));
}

const json* Field(const json& j, std::string_view name) {
  const auto it = j.find(name);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

// The message of `s` with its "interventions[0]" (the one entry parsed)
// renamed "interventions[i]".
Status RenameEntry(const Status& s, size_t i) {
  constexpr std::string_view kFirst = "interventions[0]";
  std::string m(s.message());
  if (m.starts_with(kFirst))
    m = "interventions[" + std::to_string(i) + "]" + m.substr(kFirst.size());
  return Status(s.code(), m);
}

// `entry` with `vector_b64` (base64 of little-endian f32) decoded into an
// inline `vector`; non-finite values are refused here, where the f32 value
// is known (JSON has no NaN).
StatusOr<json> DecodeVectorB64(const json& entry, const std::string& name) {
  const json& b64 = entry["vector_b64"];
  const std::string field = name + ".vector_b64";
  if (entry.contains("vector") && !entry["vector"].is_null())
    return InvalidArgumentError(field +
                                ": give vector or vector_b64, not both");
  if (!b64.is_string())
    return InvalidArgumentError(field + ": " + Shown(b64) +
                                " is not a base64 string");
  StatusOr<std::string> bytes = Base64Decode(b64.get<std::string>());
  if (!bytes.ok())
    return InvalidArgumentError(field + ": " + bytes.status().message());
  if (bytes->size() % 4 != 0)
    return InvalidArgumentError(field + ": " + std::to_string(bytes->size()) +
                                " bytes are not a whole number of f32 values");
  const size_t n = bytes->size() / 4;
  json values = json::array();
  values.get_ref<json::array_t&>().reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const auto* b =
        reinterpret_cast<const unsigned char*>(bytes->data() + 4 * i);
    const uint32_t bits = uint32_t{b[0]} | uint32_t{b[1]} << 8 |
                          uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
    float v;
    std::memcpy(&v, &bits, sizeof(v));
    if (!std::isfinite(v))
      return InvalidArgumentError(field + ": value " + std::to_string(i) +
                                  " of " + std::to_string(n) + " is " +
                                  (std::isnan(v) ? "nan" : "infinite"));
    values.push_back(static_cast<double>(v));
  }
  json out = entry;
  out.erase("vector_b64");
  out["vector"] = std::move(values);
  return out;
}

// Vector values an entry carries as sent (before pattern expansion), to
// refuse a huge request before parsing it.
int64_t RawFloats(const json& entry) {
  if (!entry.is_object()) return 0;
  const json* v = Field(entry, "vector");
  const json* b = Field(entry, "vector_b64");
  int64_t n = 0;
  if (v != nullptr && v->is_array()) n += static_cast<int64_t>(v->size());
  if (b != nullptr && b->is_string())
    n += static_cast<int64_t>(b->get_ref<const std::string&>().size() / 4 * 3 /
                              4);
  return n;
}

Status TooManyFloats(int64_t floats, int64_t max_floats) {
  return OutOfRangeError(
      "field `interventions`: " + std::to_string(floats) +
      " vector values (hook patterns expanded), more than the server's "
      "limit of " +
      std::to_string(max_floats) + " per request");
}

}  // namespace

StatusOr<RequestInterventions> ParseRequestInterventions(
    const json& body, const ModelConfig& config, int64_t prompts,
    int64_t max_floats) {
  RequestInterventions out;
  const json* list = body.is_object() ? Field(body, "interventions") : nullptr;
  if (list == nullptr) return out;
  if (!list->is_array())
    return FieldError("interventions", "a list of intervention objects", *list);
  int64_t raw = 0;
  for (const json& entry : *list) raw += RawFloats(entry);
  if (raw > max_floats) return TooManyFloats(raw, max_floats);
  for (size_t i = 0; i < list->size(); ++i) {
    const json& entry = (*list)[i];
    const std::string name = "interventions[" + std::to_string(i) + "]";
    json one = entry;
    if (entry.is_object()) {
      if (Field(entry, "vector_file") != nullptr)
        return InvalidArgumentError(
            name +
            ".vector_file: no request can read server files; send the vector "
            "inline (`vector`, a list of numbers, or `vector_b64`, base64 of "
            "little-endian f32)");
      if (Field(entry, "sae") != nullptr)
        return InvalidArgumentError(
            name +
            ".sae: no request can read server files (an SAE feature's "
            "direction: send its decoder row as `vector`)");
      if (Field(entry, "vector_b64") != nullptr) {
        ASSIGN_OR_RETURN(one, DecodeVectorB64(entry, name));
      }
    }
    const json doc = {{"interventions", json::array({std::move(one)})}};
    StatusOr<std::vector<Intervention>> parsed = ParseInterventions(
        doc.dump(-1, ' ', false, json::error_handler_t::replace), "", config);
    if (!parsed.ok()) return RenameEntry(parsed.status(), i);
    for (Intervention& iv : *parsed) {
      if (iv.mode == InterventionMode::kPatch ||
          iv.mode == InterventionMode::kPatchHead)
        return InvalidArgumentError(
            name + ".mode: " + std::string(InterventionModeName(iv.mode)) +
            " is not served on the generation routes (TheLoom's "
            "/api/patching/run patches)");
      if (!iv.rows.empty() && iv.rows.back() >= prompts)
        return InvalidArgumentError(
            name + ".rows: row " + std::to_string(iv.rows.back()) +
            " is outside the request's " + std::to_string(prompts) +
            (prompts == 1 ? " prompt" : " prompts") + " (rows count from 0)");
      out.floats += static_cast<int64_t>(iv.vector.size());
      if (out.floats > max_floats) return TooManyFloats(out.floats, max_floats);
      if (static_cast<int64_t>(out.list.size()) >= kMaxRequestInterventions)
        return OutOfRangeError(
            "field `interventions`: more than " +
            std::to_string(kMaxRequestInterventions) +
            " interventions (hook patterns expanded) in one request");
      out.list.push_back(std::move(iv));
      out.entry.push_back(static_cast<int64_t>(i));
    }
  }
  return out;
}

StatusOr<std::vector<Intervention>> InterventionsForPrompt(
    const RequestInterventions& r, int64_t row, int64_t length) {
  std::vector<Intervention> out;
  for (size_t k = 0; k < r.list.size(); ++k) {
    const Intervention& iv = r.list[k];
    if (!AppliesToRow(iv, row)) continue;
    if (iv.edits_prompt()) {
      StatusOr<std::vector<int64_t>> fit =
          ResolvePositions(iv.positions, length);
      if (!fit.ok())
        return InvalidArgumentError("interventions[" +
                                    std::to_string(r.entry[k]) +
                                    "].positions: " + fit.status().message());
    }
    out.push_back(iv);
    out.back().rows.clear();
  }
  return out;
}

StatusOr<int64_t> GetInt(const json& j, std::string_view name, int64_t def,
                         int64_t lo, int64_t hi) {
  const json* v = Field(j, name);
  if (v == nullptr) return def;
  const std::string range =
      "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  int64_t x = 0;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() &&
        v->get<uint64_t>() >
            static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return FieldError(name, range, *v);
    x = v->get<int64_t>();
  } else if (v->is_number_float() && std::isfinite(v->get<double>()) &&
             std::floor(v->get<double>()) == v->get<double>() &&
             std::fabs(v->get<double>()) < 9e15) {
    x = static_cast<int64_t>(v->get<double>());  // 8.0 is accepted as 8
  } else {
    return FieldError(name, range, *v);
  }
  if (x < lo || x > hi) return FieldError(name, range, *v);
  return x;
}

StatusOr<double> GetNumber(const json& j, std::string_view name, double def,
                           double lo, double hi) {
  const json* v = Field(j, name);
  if (v == nullptr) return def;
  std::string range =
      "a number in [" + json(lo).dump() + ", " + json(hi).dump() + "]";
  if (!v->is_number()) return FieldError(name, range, *v);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) return FieldError(name, range, *v);
  return x;
}

StatusOr<bool> GetBool(const json& j, std::string_view name, bool def) {
  const json* v = Field(j, name);
  if (v == nullptr) return def;
  if (!v->is_boolean()) return FieldError(name, "true or false", *v);
  return v->get<bool>();
}

StatusOr<std::string> GetString(const json& j, std::string_view name,
                                std::string_view def) {
  const json* v = Field(j, name);
  if (v == nullptr) return std::string(def);
  if (!v->is_string()) return FieldError(name, "a string", *v);
  return v->get<std::string>();
}

StatusOr<std::vector<std::string>> GetStrings(const json& j,
                                              std::string_view name) {
  const json* v = Field(j, name);
  std::vector<std::string> out;
  if (v == nullptr) return out;
  if (v->is_string()) return std::vector<std::string>{v->get<std::string>()};
  if (!v->is_array()) return FieldError(name, "a string or a list", *v);
  for (const json& x : *v) {
    if (!x.is_string()) return FieldError(name, "a list of strings", *v);
    out.push_back(x.get<std::string>());
  }
  return out;
}

Status ReadParams(const json& j, std::span<const eval::ParamField> fields) {
  for (const eval::ParamField& f : fields) {
    const std::string_view name = f.spec->name;
    const json* v = Field(j, name);
    if (v == nullptr) continue;
    const std::string range = eval::ParamRangeText(f);
    Status status = std::visit(
        [&](auto* field) -> Status {
          using T = std::remove_pointer_t<decltype(field)>;
          if constexpr (std::is_same_v<T, std::vector<std::string>>) {
            ASSIGN_OR_RETURN(*field, GetStrings(j, name));
          } else if constexpr (std::is_same_v<T, bool>) {
            if (!v->is_boolean()) return FieldError(name, range, *v);
            *field = v->get<bool>();
          } else if constexpr (std::is_same_v<T, std::string>) {
            ASSIGN_OR_RETURN(*field, GetString(j, name, *field));
          } else if constexpr (std::is_same_v<T, uint64_t>) {
            if (!v->is_number_integer() ||
                (!v->is_number_unsigned() && v->get<int64_t>() < 0))
              return FieldError(name, range, *v);
            *field = v->get<uint64_t>();
          } else if constexpr (std::is_same_v<T, int64_t> ||
                               std::is_same_v<T, int>) {
            // Any integer first (8.0 is 8), then the spec's range.
            StatusOr<int64_t> x =
                GetInt(j, name, 0, std::numeric_limits<int64_t>::min(),
                       std::numeric_limits<int64_t>::max());
            if (!x.ok() || !eval::InParamRange(f, static_cast<double>(*x)))
              return FieldError(name, range, *v);
            *field = static_cast<T>(*x);
          } else {
            if (!v->is_number() || !eval::InParamRange(f, v->get<double>()))
              return FieldError(name, range, *v);
            *field = static_cast<T>(v->get<double>());
          }
          return Status();
        },
        f.target);
    RETURN_IF_ERROR(status);
  }
  return Status();
}

StatusOr<json> ParseBody(std::string_view body) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos)
    return InvalidArgumentError(
        "the request body is empty: it must be a JSON object (e.g. curl -H "
        "'Content-Type: application/json' -d '{...}')");
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded())
    return InvalidArgumentError("malformed JSON body at " +
                                LocateJsonError(body).Where());
  if (!j.is_object())
    return InvalidArgumentError("the body must be a JSON object, got " +
                                std::string(j.type_name()));
  return j;
}

StatusOr<ArrayFormat> ParseArrayFormat(std::string_view s) {
  if (s == "list") return ArrayFormat::kList;
  if (s == "base64") return ArrayFormat::kBase64;
  return InvalidArgumentError(
      "field `hidden_state_format`: expected \"list\" "
      "or \"base64\", got \"" +
      std::string(s) + "\"");
}

StatusOr<DType> ParseReturnDType(std::string_view s) {
  if (s == "float32" || s == "f32" || s == "fp32") return DType::kF32;
  if (s == "bfloat16" || s == "bf16") return DType::kBF16;
  if (s == "float16" || s == "f16" || s == "fp16") return DType::kF16;
  return InvalidArgumentError(
      "hidden state dtype: expected float32, bfloat16 or float16, got \"" +
      std::string(s) + "\"");
}

std::string_view ReturnDTypeName(DType d) {
  switch (d) {
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    default:
      return "float32";
  }
}

std::string Base64Encode(const void* data, size_t bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const uint8_t*>(data);
  std::string out;
  out.reserve((bytes + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes; i += 3) {
    const uint32_t v = (p[i] << 16) | (p[i + 1] << 8) | p[i + 2];
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i + 1 == bytes) {
    const uint32_t v = p[i] << 16;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == bytes) {
    const uint32_t v = (p[i] << 16) | (p[i + 1] << 8);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

StatusOr<std::string> Base64Decode(std::string_view text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (text.size() % 4 != 0)
    return InvalidArgumentError("base64: length " +
                                std::to_string(text.size()) +
                                " is not a multiple of 4");
  std::string out;
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      int x = 0;
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        ++pad;
      } else if (pad > 0 || (x = value(c)) < 0) {
        return InvalidArgumentError("base64: invalid character at offset " +
                                    std::to_string(i + k));
      }
      v = (v << 6) | static_cast<uint32_t>(x);
    }
    out += static_cast<char>(v >> 16);
    if (pad < 2) out += static_cast<char>((v >> 8) & 255);
    if (pad < 1) out += static_cast<char>(v & 255);
  }
  return out;
}

json EncodeArray(const float* values, int64_t rows, int64_t cols, bool vector,
                 DType dtype, ArrayFormat format) {
  const int64_t n = (vector ? 1 : rows) * cols;
  json out;
  out["shape"] = vector ? json::array({cols}) : json::array({rows, cols});
  out["dtype"] = std::string(ReturnDTypeName(dtype));
  auto rounded = [dtype](float x) {
    if (dtype == DType::kBF16) return RoundBf16(x);
    if (dtype == DType::kF16) return F16ToF32(F32ToF16(x));
    return x;
  };
  if (format == ArrayFormat::kBase64) {
    if (dtype == DType::kF32) {
      out["data"] = Base64Encode(values, static_cast<size_t>(n) * 4);
    } else {
      std::vector<uint16_t> h(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        h[static_cast<size_t>(i)] =
            dtype == DType::kBF16 ? F32ToBf16(values[i]) : F32ToF16(values[i]);
      out["data"] = Base64Encode(h.data(), h.size() * 2);
    }
    out["encoding"] = "base64";
    return out;
  }
  auto row = [&](int64_t r) {
    json a = json::array();
    for (int64_t c = 0; c < cols; ++c)
      a.push_back(rounded(values[r * cols + c]));
    return a;
  };
  if (vector) {
    out["data"] = row(0);
  } else {
    json d = json::array();
    for (int64_t r = 0; r < rows; ++r) d.push_back(row(r));
    out["data"] = std::move(d);
  }
  return out;
}

StatusOr<Pooling> ParsePooling(std::string_view s) {
  if (s == "last_token" || s == "last") return Pooling::kLastToken;
  if (s == "first_token" || s == "first" || s == "cls")
    return Pooling::kFirstToken;
  if (s == "mean") return Pooling::kMean;
  return InvalidArgumentError(
      "field `pooling`: expected last_token, first_token or mean, got \"" +
      std::string(s) + "\"");
}

std::vector<float> Pool(const float* rows, int64_t n, int64_t cols,
                        Pooling pooling, bool normalize) {
  std::vector<float> out(static_cast<size_t>(cols));
  if (pooling == Pooling::kMean) {
    for (int64_t c = 0; c < cols; ++c) {
      double sum = 0;
      for (int64_t r = 0; r < n; ++r) sum += rows[r * cols + c];
      out[static_cast<size_t>(c)] = static_cast<float>(sum / n);
    }
  } else {
    const int64_t r = pooling == Pooling::kFirstToken ? 0 : n - 1;
    std::copy(rows + r * cols, rows + (r + 1) * cols, out.begin());
  }
  if (normalize) {
    double ss = 0;
    for (float x : out) ss += double{x} * x;
    const double norm = std::sqrt(ss);
    if (norm > 0)
      for (float& x : out) x = static_cast<float>(x / norm);
  }
  return out;
}

StatusOr<json> AnalyzeVector(const std::vector<double>& v) {
  if (v.empty()) return InvalidArgumentError("the vector is empty");
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]))
      return InvalidArgumentError("element " + std::to_string(i) +
                                  " is not finite");
  const double n = static_cast<double>(v.size());
  double sum = 0, ss = 0, mn = v[0], mx = v[0];
  int64_t zeros = 0;
  for (double x : v) {
    sum += x;
    ss += x * x;
    mn = std::min(mn, x);
    mx = std::max(mx, x);
    zeros += std::fabs(x) < 1e-6;
  }
  const double mean = sum / n;
  double var = 0;
  for (double x : v) var += (x - mean) * (x - mean);
  std::vector<double> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  auto quantile = [&](double q) {
    const double pos = q * (n - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, sorted.size() - 1);
    return sorted[lo] +
           (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
  };
  return json{{"dimension", v.size()},
              {"mean", mean},
              {"std", std::sqrt(var / n)},
              {"min", mn},
              {"max", mx},
              {"l2_norm", std::sqrt(ss)},
              {"sparsity", static_cast<double>(zeros) / n},
              {"quartiles",
               {{"q1", quantile(0.25)},
                {"median", quantile(0.5)},
                {"q3", quantile(0.75)}}}};
}

int HttpStatusOf(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kResourceExhausted:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kUnimplemented:
      return 501;
    default:
      return 500;
  }
}

namespace {

std::string_view ErrorType(int http_status) {
  return http_status < 500
             ? "invalid_request_error"
             : (http_status == 503 ? "overloaded" : "server_error");
}

}  // namespace

json ErrorBody(int http_status, std::string_view message) {
  return json{{"detail", message},
              {"error",
               {{"message", message},
                {"type", ErrorType(http_status)},
                {"code", http_status}}}};
}

json OpenAiErrorBody(int http_status, std::string_view message) {
  json param = nullptr;
  constexpr std::string_view kField = "field `";
  if (const size_t at = message.find(kField); at != std::string_view::npos) {
    const size_t from = at + kField.size();
    const size_t end = message.find('`', from);
    if (end != std::string_view::npos && end > from)
      param = std::string(message.substr(from, end - from));
  }
  json code = nullptr;
  if (http_status == 401) code = "invalid_api_key";
  if (http_status == 404 && message.rfind("model `", 0) == 0)
    code = "model_not_found";
  if (http_status == 413) code = "request_too_large";
  if (http_status == 501) code = "unsupported";
  return json{{"detail", message},
              {"error",
               {{"message", message},
                {"type", ErrorType(http_status)},
                {"param", param},
                {"code", code}}}};
}

}  // namespace loom::serve
