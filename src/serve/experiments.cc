#include "src/serve/experiments.h"

#include <sqlite3.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>
#include <string_view>
#include <utility>

#include "src/base/float16.h"
#include "src/io/file_util.h"
#include "src/io/safetensors.h"
#include "src/io/safetensors_writer.h"
#include "src/serve/api.h"

namespace loom::serve {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS experiments (
  id TEXT PRIMARY KEY,
  created_at TEXT NOT NULL,
  model TEXT NOT NULL,
  config_json TEXT,
  status TEXT DEFAULT 'completed',
  notes TEXT
);
CREATE INDEX IF NOT EXISTS idx_experiments_created_at ON experiments(created_at);
CREATE INDEX IF NOT EXISTS idx_experiments_model ON experiments(model);
CREATE TABLE IF NOT EXISTS conversations (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  experiment_id TEXT NOT NULL REFERENCES experiments(id) ON DELETE CASCADE,
  sequence_num INTEGER NOT NULL,
  timestamp TEXT NOT NULL,
  role TEXT NOT NULL,
  content TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_conversations_experiment ON conversations(experiment_id);
CREATE TABLE IF NOT EXISTS metrics (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  experiment_id TEXT NOT NULL REFERENCES experiments(id) ON DELETE CASCADE,
  name TEXT NOT NULL,
  value REAL NOT NULL,
  unit TEXT,
  timestamp TEXT NOT NULL,
  metadata_json TEXT
);
CREATE INDEX IF NOT EXISTS idx_metrics_experiment ON metrics(experiment_id);
CREATE INDEX IF NOT EXISTS idx_metrics_name ON metrics(name);
CREATE TABLE IF NOT EXISTS hidden_states (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  experiment_id TEXT NOT NULL REFERENCES experiments(id) ON DELETE CASCADE,
  layer INTEGER NOT NULL,
  file_path TEXT NOT NULL,
  shape_json TEXT NOT NULL,
  dtype TEXT NOT NULL,
  timestamp TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_hidden_states_experiment ON hidden_states(experiment_id);
CREATE INDEX IF NOT EXISTS idx_hidden_states_layer ON hidden_states(layer);
)sql";

Status SqlError(sqlite3* db, const std::string& what) {
  return IoError("experiments database: " + what + ": " +
                 (db != nullptr ? sqlite3_errmsg(db) : "out of memory"));
}

Status Exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string message = err != nullptr ? err : sqlite3_errmsg(db);
    sqlite3_free(err);
    return IoError("experiments database: " + std::string(sql).substr(0, 40) +
                   ": " + message);
  }
  return Status();
}

// A prepared statement, finalized on destruction.
class Stmt {
 public:
  Stmt(sqlite3* db, const std::string& sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr);
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Status ok() const {
    return rc_ == SQLITE_OK ? Status() : SqlError(db_, "prepare");
  }
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()),
                      SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& Bind(int i, const std::optional<std::string>& v) {
    if (!v) {
      sqlite3_bind_null(stmt_, i);
      return *this;
    }
    return Bind(i, *v);
  }
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Stmt& Bind(int i, double v) {
    sqlite3_bind_double(stmt_, i, v);
    return *this;
  }
  // true: a row; false: done.
  StatusOr<bool> Step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqlError(db_, "step");
  }
  Status Run() {
    ASSIGN_OR_RETURN(bool row, Step());
    (void)row;
    return Status();
  }
  bool IsNull(int col) const {
    return sqlite3_column_type(stmt_, col) == SQLITE_NULL;
  }
  std::string Text(int col) const {
    const auto* p = sqlite3_column_text(stmt_, col);
    if (p == nullptr) return "";
    return std::string(reinterpret_cast<const char*>(p),
                       static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }
  json TextOrNull(int col) const {
    return IsNull(col) ? json(nullptr) : json(Text(col));
  }
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  double Real(int col) const { return sqlite3_column_double(stmt_, col); }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_OK;
};

// BEGIN on construction; ROLLBACK unless Commit() ran.
class Transaction {
 public:
  Transaction(sqlite3* db, const char* begin) : db_(db) {
    begun_ = Exec(db, begin);
  }
  ~Transaction() {
    if (begun_.ok() && !done_) (void)Exec(db_, "ROLLBACK");
  }
  const Status& begun() const { return begun_; }
  Status Commit() {
    done_ = true;
    return Exec(db_, "COMMIT");
  }

 private:
  sqlite3* db_;
  Status begun_;
  bool done_ = false;
};

StatusOr<sqlite3*> OpenConnection(const std::string& path) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      path.c_str(), &db,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
      nullptr);
  if (rc != SQLITE_OK) {
    Status s = IoError("experiments database " + path + ": " +
                       (db != nullptr ? sqlite3_errmsg(db) : "out of memory"));
    sqlite3_close(db);
    return s;
  }
  // Writers of other processes hold the lock briefly: wait, not fail.
  sqlite3_busy_timeout(db, 10000);
  Status s = Exec(db, "PRAGMA foreign_keys=ON; PRAGMA synchronous=FULL;");
  if (!s.ok()) {
    sqlite3_close(db);
    return s;
  }
  return db;
}

json ParseObject(const std::string& text) {
  if (text.empty()) return json::object();
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? json(text) : j;
}

json ExperimentOf(const Stmt& s) {  // id, created_at, model, config_json,
                                    // status, notes
  return {{"id", s.Text(0)},
          {"created_at", s.Text(1)},
          {"model", s.Text(2)},
          {"config", s.IsNull(3) ? json::object() : ParseObject(s.Text(3))},
          {"status", s.TextOrNull(4)},
          {"notes", s.TextOrNull(5)}};
}

json ConversationOf(const Stmt& s) {
  return {{"id", s.Int(0)},           {"experiment_id", s.Text(1)},
          {"sequence_num", s.Int(2)}, {"timestamp", s.Text(3)},
          {"role", s.Text(4)},        {"content", s.Text(5)}};
}

