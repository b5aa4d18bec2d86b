// The experiment store behind TheLoom's /experiments* routes
// (docs/server.md, "Experiments"): a SQLite database in WAL mode holding
// TheLoom's four tables (experiments, conversations, metrics, hidden_states),
// with every saved hidden-state array a safetensors file in a directory
// beside it (the table keeps its path, shape and dtype).
//
// Why SQLite + safetensors (TheLoom uses SQLite + HDF5): SQLite gives
// atomic, durable transactions and concurrent readers with one writer (WAL),
// in one file; safetensors is the format Loom already writes and reads
// (src/io), is readable from Python without HDF5 (`safetensors`, numpy), and
// is memory-mappable. A hidden-state file is written complete (temporary
// file, fsync, rename) before the row naming it commits, so a row never
// names a partial file; a crash between the two leaves at most an orphan
// file, never a broken row.
//
// Crash safety: every write is one transaction; journal_mode=WAL with
// synchronous=FULL, so a transaction that returned is on disk and survives
// a killed process (SIGKILL) or a power loss; the database reopens clean.
// foreign_keys=ON (deleting an experiment deletes its rows).
//
// Thread-safety: an ExperimentStore is safe to use from many threads. Writes
// are serialised on one connection; reads take a connection of their own
// from a pool, so readers never wait for a writer (WAL snapshots) and
// several processes may open the same database.
#ifndef LOOM_SERVE_EXPERIMENTS_H_
#define LOOM_SERVE_EXPERIMENTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"
#include "src/core/tensor.h"

struct sqlite3;

namespace loom::serve {

// `path` with a leading "~/" (or a lone "~") replaced by $HOME.
std::string ExpandHome(const std::string& path);

// "2026-11-26T11:42:42.123456": UTC, microseconds, no zone (Python's
// datetime.utcnow().isoformat() with microseconds always written).
std::string IsoTimestampNow();

// Parses an ISO-8601 date or date-time ("2026-11-26", "2026-11-26T11:42",
// "...:42.5", "...Z", "...+02:00") into the stored form above, in UTC.
StatusOr<std::string> NormalizeIsoTimestamp(const std::string& text);

struct ExperimentQuery {
  int64_t limit = 100;
  int64_t offset = 0;
  std::optional<std::string> model;
  std::optional<std::string> status;
  std::optional<std::string> date_from;  // stored form, inclusive
  std::optional<std::string> date_to;    // stored form, inclusive
};

class ExperimentStore {
 public:
  // Opens (creating when missing) the database and the hidden-state
  // directory, and their parent directories.
  static StatusOr<std::unique_ptr<ExperimentStore>> Open(
      const std::string& db_path, const std::string& hidden_states_dir);
  ~ExperimentStore();
  ExperimentStore(const ExperimentStore&) = delete;
  ExperimentStore& operator=(const ExperimentStore&) = delete;

  const std::string& db_path() const { return db_path_; }
  const std::string& hidden_states_dir() const { return hidden_states_dir_; }

  // ---- Writes (each one transaction)

  // A new experiment; returns its id (a uuid4). `status`: running |
  // completed | failed.
  StatusOr<std::string> CreateExperiment(
      const std::string& model,
      const nlohmann::json& config = nlohmann::json::object(),
      const std::string& status = "completed", const std::string& notes = "");
  Status SetStatus(const std::string& id, const std::string& status);
  // Appends a message (sequence_num: the next of the experiment, from 0).
  StatusOr<int64_t> AddConversation(const std::string& id,
                                    const std::string& role,
                                    const std::string& content);
  StatusOr<int64_t> AddMetric(
      const std::string& id, const std::string& name, double value,
      const std::string& unit = "",
      const nlohmann::json& metadata = nlohmann::json::object());
  // Writes the array as `<id>[_layer<L>]_<YYYYmmdd_HHMMSS_ffffff>.safetensors`
  // (one tensor "hidden_state"; metadata experiment_id, created_at, layer)
  // in hidden_states_dir, then records it. `data` holds shape.numel()
  // elements of `dtype` (F32, BF16 or F16). Returns the row id.
  StatusOr<int64_t> SaveHiddenState(const std::string& id,
                                    std::optional<int64_t> layer, DType dtype,
                                    const Shape& shape, const void* data);
  // Deletes an experiment, its rows and its hidden-state files.
  Status DeleteExperiment(const std::string& id);

  // ---- Reads: the JSON objects of TheLoom's responses (docs/server.md)

