// Reading a whole (small) file into memory: config.json, tokenizer.json,
// input text. Unlike `ss << ifstream.rdbuf()`, which reads a directory or a
// file that fails mid-way as an empty or short text, every OS error is a
// Status naming the path, the operation and strerror: NotFound for ENOENT,
// IoError otherwise ("<path>: read: Is a directory"). No state; thread-safe.
#ifndef LOOM_BASE_READ_FILE_H_
#define LOOM_BASE_READ_FILE_H_

#include <string>

#include "src/base/status.h"

namespace loom {

StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace loom

#endif  // LOOM_BASE_READ_FILE_H_