json MetricOf(const Stmt& s) {
  return {{"id", s.Int(0)},
          {"experiment_id", s.Text(1)},
          {"name", s.Text(2)},
          {"value", s.Real(3)},
          {"unit", s.TextOrNull(4)},
          {"timestamp", s.Text(5)},
          {"metadata", s.IsNull(6) ? json::object() : ParseObject(s.Text(6))}};
}

json HiddenStateOf(const Stmt& s) {
  return {{"id", s.Int(0)},
          {"experiment_id", s.Text(1)},
          {"layer", s.Int(2)},
          {"file_path", s.Text(3)},
          {"shape", ParseObject(s.Text(4))},
          {"dtype", s.Text(5)},
          {"timestamp", s.Text(6)}};
}

constexpr const char* kExperimentColumns =
    "id, created_at, model, config_json, status, notes";
constexpr const char* kConversationColumns =
    "id, experiment_id, sequence_num, timestamp, role, content";
constexpr const char* kMetricColumns =
    "id, experiment_id, name, value, unit, timestamp, metadata_json";
constexpr const char* kHiddenStateColumns =
    "id, experiment_id, layer, file_path, shape_json, dtype, timestamp";

template <typename RowFn>
StatusOr<json> Rows(sqlite3* db, const std::string& sql,
                    const std::vector<std::string>& text_args, RowFn row) {
  Stmt s(db, sql);
  RETURN_IF_ERROR(s.ok());
  for (size_t i = 0; i < text_args.size(); ++i)
    s.Bind(static_cast<int>(i + 1), text_args[i]);
  json out = json::array();
  while (true) {
    ASSIGN_OR_RETURN(bool has, s.Step());
    if (!has) break;
    out.push_back(row(s));
  }
  return out;
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

bool PathExists(const std::string& path) {
  std::error_code ec;
  return fs::symlink_status(path, ec).type() != fs::file_type::not_found;
}

std::string Uuid4() {
  // From the kernel each time: no generator state that a fork() would copy
  // (a child process must not repeat its parent's ids).
  uint8_t b[16];
  size_t got = 0;
  while (got < sizeof b) {
    const ssize_t n = ::getrandom(b + got, sizeof b - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      break;
    }
  }
  if (got < sizeof b) {  // no getrandom: a generator seeded per call
    std::random_device rd;
    std::seed_seq seq{
        rd(),
        rd(),
        rd(),
        rd(),
        static_cast<unsigned>(::getpid()),
        static_cast<unsigned>(
            std::chrono::steady_clock::now().time_since_epoch().count())};
    std::mt19937_64 rng(seq);
    for (int i = 0; i < 16; i += 8) {
      const uint64_t r = rng();
      std::memcpy(b + i, &r, 8);
    }
  }
  b[6] = static_cast<uint8_t>((b[6] & 0x0f) | 0x40);
  b[8] = static_cast<uint8_t>((b[8] & 0x3f) | 0x80);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[b[i] >> 4];
    out += kHex[b[i] & 15];
  }
  return out;
}

// Broken-down UTC time and microseconds of now.
std::pair<std::tm, int64_t> UtcNow() {
  const auto now = std::chrono::system_clock::now();
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      now.time_since_epoch())
                      .count();
  const std::time_t secs = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  return {tm, us % 1000000};
}

std::string NumpyDTypeName(DType d) {
  switch (d) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    default:
      return std::string(DTypeName(d));
  }
}

bool ValidStatus(const std::string& s) {
  return s == "running" || s == "completed" || s == "failed";
}

Status BadStatus(const std::string& s) {
  return InvalidArgumentError("experiment status `" + s +
                              "`: expected running, completed or failed");
}

// ---- CSV (the shape pandas' to_csv writes: a header, QUOTE_MINIMAL, "\n").

std::string CsvField(const json& v) {
  std::string s;
  if (v.is_null()) return "";
  if (v.is_string()) {
    s = v.get<std::string>();
  } else if (v.is_boolean()) {
    s = v.get<bool>() ? "True" : "False";
  } else {
    s = v.dump();
  }
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

// A table of objects as CSV, columns in the given order; object-valued
// columns written as compact JSON.
std::string Csv(const std::vector<std::string>& columns, const json& rows) {
  std::string out;
  for (size_t i = 0; i < columns.size(); ++i)
    out += (i > 0 ? "," : "") + CsvField(columns[i]);
  out += "\n";
  for (const json& r : rows) {
    for (size_t i = 0; i < columns.size(); ++i) {
      const json& v = r.contains(columns[i]) ? r[columns[i]] : json(nullptr);
      out += i > 0 ? "," : "";
      out += (v.is_object() || v.is_array()) ? CsvField(v.dump()) : CsvField(v);
    }
    out += "\n";
  }
  return out;
}

const std::vector<std::string> kExperimentCsv = {
    "id", "created_at", "model", "config", "status", "notes"};
const std::vector<std::string> kConversationCsv = {
    "id", "experiment_id", "sequence_num", "timestamp", "role", "content"};
const std::vector<std::string> kMetricCsv = {
    "id", "experiment_id", "name", "value", "unit", "metadata", "timestamp"};
const std::vector<std::string> kHiddenStateCsv = {
    "id", "experiment_id", "layer", "file_path", "shape", "dtype", "timestamp"};
const std::vector<std::string> kSummaryCsv = {
    "id",    "created_at",         "model",        "status",
    "notes", "conversation_count", "metric_count", "hidden_state_count"};

Status MakeDirs(const std::string& dir, const std::string& what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return IoError(what + " " + dir + ": cannot create it: " + ec.message());
  return Status();
}

// A hidden-state file's array as a nested list of numbers (its shape);
// [] when the file cannot be read.
json ArrayOfFile(const std::string& path) {
  auto file = SafetensorsFile::Open(path);
  if (!file.ok()) return json::array();
  const TensorInfo* info = (*file)->Find("hidden_state");
  if (info == nullptr) return json::array();
  const TensorView v = (*file)->View(*info);
  const int64_t n = v.numel();
  std::vector<float> f(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h = 0;
    switch (v.dtype) {
      case DType::kF32:
        std::memcpy(&f[i], static_cast<const char*>(v.data) + i * 4, 4);
        break;
      case DType::kBF16:
        std::memcpy(&h, static_cast<const char*>(v.data) + i * 2, 2);
        f[i] = Bf16ToF32(h);
        break;
      case DType::kF16:
        std::memcpy(&h, static_cast<const char*>(v.data) + i * 2, 2);
        f[i] = F16ToF32(h);
        break;
      default:
        return json::array();
    }
  }
  const std::vector<int64_t>& dims = v.shape.dims();
  if (dims.empty()) return n == 1 ? json(f[0]) : json::array();
  // Builds the nesting from the innermost dimension outwards.
  std::vector<json> level;
  level.reserve(f.size());
  for (float x : f) level.emplace_back(x);
  for (size_t d = dims.size(); d-- > 0;) {
    const int64_t width = dims[d];
    std::vector<json> up;
    if (width == 0) {
      int64_t outer = 1;
      for (size_t k = 0; k < d; ++k) outer *= dims[k];
      up.assign(static_cast<size_t>(outer), json::array());
    } else {
      for (size_t i = 0; i < level.size(); i += static_cast<size_t>(width)) {
        json row = json::array();
        for (int64_t k = 0; k < width; ++k)
          row.push_back(std::move(level[i + static_cast<size_t>(k)]));
        up.push_back(std::move(row));
      }
    }
    level = std::move(up);
  }
  return level.empty() ? json::array() : std::move(level[0]);
}

}  // namespace

