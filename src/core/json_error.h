// Where a text that nlohmann::json does not parse stops being JSON, found
// with the non-throwing SAX parser (docs/design/error-model.md: no library
// exception for input errors).
#ifndef LOOM_CORE_JSON_ERROR_H_
#define LOOM_CORE_JSON_ERROR_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

// The 0-based byte offset of the error (the text's size when it ends too
// early), its 1-based line and column, and the parser's description
// ("syntax error while parsing object - unexpected end of input; expected
// '}'"). For a text that parses: offset -1, line and column 0, what "".
struct JsonParseError {
  int64_t offset = -1;
  int64_t line = 0;
  int64_t column = 0;
  std::string what;
  // "line 2, column 20 (byte offset 31): <what>".
  std::string Where() const;
};
JsonParseError LocateJsonError(std::string_view text);

}  // namespace loom

#endif  // LOOM_CORE_JSON_ERROR_H_
