#include "src/eval/extract_manifest.h"

#include <fstream>
#include <limits>
#include <sstream>

#include "src/base/read_file.h"
#include "src/core/json_error.h"
#include "src/io/file_util.h"

namespace loom {
namespace {

using Json = nlohmann::json;

constexpr char kFormat[] = "loom-activations";
constexpr int kVersion = 1;

std::string FieldName(const ManifestField& field) {
  std::string name;
  for (const std::string& k : field) name += (name.empty() ? "" : ".") + k;
  return name;
}

const char* TypeName(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "an integer";
    case Json::value_t::number_float:
      return "a float";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    default:
      return "a binary value";
  }
}

// A short rendering of a found value for messages.
std::string Excerpt(const Json& j) {
  std::string text = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

}  // namespace

Manifest Manifest::Create(std::string path, Json settings, Json input,
                          Json tokenizer, Json arrays,
                          std::vector<std::string> files,
                          const std::vector<std::string>& ragged_files) {
  Json doc = {{"format", kFormat},
              {"version", kVersion},
              {"settings", std::move(settings)},
              {"input", std::move(input)},
              {"tokenizer", std::move(tokenizer)},
              {"arrays", std::move(arrays)},
              {"files", std::move(files)},
              {"complete", false}};
  Manifest m(std::move(path), std::move(doc));
  ManifestProgress progress;
  for (const std::string& f : ragged_files) progress.ragged_rows[f] = 0;
  m.SetProgress(progress);
  return m;
}

StatusOr<Manifest> Manifest::Load(const std::string& path) {
  StatusOr<std::string> text = ReadFileToString(path);
  if (text.status().code() == StatusCode::kNotFound)
    return NotFoundError(text.status().message() + " (nothing to resume)");
  if (!text.ok()) return text.status();
  Json doc = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    const JsonParseError e = LocateJsonError(*text);
    return DataLossError(path + ": not valid JSON at byte offset " +
                         std::to_string(e.offset) + " of " +
                         std::to_string(text->size()) +
                         " (truncated or corrupt): " + e.what);
  }
  if (!doc.is_object())
    return DataLossError(path + ": expected a JSON object, found " +
                         TypeName(doc));
  Manifest m(path, std::move(doc));
  ASSIGN_OR_RETURN(std::string format, m.GetString({"format"}));
  if (format != kFormat)
    return DataLossError(path + ": format is \"" + format + "\", expected \"" +
                         kFormat + "\"");
  ASSIGN_OR_RETURN(int64_t version, m.GetInt({"version"}));
  if (version != kVersion)
    return DataLossError(path + ": version " + std::to_string(version) +
                         ", this loom reads version " +
                         std::to_string(kVersion));
  return m;
}

Status Manifest::WrongType(const ManifestField& field, const char* expected,
                           const Json& found) const {
  return DataLossError(path_ + ": field " + FieldName(field) + ": expected " +
                       expected + ", found " + TypeName(found) + " (" +
                       Excerpt(found) + ")");
}

StatusOr<const Json*> Manifest::Find(const ManifestField& field,
                                     const char* expected) const {
  const Json* j = &doc_;
  for (size_t i = 0; i < field.size(); ++i) {
    if (!j->is_object()) {
      const ManifestField parent(field.begin(), field.begin() + i);
      return WrongType(parent, "an object", *j);
    }
    const auto it = j->find(field[i]);
    if (it == j->end())
      return DataLossError(path_ + ": field " + FieldName(field) +
                           " is missing (expected " + expected + ")");
    j = &*it;
  }
  return j;
}

