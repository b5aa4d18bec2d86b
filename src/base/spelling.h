// "Did you mean": the nearest of some names to a misspelt one.
#ifndef LOOM_BASE_SPELLING_H_
#define LOOM_BASE_SPELLING_H_

#include <cstddef>
#include <string_view>
#include <vector>

namespace loom {

// Levenshtein distance: the fewest single-character insertions, deletions
// and substitutions that turn `a` into `b`.
size_t EditDistance(std::string_view a, std::string_view b);

// The candidate nearest to `name` when it is at most `max_distance` edits
// away (the first of equally near ones), else "".
std::string_view Nearest(std::string_view name,
                         const std::vector<std::string_view>& candidates,
                         size_t max_distance);

// The distance within which a name of this length reads as a misspelling:
// two edits, or a third of its characters for a long one.
inline size_t MisspellingDistance(std::string_view name) {
  return name.size() / 3 > 2 ? name.size() / 3 : 2;
}

}  // namespace loom

#endif  // LOOM_BASE_SPELLING_H_
