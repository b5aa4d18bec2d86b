#include "src/tokenizer/json_util.h"

#include "src/base/read_file.h"

namespace loom::tok {

Status JsonError(const JsonPath& at, std::string_view what) {
  return DataLossError(at.ToString() + ": " + std::string(what));
}

StatusOr<Json> ReadJsonFile(const std::string& path,
                            const std::string& display_name) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    return DataLossError(display_name + ": not valid JSON: " + e.what());
  }
}

namespace {
const char* TypeName(const Json& v) { return v.type_name(); }
}  // namespace

StatusOr<std::string> GetString(const Json& obj, std::string_view key,
                                const JsonPath& at) {
  if (!obj.is_object()) return JsonError(at, "expected an object");
  auto it = obj.find(key);
  if (it == obj.end()) return JsonError(at.Child(key), "missing field");
  if (!it->is_string()) {
    return JsonError(at.Child(key),
                     std::string("expected a string, got ") + TypeName(*it));
  }
  return it->get<std::string>();
}

StatusOr<std::string> OptString(const Json& obj, std::string_view key,
                                const JsonPath& at, std::string fallback) {
  if (!obj.is_object()) return JsonError(at, "expected an object");
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string()) {
    return JsonError(at.Child(key),
                     std::string("expected a string, got ") + TypeName(*it));
  }
  return it->get<std::string>();
}

StatusOr<bool> OptBool(const Json& obj, std::string_view key,
                       const JsonPath& at, bool fallback) {
  if (!obj.is_object()) return JsonError(at, "expected an object");
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return JsonError(at.Child(key),
                     std::string("expected a boolean, got ") + TypeName(*it));
  }
  return it->get<bool>();
}

StatusOr<int64_t> GetInt(const Json& obj, std::string_view key,
                         const JsonPath& at) {
  if (!obj.is_object()) return JsonError(at, "expected an object");
  auto it = obj.find(key);
  if (it == obj.end()) return JsonError(at.Child(key), "missing field");
  if (!it->is_number_integer()) {
    return JsonError(at.Child(key),
                     std::string("expected an integer, got ") + TypeName(*it));
  }
  return it->get<int64_t>();
}

StatusOr<int64_t> OptInt(const Json& obj, std::string_view key,
                         const JsonPath& at, int64_t fallback) {
  if (!obj.is_object()) return JsonError(at, "expected an object");
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  return GetInt(obj, key, at);
}

StatusOr<Pattern> GetPattern(const Json& obj, std::string_view key,
                             const JsonPath& at) {
  if (!obj.is_object()) return JsonError(at, "expected an object");
  auto it = obj.find(key);
  if (it == obj.end()) return JsonError(at.Child(key), "missing field");
  const JsonPath p = at.Child(key);
  if (it->is_string()) return Pattern{false, it->get<std::string>()};
  if (!it->is_object())
    return JsonError(p, "expected {\"String\": ...} or {\"Regex\": ...}");
  if (it->contains("String")) {
    ASSIGN_OR_RETURN(std::string s, GetString(*it, "String", p));
    return Pattern{false, s};
  }
  if (it->contains("Regex")) {
    ASSIGN_OR_RETURN(std::string s, GetString(*it, "Regex", p));
    return Pattern{true, s};
  }
  return JsonError(p, "expected {\"String\": ...} or {\"Regex\": ...}");
}

}  // namespace loom::tok