std::string ExpandHome(const std::string& path) {
  if (path == "~" || path.rfind("~/", 0) == 0) {
    const char* home = std::getenv("HOME");
    if (home != nullptr && *home != '\0')
      return std::string(home) + path.substr(1);
  }
  return path;
}

std::string IsoTimestampNow() {
  const auto [tm, us] = UtcNow();
  char buf[96];  // room for any int fields (GCC checks the worst case)
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lld",
                tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                tm.tm_min, tm.tm_sec, static_cast<long long>(us));
  return buf;
}

StatusOr<std::string> NormalizeIsoTimestamp(const std::string& text) {
  const Status bad = InvalidArgumentError(
      "expected an ISO-8601 date or date-time (e.g. 2026-01-31 or "
      "2026-01-31T12:00:00), got '" +
      text + "'");
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
  int64_t us = 0;
  size_t pos = 0;
  auto digits = [&](int n, int* out) {
    if (pos + n > text.size()) return false;
    int v = 0;
    for (int i = 0; i < n; ++i) {
      const char c = text[pos + i];
      if (c < '0' || c > '9') return false;
      v = v * 10 + (c - '0');
    }
    pos += n;
    *out = v;
    return true;
  };
  auto expect = [&](char c) {
    if (pos < text.size() && text[pos] == c) {
      ++pos;
      return true;
    }
    return false;
  };
  if (!digits(4, &y) || !expect('-') || !digits(2, &mo) || !expect('-') ||
      !digits(2, &d))
    return bad;
  int offset_minutes = 0;
  if (pos < text.size() && (text[pos] == 'T' || text[pos] == ' ')) {
    ++pos;
    if (!digits(2, &h) || !expect(':') || !digits(2, &mi)) return bad;
    if (expect(':')) {
      if (!digits(2, &s)) return bad;
      if (expect('.')) {
        int n = 0;
        int64_t frac = 0;
        while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
          if (n < 6) frac = frac * 10 + (text[pos] - '0');
          ++n;
          ++pos;
        }
        if (n == 0) return bad;
        for (int k = n; k < 6; ++k) frac *= 10;
        us = frac;
      }
    }
    if (expect('Z')) {
    } else if (pos < text.size() && (text[pos] == '+' || text[pos] == '-')) {
      const int sign = text[pos] == '-' ? -1 : 1;
      ++pos;
      int oh = 0, om = 0;
      if (!digits(2, &oh)) return bad;
      expect(':');
      if (!digits(2, &om)) return bad;
      offset_minutes = sign * (oh * 60 + om);
    }
  }
  if (pos != text.size() || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 ||
      mi > 59 || s > 60)
    return bad;
  std::tm tm{};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = s;
  std::time_t t = timegm(&tm) - static_cast<std::time_t>(offset_minutes) * 60;
  std::tm out{};
  gmtime_r(&t, &out);
  char buf[96];  // room for any int fields (GCC checks the worst case)
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lld",
                out.tm_year + 1900, out.tm_mon + 1, out.tm_mday, out.tm_hour,
                out.tm_min, out.tm_sec, static_cast<long long>(us));
  return std::string(buf);
}

Status CheckExportFormat(const std::string& format) {
  if (format == "json" || format == "csv") return Status();
  if (format == "parquet")
    return UnimplementedError(
        "format `parquet`: loom serve exports json and csv only");
  return InvalidArgumentError("Invalid format: " + format +
                              ". Must be one of: json, csv, parquet");
}

// ---------------------------------------------------------------------------

