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
SmapsRss ReadSmapsRss(const char* mapped_suffix) {
  SmapsRss r;
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (!f) return r;
  const size_t suffix_len = std::strlen(mapped_suffix);
  char line[4096];
  int64_t* into = nullptr;  // where the current mapping's Rss is added
  while (std::fgets(line, sizeof line, f)) {
    size_t n = std::strlen(line);
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == ' ')) line[--n] = 0;
    // A mapping's header: "start-end perms offset dev inode [path]"; its
    // fields follow as "Key:   value kB".
    char perms[8] = {};
    unsigned long long inode = 0;
    if (std::sscanf(line, "%*x-%*x %7s %*x %*x:%*x %llu", perms, &inode) == 2) {
      const bool mapped =
          inode != 0 && n >= suffix_len &&
          std::strcmp(line + n - suffix_len, mapped_suffix) == 0;
      const bool code = inode == 0 && std::strchr(perms, 'x') != nullptr;
      into = mapped ? &r.mapped : (inode != 0 || code) ? &r.library : nullptr;
    } else if (into != nullptr && std::strncmp(line, "Rss:", 4) == 0) {
      long long kib = 0;
      if (std::sscanf(line + 4, "%lld", &kib) == 1) *into += kib * 1024;
    }
  }
  std::fclose(f);
  r.ok = true;
  return r;
}

bool ResetPeakRss() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

}  // namespace loom
