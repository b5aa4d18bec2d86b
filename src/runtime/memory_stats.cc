#include "src/runtime/memory_stats.h"

#include <cstdio>
#include <cstring>

namespace loom {
namespace {

int64_t StatusField(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int64_t kib = -1;
  const size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, key, n) == 0 && line[n] == ':') {
      long long v = 0;
      if (std::sscanf(line + n + 1, "%lld", &v) == 1) kib = v;
      break;
    }
  }
  std::fclose(f);
  return kib < 0 ? -1 : kib * 1024;
}

}  // namespace

int64_t CurrentRssBytes() { return StatusField("VmRSS"); }
int64_t PeakRssBytes() { return StatusField("VmHWM"); }
int64_t RssFileBytes() { return StatusField("RssFile"); }

int64_t MappedRssBytes(const char* suffix) {
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (!f) return -1;
  const size_t suffix_len = std::strlen(suffix);
  char line[4096];
  bool match = false;
  int64_t kib = 0;
  while (std::fgets(line, sizeof line, f)) {
    size_t n = std::strlen(line);
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == ' ')) line[--n] = 0;
    // A mapping's header: "start-end perms offset dev inode [path]"; its
    // fields follow as "Key:   value kB".
    const char* colon = std::strchr(line, ':');
    const char* space = std::strchr(line, ' ');
    const bool header = std::strchr(line, '-') != nullptr &&
                        (colon == nullptr || (space && space < colon));
    if (header) {
      match =
          n >= suffix_len && std::strcmp(line + n - suffix_len, suffix) == 0;
    } else if (match && std::strncmp(line, "Rss:", 4) == 0) {
      long long v = 0;
      if (std::sscanf(line + 4, "%lld", &v) == 1) kib += v;
    }
  }
  std::fclose(f);
  return kib * 1024;
}

bool ResetPeakRss() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

}  // namespace loom