StatusOr<std::unique_ptr<ExperimentStore>> ExperimentStore::Open(
    const std::string& db_path, const std::string& hidden_states_dir) {
  std::unique_ptr<ExperimentStore> store(new ExperimentStore());
  store->db_path_ = db_path;
  store->hidden_states_dir_ = hidden_states_dir;
  const fs::path parent = fs::path(db_path).parent_path();
  if (!parent.empty())
    RETURN_IF_ERROR(MakeDirs(parent.string(), "persistence.db_path's folder"));
  RETURN_IF_ERROR(MakeDirs(hidden_states_dir, "persistence.hidden_states_dir"));
  ASSIGN_OR_RETURN(store->writer_, OpenConnection(db_path));
  sqlite3* db = store->writer_;
  // WAL: readers see the last committed snapshot while a writer works; the
  // mode is kept in the file.
  {
    Stmt wal(db, "PRAGMA journal_mode=WAL");
    RETURN_IF_ERROR(wal.ok());
    ASSIGN_OR_RETURN(bool row, wal.Step());
    if (!row || wal.Text(0) != "wal")
      return IoError("experiments database " + db_path +
                     ": cannot switch to WAL journal mode (got " +
                     (row ? wal.Text(0) : std::string("nothing")) + ")");
  }
  Transaction tx(db, "BEGIN IMMEDIATE");
  RETURN_IF_ERROR(tx.begun());
  RETURN_IF_ERROR(Exec(db, kSchema));
  RETURN_IF_ERROR(tx.Commit());
  return store;
}

ExperimentStore::~ExperimentStore() {
  for (sqlite3* db : readers_) sqlite3_close(db);
  sqlite3_close(writer_);
}

StatusOr<sqlite3*> ExperimentStore::TakeReader() {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (!readers_.empty()) {
      sqlite3* db = readers_.back();
      readers_.pop_back();
      return db;
    }
  }
  return OpenConnection(db_path_);
}

void ExperimentStore::GiveBackReader(sqlite3* db) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  if (readers_.size() < 16) {
    readers_.push_back(db);
    return;
  }
  sqlite3_close(db);
}

// A read connection for one call, in a read transaction (one snapshot).
class ExperimentStore::Reader {
 public:
  explicit Reader(ExperimentStore* store) : store_(store) {
    auto db = store->TakeReader();
    if (!db.ok()) {
      status_ = db.status();
      return;
    }
    db_ = *db;
    status_ = Exec(db_, "BEGIN");
  }
  ~Reader() {
    if (db_ == nullptr) return;
    if (status_.ok()) (void)Exec(db_, "COMMIT");
    store_->GiveBackReader(db_);
  }
  const Status& status() const { return status_; }
  sqlite3* db() const { return db_; }

 private:
  ExperimentStore* store_;
  sqlite3* db_ = nullptr;
  Status status_;
};

StatusOr<std::string> ExperimentStore::CreateExperiment(
    const std::string& model, const json& config, const std::string& status,
    const std::string& notes) {
  if (!ValidStatus(status)) return BadStatus(status);
  const std::string id = Uuid4();
  std::lock_guard<std::mutex> lock(write_mu_);
  Stmt s(writer_,
         "INSERT INTO experiments (id, created_at, model, config_json, status, "
         "notes) VALUES (?, ?, ?, ?, ?, ?)");
  RETURN_IF_ERROR(s.ok());
  s.Bind(1, id)
      .Bind(2, IsoTimestampNow())
      .Bind(3, model)
      .Bind(4, config.is_null() ? json::object().dump() : config.dump())
      .Bind(5, status)
      .Bind(6,
            notes.empty() ? std::nullopt : std::optional<std::string>(notes));
  RETURN_IF_ERROR(s.Run());
  return id;
}

Status ExperimentStore::SetStatus(const std::string& id,
                                  const std::string& status) {
  if (!ValidStatus(status)) return BadStatus(status);
  std::lock_guard<std::mutex> lock(write_mu_);
  Stmt s(writer_, "UPDATE experiments SET status = ? WHERE id = ?");
  RETURN_IF_ERROR(s.ok());
  s.Bind(1, status).Bind(2, id);
  RETURN_IF_ERROR(s.Run());
  if (sqlite3_changes(writer_) == 0)
    return NotFoundError("Experiment not found: " + id);
  return Status();
}

StatusOr<int64_t> ExperimentStore::AddConversation(const std::string& id,
                                                   const std::string& role,
                                                   const std::string& content) {
  std::lock_guard<std::mutex> lock(write_mu_);
  Transaction tx(writer_, "BEGIN IMMEDIATE");
  RETURN_IF_ERROR(tx.begun());
  Stmt next(writer_,
            "SELECT COALESCE(MAX(sequence_num) + 1, 0) FROM conversations "
            "WHERE experiment_id = ?");
  RETURN_IF_ERROR(next.ok());
  next.Bind(1, id);
  ASSIGN_OR_RETURN(bool row, next.Step());
  const int64_t seq = row ? next.Int(0) : 0;
  Stmt s(writer_,
         "INSERT INTO conversations (experiment_id, sequence_num, timestamp, "
         "role, content) VALUES (?, ?, ?, ?, ?)");
  RETURN_IF_ERROR(s.ok());
  s.Bind(1, id)
      .Bind(2, seq)
      .Bind(3, IsoTimestampNow())
      .Bind(4, role)
      .Bind(5, content);
  if (Status st = s.Run(); !st.ok()) {
    if (sqlite3_extended_errcode(writer_) == SQLITE_CONSTRAINT_FOREIGNKEY)
      return NotFoundError("Experiment not found: " + id);
    return st;
  }
  const int64_t rowid = sqlite3_last_insert_rowid(writer_);
  RETURN_IF_ERROR(tx.Commit());
  return rowid;
}

StatusOr<int64_t> ExperimentStore::AddMetric(const std::string& id,
                                             const std::string& name,
                                             double value,
                                             const std::string& unit,
                                             const json& metadata) {
  std::lock_guard<std::mutex> lock(write_mu_);
  Stmt s(writer_,
         "INSERT INTO metrics (experiment_id, name, value, unit, timestamp, "
         "metadata_json) VALUES (?, ?, ?, ?, ?, ?)");
  RETURN_IF_ERROR(s.ok());
  s.Bind(1, id)
      .Bind(2, name)
      .Bind(3, value)
      .Bind(4, unit.empty() ? std::nullopt : std::optional<std::string>(unit))
      .Bind(5, IsoTimestampNow())
      .Bind(6, metadata.is_null() ? json::object().dump() : metadata.dump());
  if (Status st = s.Run(); !st.ok()) {
    if (sqlite3_extended_errcode(writer_) == SQLITE_CONSTRAINT_FOREIGNKEY)
      return NotFoundError("Experiment not found: " + id);
    return st;
  }
  return sqlite3_last_insert_rowid(writer_);
}