StatusOr<int64_t> Manifest::GetInt(const ManifestField& field) const {
  ASSIGN_OR_RETURN(const Json* j, Find(field, "an integer"));
  if (j->is_number_integer() && !j->is_number_unsigned())
    return j->get<int64_t>();
  if (j->is_number_unsigned() &&
      j->get<uint64_t>() <=
          static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return static_cast<int64_t>(j->get<uint64_t>());
  return WrongType(field, "an integer", *j);
}

StatusOr<bool> Manifest::GetBool(const ManifestField& field) const {
  ASSIGN_OR_RETURN(const Json* j, Find(field, "a boolean"));
  if (!j->is_boolean()) return WrongType(field, "a boolean", *j);
  return j->get<bool>();
}

StatusOr<std::string> Manifest::GetString(const ManifestField& field) const {
  ASSIGN_OR_RETURN(const Json* j, Find(field, "a string"));
  if (!j->is_string()) return WrongType(field, "a string", *j);
  return j->get<std::string>();
}

StatusOr<std::vector<std::string>> Manifest::GetStrings(
    const ManifestField& field) const {
  ASSIGN_OR_RETURN(const Json* j, Find(field, "an array of strings"));
  if (!j->is_array()) return WrongType(field, "an array of strings", *j);
  std::vector<std::string> out;
  for (size_t i = 0; i < j->size(); ++i) {
    const Json& e = (*j)[i];
    if (!e.is_string()) {
      ManifestField at = field;
      at.back() += "[" + std::to_string(i) + "]";
      return WrongType(at, "a string", e);
    }
    out.push_back(e.get<std::string>());
  }
  return out;
}

StatusOr<const Json*> Manifest::GetObject(const ManifestField& field) const {
  ASSIGN_OR_RETURN(const Json* j, Find(field, "an object"));
  if (!j->is_object()) return WrongType(field, "an object", *j);
  return j;
}

StatusOr<ManifestProgress> Manifest::ReadProgress(
    const std::vector<std::string>& ragged_files) const {
  ManifestProgress p;
  const std::pair<const char*, int64_t*> counters[] = {
      {"rows_committed", &p.rows_committed},
      {"rows_ok", &p.rows_ok},
      {"rows_skipped", &p.rows_skipped},
      {"input_offset", &p.input_offset},
      {"rows_file_bytes", &p.rows_file_bytes},
      {"shards", &p.shards}};
  const auto progress_has = [this](const char* key) {
    const auto it = doc_.find("progress");
    return it != doc_.end() && it->is_object() && it->contains(key);
  };
  for (const auto& [name, dst] : counters) {
    ASSIGN_OR_RETURN(*dst, GetInt({"progress", name}));
    if (*dst < 0)
      return DataLossError(path_ + ": field progress." + name + " is " +
                           std::to_string(*dst) + ", expected >= 0");
  }
  if (progress_has("input_rows")) {
    // Checked against the committed rows by the resume, after the files.
    ASSIGN_OR_RETURN(p.input_rows, GetInt({"progress", "input_rows"}));
  } else {
    p.input_rows = p.rows_committed;  // written before shards existed
  }
  if (p.rows_ok + p.rows_skipped != p.rows_committed)
    return DataLossError(
        path_ + ": progress.rows_ok + rows_skipped = " +
        std::to_string(p.rows_ok + p.rows_skipped) +
        ", but progress.rows_committed = " + std::to_string(p.rows_committed));
  ASSIGN_OR_RETURN(const Json* progress, GetObject({"progress"}));
  if (progress->contains("rows_file_crc32")) {
    ASSIGN_OR_RETURN(int64_t crc, GetInt({"progress", "rows_file_crc32"}));
    if (crc < 0 || crc > 0xffffffffLL)
      return DataLossError(path_ + ": field progress.rows_file_crc32 is " +
                           std::to_string(crc) + ", expected a 32-bit crc32");
    p.rows_file_crc32 = static_cast<uint32_t>(crc);
  } else {
    p.rows_file_crc32.reset();  // written before loom recorded it
  }
  for (const std::string& f : ragged_files) {
    ASSIGN_OR_RETURN(int64_t rows, GetInt({"progress", "ragged_rows", f}));
    if (rows < 0)
      return DataLossError(path_ + ": field progress.ragged_rows." + f +
                           " is " + std::to_string(rows) + ", expected >= 0");
    p.ragged_rows[f] = rows;
  }
  return p;
}

Status Manifest::CheckSettings(const Json& now, const Json& absent) const {
  ASSIGN_OR_RETURN(const Json* recorded, GetObject({"settings"}));
  for (const auto& [key, value] : now.items()) {
    const auto it = recorded->find(key);
    Json there;
    if (it != recorded->end())
      there = *it;
    else if (absent.is_object() && absent.contains(key))
      there = absent[key];
    if (there != value)
      return FailedPreconditionError(
          "--resume: setting '" + key + "' differs from the interrupted run (" +
          Excerpt(there) + " there, " + Excerpt(value) +
          " now); resume with the same options");
  }
  return Status();
}

void Manifest::SetProgress(const ManifestProgress& p) {
  Json ragged = Json::object();
  for (const auto& [file, rows] : p.ragged_rows) ragged[file] = rows;
  doc_["progress"] = {{"rows_committed", p.rows_committed},
                      {"rows_ok", p.rows_ok},
                      {"rows_skipped", p.rows_skipped},
                      {"input_offset", p.input_offset},
                      {"rows_file_bytes", p.rows_file_bytes},
                      {"shards", p.shards},
                      {"input_rows", p.input_rows},
                      {"ragged_rows", std::move(ragged)}};
  if (p.rows_file_crc32)
    doc_["progress"]["rows_file_crc32"] = *p.rows_file_crc32;
}

void Manifest::SetSetting(const std::string& key, Json value) {
  doc_["settings"][key] = std::move(value);
}

void Manifest::SetFiles(const std::vector<std::string>& files) {
  doc_["files"] = files;
}

void Manifest::MarkComplete(Json rows, int64_t row_count) {
  doc_["rows"] = std::move(rows);
  doc_["complete"] = true;
  doc_["row_count"] = row_count;
}

Status Manifest::Save() const {
  std::string text;
  try {
    text = doc_.dump(2) + "\n";
  } catch (const Json::exception& e) {  // invalid UTF-8 in a string
    return InvalidArgumentError(path_ +
                                ": cannot encode the manifest: " + e.what());
  }
  return WriteFileDurably(path_, text);
}

}  // namespace loom
