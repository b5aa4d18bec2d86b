// Reading an integer from a JSON value of outside input without wrapping or
// undefined casts: nlohmann's get<int64_t>() wraps an unsigned beyond
// INT64_MAX (2^64 - 1 becomes -1) and casting a float beyond int64 is
// undefined behaviour.
#ifndef LOOM_CORE_JSON_INT_H_
#define LOOM_CORE_JSON_INT_H_

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>

namespace loom {

// The value of an integer JSON number within the int64 range; nullopt for
// anything else (strings, unsigned numbers beyond INT64_MAX, floats). With
// `allow_integral_float`, a float with an integral value in range (128.0)
// is accepted too.
template <typename Json>
std::optional<int64_t> JsonInt64(const Json& v,
                                 bool allow_integral_float = false) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.template get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.template get<int64_t>();
  if (allow_integral_float && v.is_number_float()) {
    const double d = v.template get<double>();
    if (d >= -0x1p63 && d < 0x1p63 && d == std::trunc(d))
      return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

}  // namespace loom

#endif  // LOOM_CORE_JSON_INT_H_