StatusOr<int64_t> ExperimentStore::SaveHiddenState(const std::string& id,
                                                   std::optional<int64_t> layer,
                                                   DType dtype,
                                                   const Shape& shape,
                                                   const void* data) {
  if (!layer)
    return InvalidArgumentError(
        "a saved hidden state needs its layer (the hidden_states table's "
        "layer column is NOT NULL)");
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16)
    return InvalidArgumentError("hidden state dtype " +
                                std::string(DTypeName(dtype)) +
                                ": expected F32, BF16 or F16");
  if (id.empty() || id.find_first_of("/\\") != std::string::npos ||
      id.find("..") != std::string::npos)
    return InvalidArgumentError("experiment id `" + id +
                                "` cannot name a file");
  const auto [tm, us] = UtcNow();
  char stamp[40];
  std::snprintf(stamp, sizeof stamp, "%04d%02d%02d_%02d%02d%02d_%06lld",
                tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                tm.tm_min, tm.tm_sec, static_cast<long long>(us));
  const std::string created = IsoTimestampNow();
  std::string path;
  for (int k = 0;; ++k) {
    path =
        JoinPath(hidden_states_dir_,
                 id + "_layer" + std::to_string(*layer) + "_" + stamp +
                     (k > 0 ? "_" + std::to_string(k) : "") + ".safetensors");
    if (!PathExists(path)) break;
  }
  {
    // The experiment must exist before its file is written.
    Reader r(this);
    RETURN_IF_ERROR(r.status());
    Stmt s(r.db(), "SELECT 1 FROM experiments WHERE id = ?");
    RETURN_IF_ERROR(s.ok());
    s.Bind(1, id);
    ASSIGN_OR_RETURN(bool found, s.Step());
    if (!found) return NotFoundError("Experiment not found: " + id);
  }
  SafetensorsWriter w;
  w.SetMetadata("experiment_id", id);
  w.SetMetadata("created_at", created);
  w.SetMetadata("layer", std::to_string(*layer));
  w.SetMetadata("dtype", NumpyDTypeName(dtype));
  RETURN_IF_ERROR(w.Add("hidden_state", dtype, shape, data,
                        DTypeBytes(dtype, shape.numel())));
  // Complete on disk (fsync, rename) before the row that names it commits.
  RETURN_IF_ERROR(w.Write(path));
  std::lock_guard<std::mutex> lock(write_mu_);
  Stmt s(writer_,
         "INSERT INTO hidden_states (experiment_id, layer, file_path, "
         "shape_json, dtype, timestamp) VALUES (?, ?, ?, ?, ?, ?)");
  RETURN_IF_ERROR(s.ok());
  s.Bind(1, id)
      .Bind(2, *layer)
      .Bind(3, path)
      .Bind(4, json(shape.dims()).dump())
      .Bind(5, NumpyDTypeName(dtype))
      .Bind(6, created);
  if (Status st = s.Run(); !st.ok()) {
    std::remove(path.c_str());
    if (sqlite3_extended_errcode(writer_) == SQLITE_CONSTRAINT_FOREIGNKEY)
      return NotFoundError("Experiment not found: " + id);
    return st;
  }
  return sqlite3_last_insert_rowid(writer_);
}

Status ExperimentStore::DeleteExperiment(const std::string& id) {
  std::vector<std::string> files;
  std::lock_guard<std::mutex> lock(write_mu_);
  Transaction tx(writer_, "BEGIN IMMEDIATE");
  RETURN_IF_ERROR(tx.begun());
  {
    Stmt s(writer_,
           "SELECT file_path FROM hidden_states WHERE experiment_id = ?");
    RETURN_IF_ERROR(s.ok());
    s.Bind(1, id);
    while (true) {
      ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      files.push_back(s.Text(0));
    }
  }
  Stmt del(writer_, "DELETE FROM experiments WHERE id = ?");
  RETURN_IF_ERROR(del.ok());
  del.Bind(1, id);
  RETURN_IF_ERROR(del.Run());
  if (sqlite3_changes(writer_) == 0)
    return NotFoundError("Experiment not found: " + id);
  RETURN_IF_ERROR(tx.Commit());
  for (const std::string& f : files) std::remove(f.c_str());
  return Status();
}

// ---- Reads

