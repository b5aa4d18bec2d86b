// Process memory measurements (Linux /proc), for comparing what a run really
// used with what the planner said it would.
#ifndef LOOM_RUNTIME_MEMORY_STATS_H_
#define LOOM_RUNTIME_MEMORY_STATS_H_

#include <cstdint>

namespace loom {

// Resident set size now (anonymous + file-backed pages, e.g. mmap'd weights).
int64_t CurrentRssBytes();
// Resident bytes by kind of mapping (/proc/self/smaps).
struct SmapsRss {
  bool ok = false;     // smaps was read
  int64_t mapped = 0;  // file mappings whose path ends with the suffix given
  // Every other file mapping (the libraries' code and data, their pages
  // copied on write included) and the anonymous executable mappings (code
  // generated at run time, e.g. oneDNN's kernels).
  int64_t library = 0;
};
// `mapped_suffix`, e.g. ".safetensors": the weights mapped from a checkpoint.
SmapsRss ReadSmapsRss(const char* mapped_suffix);
// Peak resident set size since the process started or the last ResetPeakRss.
int64_t PeakRssBytes();
// Resets the peak to the current RSS (/proc/self/clear_refs); false if the
// kernel does not allow it (the peak then counts from process start).
bool ResetPeakRss();

}  // namespace loom

#endif  // LOOM_RUNTIME_MEMORY_STATS_H_
