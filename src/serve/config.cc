#include "src/serve/config.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>
#include <variant>

#include "src/base/spelling.h"
#include "src/base/units.h"

namespace loom::serve {
namespace {

constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------------------
// The key table: one row per key, the single source of names, types and
// rules for parsing, environment overrides, validation and ToJson.

using Ref = std::variant<std::string*, bool*, int*, int64_t*, double*,
                         std::vector<std::string>*, std::vector<int>*,
                         std::vector<int64_t>*>;
using ConstRef =
    std::variant<const std::string*, const bool*, const int*, const int64_t*,
                 const double*, const std::vector<std::string>*,
                 const std::vector<int>*, const std::vector<int64_t>*>;

// How a key's value is read and checked. Built with the setters below, e.g.
// Rule().Range(0, 65535).
struct Rule {
  // Integers and integer list elements: inclusive bounds (further limited to
  // the field's type).
  int64_t min = kInt64Min;
  int64_t max = kInt64Max;
  // Floating-point numbers: bounds, the lower one excluded when min_open.
  double dmin = -kInf;
  double dmax = kInf;
  bool dmin_open = false;
  // Strings: the accepted values (empty: any), values recognised but not
  // implemented (Unimplemented), and other spellings read as a value.
  std::vector<std::string_view> choices;
  std::vector<std::string_view> unimplemented;
  std::vector<std::pair<std::string_view, std::string_view>> aliases;
  bool fold_case = false;  // strings: compared and stored in lower case
  bool nullable = false;   // strings: null reads as ""
  bool non_empty = false;  // strings and string list elements
  bool unique = false;     // lists: no value twice
  bool bytes = false;      // integers: "8MiB" as well as 8388608
  bool secret = false;     // ToJson redacts a non-empty value