StatusOr<json> ExperimentStore::ExperimentRow(sqlite3* db,
                                              const std::string& id) {
  Stmt s(db, std::string("SELECT ") + kExperimentColumns +
                 " FROM experiments WHERE id = ?");
  RETURN_IF_ERROR(s.ok());
  s.Bind(1, id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return NotFoundError("Experiment not found: " + id);
  return ExperimentOf(s);
}

int64_t ExperimentStore::Count() {
  Reader r(this);
  if (!r.status().ok()) return 0;
  Stmt s(r.db(), "SELECT COUNT(*) FROM experiments");
  if (!s.ok().ok()) return 0;
  auto row = s.Step();
  return row.ok() && *row ? s.Int(0) : 0;
}

StatusOr<json> ExperimentStore::List(const ExperimentQuery& q) {
  Reader r(this);
  RETURN_IF_ERROR(r.status());
  std::string where = " WHERE 1=1";
  std::vector<std::string> args;
  if (q.model) {
    where += " AND model = ?";
    args.push_back(*q.model);
  }
  if (q.status) {
    where += " AND status = ?";
    args.push_back(*q.status);
  }
  ASSIGN_OR_RETURN(json total_rows,
                   Rows(r.db(), "SELECT COUNT(*) FROM experiments" + where,
                        args, [](const Stmt& s) { return json(s.Int(0)); }));
  std::string dated = where;
  if (q.date_from) {
    dated += " AND created_at >= ?";
    args.push_back(*q.date_from);
  }
  if (q.date_to) {
    dated += " AND created_at <= ?";
    args.push_back(*q.date_to);
  }
  ASSIGN_OR_RETURN(
      json list,
      Rows(r.db(),
           std::string("SELECT ") + kExperimentColumns + " FROM experiments" +
               dated + " ORDER BY created_at DESC, rowid DESC LIMIT " +
               std::to_string(q.limit) + " OFFSET " + std::to_string(q.offset),
           args, ExperimentOf));
  return json{{"experiments", list},
              {"total", total_rows.empty() ? json(0) : total_rows[0]},
              {"limit", q.limit},
              {"offset", q.offset}};
}

StatusOr<json> ExperimentStore::Get(const std::string& id) {
  Reader r(this);
  RETURN_IF_ERROR(r.status());
  ASSIGN_OR_RETURN(json e, ExperimentRow(r.db(), id));
  ASSIGN_OR_RETURN(json conv,
                   Rows(r.db(),
                        std::string("SELECT ") + kConversationColumns +
                            " FROM conversations WHERE "
                            "experiment_id = ? ORDER BY "
                            "sequence_num, id",
                        {id}, ConversationOf));
  ASSIGN_OR_RETURN(json hs, Rows(r.db(),
                                 std::string("SELECT ") + kHiddenStateColumns +
                                     " FROM hidden_states WHERE "
                                     "experiment_id = ? ORDER BY layer, id",
                                 {id}, HiddenStateOf));
  ASSIGN_OR_RETURN(json metrics,
                   Rows(r.db(),
                        std::string("SELECT ") + kMetricColumns +
                            " FROM metrics WHERE experiment_id = ? ORDER BY id",
                        {id}, MetricOf));
  json summary = {{"experiment_id", id},
                  {"model", e["model"]},
                  {"created_at", e["created_at"]},
                  {"status", e["status"]},
                  {"conversation_count", conv.size()},
                  {"metric_count", metrics.size()},
                  {"hidden_state_count", hs.size()}};
  return json{{"experiment", e},
              {"conversations", conv},
              {"hidden_states", hs},
              {"metrics", metrics},
              {"summary", summary}};
}

StatusOr<json> ExperimentStore::Conversations(
    const std::string& id, const std::optional<std::string>& role) {
  Reader r(this);
  RETURN_IF_ERROR(r.status());
  RETURN_IF_ERROR(ExperimentRow(r.db(), id).status());
  std::vector<std::string> args = {id};
  std::string sql = std::string("SELECT ") + kConversationColumns +
                    " FROM conversations WHERE experiment_id = ?";
  if (role) {
    sql += " AND role = ?";
    args.push_back(*role);
  }
  ASSIGN_OR_RETURN(json rows, Rows(r.db(), sql + " ORDER BY sequence_num, id",
                                   args, ConversationOf));
  return json{
      {"experiment_id", id}, {"conversations", rows}, {"total", rows.size()}};
}

StatusOr<json> ExperimentStore::HiddenStates(const std::string& id,
                                             std::optional<int64_t> layer) {
  Reader r(this);
  RETURN_IF_ERROR(r.status());
  RETURN_IF_ERROR(ExperimentRow(r.db(), id).status());
  std::vector<std::string> args = {id};
  std::string sql = std::string("SELECT ") + kHiddenStateColumns +
                    " FROM hidden_states WHERE experiment_id = ?";
  if (layer) sql += " AND layer = " + std::to_string(*layer);
  ASSIGN_OR_RETURN(json rows, Rows(r.db(), sql + " ORDER BY layer, id", args,
                                   HiddenStateOf));
  ASSIGN_OR_RETURN(
      json layers,
      Rows(r.db(),
           "SELECT DISTINCT layer FROM hidden_states WHERE experiment_id = ? "
           "ORDER BY layer",
           {id}, [](const Stmt& s) { return json(s.Int(0)); }));
  return json{{"experiment_id", id},
              {"hidden_states", rows},
              {"layers", layers},
              {"total", rows.size()}};
}

StatusOr<json> ExperimentStore::Metrics(
    const std::string& id, const std::optional<std::string>& name) {
  Reader r(this);
  RETURN_IF_ERROR(r.status());
  RETURN_IF_ERROR(ExperimentRow(r.db(), id).status());
  std::vector<std::string> args = {id};
  std::string sql = std::string("SELECT ") + kMetricColumns +
                    " FROM metrics WHERE experiment_id = ?";
  if (name) {
    sql += " AND name = ?";
    args.push_back(*name);
  }
  ASSIGN_OR_RETURN(json rows,
                   Rows(r.db(), sql + " ORDER BY id", args, MetricOf));
  ASSIGN_OR_RETURN(
      json names,
      Rows(r.db(),
           "SELECT DISTINCT name FROM metrics WHERE experiment_id = ? ORDER "
           "BY name",
           {id}, [](const Stmt& s) { return json(s.Text(0)); }));
  return json{{"experiment_id", id},
              {"metrics", rows},
              {"metric_names", names},
              {"total", rows.size()}};
}

// ---- Exports

StatusOr<std::map<std::string, std::string>> ExperimentStore::Export(
    const std::string& id, const std::string& format, const std::string& dir,
    bool include_hidden_states) {
  RETURN_IF_ERROR(CheckExportFormat(format));
  ASSIGN_OR_RETURN(json all, Get(id));
  RETURN_IF_ERROR(MakeDirs(dir, "export folder"));
  std::map<std::string, std::string> files;
  if (format == "json") {
    json doc = {{"export_timestamp", IsoTimestampNow()},
                {"experiment", all["experiment"]},
                {"conversations", all["conversations"]},
                {"metrics", all["metrics"]},
                {"hidden_states", all["hidden_states"]}};
    if (include_hidden_states) {
      // TheLoom's layer-keyed object keeps one array per layer (the last
      // record's, as its dict does); every record, a last-position [d] and
      // a full-sequence [n, d] state of one layer both, is in the object
      // keyed by record id.
      json by_layer = json::object(), by_id = json::object();
      for (const json& h : all["hidden_states"]) {
        json data = ArrayOfFile(h["file_path"].get<std::string>());
        by_layer[std::to_string(h["layer"].get<int64_t>())] = data;
        by_id[h["id"].is_string() ? h["id"].get<std::string>()
                                  : h["id"].dump()] = std::move(data);
      }
      doc["hidden_state_data"] = std::move(by_layer);
      doc["hidden_state_data_by_id"] = std::move(by_id);
    }
    const std::string path = JoinPath(dir, id + ".json");
    RETURN_IF_ERROR(WriteFileDurably(path, doc.dump(2) + "\n"));
    files["experiment"] = path;
    return files;
  }
  const std::pair<const char*, const std::vector<std::string>*> kinds[] = {
      {"conversations", &kConversationCsv},
      {"metrics", &kMetricCsv},
      {"hidden_states", &kHiddenStateCsv}};
  const std::string exp_path = JoinPath(dir, id + "_experiment.csv");
  RETURN_IF_ERROR(WriteFileDurably(
      exp_path, Csv(kExperimentCsv, json::array({all["experiment"]}))));
  files["experiment"] = exp_path;
  for (const auto& [kind, columns] : kinds) {
    const json& rows = all[kind];
    if (rows.empty()) continue;
    const std::string path = JoinPath(dir, id + "_" + kind + ".csv");
    RETURN_IF_ERROR(WriteFileDurably(path, Csv(*columns, rows)));
    files[kind] = path;
  }
  return files;
}

StatusOr<int64_t> ExperimentStore::ExportSummary(const std::string& format,
                                                 const std::string& path,
                                                 int64_t limit) {
  RETURN_IF_ERROR(CheckExportFormat(format));
  json rows;
  {
    Reader r(this);
    RETURN_IF_ERROR(r.status());
    ASSIGN_OR_RETURN(
        rows,
        Rows(
            r.db(),
            "SELECT e.id, e.created_at, e.model, e.status, e.notes, "
            "(SELECT COUNT(*) FROM conversations c WHERE c.experiment_id = "
            "e.id), (SELECT COUNT(*) FROM metrics m WHERE m.experiment_id = "
            "e.id), (SELECT COUNT(*) FROM hidden_states h WHERE "
            "h.experiment_id = e.id) FROM experiments e ORDER BY "
            "e.created_at DESC, e.rowid DESC LIMIT " +
                std::to_string(limit),
            {}, [](const Stmt& s) {
              return json{
                  {"id", s.Text(0)},          {"created_at", s.Text(1)},
                  {"model", s.Text(2)},       {"status", s.TextOrNull(3)},
                  {"notes", s.TextOrNull(4)}, {"conversation_count", s.Int(5)},
                  {"metric_count", s.Int(6)}, {"hidden_state_count", s.Int(7)}};
            }));
  }
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) RETURN_IF_ERROR(MakeDirs(parent.string(), "folder"));
  if (format == "json") {
    const json doc = {{"export_timestamp", IsoTimestampNow()},
                      {"total_experiments", rows.size()},
                      {"experiments", rows}};
    RETURN_IF_ERROR(WriteFileDurably(path, doc.dump(2) + "\n"));
  } else {
    RETURN_IF_ERROR(WriteFileDurably(path, Csv(kSummaryCsv, rows)));
  }
  return static_cast<int64_t>(rows.size());
}

