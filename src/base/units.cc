#include "src/base/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace loom {

StatusOr<int64_t> ParseBytes(std::string_view text) {
  std::string s(text);
  size_t i = 0;
  while (i < s.size() &&
         (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.'))
    ++i;
  if (i == 0)
    return InvalidArgumentError("byte size '" + s +
                                "': expected a number, e.g. 24GiB");
  char* end = nullptr;
  const double value = std::strtod(s.substr(0, i).c_str(), &end);
  std::string unit;
  for (size_t j = i; j < s.size(); ++j) {
    if (!std::isspace(static_cast<unsigned char>(s[j])))
      unit += std::tolower(static_cast<unsigned char>(s[j]));
  }
  double mult = 1;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "kb" || unit == "k")
    mult = 1e3;
  else if (unit == "mb" || unit == "m")
    mult = 1e6;
  else if (unit == "gb" || unit == "g")
    mult = 1e9;
  else if (unit == "tb" || unit == "t")
    mult = 1e12;
  else if (unit == "kib")
    mult = static_cast<double>(kKiB);
  else if (unit == "mib")
    mult = static_cast<double>(kMiB);
  else if (unit == "gib")
    mult = static_cast<double>(kGiB);
  else if (unit == "tib")
    mult = static_cast<double>(kGiB) * 1024;
  else
    return InvalidArgumentError(
        "byte size '" + s + "': unknown unit '" + unit +
        "' (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
  const double bytes = value * mult;
  if (!std::isfinite(bytes) || bytes > 9.0e18)
    return InvalidArgumentError("byte size '" + s + "' is too large");
  return static_cast<int64_t>(std::llround(bytes));
}

std::string FormatBytes(int64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  const int64_t mag = bytes < 0 ? -bytes : bytes;
  if (mag >= kGiB)
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / kGiB);
  else if (mag >= kMiB)
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / kMiB);
  else if (mag >= kKiB)
    std::snprintf(buf, sizeof buf, "%.2f KiB", b / kKiB);
  else
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  return buf;
}

}  // namespace loom
