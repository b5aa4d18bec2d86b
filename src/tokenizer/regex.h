// A compiled Unicode regular expression (PCRE2 with UTF + UCP, JIT-compiled
// when the platform supports it). Immutable after construction and safe to
// use from many threads at once.
#ifndef LOOM_SRC_TOKENIZER_REGEX_H_
#define LOOM_SRC_TOKENIZER_REGEX_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/base/status.h"

namespace loom::tok {

class Regex {
 public:
  // `literal`: match `pattern` as plain text.
  static StatusOr<std::unique_ptr<Regex>> Compile(const std::string& pattern,
                                                  bool literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends every non-overlapping, non-empty match in `subject` (valid UTF-8)
  // as [begin, end) byte offsets relative to `subject`.
  void FindAll(std::string_view subject,
               std::vector<std::pair<uint32_t, uint32_t>>* out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

}  // namespace loom::tok

#endif  // LOOM_SRC_TOKENIZER_REGEX_H_
