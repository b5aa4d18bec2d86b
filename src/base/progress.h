// A one-line progress bar on stderr ("label [#####.....] 12/40 windows  3s,
// eta 7s"), for the long jobs of every front end: perplexity and compare
// windows, patch grid cells, the Python module's extract prompts. Drawn only
// where asked (the front ends draw it when stderr is a terminal), erased at
// the end.
#ifndef LOOM_BASE_PROGRESS_H_
#define LOOM_BASE_PROGRESS_H_

#include <cstdint>
#include <functional>
#include <string>

namespace loom {

// Called with (done, total) after each step; null when `enabled` is false.
std::function<void(int64_t, int64_t)> MakeProgressBar(bool enabled,
                                                      std::string label,
                                                      std::string unit);

// Whether stderr is a terminal (a bar would be seen, not logged).
bool StderrIsTerminal();

}  // namespace loom

#endif  // LOOM_BASE_PROGRESS_H_
