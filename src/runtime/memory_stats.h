// Process memory measurements (Linux /proc), for comparing what a run really
// used with what the planner said it would.
#ifndef LOOM_RUNTIME_MEMORY_STATS_H_
#define LOOM_RUNTIME_MEMORY_STATS_H_

#include <cstdint>

namespace loom {

// Resident set size now (anonymous + file-backed pages, e.g. mmap'd weights).
int64_t CurrentRssBytes();
// Resident file-backed pages (libraries' code and data, mmap'd files).
int64_t RssFileBytes();
// Resident bytes of the file mappings whose path ends with `suffix`
// (/proc/self/smaps), e.g. ".safetensors": the weights mapped from a
// checkpoint. -1 if smaps cannot be read.
int64_t MappedRssBytes(const char* suffix);
// Peak resident set size since the process started or the last ResetPeakRss.
int64_t PeakRssBytes();
// Resets the peak to the current RSS (/proc/self/clear_refs); false if the
// kernel does not allow it (the peak then counts from process start).
bool ResetPeakRss();

}  // namespace loom

#endif  // LOOM_RUNTIME_MEMORY_STATS_H_
