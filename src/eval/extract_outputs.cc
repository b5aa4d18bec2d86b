#include "src/eval/extract_outputs.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "src/base/check.h"
#include "src/base/read_file.h"
#include "src/core/json_error.h"
#include "src/core/tensor.h"
#include "src/eval/extract_derived_runner.h"
#include "src/io/file_util.h"
#include "src/io/safetensors_writer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// --resume: `path` holds at least `rows` committed rows of `dtype` x
// `row_shape`, whole on disk. Reads only the header and the file size.
Status CheckNpyFile(const std::string& path, DType dtype,
                    const std::vector<int64_t>& row_shape, int64_t rows) {
  StatusOr<NpyHeader> h = ReadNpyHeader(path);
  if (!h.ok() && h.status().code() == StatusCode::kNotFound)
    return DataLossError("--resume: " + path + " is missing; the manifest " +
                         "commits " + std::to_string(rows) + " rows to it");
  if (!h.ok()) return h.status().WithContext("--resume");
  std::vector<int64_t> want = row_shape;
  want.insert(want.begin(), rows);
  std::vector<int64_t> found_rows(h->shape.begin() + (h->shape.empty() ? 0 : 1),
                                  h->shape.end());
  if (h->shape.empty() || h->dtype != dtype || found_rows != row_shape)
    return DataLossError(
        "--resume: " + path + " holds " + std::string(DTypeName(h->dtype)) +
        " " + Shape(h->shape).ToString() + ", the manifest expects " +
        std::string(DTypeName(dtype)) + " " + Shape(want).ToString());
  if (h->shape[0] < rows)
    return DataLossError("--resume: " + path + " commits " +
                         std::to_string(h->shape[0]) +
                         " rows, the manifest commits " + std::to_string(rows));
  StatusOr<int64_t> size = FileSize(path);
  if (!size.ok()) return size.status().WithContext("--resume");
  int64_t row_bytes = DTypeSize(dtype);
  for (int64_t d : row_shape) row_bytes *= d;
  const int64_t need = h->data_offset + rows * row_bytes;
  if (*size < need)
    return DataLossError("--resume: " + path + " has " + std::to_string(*size) +
                         " bytes, its " + std::to_string(rows) +
                         " committed rows need " + std::to_string(need) +
                         " (truncated)");
  return Status();
}

// The rows `out` commits: the window count, or for ragged arrays (which
// hold concatenated rows) the count recorded per file; none if unrecorded.
std::optional<int64_t> CommittedRows(const ManifestProgress& p,
                                     const OutputArray& out) {
  if (!out.sel.ragged()) return p.rows_committed;
  const auto it = p.ragged_rows.find(out.file);
  if (it == p.ragged_rows.end()) return std::nullopt;
  return it->second;
}

// The shard index of a file name "<...>.shard-NNNNN.safetensors", or -1.
int64_t ShardIndex(const std::string& name) {
  const size_t at = name.rfind(".shard-");
  if (at == std::string::npos) return -1;
  return std::strtoll(name.c_str() + at + 7, nullptr, 10);
}

}  // namespace

void ConvertActivations(Backend& host, const float* src, uint8_t* dst,
                        DType dtype, int64_t n) {
  host.ConvertFromF32(src, dst, dtype, n);
}

