// ConfigReader: typed, Status-returning access to a config.json object. Every
// error names the file and the key, and the value found vs the type expected.
#ifndef LOOM_MODEL_CONFIG_READER_H_
#define LOOM_MODEL_CONFIG_READER_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "src/base/status.h"

namespace loom {

class ConfigReader {
 public:
  ConfigReader(std::string source, nlohmann::json json)
      : source_(std::move(source)), json_(std::move(json)) {}

  // Parses a JSON file into a reader; the top level must be an object.
  static StatusOr<ConfigReader> FromFile(const std::string& path);

  const std::string& source() const { return source_; }
  const nlohmann::json& json() const { return json_; }
  bool Has(const std::string& key) const;  // present and not null

  StatusOr<int64_t> Int(const std::string& key) const;
  StatusOr<double> Float(const std::string& key) const;
  StatusOr<bool> Bool(const std::string& key) const;
  StatusOr<std::string> String(const std::string& key) const;

  // Defaults for absent or null keys; a present value of the wrong type is
  // still an error.
  StatusOr<int64_t> Int(const std::string& key, int64_t fallback) const;
  StatusOr<double> Float(const std::string& key, double fallback) const;
  StatusOr<bool> Bool(const std::string& key, bool fallback) const;
  StatusOr<std::string> String(const std::string& key,
                               const std::string& fallback) const;

  // A sub-object ("rope_scaling"); nullopt if absent or null.
  StatusOr<std::optional<ConfigReader>> Object(const std::string& key) const;

 private:
  Status TypeError(const std::string& key, const char* expected) const;
  std::string source_;
  nlohmann::json json_;
};

}  // namespace loom

#endif  // LOOM_MODEL_CONFIG_READER_H_
