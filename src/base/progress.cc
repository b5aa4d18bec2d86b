#include "src/base/progress.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace loom {

bool StderrIsTerminal() { return isatty(STDERR_FILENO) != 0; }

std::function<void(int64_t, int64_t)> MakeProgressBar(bool enabled,
                                                      std::string label,
                                                      std::string unit) {
  if (!enabled) return nullptr;
  const auto start = std::chrono::steady_clock::now();
  return [label = std::move(label), unit = std::move(unit), start](
             int64_t done, int64_t total) {
    constexpr int kWidth = 30;
    const int filled =
        total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    const double eta = done > 0 ? s * static_cast<double>(total - done) /
                                      static_cast<double>(done)
                                : 0.0;
    std::fprintf(stderr, "\r%s [%s%s] %lld/%lld %s  %.0fs, eta %.0fs ",
                 label.c_str(), std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, '.').c_str(),
                 static_cast<long long>(done), static_cast<long long>(total),
                 unit.c_str(), s, eta);
    if (done == total) std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  };
}

}  // namespace loom
