// Shared setup for benchmarks: the synthetic TinyLlama-1.1B-shaped model
// (bf16, written once to $LOOM_BENCH_DIR or the system temp dir), and an
// aligned buffer.
#ifndef LOOM_BENCH_BENCH_UTIL_H_
#define LOOM_BENCH_BENCH_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "src/model/synth.h"

namespace loom::bench {

// A 64-byte aligned buffer of at least `bytes` (workspaces must be aligned).
struct Buf {
  explicit Buf(int64_t bytes)
      : p(std::aligned_alloc(64,
                             (std::max<int64_t>(bytes, 64) + 63) / 64 * 64)) {}
  ~Buf() { std::free(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void* p;
};

inline std::string SyntheticTinyLlamaDir() {
  const char* env = std::getenv("LOOM_BENCH_DIR");
  const std::string base =
      env ? env : std::filesystem::temp_directory_path().string();
  const std::string dir = base + "/loom-synth-tinyllama-1.1b-bf16";
  if (!std::filesystem::exists(dir + "/model.safetensors")) {
    SynthOptions o;
    o.preset = "tinyllama-1.1b";
    o.dtype = DType::kBF16;
    auto r = WriteSyntheticModel(dir, o);
    if (!r.ok()) {
      std::fprintf(stderr, "synth failed: %s\n", r.status().ToString().c_str());
      std::exit(1);
    }
  }
  return dir;
}

}  // namespace loom::bench

#endif  // LOOM_BENCH_BENCH_UTIL_H_
