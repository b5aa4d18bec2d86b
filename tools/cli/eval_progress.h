// A one-line progress bar on stderr for `loom perplexity` / `loom compare`,
// drawn only when stderr is a terminal and --quiet is not given.
#ifndef LOOM_TOOLS_CLI_EVAL_PROGRESS_H_
#define LOOM_TOOLS_CLI_EVAL_PROGRESS_H_

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace loom::cli {

inline std::function<void(int64_t, int64_t)> MakeWindowProgress(
    bool quiet, std::string label) {
  if (quiet || !isatty(STDERR_FILENO)) return nullptr;
  const auto start = std::chrono::steady_clock::now();
  return [label = std::move(label), start](int64_t done, int64_t total) {
    constexpr int kWidth = 30;
    const int filled =
        total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    const double eta = done > 0 ? s * static_cast<double>(total - done) /
                                      static_cast<double>(done)
                                : 0.0;
    std::fprintf(stderr, "\r%s [%s%s] %lld/%lld windows  %.0fs, eta %.0fs ",
                 label.c_str(), std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, '.').c_str(),
                 static_cast<long long>(done), static_cast<long long>(total), s,
                 eta);
    if (done == total) std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  };
}

}  // namespace loom::cli

#endif  // LOOM_TOOLS_CLI_EVAL_PROGRESS_H_