// ---------------------------------------------------------------------------
// Routes.

namespace {

std::optional<std::string> Param(const ExperimentRoutes::Params& q,
                                 const std::string& name) {
  const auto it = q.find(name);
  if (it == q.end()) return std::nullopt;
  return it->second;
}

StatusOr<std::optional<int64_t>> IntParam(const ExperimentRoutes::Params& q,
                                          const std::string& name, int64_t lo,
                                          int64_t hi) {
  const std::optional<std::string> v = Param(q, name);
  if (!v) return std::optional<int64_t>();
  int64_t x = 0;
  const char* end = v->data() + v->size();
  const auto r = std::from_chars(v->data(), end, x);
  if (v->empty() || r.ec != std::errc() || r.ptr != end || x < lo || x > hi)
    return InvalidArgumentError(
        "query parameter `" + name + "`: expected an integer in [" +
        std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + *v + "'");
  return std::optional<int64_t>(x);
}

StatusOr<std::optional<std::string>> DateParam(
    const ExperimentRoutes::Params& q, const std::string& name) {
  const std::optional<std::string> v = Param(q, name);
  if (!v) return std::optional<std::string>();
  StatusOr<std::string> t = NormalizeIsoTimestamp(*v);
  if (!t.ok())
    return InvalidArgumentError("query parameter `" + name +
                                "`: " + t.status().message());
  return std::optional<std::string>(*t);
}

json FilesJson(const std::map<std::string, std::string>& files) {
  json out = json::object();
  for (const auto& [k, v] : files) out[k] = v;
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<ExperimentRoutes>> ExperimentRoutes::Create(
    const PersistenceOptions& o) {
  std::unique_ptr<ExperimentRoutes> r(new ExperimentRoutes());
  r->export_dir_ = ExpandHome(o.export_dir);
  if (!o.enabled) return r;
  auto store = ExperimentStore::Open(ExpandHome(o.db_path),
                                     ExpandHome(o.hidden_states_dir));
  if (!store.ok())
    return store.status().WithContext("persistence (persistence.db_path " +
                                      o.db_path + ")");
  r->store_ = std::move(store).value();
  return r;
}

Status ExperimentRoutes::Enabled() const {
  if (store_ != nullptr) return Status();
  return FailedPreconditionError(
      "Persistence is not enabled. Set persistence.enabled=true in config.");
}

StatusOr<std::string> ExperimentRoutes::ExportPath(
    const std::string& given, const std::string& field) const {
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(export_dir_, ec);
  if (ec)
    return IoError("persistence.export_dir " + export_dir_ + ": " +
                   ec.message());
  if (given.empty()) return root.string();
  const fs::path p =
      fs::path(given).is_absolute() ? fs::path(given) : root / fs::path(given);
  const fs::path resolved = fs::weakly_canonical(p, ec);
  if (ec) return InvalidArgumentError("field `" + field + "`: " + ec.message());
  const std::string r = resolved.string(), base = root.string();
  if (r == base || r.rfind(base + "/", 0) == 0) return r;
  return InvalidArgumentError(
      "field `" + field + "`: '" + given +
      "' is outside persistence.export_dir; exports are written inside it "
      "(give a path relative to it)");
}

StatusOr<json> ExperimentRoutes::List(const Params& q) {
  RETURN_IF_ERROR(Enabled());
  ExperimentQuery e;
  ASSIGN_OR_RETURN(std::optional<int64_t> limit, IntParam(q, "limit", 1, 1000));
  ASSIGN_OR_RETURN(std::optional<int64_t> offset,
                   IntParam(q, "offset", 0, int64_t{1} << 40));
  if (limit) e.limit = *limit;
  if (offset) e.offset = *offset;
  e.model = Param(q, "model");
  e.status = Param(q, "status");
  ASSIGN_OR_RETURN(e.date_from, DateParam(q, "date_from"));
  ASSIGN_OR_RETURN(e.date_to, DateParam(q, "date_to"));
  return store_->List(e);
}

StatusOr<json> ExperimentRoutes::Get(const std::string& id) {
  RETURN_IF_ERROR(Enabled());
  return store_->Get(id);
}

StatusOr<json> ExperimentRoutes::Conversations(const std::string& id,
                                               const Params& q) {
  RETURN_IF_ERROR(Enabled());
  return store_->Conversations(id, Param(q, "role"));
}

StatusOr<json> ExperimentRoutes::HiddenStates(const std::string& id,
                                              const Params& q) {
  RETURN_IF_ERROR(Enabled());
  ASSIGN_OR_RETURN(std::optional<int64_t> layer,
                   IntParam(q, "layer", -(int64_t{1} << 31), int64_t{1} << 31));
  return store_->HiddenStates(id, layer);
}

StatusOr<json> ExperimentRoutes::Metrics(const std::string& id,
                                         const Params& q) {
  RETURN_IF_ERROR(Enabled());
  return store_->Metrics(id, Param(q, "metric_name"));
}

StatusOr<json> ExperimentRoutes::Export(const json& b) {
  RETURN_IF_ERROR(Enabled());
  ASSIGN_OR_RETURN(std::string id, GetString(b, "experiment_id", ""));
  if (id.empty())
    return InvalidArgumentError("field `experiment_id` is required");
  ASSIGN_OR_RETURN(std::string format, GetString(b, "format", "json"));
  RETURN_IF_ERROR(CheckExportFormat(format));
  ASSIGN_OR_RETURN(std::string out, GetString(b, "output_path", ""));
  ASSIGN_OR_RETURN(bool with_states,
                   GetBool(b, "include_hidden_states", false));
  ASSIGN_OR_RETURN(std::string dir, ExportPath(out, "output_path"));
  ASSIGN_OR_RETURN(auto files, store_->Export(id, format, dir, with_states));
  return json{{"experiment_id", id},
              {"format", format},
              {"output_files", FilesJson(files)},
              {"total_files", files.size()}};
}

StatusOr<json> ExperimentRoutes::ExportBatch(const json& b) {
  RETURN_IF_ERROR(Enabled());
  ASSIGN_OR_RETURN(std::vector<std::string> ids,
                   GetStrings(b, "experiment_ids"));
  if (ids.empty())
    return InvalidArgumentError(
        "field `experiment_ids`: expected a list of at least 1 id");
  ASSIGN_OR_RETURN(std::string format, GetString(b, "format", "json"));
  RETURN_IF_ERROR(CheckExportFormat(format));
  ASSIGN_OR_RETURN(std::string out, GetString(b, "output_dir", ""));
  ASSIGN_OR_RETURN(std::string dir, ExportPath(out, "output_dir"));
  json exported = json::object();
  for (const std::string& id : ids) {
    ASSIGN_OR_RETURN(auto files, store_->Export(id, format, dir, false));
    exported[id] = FilesJson(files);
  }
  return json{{"exported", exported},
              {"total_experiments", exported.size()},
              {"format", format}};
}

StatusOr<json> ExperimentRoutes::ExportSummary(const json& b) {
  RETURN_IF_ERROR(Enabled());
  ASSIGN_OR_RETURN(std::string format, GetString(b, "format", "csv"));
  RETURN_IF_ERROR(CheckExportFormat(format));
  ASSIGN_OR_RETURN(int64_t limit, GetInt(b, "limit", 1000, 1, 10000));
  ASSIGN_OR_RETURN(std::string out, GetString(b, "output_path", ""));
  if (out.empty()) out = "experiments_summary." + format;
  ASSIGN_OR_RETURN(std::string path, ExportPath(out, "output_path"));
  if (path == ExportPath("", "output_path").value())
    return InvalidArgumentError(
        "field `output_path`: a file path inside persistence.export_dir, got "
        "the folder itself");
  ASSIGN_OR_RETURN(int64_t n, store_->ExportSummary(format, path, limit));
  return json{
      {"output_path", path}, {"total_experiments", n}, {"format", format}};
}

}  // namespace loom::serve
