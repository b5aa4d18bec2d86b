// The valid ranges of numeric flags, as CLI11 validators. A value outside
// its flag's range is a usage error (exit 2) like a value of the wrong type,
// caught while parsing, before anything is read or written; the message names
// the flag, the value given and the range:
//   loom extract: --batch-tokens: got 0, expected an integer >= 1
// A value that is no number at all is left to CLI11's conversion ("Could not
// convert: --batch-tokens = many"). Where 0 has a documented meaning (threads
// 0 = all cores, --streaming-chunk-size 0 = off) the range includes it; where
// a default is computed from the model (--ctx, --batch-tokens) 0 is not a
// way to ask for it, the default is had by leaving the flag out.
#ifndef LOOM_TOOLS_CLI_FLAG_RANGES_H_
#define LOOM_TOOLS_CLI_FLAG_RANGES_H_

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace loom::cli {

// NumberRange's hi for no upper bound.
inline constexpr double kNoLimit = std::numeric_limits<double>::infinity();

// An integer in [lo, hi] (hi = INT64_MAX: no upper bound).
inline CLI::Validator IntRange(
    int64_t lo, int64_t hi = std::numeric_limits<int64_t>::max()) {
  const bool open = hi == std::numeric_limits<int64_t>::max();
  const std::string range =
      open ? ">= " + std::to_string(lo)
           : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& in) -> std::string {
        int64_t v = 0;
        // Not an integer (or beyond int64): CLI11's conversion reports it.
        if (!CLI::detail::lexical_cast(in, v)) return std::string();
        if (v >= lo && v <= hi) return std::string();
        return "got " + in + ", expected an integer " + range;
      },
      open ? ">=" + std::to_string(lo)
           : std::to_string(lo) + ".." + std::to_string(hi));
}

// An unsigned 64-bit integer given without a sign: CLI11 reads "-1" into a
// uint64_t as 2^64 - 1.
inline CLI::Validator Unsigned64() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        const size_t at = in.find_first_not_of(" \t");
        if (at == std::string::npos || in[at] != '-') return std::string();
        return "got " + in + ", expected an integer in [0, " +
               std::to_string(std::numeric_limits<uint64_t>::max()) + "]";
      },
      "");
}

// A finite number in the interval from lo to hi, each end open or closed.
inline CLI::Validator NumberRange(double lo, bool lo_open, double hi,
                                  bool hi_open) {
  const bool no_hi = hi == kNoLimit;
  auto text = [](double x) {
    std::string s = std::to_string(x);
    s.erase(s.find_last_not_of('0') + 1);
    if (s.back() == '.') s.pop_back();
    return s;
  };
  const std::string range = no_hi ? (lo_open ? "> " : ">= ") + text(lo)
                                  : "in " + std::string(lo_open ? "(" : "[") +
                                        text(lo) + ", " + text(hi) +
                                        (hi_open ? ")" : "]");
  return CLI::Validator(
      [=](std::string& in) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(in, v)) return std::string();
        const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) &&
                        (no_hi || (hi_open ? v < hi : v <= hi));
        if (ok) return std::string();
        return "got " + in + ", expected a finite number " + range;
      },
      no_hi ? std::string(lo_open ? ">" : ">=") + text(lo)
            : std::string(lo_open ? "(" : "[") + text(lo) + "," + text(hi) +
                  (hi_open ? ")" : "]"));
}

}  // namespace loom::cli

#endif  // LOOM_TOOLS_CLI_FLAG_RANGES_H_