void OutputSet::Store(const OutputArray& o, const float* src, uint8_t* dst,
                      int64_t n) const {
  if (o.dtype != DType::kI32) {
    ConvertActivations(*host_, src, dst, o.dtype, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t v = static_cast<int32_t>(src[i]);  // exact: |v| < 2^24
    std::memcpy(dst + i * 4, &v, 4);
  }
}

std::vector<int64_t> OutputArray::row_shape() const {
  std::vector<int64_t> s;
  if (sel.kind == RowSelector::Kind::kPos) s.push_back(sel.rows_per_prompt());
  if (heads > 0) s.push_back(heads);
  s.push_back(heads > 0 ? width / heads : width);
  return s;
}

// ---- OutputSet: layout and files --------------------------------------------

OutputSet::OutputSet(const ExtractSettings& settings, DType dtype,
                     OutputFormat format, std::string out_dir, Backend* host)
    : dtype_(dtype),
      format_(format),
      host_(host),
      out_dir_(std::move(out_dir)) {
  for (const HookPoint& hp : settings.hooks.hooks()) {
    for (const RowSelector& sel : settings.selectors) {
      OutputArray out;
      out.hook = hp;
      out.hook_name = HookName(hp);
      out.dtype = dtype_;
      out.sel = sel;
      // The resolver accepted only hooks that exist and have a width.
      StatusOr<int64_t> width =
          HookWidth(hp, settings.config, settings.pattern_keys());
      LOOM_CHECK(width.ok()) << width.status().ToString();
      out.width = *width;
      if (hp.site == HookSite::kPattern) out.heads = settings.config.num_heads;
      out.file = out.hook_name + "." + sel.file_name + ".npy";
      arrays_.push_back(std::move(out));
    }
  }
  for (size_t i = 0; i < settings.derived.size(); ++i) {
    const DerivedHook& d = settings.derived[i];
    for (const RowSelector& sel : settings.selectors) {
      OutputArray out;
      out.hook = d.source;
      out.derived = static_cast<int>(i);
      out.hook_name = d.name;
      out.dtype = d.integer() ? DType::kI32 : dtype_;
      out.sel = sel;
      out.width = d.width;
      out.file = out.hook_name + "." + sel.file_name + ".npy";
      arrays_.push_back(std::move(out));
    }
  }
  const Analyses& a = settings.analyses;
  if (a.dashboard > 0 && format_ != OutputFormat::kMemory)
    for (size_t i = 0; i < a.saes.size(); ++i) {
      dashboards_.push_back(
          std::make_unique<SaeDashboard>(a.saes[i]->d_sae, a.dashboard));
      dashboard_files_.push_back(HookName(a.sae_hooks[i]) +
                                 ".hook_sae_acts_post.dashboard.safetensors");
    }
  for (const RowSelector& sel : settings.selectors) {
    if (!sel.ragged()) continue;
    RaggedIndex ri;
    ri.file = sel.file_name + ".offsets.npy";
    ragged_.push_back(std::move(ri));
    for (OutputArray& out : arrays_)
      if (out.sel.file_name == sel.file_name)
        out.ragged = static_cast<int>(ragged_.size()) - 1;
  }
}

std::string OutputSet::PathOf(const std::string& file) const {
  return out_dir_ + "/" + file;
}

std::vector<std::string> OutputSet::InitialFiles() const {
  std::vector<std::string> files;
  if (format_ != OutputFormat::kNpy) return files;
  for (const auto& out : arrays_) files.push_back(out.file);
  for (const auto& ri : ragged_) files.push_back(ri.file);
  return files;
}

std::vector<std::string> OutputSet::RaggedDataFiles() const {
  std::vector<std::string> files;
  for (const auto& out : arrays_)
    if (out.sel.ragged()) files.push_back(out.file);
  return files;
}

Json OutputSet::ArraysJson() const {
  Json arrays = Json::array();
  for (const auto& out : arrays_) {
    Json a = {{"hook", out.hook_name},
              {"selector", out.sel.spec},
              {"dtype", std::string(DTypeLongName(out.dtype))},
              {"row_shape",
               out.sel.ragged() || out.sel.kind != RowSelector::Kind::kPos
                   ? Json{out.width}
                   : Json{out.sel.rows_per_prompt(), out.width}}};
    if (format_ == OutputFormat::kNpy) a["file"] = out.file;
    if (format_ == OutputFormat::kNpy && out.dtype == DType::kBF16)
      a["storage"] = kBf16NpyStorage;
    if (out.sel.ragged())
      a["offsets_file"] = out.sel.file_name + ".offsets.npy";
    arrays.push_back(a);
  }
  return arrays;
}

Status OutputSet::CreateDashboards() const {
  for (size_t i = 0; i < dashboards_.size(); ++i)
    RETURN_IF_ERROR(dashboards_[i]->Write(PathOf(dashboard_files_[i]), 0));
  return Status();
}

Status OutputSet::Create() {
  RETURN_IF_ERROR(CreateDashboards());
  if (format_ != OutputFormat::kNpy) return Status();
  for (auto& out : arrays_) {
    ASSIGN_OR_RETURN(out.npy, NpyWriter::Create(PathOf(out.file), out.dtype,
                                                out.row_shape()));
  }
  for (auto& ri : ragged_) {
    ASSIGN_OR_RETURN(ri.npy,
                     NpyWriter::Create(PathOf(ri.file), DType::kI64, {}));
    const int64_t zero = 0;
    RETURN_IF_ERROR(ri.npy->AppendRows(&zero, 1));
    RETURN_IF_ERROR(ri.npy->Commit());
  }
  return Status();
}

Status OutputSet::CheckCommitted(const ManifestProgress& progress,
                                 const std::vector<std::string>& files) const {
  for (size_t i = 0; i < dashboards_.size(); ++i) {
    SaeDashboard probe(dashboards_[i]->features(), dashboards_[i]->top_n());
    RETURN_IF_ERROR(probe.Load(PathOf(dashboard_files_[i]),
                               progress.rows_committed, /*check_only=*/true));
  }
  return format_ == OutputFormat::kNpy ? CheckCommittedNpy(progress)
                                       : CheckCommittedShards(progress, files);
}

Status OutputSet::CheckCommittedNpy(const ManifestProgress& p) const {
  for (const auto& out : arrays_) {
    const std::optional<int64_t> rows = CommittedRows(p, out);
    if (!rows)
      return DataLossError("--resume: the manifest records no row count for " +
                           out.file);
    RETURN_IF_ERROR(
        CheckNpyFile(PathOf(out.file), out.dtype, out.row_shape(), *rows));
  }
  for (const auto& ri : ragged_)
    RETURN_IF_ERROR(
        CheckNpyFile(PathOf(ri.file), DType::kI64, {}, p.rows_committed + 1));
  return Status();
}

Status OutputSet::CheckCommittedShards(
    const ManifestProgress& p, const std::vector<std::string>& files) const {
  const int64_t want = p.shards * static_cast<int64_t>(arrays_.size());
  if (static_cast<int64_t>(files.size()) != want)
    return DataLossError("--resume: the manifest lists " +
                         std::to_string(files.size()) + " shard files, " +
                         std::to_string(p.shards) + " committed shards of " +
                         std::to_string(arrays_.size()) + " arrays make " +
                         std::to_string(want));
  for (const std::string& f : files) {
    std::error_code ec;
    if (!fs::is_regular_file(PathOf(f), ec))
      return DataLossError("--resume: committed shard " + PathOf(f) +
                           " is missing");
  }
  return Status();
}

Status OutputSet::Reopen(const ManifestProgress& p,
                         const std::vector<std::string>& files) {
  for (size_t i = 0; i < dashboards_.size(); ++i)
    RETURN_IF_ERROR(
        dashboards_[i]->Load(PathOf(dashboard_files_[i]), p.rows_committed));
  if (format_ == OutputFormat::kNpy) {
    for (auto& out : arrays_) {
      const std::optional<int64_t> keep = CommittedRows(p, out);
      LOOM_CHECK(keep.has_value()) << out.file << ": CheckCommitted first";
      ASSIGN_OR_RETURN(out.npy,
                       NpyWriter::OpenForAppend(PathOf(out.file), *keep));
    }
    for (auto& ri : ragged_) {
      ASSIGN_OR_RETURN(ri.npy, NpyWriter::OpenForAppend(PathOf(ri.file),
                                                        p.rows_committed + 1));
    }
    return Status();
  }
  // Drop shards written after the last commit record: those it does not
  // list (a --shard job's windows are not numbered from 0 without gaps).
  const std::set<std::string> committed(files.begin(), files.end());
  std::error_code ec;
  for (fs::directory_iterator it(out_dir_, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const int64_t index = ShardIndex(name);
    if (index < 0 || committed.count(name) > 0) continue;
    std::error_code rm;
    if (!fs::remove(it->path(), rm) && rm)
      return IoError(it->path().string() + ": cannot remove: " + rm.message());
  }
  if (ec) return IoError("--out " + out_dir_ + ": " + ec.message());
  return Status();
}

// ---- OutputSet: one window --------------------------------------------------

void OutputSet::StageWindow(const std::vector<PreparedRow>& window) {
  window_ = &window;
  const int64_t W = static_cast<int64_t>(window.size());
  for (auto& ri : ragged_) ri.slot_begin.assign(W + 1, 0);
  for (OutputArray& out : arrays_) {
    const int64_t ds = DTypeSize(out.dtype);
    if (out.ragged >= 0) {
      RaggedIndex& ri = ragged_[out.ragged];
      int64_t total = 0;
      for (int64_t s = 0; s < W; ++s) {
        ri.slot_begin[s] = total;
        if (!window[s].ok()) continue;
        SpanRange r;
        ResolveSpan(out.sel, window[s].size(), &r);  // checked by RowPreparer
        total += r.end - r.begin;
      }
      ri.slot_begin[W] = total;
      ri.window_rows = total;
      out.stage.assign(static_cast<size_t>(total * out.width * ds), 0);
      continue;
    }
    out.stage.assign(
        static_cast<size_t>(W * out.sel.rows_per_prompt() * out.width * ds), 0);
    if (out.sel.kind == RowSelector::Kind::kMean)
      out.acc.assign(W * out.width, 0.0);
    if (out.sel.kind == RowSelector::Kind::kMax)
      out.acc.assign(W * out.width, -std::numeric_limits<double>::infinity());
  }
}

OutputSet::SeqRows OutputSet::Locate(const Batch& batch, int64_t s,
                                     int64_t row_begin, int64_t row_end) const {
  const int64_t b = batch.seq_start[s], e = batch.seq_start[s + 1];
  SeqRows q;
  q.slot = (*slots_)[s];
  if (chunk_row_tokens_ > 0) {  // a chunk of a streamed row
    LOOM_CHECK_EQ(batch.num_seqs(), 1);
    q.origin = b - chunk_pos0_;
    q.len = chunk_row_tokens_;
  } else {
    q.origin = b;
    q.len = e - b;
  }
  q.lo = std::max(b, row_begin);
  q.hi = std::min(e, row_end);
  return q;
}

void OutputSet::RowPosition(const Batch& batch, int64_t s, int64_t t,
                            int64_t* row, int64_t* position) const {
  const SeqRows q = Locate(batch, s, t, t + 1);
  *row = (*window_)[static_cast<size_t>(q.slot)].index;
  *position = t - q.origin;
}

void OutputSet::Capture(const HookPoint& hook, const Batch& batch,
                        const ActivationRows& rows, int derived) {
  const int64_t row_end = rows.row_begin + rows.rows;
  for (OutputArray& o : arrays_) {
    if (!(o.hook == hook) || o.derived != derived) continue;
    LOOM_CHECK_EQ(rows.cols, o.width);
    for (int64_t s = 0; s < batch.num_seqs(); ++s) {
      const int64_t b = batch.seq_start[s], e = batch.seq_start[s + 1];
      if (e <= rows.row_begin || b >= row_end) continue;
      const SeqRows q = Locate(batch, s, rows.row_begin, row_end);
      if (o.sel.ragged())
        CaptureRagged(o, q, rows);
      else if (o.sel.reduced())
        CaptureReduced(o, q, rows);
      else
        CaptureFixed(o, q, rows);
    }
  }
}

// last / first / pos: the row of each selected position, when it is in this
// block of rows (and, for a streamed row, in this chunk).
void OutputSet::CaptureFixed(OutputArray& o, const SeqRows& q,
                             const ActivationRows& rows) {
  const int64_t ds = DTypeSize(o.dtype);
  auto copy = [&](int64_t p, int64_t dst_row) {
    const int64_t t = q.origin + p;  // packed token index
    if (t < q.lo || t >= q.hi) return;
    Store(o, rows.data + (t - rows.row_begin) * rows.ld,
          &o.stage[dst_row * o.width * ds], o.width);
  };
  switch (o.sel.kind) {
    case RowSelector::Kind::kLast:
      copy(q.len - 1, q.slot);
      break;
    case RowSelector::Kind::kFirst:
      copy(0, q.slot);
      break;
    default: {  // kPos
      const int64_t n = static_cast<int64_t>(o.sel.positions.size());
      for (int64_t k = 0; k < n; ++k)
        copy(ResolvePosition(o.sel.positions[k], q.len), q.slot * n + k);
    }
  }
}

// mean / max: accumulated in double over the sequence's rows in this block,
// in token order (across the chunks of a streamed row too).
void OutputSet::CaptureReduced(OutputArray& o, const SeqRows& q,
                               const ActivationRows& rows) {
  double* acc = &o.acc[q.slot * o.width];
  const bool mean = o.sel.kind == RowSelector::Kind::kMean;
  for (int64_t t = q.lo; t < q.hi; ++t) {
    const float* r = rows.data + (t - rows.row_begin) * rows.ld;
    if (mean) {
      for (int64_t j = 0; j < o.width; ++j) acc[j] += r[j];
    } else {
      for (int64_t j = 0; j < o.width; ++j)
        acc[j] = std::max(acc[j], static_cast<double>(r[j]));
    }
  }
}

// all / span: every selected position in this block, at the slot's rows of
// the window.
void OutputSet::CaptureRagged(OutputArray& o, const SeqRows& q,
                              const ActivationRows& rows) {
  const int64_t ds = DTypeSize(o.dtype);
  SpanRange span;
  LOOM_CHECK(ResolveSpan(o.sel, q.len, &span));
  const RaggedIndex& ri = ragged_[o.ragged];
  const int64_t from = std::max(span.begin, q.lo - q.origin);
  const int64_t to = std::min(span.end, q.hi - q.origin);
  for (int64_t p = from; p < to; ++p) {
    const int64_t t = q.origin + p;
    const int64_t dst_row = ri.slot_begin[q.slot] + (p - span.begin);
    Store(o, rows.data + (t - rows.row_begin) * rows.ld,
          &o.stage[dst_row * o.width * ds], o.width);
  }
}

void OutputSet::PickRows(const HookPoint& hook, const Batch& batch,
                         int64_t row_begin, int64_t rows, DevicePicks* picks,
                         int derived) {
  const int64_t row_end = row_begin + rows;
  for (OutputArray& o : arrays_) {
    if (!(o.hook == hook) || o.derived != derived) continue;
    const int64_t ds = DTypeSize(o.dtype);
    for (int64_t s = 0; s < batch.num_seqs(); ++s) {
      const int64_t b = batch.seq_start[s], e = batch.seq_start[s + 1];
      if (e <= row_begin || b >= row_end) continue;
      const SeqRows q = Locate(batch, s, row_begin, row_end);
      auto pick = [&](int64_t p, int64_t dst_row) {
        const int64_t t = q.origin + p;
        if (t < q.lo || t >= q.hi) return;
        picks->rows.push_back(static_cast<int32_t>(t - row_begin));
        picks->dst.push_back(&o.stage[dst_row * o.width * ds]);
      };
      if (o.sel.ragged()) {
        // As CaptureRagged.
        SpanRange span;
        LOOM_CHECK(ResolveSpan(o.sel, q.len, &span));
        const RaggedIndex& ri = ragged_[o.ragged];
        const int64_t from = std::max(span.begin, q.lo - q.origin);
        const int64_t to = std::min(span.end, q.hi - q.origin);
        for (int64_t p = from; p < to; ++p)
          pick(p, ri.slot_begin[q.slot] + (p - span.begin));
      } else if (o.sel.reduced()) {
        // As CaptureReduced.
        picks->seg_begin.push_back(static_cast<int32_t>(q.lo - row_begin));
        picks->seg_end.push_back(static_cast<int32_t>(q.hi - row_begin));
        picks->seg_acc.push_back(&o.acc[q.slot * o.width]);
        picks->seg_max.push_back(o.sel.kind == RowSelector::Kind::kMax);
      } else {
        // As CaptureFixed.
        switch (o.sel.kind) {
          case RowSelector::Kind::kLast:
            pick(q.len - 1, q.slot);
            break;
          case RowSelector::Kind::kFirst:
            pick(0, q.slot);
            break;
          default: {
            const int64_t n = static_cast<int64_t>(o.sel.positions.size());
            for (int64_t k = 0; k < n; ++k) {
              const int64_t p = ResolvePosition(o.sel.positions[k], q.len);
              if (p >= 0 && p < q.len) pick(p, q.slot * n + k);
            }
          }
        }
      }
    }
  }
}

int64_t OutputSet::MaxPickedRows(int64_t max_tokens) const {
  int64_t n = 0;
  for (const OutputArray& o : arrays_)
    if (!o.sel.reduced()) n += max_tokens * o.sel.rows_per_prompt();
  return n;
}

int64_t OutputSet::MaxPickedBytes(int64_t max_tokens) const {
  int64_t n = 0;
  for (const OutputArray& o : arrays_)
    if (!o.sel.reduced())
      n += max_tokens * o.sel.rows_per_prompt() * o.width * DTypeSize(o.dtype);
  return n;
}

int64_t OutputSet::MaxSegmentValues(int64_t max_tokens) const {
  int64_t n = 0;
  for (const OutputArray& o : arrays_)
    if (o.sel.reduced()) n += max_tokens * o.width;
  return n;
}

void OutputSet::FinishWindow(const std::vector<PreparedRow>& window) {
  const int64_t W = static_cast<int64_t>(window.size());
  for (OutputArray& out : arrays_) {
    if (out.sel.ragged()) continue;
    const int64_t ds = DTypeSize(out.dtype);
    const int64_t per = out.sel.rows_per_prompt() * out.width;
    std::vector<float> row(per);
    for (int64_t s = 0; s < W; ++s) {
      if (window[s].ok() && !out.sel.reduced()) continue;  // stored by Capture
      if (!window[s].ok()) {
        // A skipped row: NaN, or -1 in an int32 array.
        std::fill(row.begin(), row.end(),
                  out.dtype == DType::kI32
                      ? -1.0f
                      : std::numeric_limits<float>::quiet_NaN());
      } else {
        const double div = out.sel.kind == RowSelector::Kind::kMean
                               ? static_cast<double>(window[s].size())
                               : 1.0;
        for (int64_t j = 0; j < out.width; ++j)
          row[j] = static_cast<float>(out.acc[s * out.width + j] / div);
      }
      Store(out, row.data(), &out.stage[s * per * ds], per);
    }
  }
}

// ---- OutputSet: commit ------------------------------------------------------

Status OutputSet::CommitArrays(int64_t window_size, int64_t window_index,
                               int64_t first_row, ManifestProgress* progress,
                               std::vector<std::string>* files) {
  if (format_ == OutputFormat::kMemory) return CommitMemory(window_size);
  RETURN_IF_ERROR(format_ == OutputFormat::kNpy
                      ? CommitNpy(window_size, progress)
                      : CommitShards(window_size, window_index, first_row,
                                     progress, files));
  // The dashboards of the rows committed with this window.
  for (size_t i = 0; i < dashboards_.size(); ++i)
    RETURN_IF_ERROR(dashboards_[i]->Write(
        PathOf(dashboard_files_[i]), progress->rows_committed + window_size));
  return Status();
}

Status OutputSet::CommitNpy(int64_t W, ManifestProgress* progress) {
  for (OutputArray& out : arrays_) {
    RETURN_IF_ERROR(out.npy->Append(out.stage.data(),
                                    static_cast<int64_t>(out.stage.size())));
    RETURN_IF_ERROR(out.npy->Commit());
    if (out.sel.ragged())
      progress->ragged_rows[out.file] = out.npy->committed_rows();
  }
  for (size_t r = 0; r < ragged_.size(); ++r) {
    RaggedIndex& ri = ragged_[r];
    // Global offsets: the data file's rows before this window + slot begins.
    int64_t base = 0;
    for (const OutputArray& out : arrays_)
      if (out.ragged == static_cast<int>(r))
        base = out.npy->committed_rows() - ri.window_rows;
    std::vector<int64_t> ends(W);
    for (int64_t s = 0; s < W; ++s) ends[s] = base + ri.slot_begin[s + 1];
    RETURN_IF_ERROR(ri.npy->AppendRows(ends.data(), W));
    RETURN_IF_ERROR(ri.npy->Commit());
  }
  return Status();
}

Status OutputSet::CommitShards(int64_t W, int64_t window_index,
                               int64_t first_row, ManifestProgress* progress,
                               std::vector<std::string>* files) {
  char shard[32];
  std::snprintf(shard, sizeof shard, ".shard-%05lld",
                static_cast<long long>(window_index));
  for (OutputArray& out : arrays_) {
    const std::string name =
        out.hook_name + "." + out.sel.file_name + shard + ".safetensors";
    SafetensorsWriter w;
    w.SetMetadata("first_row", std::to_string(first_row));
    w.SetMetadata("rows", std::to_string(W));
    std::vector<int64_t> shape = out.row_shape();
    shape.insert(shape.begin(),
                 out.ragged >= 0 ? ragged_[out.ragged].window_rows : W);
    RETURN_IF_ERROR(w.Add("activations", out.dtype, Shape(shape),
                          out.stage.data(),
                          static_cast<int64_t>(out.stage.size())));
    if (out.ragged >= 0) {
      const std::vector<int64_t>& offs = ragged_[out.ragged].slot_begin;
      RETURN_IF_ERROR(w.Add("offsets", DType::kI64, Shape({W + 1}), offs.data(),
                            (W + 1) * 8));
    }
    RETURN_IF_ERROR(w.Write(PathOf(name)));
    files->push_back(name);
  }
  ++progress->shards;
  return Status();
}

// ---- OutputSet: in memory (kMemory) -----------------------------------------

void OutputSet::ReserveMemory(const std::vector<PreparedRow>& rows) {
  const int64_t n = static_cast<int64_t>(rows.size());
  for (OutputArray& out : arrays_) {
    const int64_t ds = DTypeSize(out.dtype);
    int64_t data_rows = n * out.sel.rows_per_prompt();
    if (out.sel.ragged()) {
      data_rows = 0;
      for (const PreparedRow& row : rows) {
        if (!row.ok()) continue;
        SpanRange r;
        ResolveSpan(out.sel, row.size(), &r);  // checked by RowPreparer
        data_rows += r.end - r.begin;
      }
    }
    out.memory.reserve(static_cast<size_t>(data_rows * out.width * ds));
  }
  for (RaggedIndex& ri : ragged_)
    ri.memory_offsets.reserve(static_cast<size_t>(n + 1));
}

Status OutputSet::CommitMemory(int64_t W) {
  for (OutputArray& out : arrays_) {
    out.memory.insert(out.memory.end(), out.stage.begin(), out.stage.end());
    out.memory_rows += out.ragged >= 0 ? ragged_[out.ragged].window_rows : W;
  }
  for (RaggedIndex& ri : ragged_) {
    if (ri.memory_offsets.empty()) ri.memory_offsets.push_back(0);
    const int64_t base = ri.memory_offsets.back();
    for (int64_t s = 0; s < W; ++s)
      ri.memory_offsets.push_back(base + ri.slot_begin[s + 1]);
  }
  return Status();
}

std::vector<OutputSet::MemoryArray> OutputSet::TakeMemoryArrays() {
  std::vector<MemoryArray> taken;
  for (OutputArray& out : arrays_) {
    MemoryArray a;
    a.hook = out.hook_name;
    a.selector = out.sel.spec;
    a.selector_file = out.sel.file_name;
    a.shape = out.row_shape();
    a.shape.insert(a.shape.begin(), out.memory_rows);
    a.dtype = out.dtype;
    a.data = std::move(out.memory);
    out.memory = {};
    out.memory_rows = 0;
    taken.push_back(std::move(a));
  }
  return taken;
}

std::vector<OutputSet::MemoryOffsets> OutputSet::TakeMemoryOffsets() {
  std::vector<MemoryOffsets> taken;
  for (size_t r = 0; r < ragged_.size(); ++r) {
    MemoryOffsets m;
    for (const OutputArray& out : arrays_)
      if (out.ragged == static_cast<int>(r)) {
        m.selector = out.sel.spec;
        m.selector_file = out.sel.file_name;
      }
    m.offsets = std::move(ragged_[r].memory_offsets);
    if (m.offsets.empty()) m.offsets.push_back(0);  // no rows committed
    ragged_[r].memory_offsets = {};
    taken.push_back(std::move(m));
  }
  return taken;
}

int64_t OutputSet::PatternRowWidth() const {
  int64_t w = 0;
  for (const OutputArray& o : arrays_)
    if (o.heads > 0) w = std::max(w, o.width);
  return w;
}

int64_t OutputSet::IntegerHookWidth() const {
  int64_t w = 0;
  for (const OutputArray& o : arrays_)
    if (o.derived < 0 && IsIntegerSite(o.hook.site)) w = std::max(w, o.width);
  return w;
}

// ---- ExtractSink ------------------------------------------------------------

Status ExtractSink::EnableDevices(const std::vector<Backend*>& devices) {
  devices_ = devices;
  if (devices_.empty()) return Status();
  Backend& be = *devices_.front();
  const int64_t T = max_tokens_;
  const int64_t rows = outputs_->MaxPickedRows(T);
  const int64_t segments = outputs_->MaxSegmentValues(T);
  ASSIGN_OR_RETURN(
      pinned_rows_,
      be.Allocate(std::max<int64_t>(outputs_->MaxPickedBytes(T), 64),
                  MemoryKind::kPinnedHost));
  // Row indices, then each reduced array's segment bounds (<= 2 T each).
  ASSIGN_OR_RETURN(pinned_index_, be.Allocate((rows + 2 * segments + 16) * 4,
                                              MemoryKind::kPinnedHost));
  ASSIGN_OR_RETURN(pinned_sums_,
                   be.Allocate(std::max<int64_t>(segments * 8, 64),
                               MemoryKind::kPinnedHost));
  const size_t n = static_cast<size_t>(rows + segments);
  picks_.rows.reserve(n);
  picks_.dst.reserve(n);
  picks_.seg_begin.reserve(n);
  picks_.seg_end.reserve(n);
  picks_.seg_acc.reserve(n);
  picks_.seg_max.reserve(n);
  pending_.reserve(n);
  pending_segments_.reserve(n);
  return Status();
}

Status ExtractSink::OnDeviceActivation(const HookPoint& hook,
                                       const Batch& batch, int64_t row_begin,
                                       const ActivationView& view) {
  Backend* be = nullptr;
  for (Backend* b : devices_)
    if (b->device() == view.device) be = b;
  if (be == nullptr || view.dtype != DType::kF32)
    return InternalError("extract: hook " + HookName(hook) +
                         " was delivered in the memory of a device the sink "
                         "was not given, or as " +
                         std::string(DTypeName(view.dtype)));
  picks_.Clear();
  outputs_->PickRows(hook, batch, row_begin, view.rows, &picks_);
  const int64_t n = static_cast<int64_t>(picks_.rows.size());
  const int64_t g = static_cast<int64_t>(picks_.seg_begin.size());
  const int64_t ds = DTypeSize(outputs_->dtype());
  const int64_t row_bytes = view.cols * ds;
  int32_t* index = static_cast<int32_t*>(pinned_index_.data());
  const int64_t index_cap = pinned_index_.bytes / 4;
  if (bytes_used_ + n * row_bytes > pinned_rows_.bytes ||
      index_used_ + n + 2 * g > index_cap ||
      (sums_used_ + g * view.cols) * 8 > pinned_sums_.bytes)
    return InternalError("extract: the device capture staging of hook " +
                         HookName(hook) + " is full (" + std::to_string(n) +
                         " rows, " + std::to_string(g) +
                         " segments); it was sized for " +
                         std::to_string(max_tokens_) + " tokens per batch");
  if (n > 0) {
    int32_t* idx = index + index_used_;
    std::copy(picks_.rows.begin(), picks_.rows.end(), idx);
    uint8_t* stage = static_cast<uint8_t*>(pinned_rows_.data()) + bytes_used_;
    be->GatherRowsConvert(static_cast<const float*>(view.data), view.ld, idx, n,
                          view.cols, stage, outputs_->dtype());
    for (int64_t i = 0; i < n; ++i)
      pending_.push_back({picks_.dst[i], stage + i * row_bytes, row_bytes});
    index_used_ += n;
    bytes_used_ += n * row_bytes;
  }
  // Sums and maxima in double: one SegmentReduce per kind.
  for (const bool max : {false, true}) {
    int64_t k = 0;
    int32_t* begin = index + index_used_;
    for (int64_t i = 0; i < g; ++i)
      if (static_cast<bool>(picks_.seg_max[i]) == max)
        begin[k++] = picks_.seg_begin[i];
    if (k == 0) continue;
    int32_t* end = begin + k;
    double* sums = static_cast<double*>(pinned_sums_.data()) + sums_used_;
    k = 0;
    for (int64_t i = 0; i < g; ++i) {
      if (static_cast<bool>(picks_.seg_max[i]) != max) continue;
      end[k] = picks_.seg_end[i];
      pending_segments_.push_back(
          {picks_.seg_acc[i], sums + k * view.cols, view.cols, max});
      ++k;
    }
    be->SegmentReduce(static_cast<const float*>(view.data), view.ld, begin, end,
                      k, view.cols, max, /*accumulate=*/false, sums);
    index_used_ += 2 * k;
    sums_used_ += k * view.cols;
  }
  return Status();
}

void ExtractSink::Flush() {
  for (const Pending& p : pending_)
    std::memcpy(p.dst, p.src, static_cast<size_t>(p.bytes));
  for (const PendingSegment& s : pending_segments_)
    for (int64_t j = 0; j < s.width; ++j)
      s.acc[j] = s.max ? std::max(s.acc[j], s.sums[j]) : s.acc[j] + s.sums[j];
  pending_.clear();
  pending_segments_.clear();
  bytes_used_ = index_used_ = sums_used_ = 0;
}

Status ExtractSink::OnActivation(const HookPoint& hook, const Batch& batch,
                                 int64_t /*seq*/, int64_t row_begin,
                                 const ActivationView& view) {
  if (derived_ != nullptr && derived_->Reads(hook) &&
      (view.device.kind != DeviceKind::kCpu || !view.host_f32()))
    return UnimplementedError(
        "extract: --sae / --lens read " + HookName(hook) +
        ", which arrives in device memory or not as f32; SAEs and lenses run "
        "on host f32 rows only so far (run the layer "
        "that delivers it on the CPU)");
  if (view.device.kind != DeviceKind::kCpu) {
    if (view.dtype == DType::kF32 && hook.site != HookSite::kPattern)
      return OnDeviceActivation(hook, batch, row_begin, view);
    if (view.dtype == DType::kI32 && view.ld == view.cols &&
        view.rows * view.cols <= static_cast<int64_t>(device_ints_.size())) {
      // Expert ids: a few integers per token, checked and widened on the
      // host.
      for (Backend* b : devices_)
        if (b->device() == view.device) {
          RETURN_IF_ERROR(b->Copy(device_ints_.data(), DeviceRef{}, view.data,
                                  view.device, view.rows * view.cols * 4));
          ActivationView host = view;
          host.data = device_ints_.data();
          host.device = DeviceRef{};
          return OnActivation(hook, batch, -1, row_begin, host);
        }
    }
    return UnimplementedError(
        "extract: hook " + HookName(hook) +
        (hook.site == HookSite::kPattern
             ? " (attention probabilities) is captured on the host only; run "
               "the layers that deliver it on the CPU"
             : " arrived in device memory as " +
                   std::string(DTypeName(view.dtype)) +
                   "; only f32 device views are selected on the device"));
  }
  if (view.dtype == DType::kI32 && view.device.kind == DeviceKind::kCpu) {
    const int64_t exact = outputs_->dtype() == DType::kBF16  ? 256
                          : outputs_->dtype() == DType::kF16 ? 2048
                                                             : (1 << 24);
    const int32_t* v = static_cast<const int32_t*>(view.data);
    if (view.rows * view.cols > static_cast<int64_t>(ints_.size()))
      return InternalError(
          "extract: hook " + HookName(hook) + " delivered " +
          std::to_string(view.rows) + " x " + std::to_string(view.cols) +
          " integers; the sink was sized for " + std::to_string(ints_.size()));
    for (int64_t r = 0; r < view.rows; ++r)
      for (int64_t j = 0; j < view.cols; ++j) {
        const int32_t x = v[r * view.ld + j];
        if (x < -exact || x > exact)
          return InvalidArgumentError(
              "extract: hook " + HookName(hook) + " holds the integer " +
              std::to_string(x) + ", which " +
              std::string(DTypeName(outputs_->dtype())) +
              " does not represent exactly (|x| <= " + std::to_string(exact) +
              "); use --dtype f32");
        ints_[static_cast<size_t>(r * view.cols + j)] = static_cast<float>(x);
      }
    outputs_->Capture(hook, batch,
                      ActivationRows{.data = ints_.data(),
                                     .row_begin = row_begin,
                                     .rows = view.rows,
                                     .cols = view.cols,
                                     .ld = view.cols});
    return Status();
  }
  if (hook.site == HookSite::kPattern && view.host_f32())
    return OnPattern(hook, batch, row_begin, view);
  if (!view.host_f32())
    return UnimplementedError("extract: hook " + HookName(hook) +
                              " was delivered in device memory or as " +
                              std::string(DTypeName(view.dtype)) +
                              "; extraction reads host f32 views only");
  const ActivationRows rows{.data = view.f32(),
                            .row_begin = row_begin,
                            .rows = view.rows,
                            .cols = view.cols,
                            .ld = view.ld};
  outputs_->Capture(hook, batch, rows);
  if (derived_ != nullptr && derived_->Reads(hook))
    return derived_->OnRows(hook, batch, rows, outputs_);
  return Status();
}

Status ExtractSink::OnPattern(const HookPoint& hook, const Batch& batch,
                              int64_t row_begin, const ActivationView& view) {
  const int64_t len = view.cols;  // L: queries and keys of the sequence
  const int64_t heads = len > 0 ? view.rows / len : 0;
  const int64_t keys =
      heads > 0 ? static_cast<int64_t>(pattern_row_.size()) / heads : 0;
  if (heads * len != view.rows || len > keys)
    return InternalError("extract: hook " + HookName(hook) + " delivered " +
                         std::to_string(view.rows) + " x " +
                         std::to_string(view.cols) +
                         " probabilities; the sink holds rows of " +
                         std::to_string(pattern_row_.size()) + " values");
  // pattern_row_: [heads, keys]; keys past the sequence stay 0.
  std::fill(pattern_row_.begin(), pattern_row_.end(), 0.0f);
  const float* p = view.f32();  // [heads, L, L], ld apart
  for (int64_t t = 0; t < len; ++t) {
    for (int64_t h = 0; h < heads; ++h)
      std::copy_n(p + (h * len + t) * view.ld, len,
                  pattern_row_.data() + h * keys);
    outputs_->Capture(hook, batch,
                      ActivationRows{.data = pattern_row_.data(),
                                     .row_begin = row_begin + t,
                                     .rows = 1,
                                     .cols = heads * keys,
                                     .ld = heads * keys});
  }
  return Status();
}

// ---- RowsLog ----------------------------------------------------------------

Status RowsLog::Create() { return WriteFileDurably(path_, ""); }

namespace {

// Why `line` (one line of rows.jsonl, without its newline) is not the record
// of row `row` as RowsLog::Records writes it; "" if it is. `*skipped` is its
// status. `*error_at`: the offset in the line of a JSON syntax error.
std::string CheckRecord(std::string_view line, int64_t row, bool* skipped,
                        int64_t* error_at) {
  const Json r = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (r.is_discarded()) {
    const JsonParseError e = LocateJsonError(line);
    *error_at = e.offset;
    return "not JSON: " + e.what;
  }
  if (!r.is_object()) return "not a JSON object";
  for (const auto& [key, value] : r.items())
    if (key != "row" && key != "id" && key != "tokens" && key != "status" &&
        key != "reason")
      return "unexpected field '" + key + "'";
  const auto field = [&](const char* name) -> const Json* {
    const auto it = r.find(name);
    return it == r.end() ? nullptr : &*it;
  };
  const Json* at = field("row");
  if (!at || !at->is_number_integer())
    return "field row is missing or not an integer";
  if (at->get<int64_t>() != row)
    return "expected row " + std::to_string(row) + ", found " + at->dump();
  const Json* id = field("id");
  if (!id || id->is_null()) return "field id is missing";
  const Json* tokens = field("tokens");
  if (!tokens || !tokens->is_number_integer() || tokens->get<int64_t>() < 0)
    return "field tokens is missing or not a count";
  const Json* status = field("status");
  const Json* reason = field("reason");
  if (status && *status == "ok" && !reason) {
    *skipped = false;
    return "";
  }
  if (status && *status == "skipped" && reason && reason->is_string()) {
    *skipped = true;
    return "";
  }
  return "expected status \"ok\" without a reason or \"skipped\" with one";
}

}  // namespace

StatusOr<uint32_t> RowsLog::CheckCommitted(
    const ManifestProgress& p,
    const std::function<int64_t(int64_t)>& input_row) const {
  const int64_t committed = p.rows_file_bytes;
  if (StatusOr<int64_t> size = FileSize(path_); !size.ok())
    return DataLossError("--resume: " + size.status().message() +
                         "; the manifest commits " + std::to_string(committed) +
                         " bytes of it");
  std::ifstream in(path_, std::ios::binary);
  if (!in) return IoError("--resume: " + path_ + ": cannot open");
  uint32_t crc = 0;
  int64_t offset = 0, lines = 0, ok = 0, skipped = 0;
  // "--resume: <path>: byte offset <at> (line <the current line>): "
  const auto where = [&](int64_t at) {
    return "--resume: " + path_ + ": byte offset " + std::to_string(at) +
           " (line " + std::to_string(lines + 1) + "): ";
  };
  std::string line;
  while (offset < committed && std::getline(in, line)) {
    const bool newline = !in.eof();  // else the file ends inside this line
    const int64_t end = offset + static_cast<int64_t>(line.size()) + newline;
    if (end > committed)
      return DataLossError(
          where(offset) + "the line runs past the committed end at byte " +
          std::to_string(committed) + " (the manifest commits " +
          std::to_string(p.rows_committed) + " rows)");
    if (!newline) {
      if (end == committed)
        return DataLossError(where(offset) +
                             "the committed bytes end inside this line (no "
                             "newline)");
      offset = end;
      break;
    }
    bool is_skipped = false;
    int64_t error_at = -1;
    const std::string why = CheckRecord(
        line, input_row ? input_row(lines) : lines, &is_skipped, &error_at);
    if (!why.empty())
      return DataLossError(where(error_at < 0 ? offset : offset + error_at) +
                           why);
    crc = Crc32(Crc32(crc, line), "\n");
    offset = end;
    ++lines;
    (is_skipped ? skipped : ok) += 1;
  }
  if (in.bad()) return IoError("--resume: " + path_ + ": read error");
  if (offset < committed)
    return DataLossError(
        "--resume: " + path_ + " has " + std::to_string(offset) +
        " bytes, the manifest commits " + std::to_string(committed) +
        " (truncated: it ends at byte offset " + std::to_string(offset) +
        ", in line " + std::to_string(lines + 1) + ")");
  const std::string range =
      "committed bytes [0, " + std::to_string(committed) + ")";
  if (lines != p.rows_committed)
    return DataLossError("--resume: " + path_ + ": the " + range + " hold " +
                         std::to_string(lines) +
                         " rows, the manifest commits " +
                         std::to_string(p.rows_committed));
  if (ok != p.rows_ok || skipped != p.rows_skipped)
    return DataLossError(
        "--resume: " + path_ + ": the " + range + " hold " +
        std::to_string(ok) + " ok and " + std::to_string(skipped) +
        " skipped rows, the manifest counts " + std::to_string(p.rows_ok) +
        " and " + std::to_string(p.rows_skipped));
  if (p.rows_file_crc32 && *p.rows_file_crc32 != crc) {
    char text[64];
    std::snprintf(text, sizeof text,
                  "crc32 0x%08x, the manifest records 0x%08x", crc,
                  *p.rows_file_crc32);
    return DataLossError("--resume: " + path_ + ": " + range + " have " + text +
                         " (changed after they were committed)");
  }
  return crc;
}

Status RowsLog::Reopen(int64_t committed_bytes) {
  return TruncateFileDurably(path_, committed_bytes);
}

std::string RowsLog::Records(const std::vector<PreparedRow>& window,
                             int64_t* rows_ok, int64_t* rows_skipped) {
  std::string text;
  for (const PreparedRow& p : window) {
    Json r = {{"row", p.index},
              {"id", p.id},
              {"tokens", p.size()},
              {"status", p.ok() ? "ok" : "skipped"}};
    if (!p.ok()) r["reason"] = p.reason;
    text += r.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
    (p.ok() ? *rows_ok : *rows_skipped) += 1;
  }
  return text;
}

StatusOr<int64_t> RowsLog::Append(const std::string& records) {
  RETURN_IF_ERROR(AppendFileDurably(path_, records));
  return static_cast<int64_t>(records.size());
}

uint32_t RowsLog::Crc32(uint32_t crc, std::string_view bytes) {
  return static_cast<uint32_t>(
      crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

StatusOr<Json> RowsLog::ReadAll() const {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path_));
  Json rows = Json::array();
  // Lines as std::getline splits them: no empty line after the last '\n'.
  size_t begin = 0;
  for (int64_t n = 1; begin < text.size(); ++n) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    Json r = Json::parse(text.begin() + static_cast<std::ptrdiff_t>(begin),
                         text.begin() + static_cast<std::ptrdiff_t>(end),
                         nullptr, /*allow_exceptions=*/false);
    if (r.is_discarded())
      return DataLossError(path_ + ": line " + std::to_string(n) +
                           " is not JSON");
    rows.push_back(std::move(r));
    begin = end + 1;
  }
  return rows;
}

}  // namespace loom
