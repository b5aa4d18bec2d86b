// Byte counts: parsing "24GiB"/"80GB"/"512MiB" and printing "1.50 GiB".
#ifndef LOOM_BASE_UNITS_H_
#define LOOM_BASE_UNITS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "src/base/status.h"

namespace loom {

inline constexpr int64_t kKiB = 1024;
inline constexpr int64_t kMiB = 1024 * kKiB;
inline constexpr int64_t kGiB = 1024 * kMiB;

// Accepts an integer or decimal number followed by an optional unit:
// B, KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024).
// A bare number is bytes. Case-insensitive units.
StatusOr<int64_t> ParseBytes(std::string_view text);

// "12.34 GiB", "512.00 MiB", "17 B".
std::string FormatBytes(int64_t bytes);

// Rounds `n` up to a multiple of `align` (a power of two).
constexpr int64_t AlignUp(int64_t n, int64_t align) {
  return (n + align - 1) & ~(align - 1);
}

}  // namespace loom

#endif  // LOOM_BASE_UNITS_H_
