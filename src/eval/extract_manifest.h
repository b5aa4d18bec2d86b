// manifest.json of `loom extract`: the job's settings, input, arrays and the
// commit record (progress). Written whole and durably after every committed
// window; read back on --resume through checked accessors, so a manifest that
// is absent, not JSON, or has a field missing or of the wrong type is a clear
// error (NotFound / DataLoss naming the field, the expected type and what was
// found), never an exception. Layout: docs/formats/activations.md.
#ifndef LOOM_EVAL_EXTRACT_MANIFEST_H_
#define LOOM_EVAL_EXTRACT_MANIFEST_H_

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"

namespace loom {

// A field of the manifest, as the keys from the root:
// {"progress", "rows_committed"}.
using ManifestField = std::vector<std::string>;

// The commit record's counters.
struct ManifestProgress {
  int64_t rows_committed = 0;  // input rows committed (ok + skipped)
  int64_t rows_ok = 0;
  int64_t rows_skipped = 0;
  int64_t input_offset = 0;  // input byte offset of the next row
  // Input rows before input_offset (the index of the next row): the rows
  // committed, plus, for a shard (--shard), the other shards' rows read
  // past. Absent in a manifest written before shards: rows_committed.
  int64_t input_rows = 0;
  int64_t rows_file_bytes = 0;  // committed size of rows.jsonl
  // zlib's crc32 of those bytes, extended at every commit; none in a
  // manifest written before loom recorded it (a resume then computes it).
  std::optional<uint32_t> rows_file_crc32 = uint32_t{0};
  int64_t shards = 0;  // safetensors shards committed
  // Data rows committed in each ragged .npy array (by file name).
  std::map<std::string, int64_t> ragged_rows;
};

class Manifest {
 public:
  // The manifest of a new job: `files` listed, progress zero (with a
  // ragged_rows entry for each of `ragged_files`), not complete.
  static Manifest Create(std::string path, nlohmann::json settings,
                         nlohmann::json input, nlohmann::json tokenizer,
                         nlohmann::json arrays, std::vector<std::string> files,
                         const std::vector<std::string>& ragged_files);
  // Reads `path`: NotFound when it does not exist, DataLoss when it is not a
  // JSON object (naming the byte offset where it stops being JSON) or not a
  // loom-activations manifest of this version.
  static StatusOr<Manifest> Load(const std::string& path);

  // Checked accessors: DataLoss "<path>: field a.b: expected <type>, found
  // <type> (<value>)" when the field is absent or of another type.
  StatusOr<int64_t> GetInt(const ManifestField& field) const;
  StatusOr<bool> GetBool(const ManifestField& field) const;
  StatusOr<std::string> GetString(const ManifestField& field) const;
  StatusOr<std::vector<std::string>> GetStrings(
      const ManifestField& field) const;
  StatusOr<const nlohmann::json*> GetObject(const ManifestField& field) const;

  // The progress block; every counter is required, and ragged_rows must hold
  // a non-negative count for each of `ragged_files`. rows_file_crc32 is read
  // when present (a 32-bit value), none when absent.
  StatusOr<ManifestProgress> ReadProgress(
      const std::vector<std::string>& ragged_files) const;
  // FailedPrecondition naming the first setting of `now` that differs from
  // the recorded one (both values), DataLoss if "settings" is not an object.
  // A setting the manifest does not record (written before the setting
  // existed) is taken as its value in `absent` (an object), if there.
  Status CheckSettings(
      const nlohmann::json& now,
      const nlohmann::json& absent = nlohmann::json::object()) const;

  void SetProgress(const ManifestProgress& progress);
  void SetFiles(const std::vector<std::string>& files);
  // The job is done: the per-row records and the row count join it.
  void MarkComplete(nlohmann::json rows, int64_t row_count);
  // Replaces the file durably (temp + fsync + rename + fsync dir).
  Status Save() const;

  // `loom merge`: a copy of this manifest that saves to `path`, and the
  // changes merging makes (settings.<key>; the per-row records).
  Manifest CopyTo(std::string path) const {
    return Manifest(std::move(path), doc_);
  }
  void SetSetting(const std::string& key, nlohmann::json value);
  const nlohmann::json& doc() const { return doc_; }

  const std::string& path() const { return path_; }

 private:
  Manifest(std::string path, nlohmann::json doc)
      : path_(std::move(path)), doc_(std::move(doc)) {}
  // The field's value, or DataLoss "field ...: missing" (naming `expected`).
  StatusOr<const nlohmann::json*> Find(const ManifestField& field,
                                       const char* expected) const;
  Status WrongType(const ManifestField& field, const char* expected,
                   const nlohmann::json& found) const;

  std::string path_;
  nlohmann::json doc_;
};

}  // namespace loom

#endif  // LOOM_EVAL_EXTRACT_MANIFEST_H_
