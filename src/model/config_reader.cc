#include "src/model/config_reader.h"

#include <cstdint>

#include "src/base/read_file.h"
#include "src/core/json_error.h"
#include "src/core/json_int.h"

namespace loom {

StatusOr<ConfigReader> ConfigReader::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  nlohmann::json j =
      nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return DataLossError(path + ": not valid JSON at " +
                         LocateJsonError(text).Where());
  if (!j.is_object())
    return DataLossError(path + ": top level is " + std::string(j.type_name()) +
                         ", expected an object");
  return ConfigReader(path, std::move(j));
}

bool ConfigReader::Has(const std::string& key) const {
  auto it = json_.find(key);
  return it != json_.end() && !it->is_null();
}

Status ConfigReader::TypeError(const std::string& key,
                               const char* expected) const {
  return InvalidArgumentError(
      source_ + ": key '" + key + "' is " + json_.at(key).dump() + " (" +
      json_.at(key).type_name() + "), expected " + expected);
}

StatusOr<int64_t> ConfigReader::Int(const std::string& key) const {
  if (!Has(key))
    return NotFoundError(source_ + ": missing required key '" + key + "'");
  // 128.0 is an integer; 1e300, 0.5 and 2^64 are not.
  if (auto i = JsonInt64(json_.at(key), /*allow_integral_float=*/true))
    return *i;
  return TypeError(key, "an integer (within the int64 range)");
}

StatusOr<double> ConfigReader::Float(const std::string& key) const {
  if (!Has(key))
    return NotFoundError(source_ + ": missing required key '" + key + "'");
  const auto& v = json_.at(key);
  if (v.is_number()) return v.get<double>();
  return TypeError(key, "a number");
}

StatusOr<bool> ConfigReader::Bool(const std::string& key) const {
  if (!Has(key))
    return NotFoundError(source_ + ": missing required key '" + key + "'");
  const auto& v = json_.at(key);
  if (v.is_boolean()) return v.get<bool>();
  return TypeError(key, "a boolean");
}

StatusOr<std::string> ConfigReader::String(const std::string& key) const {
  if (!Has(key))
    return NotFoundError(source_ + ": missing required key '" + key + "'");
  const auto& v = json_.at(key);
  if (v.is_string()) return v.get<std::string>();
  return TypeError(key, "a string");
}

StatusOr<int64_t> ConfigReader::Int(const std::string& key,
                                    int64_t fallback) const {
  return Has(key) ? Int(key) : StatusOr<int64_t>(fallback);
}
StatusOr<double> ConfigReader::Float(const std::string& key,
                                     double fallback) const {
  return Has(key) ? Float(key) : StatusOr<double>(fallback);
}
StatusOr<bool> ConfigReader::Bool(const std::string& key, bool fallback) const {
  return Has(key) ? Bool(key) : StatusOr<bool>(fallback);
}
StatusOr<std::string> ConfigReader::String(const std::string& key,
                                           const std::string& fallback) const {
  return Has(key) ? String(key) : StatusOr<std::string>(fallback);
}

StatusOr<std::optional<ConfigReader>> ConfigReader::Object(
    const std::string& key) const {
  if (!Has(key)) return std::optional<ConfigReader>();
  const auto& v = json_.at(key);
  if (!v.is_object()) return TypeError(key, "an object");
  return std::optional<ConfigReader>(
      ConfigReader(source_ + " [" + key + "]", v));
}

}  // namespace loom