  Rule& Min(int64_t v) { return min = v, *this; }
  Rule& Range(int64_t lo, int64_t hi) { return min = lo, max = hi, *this; }
  Rule& Real(double lo, double hi, bool lo_open = false) {
    return dmin = lo, dmax = hi, dmin_open = lo_open, *this;
  }
  Rule& Choices(std::vector<std::string_view> v) {
    return choices = std::move(v), *this;
  }
  Rule& Unimplemented(std::vector<std::string_view> v) {
    return unimplemented = std::move(v), *this;
  }
  Rule& Aliases(std::vector<std::pair<std::string_view, std::string_view>> v) {
    return aliases = std::move(v), *this;
  }
  Rule& FoldCase() { return fold_case = true, *this; }
  Rule& Nullable() { return nullable = true, *this; }
  Rule& NonEmpty() { return non_empty = true, *this; }
  Rule& Unique() { return unique = true, *this; }
  Rule& Bytes() { return bytes = true, *this; }
  Rule& Secret() { return secret = true, *this; }
};

struct Field {
  std::string_view section;
  std::string_view key;
  Ref (*ref)(ServeConfig&);
  ConstRef (*cref)(const ServeConfig&);
  Rule rule;
};

// Names a section and key once: the YAML names are the member names.
#define LOOM_SERVE_FIELD(section_name, key_name)                      \
  std::string_view(#section_name), std::string_view(#key_name),       \
      [](ServeConfig& c) -> Ref { return &c.section_name.key_name; }, \
      [](const ServeConfig& c) -> ConstRef {                          \
        return &c.section_name.key_name;                              \
      }

const std::vector<Field>& Fields() {
  static const auto* const kFields = new std::vector<Field>{
      {LOOM_SERVE_FIELD(server, transport),
       Rule().Choices({"http", "unix", "both"})},
      {LOOM_SERVE_FIELD(server, unix_socket), Rule().NonEmpty()},
      {LOOM_SERVE_FIELD(server, http_host), Rule().NonEmpty()},
      {LOOM_SERVE_FIELD(server, http_port), Rule().Range(0, 65535)},
      {LOOM_SERVE_FIELD(server, auth_token), Rule().Nullable().Secret()},
      {LOOM_SERVE_FIELD(server, max_body_bytes), Rule().Min(1).Bytes()},
      {LOOM_SERVE_FIELD(server, max_analysis_body_bytes),
       Rule().Min(1).Bytes()},
      {LOOM_SERVE_FIELD(server, max_prompt_tokens), Rule().Min(0)},
      {LOOM_SERVE_FIELD(server, max_queue), Rule().Min(0)},
      {LOOM_SERVE_FIELD(server, max_batch_prompts), Rule().Min(1)},
      {LOOM_SERVE_FIELD(server, threads), Rule().Min(0)},
      {LOOM_SERVE_FIELD(server, chat_stream_format),
       Rule().Choices({"auto", "openai", "theloom"})},
      {LOOM_SERVE_FIELD(server, cors_origins), Rule().NonEmpty()},
      {LOOM_SERVE_FIELD(server, cors_allow_credentials), Rule()},
      {LOOM_SERVE_FIELD(server, shutdown_timeout_seconds), Rule().Min(0)},
      {LOOM_SERVE_FIELD(gpu, devices), Rule().Min(0).Unique()},
      {LOOM_SERVE_FIELD(gpu, default_device), Rule().Min(-1)},
      {LOOM_SERVE_FIELD(gpu, memory_fraction), Rule().Real(0.1, 1.0)},
      {LOOM_SERVE_FIELD(models, dirs), Rule().NonEmpty().Unique()},
      {LOOM_SERVE_FIELD(models, preload), Rule().NonEmpty().Unique()},
      {LOOM_SERVE_FIELD(models, max_loaded), Rule().Min(1)},
      {LOOM_SERVE_FIELD(models, default_dtype),
       Rule()
           .Choices({"auto", "float32", "bfloat16", "float16"})
           .Aliases(
               {{"f32", "float32"}, {"bf16", "bfloat16"}, {"f16", "float16"}})},
      {LOOM_SERVE_FIELD(hidden_states, default_layers), Rule()},
      {LOOM_SERVE_FIELD(hidden_states, precision),
       Rule().Choices({"float32", "bfloat16", "float16"})},
      {LOOM_SERVE_FIELD(hidden_states, embedding_layer),
       Rule().Range(-100000, 100000)},
      {LOOM_SERVE_FIELD(hidden_states, embedding_pooling),
       Rule()
           .Choices({"last_token", "first_token", "mean"})
           .Aliases({{"last", "last_token"},
                     {"first", "first_token"},
                     {"cls", "first_token"}})},
      {LOOM_SERVE_FIELD(hidden_states, embedding_normalize), Rule()},
      {LOOM_SERVE_FIELD(memory, precision_mode),
       Rule().Choices({"auto", "fp32", "fp16", "bf16"})},
      {LOOM_SERVE_FIELD(memory, streaming_chunk_size), Rule().Min(1)},
      {LOOM_SERVE_FIELD(memory, memory_warning_threshold),
       Rule().Real(0.0, 1.0, /*lo_open=*/true)},
      {LOOM_SERVE_FIELD(memory, activation_cache_filter), Rule().NonEmpty()},
      {LOOM_SERVE_FIELD(batching, slots), Rule().Min(1)},
      {LOOM_SERVE_FIELD(batching, context), Rule().Min(0)},
      {LOOM_SERVE_FIELD(batching, batch_tokens), Rule().Min(0)},
      {LOOM_SERVE_FIELD(batching, capture_bytes), Rule().Min(1).Bytes()},
      {LOOM_SERVE_FIELD(batching, kv_tokens), Rule().Min(0)},
      {LOOM_SERVE_FIELD(batching, page_size), Rule().Min(0)},
      {LOOM_SERVE_FIELD(logging, level),
       Rule().Choices({"debug", "info", "warning", "error"}).FoldCase()},
      {LOOM_SERVE_FIELD(logging, file), Rule().Nullable()},
      {LOOM_SERVE_FIELD(logging, format), Rule().Nullable()},
      {LOOM_SERVE_FIELD(persistence, enabled), Rule()},
      {LOOM_SERVE_FIELD(persistence, db_path), Rule().NonEmpty()},
      {LOOM_SERVE_FIELD(persistence, hidden_states_dir), Rule().NonEmpty()},
      {LOOM_SERVE_FIELD(persistence, export_dir), Rule().NonEmpty()},
      {LOOM_SERVE_FIELD(persistence, compression),
       Rule()
           .Nullable()
           .Choices({"gzip", "lzf", "none"})
           .Aliases({{"", "none"}})
           .FoldCase()},
      {LOOM_SERVE_FIELD(persistence, compression_level), Rule().Range(0, 9)},
      {LOOM_SERVE_FIELD(persistence, auto_persist), Rule()},
      {LOOM_SERVE_FIELD(persistence, chunk_size), Rule().Min(64)},
      {LOOM_SERVE_FIELD(interp, saes), Rule().NonEmpty()},
  };
  return *kFields;
}

#undef LOOM_SERVE_FIELD

constexpr std::string_view kSections[] = {
    "server", "gpu",      "models",  "hidden_states",
    "memory", "batching", "logging", "persistence", "interp",
};

// TheLoom's keys and sections that mean nothing to Loom: accepted, ignored,
// reported in ServeConfig::warnings.
constexpr std::pair<std::string_view, std::string_view> kIgnoredKeys[] = {
    {"models", "cache_dir"},
    {"models", "trust_remote_code"},
    {"models", "auto_unload_minutes"},
    {"hidden_states", "include_attention"},
    {"memory", "enable_gradient_checkpointing"},
};
constexpr std::string_view kIgnoredSections[] = {
    "loaders",
    "patching",
    "model_overrides",
};

// TheLoom's flat environment variables (after LOOM_, lower case).
constexpr std::pair<std::string_view, std::string_view> kFlatVariables[] = {
    {"max_models", "models.max_loaded"},
    {"default_device", "gpu.default_device"},
    {"memory_fraction", "gpu.memory_fraction"},
};

bool IsSection(std::string_view name) {
  return std::find(std::begin(kSections), std::end(kSections), name) !=
         std::end(kSections);
}

bool IsIgnoredSection(std::string_view name) {
  return std::find(std::begin(kIgnoredSections), std::end(kIgnoredSections),
                   name) != std::end(kIgnoredSections);
}

bool IsIgnoredKey(std::string_view section, std::string_view key) {
  return std::find(std::begin(kIgnoredKeys), std::end(kIgnoredKeys),
                   std::pair(section, key)) != std::end(kIgnoredKeys);
}

const Field* FindField(std::string_view section, std::string_view key) {
  for (const Field& f : Fields()) {
    if (f.section == section && f.key == key) return &f;
  }
  return nullptr;
}

// ---------------------------------------------------------------------------
// Text helpers for messages.

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// "abc" with quotes, backslashes and control bytes escaped, long text cut.
std::string Quote(std::string_view s) {
  constexpr size_t kMaxShown = 120;
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < kMaxShown; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > kMaxShown) out += "...";
  return out + "\"";
}

// A plain scalar as written, quoted only when it would read ambiguously.
std::string ShowPlain(std::string_view s) {
  if (s.empty() || s.size() > 120) return Quote(s);
  for (char c : s) {
    const bool safe =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
        (c >= '0' && c <= '9') ||
        std::string_view("._+-:/").find(c) != std::string_view::npos;
    if (!safe) return Quote(s);
  }
  return std::string(s);
}

std::string FormatDouble(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

template <typename Range>
std::string JoinNames(const Range& names, std::string_view sep = ", ") {
  std::string out;
  for (const auto& n : names) {
    if (!out.empty()) out += sep;
    out += n;
  }
  return out;
}

// " (did you mean X?)" when one candidate is close to `name`, else "".
std::string Suggestion(std::string_view name,
                       const std::vector<std::string_view>& candidates,
                       std::string_view prefix) {
  const std::string_view best =
      Nearest(Lower(name), candidates, MisspellingDistance(name));
  if (best.empty()) return "";
  return " (did you mean " + std::string(prefix) + std::string(best) + "?)";
}

std::vector<std::string_view> KeysOf(std::string_view section) {
  std::vector<std::string_view> keys;
  for (const Field& f : Fields()) {
    if (f.section == section) keys.push_back(f.key);
  }
  return keys;
}

std::string UnknownSectionMessage(std::string_view name) {
  const std::vector<std::string_view> sections(std::begin(kSections),
                                               std::end(kSections));
  return "unknown section " + ShowPlain(name) + Suggestion(name, sections, "") +
         "; the sections are: " + JoinNames(sections);
}

std::string UnknownKeyMessage(std::string_view section, std::string_view key) {
  const std::vector<std::string_view> keys = KeysOf(section);
  const std::string prefix = std::string(section) + ".";
  return "unknown key " + prefix + ShowPlain(key) +
         Suggestion(key, keys, prefix) + "; the keys of " +
         std::string(section) + " are: " + JoinNames(keys);
}

std::string IgnoredKeyWarning(std::string_view section, std::string_view key) {
  return std::string(section) + "." + std::string(key) +
         " is a TheLoom key that loom serve ignores";
}

std::string IgnoredSectionWarning(std::string_view section) {
  return "section " + std::string(section) +
         " is a TheLoom section that loom serve ignores";
}

// ---------------------------------------------------------------------------
// Checks of values (no location): "path: expected E, found V".

Status Mismatch(std::string_view path, std::string_view expected,
                std::string_view found) {
  return InvalidArgumentError(std::string(path) + ": expected " +
                              std::string(expected) + ", found " +
                              std::string(found));
}

// The bounds of an integer field: the rule's, within the C++ type's.
template <typename T>
std::pair<int64_t, int64_t> IntBounds(const Rule& rule) {
  return {std::max<int64_t>(rule.min, std::numeric_limits<T>::min()),
          std::min<int64_t>(rule.max, std::numeric_limits<T>::max())};
}

std::string IntExpectation(const Rule& rule, int64_t lo, int64_t hi) {
  std::string what = rule.bytes ? "a byte count" : "an integer";
  if (lo != kInt64Min && hi != kInt64Max) {
    what += " in " + std::to_string(lo) + ".." + std::to_string(hi);
  } else if (lo == 1) {
    what += " > 0";
  } else if (lo != kInt64Min) {
    what += " >= " + std::to_string(lo);
  } else if (hi != kInt64Max) {
    what += " <= " + std::to_string(hi);
  }
  if (rule.bytes) what += " (e.g. 8388608 or 8MiB)";
  return what;
}

Status CheckInt(std::string_view path, const Rule& rule, int64_t lo, int64_t hi,
                int64_t value) {
  if (value < lo || value > hi)
    return Mismatch(path, IntExpectation(rule, lo, hi), std::to_string(value));
  return Status::Ok();
}

std::string DoubleExpectation(const Rule& rule) {
  return "a number in " + std::string(rule.dmin_open ? "(" : "[") +
         FormatDouble(rule.dmin) + ", " + FormatDouble(rule.dmax) + "]";
}

Status CheckDouble(std::string_view path, const Rule& rule, double value) {
  const bool above_min =
      rule.dmin_open ? value > rule.dmin : value >= rule.dmin;
  if (!(above_min && value <= rule.dmax))  // NaN fails too
    return Mismatch(path, DoubleExpectation(rule), FormatDouble(value));
  return Status::Ok();
}

std::string StringExpectation(const Rule& rule) {
  if (!rule.choices.empty()) return "one of " + JoinNames(rule.choices);
  return rule.non_empty ? "a non-empty string" : "a string";
}

// Checks a string and returns it as stored: lower case when the rule folds
// case, an alias replaced by its value.
StatusOr<std::string> CanonicalString(std::string_view path, const Rule& rule,
                                      std::string_view text) {
  std::string value = rule.fold_case ? Lower(text) : std::string(text);
  for (const auto& [alias, name] : rule.aliases) {
    if (value == alias) value = name;
  }
  if (rule.non_empty && value.empty())
    return Mismatch(path, StringExpectation(rule), Quote(text));
  if (rule.choices.empty() ||
      std::find(rule.choices.begin(), rule.choices.end(), value) !=
          rule.choices.end())
    return value;
  if (std::find(rule.unimplemented.begin(), rule.unimplemented.end(), value) !=
      rule.unimplemented.end()) {
    return UnimplementedError(std::string(path) + ": " + Quote(text) +
                              " is not implemented by loom serve; expected " +
                              JoinNames(rule.choices, " or "));
  }
  return Mismatch(path, StringExpectation(rule), Quote(text));
}

template <typename T>
Status CheckUnique(std::string_view path, const std::vector<T>& values) {
  for (size_t i = 0; i < values.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (values[j] == values[i]) {
        std::string shown;
        if constexpr (std::is_same_v<T, std::string>) {
          shown = Quote(values[i]);
        } else {
          shown = std::to_string(values[i]);
        }
        return InvalidArgumentError(
            std::string(path) + ": " + shown + " is listed twice (items " +
            std::to_string(j) + " and " + std::to_string(i) + ")");
      }
    }
  }
  return Status::Ok();
}

std::string ItemPath(std::string_view path, size_t i) {
  return std::string(path) + "[" + std::to_string(i) + "]";
}

std::string FieldPath(const Field& f) {
  return std::string(f.section) + "." + std::string(f.key);
}

// Checks one field's current value against its rule.
Status CheckField(const Field& f, const ServeConfig& config) {
  const std::string path = FieldPath(f);
  const Rule& rule = f.rule;
  return std::visit(
      [&](const auto* value) -> Status {
        using T = std::remove_cvref_t<decltype(*value)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return CanonicalString(path, rule, *value).status();
        } else if constexpr (std::is_same_v<T, bool>) {
          return Status::Ok();
        } else if constexpr (std::is_same_v<T, int> ||
                             std::is_same_v<T, int64_t>) {
          const auto [lo, hi] = IntBounds<T>(rule);
          return CheckInt(path, rule, lo, hi, *value);
        } else if constexpr (std::is_same_v<T, double>) {
          return CheckDouble(path, rule, *value);
        } else {
          using E = typename T::value_type;
          for (size_t i = 0; i < value->size(); ++i) {
            if constexpr (std::is_same_v<E, std::string>) {
              RETURN_IF_ERROR(
                  CanonicalString(ItemPath(path, i), rule, (*value)[i]));
            } else {
              const auto [lo, hi] = IntBounds<E>(rule);
              RETURN_IF_ERROR(
                  CheckInt(ItemPath(path, i), rule, lo, hi, (*value)[i]));
            }
          }
          if (rule.unique) return CheckUnique(path, *value);
          return Status::Ok();
        }
      },
      f.cref(config));
}

// ---------------------------------------------------------------------------
// Reading YAML nodes into fields.

// Where values come from: a file (messages carry line and column) or an
// environment variable (its name is the place).
struct Source {
  std::string name;
  bool has_marks = true;
  // The mark used for a null value (whose own mark is where the next token
  // starts): the key's.
  YAML::Mark fallback = YAML::Mark::null_mark();

