#include "src/core/json_error.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace loom {
namespace {

// Records where the parse fails; accepts everything else.
class ErrorLocator : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& e) override {
    error_.offset = static_cast<int64_t>(position) - 1;  // position is 1-based
    // "[json.exception.parse_error.101] parse error at line 1, column 8:
    // syntax error ...": the part after the position.
    error_.what = e.what();
    const size_t column = error_.what.find(", column ");
    const size_t colon =
        column == std::string::npos ? column : error_.what.find(": ", column);
    if (colon != std::string::npos) error_.what.erase(0, colon + 2);
    return false;  // stop; sax_parse then returns false without throwing
  }
  const JsonParseError& error() const { return error_; }

 private:
  JsonParseError error_;
};

}  // namespace

std::string JsonParseError::Where() const {
  return "line " + std::to_string(line) + ", column " + std::to_string(column) +
         " (byte offset " + std::to_string(offset) + "): " + what;
}

JsonParseError LocateJsonError(std::string_view text) {
  ErrorLocator locator;
  nlohmann::json::sax_parse(text, &locator);
  JsonParseError e = locator.error();
  if (e.offset < 0) return e;
  const std::string_view before = text.substr(
      0, std::min<size_t>(static_cast<size_t>(e.offset), text.size()));
  e.line = 1 + std::count(before.begin(), before.end(), '\n');
  const size_t nl = before.rfind('\n');
  e.column = static_cast<int64_t>(before.size()) -
             (nl == std::string_view::npos ? 0 : static_cast<int64_t>(nl) + 1) +
             1;
  return e;
}

}  // namespace loom
