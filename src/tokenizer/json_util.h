// Small helpers for reading tokenizer JSON files into Status-returning code.
// Every error names the file and the dotted path of the field.
#ifndef LOOM_SRC_TOKENIZER_JSON_UTIL_H_
#define LOOM_SRC_TOKENIZER_JSON_UTIL_H_

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "src/base/status.h"

namespace loom::tok {

using Json = nlohmann::json;

// Location of a JSON value, for error messages: "tokenizer.json: model.vocab".
struct JsonPath {
  std::string file;
  std::string path;
  JsonPath Child(std::string_view key) const {
    return {file,
            path.empty() ? std::string(key) : path + "." + std::string(key)};
  }
  JsonPath Index(size_t i) const {
    return {file, path + "[" + std::to_string(i) + "]"};
  }
  std::string ToString() const {
    return file + ": " + (path.empty() ? "<root>" : path);
  }
};

Status JsonError(const JsonPath& at, std::string_view what);

// Reads a whole file and parses it. NotFound when the file is missing,
// DataLoss when it is not valid JSON.
StatusOr<Json> ReadJsonFile(const std::string& path,
                            const std::string& display_name);

// Field accessors: a missing key yields `fallback` (Opt*) or an error naming
// the field; a key of the wrong type is always an error.
StatusOr<std::string> GetString(const Json& obj, std::string_view key,
                                const JsonPath& at);
StatusOr<std::string> OptString(const Json& obj, std::string_view key,
                                const JsonPath& at, std::string fallback);
StatusOr<bool> OptBool(const Json& obj, std::string_view key,
                       const JsonPath& at, bool fallback);
StatusOr<int64_t> GetInt(const Json& obj, std::string_view key,
                         const JsonPath& at);
StatusOr<int64_t> OptInt(const Json& obj, std::string_view key,
                         const JsonPath& at, int64_t fallback);
// A string pattern given as {"String": "..."} or {"Regex": "..."}.
struct Pattern {
  bool is_regex = false;
  std::string text;
};
StatusOr<Pattern> GetPattern(const Json& obj, std::string_view key,
                             const JsonPath& at);

}  // namespace loom::tok

#endif  // LOOM_SRC_TOKENIZER_JSON_UTIL_H_