  std::string At(const YAML::Mark& mark) const {
    if (!has_marks || mark.line < 0) return name + ": ";
    return name + ":" + std::to_string(mark.line + 1) + ":" +
           std::to_string(mark.column + 1) + ": ";
  }
  std::string At(const YAML::Node& node) const {
    return At(node.IsNull() ? fallback : node.Mark());
  }
  // `status` with this place in front of its message.
  Status Locate(const YAML::Node& node, const Status& status) const {
    if (status.ok()) return status;
    return Status(status.code(), At(node) + status.message());
  }
};

// A plain scalar: one written without quotes or tags, so a number or a
// boolean may be read from it.
bool IsPlainScalar(const YAML::Node& node) {
  return node.IsScalar() && node.Tag() == "?";
}

// What a node holds, for "found ...".
std::string Found(const YAML::Node& node) {
  if (node.IsNull()) return "null (no value)";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a map";
  if (!node.IsScalar()) return "nothing";
  if (IsPlainScalar(node)) return ShowPlain(node.Scalar());
  return "the string " + Quote(node.Scalar());
}

std::optional<int64_t> ParseDecimal(std::string_view text) {
  if (!text.empty() && text[0] == '+') text.remove_prefix(1);
  if (text.empty() || text[0] == '+') return std::nullopt;
  int64_t value = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), value);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size())
    return std::nullopt;
  return value;
}