  // {experiments, total, limit, offset}: newest first; total counts the
  // model/status filters only (as TheLoom's).
  StatusOr<nlohmann::json> List(const ExperimentQuery& q);
  // {experiment, conversations, hidden_states, metrics, summary}; NotFound
  // "Experiment not found: <id>".
  StatusOr<nlohmann::json> Get(const std::string& id);
  StatusOr<nlohmann::json> Conversations(
      const std::string& id, const std::optional<std::string>& role);
  StatusOr<nlohmann::json> HiddenStates(const std::string& id,
                                        std::optional<int64_t> layer);
  StatusOr<nlohmann::json> Metrics(const std::string& id,
                                   const std::optional<std::string>& name);
  int64_t Count();

  // ---- Exports (files written whole: temporary file, then rename)

  // json: <dir>/<id>.json; csv: <dir>/<id>_experiment.csv and, when not
  // empty, _conversations.csv, _metrics.csv, _hidden_states.csv. Returns
  // {kind: path}. InvalidArgument for another format (parquet:
  // Unimplemented).
  StatusOr<std::map<std::string, std::string>> Export(
      const std::string& id, const std::string& format, const std::string& dir,
      bool include_hidden_states);
  // One row per experiment (newest first, at most `limit`) to `path`;
  // returns the number of rows.
  StatusOr<int64_t> ExportSummary(const std::string& format,
                                  const std::string& path, int64_t limit);

 private:
  ExperimentStore() = default;
  class Reader;  // a pooled read connection
  StatusOr<sqlite3*> TakeReader();
  void GiveBackReader(sqlite3* db);
  StatusOr<nlohmann::json> ExperimentRow(sqlite3* db, const std::string& id);

  std::string db_path_;
  std::string hidden_states_dir_;
  std::mutex write_mu_;
  sqlite3* writer_ = nullptr;
  std::mutex pool_mu_;
  std::vector<sqlite3*> readers_;
};

// Export formats: "json" | "csv" (| "parquet": Unimplemented); anything else
// is InvalidArgument naming them.
Status CheckExportFormat(const std::string& format);

// The `persistence` section as the server uses it.
struct PersistenceOptions {
  bool enabled = false;
  // A leading "~/" is expanded (HOME) when the store opens.
  std::string db_path = "~/.local/share/loom/experiments.db";
  std::string hidden_states_dir = "~/.local/share/loom/hidden_states";
  // Exports are written inside this folder only: a request's output_path
  // (output_dir) is taken relative to it, and one that leads outside it is
  // refused (no request writes elsewhere on the server).
  std::string export_dir = "~/.local/share/loom/exports";
  // With enabled: record every completed generation request as an
  // experiment (experiment_recorder.h; a request's `persist: false` opts
  // out).
  bool auto_persist = true;
};

// The /experiments* routes over a store: each takes the query parameters or
// the JSON body and returns the response body, or a Status the server turns
// into the error reply (FailedPrecondition -> 503 "Persistence is not
// enabled. ..." when disabled; NotFound -> 404; InvalidArgument -> 400;
// parquet -> 501). Thread-safe.
class ExperimentRoutes {
 public:
  using Params = std::multimap<std::string, std::string>;

  // Opens the store when enabled (creating the folders); errors name the key.
  static StatusOr<std::unique_ptr<ExperimentRoutes>> Create(
      const PersistenceOptions& options);

  // nullptr when persistence is disabled.
  ExperimentStore* store() const { return store_.get(); }
  const std::string& export_dir() const { return export_dir_; }

  StatusOr<nlohmann::json> List(const Params& query);
  StatusOr<nlohmann::json> Get(const std::string& id);
  StatusOr<nlohmann::json> Conversations(const std::string& id,
                                         const Params& query);
  StatusOr<nlohmann::json> HiddenStates(const std::string& id,
                                        const Params& query);
  StatusOr<nlohmann::json> Metrics(const std::string& id, const Params& query);
  StatusOr<nlohmann::json> Export(const nlohmann::json& body);
  StatusOr<nlohmann::json> ExportBatch(const nlohmann::json& body);
  StatusOr<nlohmann::json> ExportSummary(const nlohmann::json& body);

  // `given` ("" = export_dir) as a path inside export_dir; InvalidArgument
  // naming `field` when it leads outside.
  StatusOr<std::string> ExportPath(const std::string& given,
                                   const std::string& field) const;

 private:
  ExperimentRoutes() = default;
  Status Enabled() const;

  std::unique_ptr<ExperimentStore> store_;
  std::string export_dir_;
};

}  // namespace loom::serve

#endif  // LOOM_SERVE_EXPERIMENTS_H_
