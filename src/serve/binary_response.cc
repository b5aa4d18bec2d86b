#include "src/serve/binary_response.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>

#include "src/base/float16.h"
#include "src/core/tensor.h"
#include "src/io/npy.h"
#include "src/io/safetensors_writer.h"

namespace loom::serve {
namespace {

std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  std::string out(s.substr(b, e - b));
  for (char& c : out) c = static_cast<char>(std::tolower(c));
  return out;
}

// The array's values in `dtype`, little-endian bytes.
std::vector<uint8_t> Converted(const BinaryArray& a, DType dtype) {
  int64_t n = 1;
  for (int64_t d : a.shape) n *= d;
  std::vector<uint8_t> out(static_cast<size_t>(n * DTypeSize(dtype)));
  if (dtype == DType::kF32) {
    if (n > 0) std::memcpy(out.data(), a.values, out.size());
    return out;
  }
  auto* h = reinterpret_cast<uint16_t*>(out.data());
  for (int64_t i = 0; i < n; ++i)
    h[i] =
        dtype == DType::kBF16 ? F32ToBf16(a.values[i]) : F32ToF16(a.values[i]);
  return out;
}

}  // namespace

StatusOr<BodyFormat> NegotiateBody(std::string_view accept) {
  if (Trim(accept).empty()) return BodyFormat::kJson;
  // (q, exact type, format) of the best acceptable range so far.
  bool found = false;
  double best_q = 0.0;
  bool best_exact = false;
  BodyFormat best = BodyFormat::kJson;
  size_t at = 0;
  while (at <= accept.size()) {
    size_t end = accept.find(',', at);
    if (end == std::string_view::npos) end = accept.size();
    const std::string_view range = accept.substr(at, end - at);
    at = end + 1;
    const size_t semi = range.find(';');
    const std::string type = Trim(range.substr(0, semi));
    double q = 1.0;
    if (semi != std::string_view::npos) {
      std::string_view params = range.substr(semi + 1);
      while (!params.empty()) {
        const size_t next = params.find(';');
        const std::string p = Trim(params.substr(0, next));
        if (p.rfind("q=", 0) == 0) q = std::strtod(p.c_str() + 2, nullptr);
        if (next == std::string_view::npos) break;
        params.remove_prefix(next + 1);
      }
    }
    BodyFormat f;
    bool exact = true;
    if (type == "application/json") {
      f = BodyFormat::kJson;
    } else if (type == "*/*" || type == "application/*") {
      f = BodyFormat::kJson;
      exact = false;
    } else if (type == kNpyContentType) {
      f = BodyFormat::kNpy;
    } else if (type == kSafetensorsContentType) {
      f = BodyFormat::kSafetensors;
    } else {
      continue;
    }
    if (q <= 0.0) continue;
    if (!found || q > best_q || (q == best_q && exact && !best_exact)) {
      found = true;
      best_q = q;
      best_exact = exact;
      best = f;
    }
  }
  if (!found)
    return InvalidArgumentError(
        "Accept: " + std::string(accept) +
        ": this route answers application/json (the default), " +
        std::string(kNpyContentType) + " (one array) or " +
        std::string(kSafetensorsContentType));
  return best;
}

std::string_view ContentTypeOf(BodyFormat f) {
  switch (f) {
    case BodyFormat::kNpy:
      return kNpyContentType;
    case BodyFormat::kSafetensors:
      return kSafetensorsContentType;
    default:
      return "application/json";
  }
}

std::string NpyNeedsOneArray(int64_t count, const std::string& names) {
  return "Accept: " + std::string(kNpyContentType) +
         " holds exactly one array, and this reply has " +
         std::to_string(count) + (names.empty() ? "" : " (" + names + ")") +
         "; ask for " + std::string(kSafetensorsContentType) +
         " (every array, the other fields in its metadata) or for fewer "
         "arrays";
}

StatusOr<std::string> BinaryBody(BodyFormat format,
                                 const std::vector<BinaryArray>& arrays,
                                 DType dtype, const nlohmann::json& rest) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16)
    return InvalidArgumentError(
        "binary replies hold float32, bfloat16 or "
        "float16 arrays");
  if (format == BodyFormat::kNpy) {
    if (arrays.size() != 1) {
      std::string names;
      for (const BinaryArray& a : arrays)
        names += (names.empty() ? "" : ", ") + a.name;
      return InvalidArgumentError(
          NpyNeedsOneArray(static_cast<int64_t>(arrays.size()), names));
    }
    const std::vector<uint8_t> bytes = Converted(arrays[0], dtype);
    return NpyBytes(dtype, arrays[0].shape, bytes.data(),
                    static_cast<int64_t>(bytes.size()));
  }
  if (format != BodyFormat::kSafetensors)
    return InvalidArgumentError("a binary reply is npy or safetensors");
  SafetensorsWriter w;
  for (const BinaryArray& a : arrays)
    RETURN_IF_ERROR(
        w.AddOwned(a.name, dtype, Shape(a.shape), Converted(a, dtype)));
  w.SetMetadata("format", "loom-serve");
  w.SetMetadata(
      "response",
      rest.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  return w.Serialize();
}

}  // namespace loom::serve