StatusOr<int64_t> ReadInt(const YAML::Node& node, std::string_view path,
                          const Rule& rule, int64_t lo, int64_t hi) {
  if (!IsPlainScalar(node))
    return Mismatch(path, IntExpectation(rule, lo, hi), Found(node));
  const std::string& text = node.Scalar();
  std::optional<int64_t> value = ParseDecimal(text);
  if (!value && rule.bytes && !text.empty() && text[0] >= '0' &&
      text[0] <= '9') {
    StatusOr<int64_t> bytes = ParseBytes(text);
    if (bytes.ok()) value = *bytes;
  }
  if (!value || *value < lo || *value > hi)
    return Mismatch(path, IntExpectation(rule, lo, hi), Found(node));
  return *value;
}

StatusOr<double> ReadDouble(const YAML::Node& node, std::string_view path,
                            const Rule& rule) {
  if (!IsPlainScalar(node))
    return Mismatch(path, DoubleExpectation(rule), Found(node));
  std::string_view text = node.Scalar();
  if (!text.empty() && text[0] == '+') text.remove_prefix(1);
  double value = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || text[0] == '+' || r.ec != std::errc() ||
      r.ptr != text.data() + text.size() || !std::isfinite(value))
    return Mismatch(path, DoubleExpectation(rule), Found(node));
  RETURN_IF_ERROR(CheckDouble(path, rule, value));
  return value;
}

