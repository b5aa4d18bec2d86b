// Helpers shared by the libFuzzer harnesses (docs/design/fuzzing.md).
//
// Every harness is a `LLVMFuzzerTestOneInput` over one parser of outside
// input. Built with LOOM_FUZZ (clang) it links libFuzzer; otherwise it links
// replay_main.cc, and CTest replays the committed corpus and regression
// inputs through it in every build.
#ifndef LOOM_FUZZ_FUZZ_UTIL_H_
#define LOOM_FUZZ_FUZZ_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::fuzz {

// A directory private to this process: created on first use, removed at
// exit.
const std::string& ScratchDir();

// Writes `bytes` to ScratchDir()/`name` (creating parent directories),
// replacing the file; returns its path.
std::string WriteScratch(const std::string& name, std::string_view bytes);

// Copies the regular files of directory `from` into `to` (created; files
// already in `to` are replaced, others removed).
void CopyDir(const std::string& from, const std::string& to);

// The directory of bundled data: LOOM_SOURCE_DIR/`relative`.
std::string SourcePath(const std::string& relative);

// A property a harness checks failed: prints `what` and aborts, so libFuzzer
// saves the input (and the replay test fails).
[[noreturn]] void Fail(const std::string& what);

// Splits `text` at `sep` (at most `max_parts` parts; the last holds the rest).
std::vector<std::string_view> Split(std::string_view text, char sep,
                                    size_t max_parts);

// Reads the input as: one selector byte (0 if empty), then the rest.
struct ModeAndRest {
  uint8_t mode = 0;
  std::string_view rest;
};
ModeAndRest TakeMode(const uint8_t* data, size_t size);

}  // namespace loom::fuzz

#endif  // LOOM_FUZZ_FUZZ_UTIL_H_