StatusOr<bool> ReadBool(const YAML::Node& node, std::string_view path) {
  if (IsPlainScalar(node)) {
    const std::string text = Lower(node.Scalar());
    if (text == "true" || text == "yes" || text == "on") return true;
    if (text == "false" || text == "no" || text == "off") return false;
  }
  return Mismatch(path, "true or false", Found(node));
}

StatusOr<std::string> ReadString(const YAML::Node& node, std::string_view path,
                                 const Rule& rule) {
  if (node.IsNull() && rule.nullable) return std::string();
  if (!node.IsScalar())
    return Mismatch(path, StringExpectation(rule), Found(node));
  return CanonicalString(path, rule, node.Scalar());
}

// Reads `node` into field `f` of `config`. Errors carry the place of the
// offending node (a list item's own).
Status SetField(const Source& source, const Field& f, const YAML::Node& node,
                ServeConfig& config) {
  const std::string path = FieldPath(f);
  const Rule& rule = f.rule;
  return std::visit(
      [&](auto* out) -> Status {
        using T = std::remove_cvref_t<decltype(*out)>;
        if constexpr (std::is_same_v<T, std::string>) {
          StatusOr<std::string> value = ReadString(node, path, rule);
          if (!value.ok()) return source.Locate(node, value.status());
          *out = std::move(*value);
        } else if constexpr (std::is_same_v<T, bool>) {
          StatusOr<bool> value = ReadBool(node, path);
          if (!value.ok()) return source.Locate(node, value.status());
          *out = *value;
        } else if constexpr (std::is_same_v<T, int> ||
                             std::is_same_v<T, int64_t>) {
          const auto [lo, hi] = IntBounds<T>(rule);
          StatusOr<int64_t> value = ReadInt(node, path, rule, lo, hi);
          if (!value.ok()) return source.Locate(node, value.status());
          *out = static_cast<T>(*value);
        } else if constexpr (std::is_same_v<T, double>) {
          StatusOr<double> value = ReadDouble(node, path, rule);
          if (!value.ok()) return source.Locate(node, value.status());
          *out = *value;
        } else {
          using E = typename T::value_type;
          T values;
          if (!node.IsNull()) {  // null: the empty list
            if (!node.IsSequence()) {
              const std::string what = std::is_same_v<E, std::string>
                                           ? "a list of strings"
                                           : "a list of integers";
              return source.Locate(
                  node, Mismatch(path, what + " (e.g. [a, b])", Found(node)));
            }
            for (size_t i = 0; i < node.size(); ++i) {
              const YAML::Node item = node[i];
              const std::string item_path = ItemPath(path, i);
              if constexpr (std::is_same_v<E, std::string>) {
                // A list item has no "no value" meaning: null is an error.
                Rule item_rule = rule;
                item_rule.nullable = false;
                StatusOr<std::string> value =
                    ReadString(item, item_path, item_rule);
                if (!value.ok()) return source.Locate(item, value.status());
                values.push_back(std::move(*value));
              } else {
                const auto [lo, hi] = IntBounds<E>(rule);
                StatusOr<int64_t> value =
                    ReadInt(item, item_path, rule, lo, hi);
                if (!value.ok()) return source.Locate(item, value.status());
                values.push_back(static_cast<E>(*value));
              }
            }
          }
          if (rule.unique) {
            Status unique = CheckUnique(path, values);
            if (!unique.ok()) return source.Locate(node, unique);
          }
          *out = std::move(values);
        }
        return Status::Ok();
      },
      f.ref(config));
}

// Tracks the keys of one map to reject a key given twice.
class DuplicateCheck {
 public:
  // Error when `name` was seen before in this map.
  Status Add(const Source& source, const YAML::Node& key,
             const std::string& path) {
    const auto [it, inserted] = lines_.emplace(key.Scalar(), key.Mark().line);
    if (inserted) return Status::Ok();
    return InvalidArgumentError(source.At(key.Mark()) + path +
                                " is given twice (first at line " +
                                std::to_string(it->second + 1) + ")");
  }

 private:
  std::map<std::string, int> lines_;
};

Status ParseSection(const Source& file, std::string_view section,
                    const YAML::Node& node, ServeConfig& config) {
  if (node.IsNull()) return Status::Ok();  // "server:" alone: the defaults
  if (!node.IsMap()) {
    return InvalidArgumentError(
        file.At(node) + "section " + std::string(section) +
        ": expected a map of keys, found " + Found(node));
  }
  DuplicateCheck seen;
  for (auto it = node.begin(); it != node.end(); ++it) {
    const YAML::Node key = it->first;
    const YAML::Node value = it->second;
    if (!key.IsScalar()) {
      return InvalidArgumentError(file.At(key.Mark()) + "section " +
                                  std::string(section) +
                                  ": expected a key name, found " + Found(key));
    }
    const std::string& name = key.Scalar();
    const std::string path = std::string(section) + "." + name;
    RETURN_IF_ERROR(seen.Add(file, key, path));
    if (IsIgnoredKey(section, name)) {
      config.warnings.push_back(file.At(key.Mark()) +
                                IgnoredKeyWarning(section, name));
      continue;
    }
    const Field* field = FindField(section, name);
    if (field == nullptr) {
      return InvalidArgumentError(file.At(key.Mark()) +
                                  UnknownKeyMessage(section, name));
    }
    Source at_key = file;
    at_key.fallback = key.Mark();
    RETURN_IF_ERROR(SetField(at_key, *field, value, config));
  }
  return Status::Ok();
}

Status ParseDocument(const Source& file, const YAML::Node& root,
                     ServeConfig& config) {
  if (root.IsNull()) return Status::Ok();
  if (!root.IsMap()) {
    return InvalidArgumentError(file.At(root) + "expected a map of sections (" +
                                JoinNames(kSections) + "), found " +
                                Found(root));
  }
  DuplicateCheck seen;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const YAML::Node key = it->first;
    if (!key.IsScalar()) {
      return InvalidArgumentError(
          file.At(key.Mark()) + "expected a section name, found " + Found(key));
    }
    const std::string& name = key.Scalar();
    RETURN_IF_ERROR(seen.Add(file, key, "section " + name));
    if (IsIgnoredSection(name)) {
      config.warnings.push_back(file.At(key.Mark()) +
                                IgnoredSectionWarning(name));
      continue;
    }
    if (!IsSection(name)) {
      return InvalidArgumentError(file.At(key.Mark()) +
                                  UnknownSectionMessage(name));
    }
    Source at_key = file;
    at_key.fallback = key.Mark();
    RETURN_IF_ERROR(ParseSection(at_key, name, it->second, config));
  }
  return Status::Ok();
}

Status MalformedYaml(const Source& source, const YAML::ParserException& e) {
  return InvalidArgumentError(source.At(e.mark) + "malformed YAML: " + e.msg);
}

// Counts the documents of a YAML stream (instead of YAML::LoadAll, which
// never returns on some malformed streams such as ",&" in yaml-cpp 0.7: its
// parser reports an empty document forever without consuming the token,
// and LoadAll keeps them until memory runs out; yaml-cpp issue 1040). A
// document that starts where the previous one started is that loop: `stuck`.
class DocumentCounter : public YAML::EventHandler {
 public:
  int documents = 0;
  bool stuck = false;
  YAML::Mark start = YAML::Mark::null_mark();  // of the last document
  // Where the root of the second document is (as YAML::Node::Mark gives it;
  // null_mark for a null root).
  YAML::Mark second = YAML::Mark::null_mark();

  void OnDocumentStart(const YAML::Mark& mark) override {
    if (documents > 0 && mark.pos == start.pos) stuck = true;
    start = mark;
    ++documents;
    root_pending_ = true;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {
    Root(YAML::Mark::null_mark());
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { Root(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    Root(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&,
                       YAML::anchor_t, YAML::EmitterStyle::value) override {
    Root(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    Root(mark);
  }
  void OnMapEnd() override {}

 private:
  void Root(const YAML::Mark& mark) {
    if (root_pending_ && documents == 2) second = mark;
    root_pending_ = false;
  }
  bool root_pending_ = false;
};

// ---------------------------------------------------------------------------
// Environment variables.

struct EnvOverride {
  std::string name;  // as given
  std::string value;
  std::string section;  // lower case
  std::string key;      // lower case
};

std::string ListOfInts(const std::vector<int>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(values[i]);
  }
  return out + "]";
}

Status ApplyOneOverride(const EnvOverride& var,
                        std::set<std::string>& warned_sections,
                        ServeConfig& config) {
  Source source;
  source.name = "environment variable " + var.name;
  source.has_marks = false;
  if (IsIgnoredSection(var.section)) {
    if (warned_sections.insert(var.section).second) {
      config.warnings.push_back(source.At(YAML::Mark::null_mark()) +
                                IgnoredSectionWarning(var.section));
    }
    return Status::Ok();
  }
  if (!IsSection(var.section)) {
    return InvalidArgumentError(source.At(YAML::Mark::null_mark()) +
                                UnknownSectionMessage(var.section));
  }
  if (IsIgnoredKey(var.section, var.key)) {
    config.warnings.push_back(source.At(YAML::Mark::null_mark()) +
                              IgnoredKeyWarning(var.section, var.key));
    return Status::Ok();
  }
  const Field* field = FindField(var.section, var.key);
  if (field == nullptr) {
    return InvalidArgumentError(source.At(YAML::Mark::null_mark()) +
                                UnknownKeyMessage(var.section, var.key));
  }
  // A string key takes the value verbatim: YAML would read a token such as
  // "*abc" or "a: b" as something else.
  Ref ref = field->ref(config);
  if (std::string** out = std::get_if<std::string*>(&ref)) {
    StatusOr<std::string> value =
        CanonicalString(FieldPath(*field), field->rule, var.value);
    if (!value.ok()) {
      return Status(value.status().code(), source.At(YAML::Mark::null_mark()) +
                                               value.status().message());
    }
    **out = std::move(*value);
    return Status::Ok();
  }
  YAML::Node node;
  try {
    node = YAML::Load(var.value);
  } catch (const YAML::ParserException& e) {
    return InvalidArgumentError(source.At(YAML::Mark::null_mark()) +
                                FieldPath(*field) + ": malformed value " +
                                Quote(var.value) + ": " + e.msg);
  }
  return SetField(source, *field, node, config);
}

}  // namespace

// ---------------------------------------------------------------------------

nlohmann::json ServeConfig::ToJson() const {
  nlohmann::json out = nlohmann::json::object();
  for (const Field& f : Fields()) {
    nlohmann::json& slot = out[std::string(f.section)][std::string(f.key)];
    std::visit([&](const auto* value) { slot = *value; }, f.cref(*this));
    if (f.rule.secret && slot.is_string() &&
        !slot.get_ref<const std::string&>().empty())
      slot = "<redacted>";
  }
  out["warnings"] = warnings;
  return out;
}

Status ValidateServeConfig(const ServeConfig& config) {
  for (const Field& f : Fields()) RETURN_IF_ERROR(CheckField(f, config));
  const GpuSection& gpu = config.gpu;
  if (gpu.default_device != -1 &&
      std::find(gpu.devices.begin(), gpu.devices.end(), gpu.default_device) ==
          gpu.devices.end()) {
    return InvalidArgumentError(
        "gpu.default_device: expected -1 (the CPU) or one of gpu.devices " +
        ListOfInts(gpu.devices) + ", found " +
        std::to_string(gpu.default_device));
  }
  // sockaddr_un::sun_path holds 108 bytes, the terminating NUL included.
  if (config.server.unix_socket.size() > 107) {
    return InvalidArgumentError(
        "server.unix_socket: a socket path holds at most 107 bytes, found " +
        std::to_string(config.server.unix_socket.size()));
  }
  if (config.batching.kv_tokens > 0 && config.batching.page_size == 0) {
    return InvalidArgumentError(
        "batching.kv_tokens: " + std::to_string(config.batching.kv_tokens) +
        " KV tokens need pages, but batching.page_size is 0");
  }
  const ModelsSection& models = config.models;
  if (static_cast<int64_t>(models.preload.size()) > models.max_loaded) {
    return InvalidArgumentError(
        "models.preload: " + std::to_string(models.preload.size()) +
        " models to load at start, more than models.max_loaded (" +
        std::to_string(models.max_loaded) + ")");
  }
  return Status::Ok();
}

StatusOr<ServeConfig> ParseServeConfig(std::string_view yaml_text,
                                       std::string_view source_name) {
  Source file;
  file.name = source_name.empty() ? "config" : std::string(source_name);
  try {
    const std::string text(yaml_text);
    DocumentCounter counter;
    {
      std::istringstream in(text);
      YAML::Parser parser(in);
      while (!counter.stuck && parser.HandleNextDocument(counter)) {
      }
    }
    if (counter.stuck)
      return InvalidArgumentError(file.At(counter.start) +
                                  "malformed YAML: unexpected character");
    ServeConfig config;
    if (counter.documents == 0) return config;
    if (counter.documents > 1) {
      return InvalidArgumentError(file.At(counter.second) + "holds " +
                                  std::to_string(counter.documents) +
                                  " YAML documents, expected one");
    }
    RETURN_IF_ERROR(ParseDocument(file, YAML::Load(text), config));
    Status valid = ValidateServeConfig(config);
    if (!valid.ok()) return valid.WithContext(file.name);
    return config;
  } catch (const YAML::ParserException& e) {
    return MalformedYaml(file, e);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(file.name + ": YAML error: " + e.what());
  } catch (const std::exception& e) {
    return InternalError(file.name +
                         ": reading the configuration: " + e.what());
  }
}

StatusOr<ServeConfig> LoadServeConfig(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) {
    if (ec && ec != std::errc::no_such_file_or_directory)
      return IoError("serve config " + path + ": " + ec.message());
    return NotFoundError("serve config " + path + ": no such file");
  }
  if (std::filesystem::is_directory(st))
    return InvalidArgumentError("serve config " + path +
                                ": is a directory, expected a YAML file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError("serve config " + path + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad())
    return IoError("serve config " + path +
                   ": read failed: " + std::strerror(errno));
  return ParseServeConfig(text.str(), path);
}

Status ApplyEnvOverrides(const std::vector<std::string>& env,
                         ServeConfig& config) {
  std::vector<EnvOverride> flat, nested;
  for (const std::string& entry : env) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = entry.substr(0, eq);
    const std::string lower = Lower(name);
    if (!lower.starts_with("loom_")) continue;
    const std::string rest = lower.substr(5);
    EnvOverride var;
    var.name = name;
    var.value = entry.substr(eq + 1);
    const size_t split = rest.find("__");
    if (split == std::string::npos) {
      for (const auto& [flat_name, path] : kFlatVariables) {
        if (rest == flat_name) {
          const size_t dot = path.find('.');
          var.section = std::string(path.substr(0, dot));
          var.key = std::string(path.substr(dot + 1));
          flat.push_back(var);
        }
      }
      continue;  // not ours
    }
    var.section = rest.substr(0, split);
    var.key = rest.substr(split + 2);
    nested.push_back(std::move(var));
  }
  if (flat.empty() && nested.empty()) return Status::Ok();

  ServeConfig result = config;
  std::set<std::string> warned_sections;
  try {
    for (const std::vector<EnvOverride>* group : {&flat, &nested}) {
      for (const EnvOverride& var : *group)
        RETURN_IF_ERROR(ApplyOneOverride(var, warned_sections, result));
    }
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(std::string("environment overrides: ") +
                                e.what());
  } catch (const std::exception& e) {
    return InternalError(std::string("environment overrides: ") + e.what());
  }
  Status valid = ValidateServeConfig(result);
  if (!valid.ok())
    return valid.WithContext("after the LOOM_ environment overrides");
  config = std::move(result);
  return Status::Ok();
}

}  // namespace loom::serve
