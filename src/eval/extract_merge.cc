#include "src/eval/extract_merge.h"

#include <fcntl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string_view>

#include "src/base/read_file.h"
#include "src/eval/extract.h"
#include "src/eval/extract_manifest.h"
#include "src/eval/extract_outputs.h"
#include "src/eval/shard.h"
#include "src/io/file_util.h"
#include "src/io/npy.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// Bytes copied per read while moving array rows.
constexpr int64_t kCopyChunk = int64_t{64} << 20;

// One shard's output, read and checked.
struct ShardOut {
  std::string dir;
  std::optional<FileLock> lock;  // held while merging: nobody writes it
  std::optional<Manifest> manifest;
  ShardSpec shard;
  ManifestProgress progress;
  std::vector<std::string> files;
  std::string name() const { return dir + " (shard " + shard.ToString() + ")"; }
};

std::string Short(const Json& j) {
  std::string text = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

StatusOr<ShardOut> LoadShard(const std::string& dir) {
  ShardOut s;
  s.dir = dir;
  const std::string path = dir + "/manifest.json";
  std::error_code ec;
  if (!fs::exists(path, ec))
    return NotFoundError(dir +
                         " has no manifest.json (not an output of loom "
                         "extract)");
  StatusOr<FileLock> lock = LockOutDir(dir);
  if (!lock.ok())
    return lock.status().WithContext("shard " + dir +
                                     " is still being written");
  s.lock.emplace(std::move(lock).value());
  ASSIGN_OR_RETURN(s.manifest, Manifest::Load(path));
  const Manifest& m = *s.manifest;
  ASSIGN_OR_RETURN(const Json* settings, m.GetObject({"settings"}));
  std::string spec = "0/1";
  if (settings->contains("shard")) {
    ASSIGN_OR_RETURN(spec, m.GetString({"settings", "shard"}));
  }
  StatusOr<ShardSpec> shard = ParseShardSpec(spec);
  if (!shard.ok())
    return DataLossError(path +
                         ": field settings.shard: " + shard.status().message());
  s.shard = *shard;
  ASSIGN_OR_RETURN(bool complete, m.GetBool({"complete"}));
  ASSIGN_OR_RETURN(const Json* progress, m.GetObject({"progress"}));
  std::vector<std::string> ragged;
  if (const auto it = progress->find("ragged_rows");
      it != progress->end() && it->is_object())
    for (const auto& [file, rows] : it->items()) ragged.push_back(file);
  ASSIGN_OR_RETURN(s.progress, m.ReadProgress(ragged));
  if (!complete)
    return FailedPreconditionError(
        s.name() + " is not complete (" +
        std::to_string(s.progress.rows_committed) +
        " rows committed); finish it with loom extract --resume and the same "
        "options, then merge");
  ASSIGN_OR_RETURN(s.files, m.GetStrings({"files"}));
  ASSIGN_OR_RETURN(int64_t row_count, m.GetInt({"row_count"}));
  const auto rows = m.doc().find("rows");
  if (rows == m.doc().end() || !rows->is_array() ||
      static_cast<int64_t>(rows->size()) != s.progress.rows_committed ||
      row_count != s.progress.rows_committed)
    return DataLossError(path + ": fields rows / row_count do not hold the " +
                         std::to_string(s.progress.rows_committed) +
                         " committed rows");
  return s;
}

// Both shards come from one job: every field but settings.shard (and the
// progress, files and per-row records) is the same.
Status CheckSameJob(const ShardOut& a, const ShardOut& b) {
  const Json& x = a.manifest->doc();
  const Json& y = b.manifest->doc();
  const auto differ = [&](const std::string& what, const Json& u,
                          const Json& v) {
    return FailedPreconditionError(
        a.name() + " and " + b.name() + " are not shards of one job: " + what +
        " is " + Short(u) + " in " + a.dir + ", " + Short(v) + " in " + b.dir +
        " (merge only the shards of one loom extract job)");
  };
  const Json& sx = x["settings"];
  const Json& sy = y["settings"];
  std::set<std::string> keys;
  for (const auto& [k, v] : sx.items()) keys.insert(k);
  for (const auto& [k, v] : sy.items()) keys.insert(k);
  for (const std::string& k : keys) {
    if (k == "shard") continue;
    const Json u = sx.value(k, Json()), v = sy.value(k, Json());
    if (u != v) return differ("setting '" + k + "'", u, v);
  }
  for (const char* key : {"input", "tokenizer", "arrays", "format", "version"})
    if (x.value(key, Json()) != y.value(key, Json()))
      return differ(key, x.value(key, Json()), y.value(key, Json()));
  return Status();
}

// The shards, one for each index 0..N-1, in index order.
StatusOr<std::vector<ShardOut>> LoadShards(
    const std::vector<std::string>& dirs) {
  if (dirs.empty()) return InvalidArgumentError("no shard directories given");
  std::vector<ShardOut> shards;
  for (size_t i = 0; i < dirs.size(); ++i)
    for (size_t j = 0; j < i; ++j) {
      std::error_code ec;
      if (fs::equivalent(dirs[i], dirs[j], ec))
        return InvalidArgumentError("shard directory " + dirs[i] +
                                    " is given twice");
    }
  for (const std::string& d : dirs) {
    ASSIGN_OR_RETURN(ShardOut s, LoadShard(d));
    shards.push_back(std::move(s));
  }
  const int64_t n = shards.front().shard.count;
  std::map<int64_t, const ShardOut*> by_index;
  for (const ShardOut& s : shards) {
    if (s.shard.count != n)
      return FailedPreconditionError(
          shards.front().name() + " and " + s.name() +
          " split the input differently (" + std::to_string(n) + " and " +
          std::to_string(s.shard.count) + " shards)");
    const auto [it, fresh] = by_index.emplace(s.shard.index, &s);
    if (!fresh)
      return InvalidArgumentError(it->second->dir + " and " + s.dir +
                                  " are both shard " + s.shard.ToString());
    RETURN_IF_ERROR(CheckSameJob(shards.front(), s));
  }
  for (int64_t i = 0; i < n; ++i)
    if (by_index.count(i) == 0) {
      std::string given;
      for (const ShardOut& s : shards)
        given += (given.empty() ? "" : ", ") + s.name();
      return InvalidArgumentError("shard " + ShardSpec{i, n}.ToString() +
                                  " is missing (given: " + given + "); all " +
                                  std::to_string(n) +
                                  " shards of the job are needed");
    }
  std::sort(shards.begin(), shards.end(),
            [](const ShardOut& a, const ShardOut& b) {
              return a.shard.index < b.shard.index;
            });
  return shards;
}

// The windows of the whole input: window w holds rows [w C, w C + rows(w)).
struct Windows {
  int64_t C = 0;      // commit_every
  int64_t total = 0;  // input rows
  int64_t count = 0;  // windows
  int64_t N = 1;      // shards
  int64_t rows(int64_t w) const { return std::min(C, total - w * C); }
  int64_t shard(int64_t w) const { return w % N; }
  // First row of window w inside its shard's output.
  int64_t local_begin(int64_t w) const { return (w / N) * C; }
};

StatusOr<Windows> CheckWindows(const std::vector<ShardOut>& shards) {
  Windows win;
  ASSIGN_OR_RETURN(
      win.C, shards.front().manifest->GetInt({"settings", "commit_every"}));
  if (win.C <= 0)
    return DataLossError(shards.front().dir +
                         "/manifest.json: settings.commit_every is " +
                         std::to_string(win.C));
  win.N = static_cast<int64_t>(shards.size());
  int64_t read_to = 0;
  for (const ShardOut& s : shards) {
    win.total += s.progress.rows_committed;
    read_to = std::max(read_to, s.progress.input_rows);
  }
  win.count = (win.total + win.C - 1) / win.C;
  std::vector<int64_t> expect(shards.size(), 0);
  for (int64_t w = 0; w < win.count; ++w) expect[win.shard(w)] += win.rows(w);
  for (size_t i = 0; i < shards.size(); ++i)
    if (expect[i] != shards[i].progress.rows_committed)
      return DataLossError(
          shards[i].name() + " holds " +
          std::to_string(shards[i].progress.rows_committed) +
          " rows; the shards hold " + std::to_string(win.total) +
          " in all, of which windows of " + std::to_string(win.C) +
          " rows give it " + std::to_string(expect[i]) +
          " (its manifest does not match the other shards')");
  if (read_to != win.total)
    return DataLossError("the shards hold " + std::to_string(win.total) +
                         " rows, but their manifests read " +
                         std::to_string(read_to) + " input rows");
  return win;
}

// An open .npy of a shard: header and descriptor.
struct NpyIn {
  NpyHeader header;
  io_internal::UniqueFd fd;
  std::string path;
  int64_t row_bytes = 0;
};

StatusOr<NpyIn> OpenNpy(const std::string& path, int64_t rows) {
  NpyIn in;
  in.path = path;
  ASSIGN_OR_RETURN(in.header, ReadNpyHeader(path));
  if (in.header.shape.empty() || in.header.shape[0] != rows)
    return DataLossError(path + ": holds " +
                         (in.header.shape.empty()
                              ? std::string("a scalar")
                              : std::to_string(in.header.shape[0]) + " rows") +
                         ", its manifest commits " + std::to_string(rows));
  in.row_bytes = DTypeSize(in.header.dtype);
  for (size_t d = 1; d < in.header.shape.size(); ++d)
    in.row_bytes *= in.header.shape[d];
  ASSIGN_OR_RETURN(in.fd, io_internal::OpenFile(path, O_RDONLY));
  return in;
}

// Appends rows [begin, begin + n) of `in` to `out`, a chunk at a time.
Status CopyRows(const NpyIn& in, int64_t begin, int64_t n, NpyWriter& out,
                std::vector<char>& buf, int64_t* copied) {
  const int64_t rows_per_chunk =
      std::max<int64_t>(1, kCopyChunk / in.row_bytes);
  for (int64_t r = 0; r < n;) {
    const int64_t m = std::min(rows_per_chunk, n - r);
    const int64_t bytes = m * in.row_bytes;
    if (static_cast<int64_t>(buf.size()) < bytes)
      buf.resize(static_cast<size_t>(bytes));
    RETURN_IF_ERROR(io_internal::PreadFully(
        in.fd.get(), in.path, buf.data(), bytes,
        in.header.data_offset + (begin + r) * in.row_bytes));
    RETURN_IF_ERROR(out.Append(buf.data(), bytes));
    *copied += bytes;
    r += m;
  }
  return Status();
}

// Every .npy array (and ragged offsets) of the job, windows in input order.
Status MergeNpy(const std::vector<ShardOut>& shards, const Windows& win,
                const std::string& out_dir, ManifestProgress* progress,
                int64_t* copied) {
  const Json& arrays = shards.front().manifest->doc()["arrays"];
  std::vector<char> buf;
  std::set<std::string> offsets_done;
  for (const Json& a : arrays) {
    const std::string file = a.value("file", "");
    const std::string offsets_file = a.value("offsets_file", "");
    if (file.empty())
      return DataLossError(shards.front().dir +
                           "/manifest.json: an array has no file");
    std::vector<NpyIn> data, offs_in;
    std::vector<std::vector<int64_t>> offsets;  // [shards][rows + 1]
    for (const ShardOut& s : shards) {
      const int64_t rows = s.progress.rows_committed;
      if (offsets_file.empty()) {
        ASSIGN_OR_RETURN(NpyIn in, OpenNpy(s.dir + "/" + file, rows));
        data.push_back(std::move(in));
        continue;
      }
      ASSIGN_OR_RETURN(NpyArray o, ReadNpy(s.dir + "/" + offsets_file));
      if (o.header.dtype != DType::kI64 ||
          o.header.shape != std::vector<int64_t>{rows + 1})
        return DataLossError(s.dir + "/" + offsets_file + ": expected int64 [" +
                             std::to_string(rows + 1) + "] offsets");
      std::vector<int64_t> v(static_cast<size_t>(rows + 1));
      std::copy_n(reinterpret_cast<const int64_t*>(o.data.data()), rows + 1,
                  v.data());
      const auto it = s.progress.ragged_rows.find(file);
      const int64_t data_rows =
          it == s.progress.ragged_rows.end() ? -1 : it->second;
      if (v.front() != 0 || v.back() != data_rows ||
          !std::is_sorted(v.begin(), v.end()))
        return DataLossError(
            s.dir + "/" + offsets_file + ": offsets do not run from 0 to the " +
            std::to_string(data_rows) + " committed rows of " + file);
      ASSIGN_OR_RETURN(NpyIn in, OpenNpy(s.dir + "/" + file, data_rows));
      data.push_back(std::move(in));
      offsets.push_back(std::move(v));
    }
    const NpyHeader& h = data.front().header;
    const std::vector<int64_t> row_shape(h.shape.begin() + 1, h.shape.end());
    ASSIGN_OR_RETURN(
        std::unique_ptr<NpyWriter> out,
        NpyWriter::Create(out_dir + "/" + file, h.dtype, row_shape));
    std::unique_ptr<NpyWriter> out_offsets;
    const bool write_offsets =
        !offsets_file.empty() && offsets_done.insert(offsets_file).second;
    if (write_offsets) {
      ASSIGN_OR_RETURN(
          out_offsets,
          NpyWriter::Create(out_dir + "/" + offsets_file, DType::kI64, {}));
      const int64_t zero = 0;
      RETURN_IF_ERROR(out_offsets->AppendRows(&zero, 1));
    }
    for (int64_t w = 0; w < win.count; ++w) {
      const int64_t s = win.shard(w), b = win.local_begin(w), n = win.rows(w);
      if (offsets_file.empty()) {
        RETURN_IF_ERROR(CopyRows(data[s], b, n, *out, buf, copied));
        continue;
      }
      const std::vector<int64_t>& o = offsets[s];
      const int64_t base = out->rows() - o[b];  // [b + n + 1] renumbered
      RETURN_IF_ERROR(
          CopyRows(data[s], o[b], o[b + n] - o[b], *out, buf, copied));
      if (write_offsets) {
        std::vector<int64_t> ends(o.begin() + b + 1, o.begin() + b + n + 1);
        for (int64_t& e : ends) e += base;
        RETURN_IF_ERROR(out_offsets->AppendRows(ends.data(), n));
      }
    }
    RETURN_IF_ERROR(out->Commit());
    if (!offsets_file.empty()) progress->ragged_rows[file] = out->rows();
    if (out_offsets) RETURN_IF_ERROR(out_offsets->Commit());
  }
  return Status();
}

// The window a shard file "<...>.shard-NNNNN.safetensors" holds, or -1.
int64_t WindowOfShardFile(const std::string& name) {
  const size_t at = name.rfind(".shard-");
  if (at == std::string::npos) return -1;
  char* end = nullptr;
  const long long w = std::strtoll(name.c_str() + at + 7, &end, 10);
  return std::string_view(end) == ".safetensors" ? w : -1;
}

// Safetensors: every shard file is already named and numbered by its
// window; copied in window order.
Status MergeSafetensors(const std::vector<ShardOut>& shards, const Windows& win,
                        const std::string& out_dir,
                        std::vector<std::string>* files, int64_t* copied) {
  const int64_t A =
      static_cast<int64_t>(shards.front().manifest->doc()["arrays"].size());
  for (const ShardOut& s : shards) {
    const int64_t windows = (s.progress.rows_committed + win.C - 1) / win.C;
    if (static_cast<int64_t>(s.files.size()) != windows * A)
      return DataLossError(
          s.name() + " lists " + std::to_string(s.files.size()) + " files; " +
          std::to_string(windows) + " windows of " + std::to_string(A) +
          " arrays make " + std::to_string(windows * A));
  }
  for (int64_t w = 0; w < win.count; ++w) {
    const ShardOut& s = shards[static_cast<size_t>(win.shard(w))];
    const int64_t k = w / win.N;
    for (int64_t a = 0; a < A; ++a) {
      const std::string& name = s.files[static_cast<size_t>(k * A + a)];
      if (WindowOfShardFile(name) != w)
        return DataLossError(s.name() + ": file " + name +
                             " is listed as its window " + std::to_string(w) +
                             " of the input");
      RETURN_IF_ERROR(
          CopyFileDurably(s.dir + "/" + name, out_dir + "/" + name));
      ASSIGN_OR_RETURN(int64_t bytes, FileSize(out_dir + "/" + name));
      *copied += bytes;
      files->push_back(name);
    }
  }
  return Status();
}

// rows.jsonl of the whole input: each shard's committed lines (checked
// against its crc32), windows in input order.
StatusOr<std::string> MergeRowsLog(const std::vector<ShardOut>& shards,
                                   const Windows& win) {
  std::vector<std::vector<std::string_view>> lines(shards.size());
  std::vector<std::string> texts(shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardOut& s = shards[i];
    const std::string path = s.dir + "/rows.jsonl";
    ASSIGN_OR_RETURN(texts[i], ReadFileToString(path));
    const int64_t committed = s.progress.rows_file_bytes;
    if (static_cast<int64_t>(texts[i].size()) < committed)
      return DataLossError(path + " has " + std::to_string(texts[i].size()) +
                           " bytes, its manifest commits " +
                           std::to_string(committed));
    texts[i].resize(static_cast<size_t>(committed));
    if (s.progress.rows_file_crc32 &&
        RowsLog::Crc32(0, texts[i]) != *s.progress.rows_file_crc32)
      return DataLossError(path +
                           ": the committed bytes do not have the crc32 its "
                           "manifest records (changed after they were "
                           "committed)");
    std::string_view rest(texts[i]);
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      if (nl == std::string_view::npos)
        return DataLossError(path + ": the committed bytes end inside a line");
      lines[i].push_back(rest.substr(0, nl + 1));
      rest.remove_prefix(nl + 1);
    }
    if (static_cast<int64_t>(lines[i].size()) != s.progress.rows_committed)
      return DataLossError(path + " has " + std::to_string(lines[i].size()) +
                           " committed lines, its manifest commits " +
                           std::to_string(s.progress.rows_committed) + " rows");
  }
  std::string merged;
  for (int64_t w = 0; w < win.count; ++w) {
    const auto& l = lines[static_cast<size_t>(win.shard(w))];
    for (int64_t r = 0; r < win.rows(w); ++r)
      merged += l[static_cast<size_t>(win.local_begin(w) + r)];
  }
  return merged;
}

}  // namespace

Json MergeSummary::ToJson() const {
  return Json{{"shards", shards},   {"rows", rows},
              {"rows_ok", rows_ok}, {"rows_skipped", rows_skipped},
              {"windows", windows}, {"bytes_copied", bytes_copied},
              {"files", files},     {"complete", true}};
}

StatusOr<MergeSummary> MergeExtractShards(const MergeOptions& o) {
  ASSIGN_OR_RETURN(std::vector<ShardOut> shards, LoadShards(o.shard_dirs));
  ASSIGN_OR_RETURN(Windows win, CheckWindows(shards));
  ASSIGN_OR_RETURN(std::string format,
                   shards.front().manifest->GetString({"settings", "format"}));
  // OUT: created if needed, locked, and holding no job.
  for (const ShardOut& s : shards) {
    std::error_code ec;
    if (fs::equivalent(s.dir, o.out_dir, ec))
      return InvalidArgumentError("OUT " + o.out_dir + " is one of the shards");
  }
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return IoError("OUT " + o.out_dir + ": " + ec.message());
  std::optional<FileLock> lock;
  if (!o.out_locked) {
    ASSIGN_OR_RETURN(lock, LockOutDir(o.out_dir));
  }
  const std::string manifest_path = o.out_dir + "/manifest.json";
  if (fs::exists(manifest_path, ec))
    return FailedPreconditionError(
        "OUT " + o.out_dir +
        " already holds a job (manifest.json); choose another directory "
        "(nothing was overwritten)");

  MergeSummary summary;
  summary.shards = win.N;
  summary.windows = win.count;
  ManifestProgress p;
  for (const ShardOut& s : shards) {
    p.rows_ok += s.progress.rows_ok;
    p.rows_skipped += s.progress.rows_skipped;
    p.input_offset = std::max(p.input_offset, s.progress.input_offset);
    for (const auto& [file, rows] : s.progress.ragged_rows)
      p.ragged_rows[file] += rows;
  }
  p.rows_committed = win.total;
  p.input_rows = win.total;
  // The arrays, then rows.jsonl, then the manifest (the commit record).
  std::vector<std::string> files = shards.front().files;
  if (format == "npy") {
    RETURN_IF_ERROR(
        MergeNpy(shards, win, o.out_dir, &p, &summary.bytes_copied));
  } else {
    files.clear();
    RETURN_IF_ERROR(MergeSafetensors(shards, win, o.out_dir, &files,
                                     &summary.bytes_copied));
    p.shards = win.count;
  }
  ASSIGN_OR_RETURN(std::string rows_log, MergeRowsLog(shards, win));
  RETURN_IF_ERROR(WriteFileDurably(o.out_dir + "/rows.jsonl", rows_log));
  p.rows_file_bytes = static_cast<int64_t>(rows_log.size());
  p.rows_file_crc32 = RowsLog::Crc32(0, rows_log);
  Json rows = Json::array();
  for (int64_t w = 0; w < win.count; ++w) {
    const Json& r =
        shards[static_cast<size_t>(win.shard(w))].manifest->doc()["rows"];
    for (int64_t i = 0; i < win.rows(w); ++i)
      rows.push_back(r[static_cast<size_t>(win.local_begin(w) + i)]);
  }
  Manifest m = shards.front().manifest->CopyTo(manifest_path);
  m.SetSetting("shard", ShardSpec{}.ToString());
  m.SetProgress(p);
  m.SetFiles(files);
  m.MarkComplete(std::move(rows), win.total);
  RETURN_IF_ERROR(m.Save());

  summary.rows = win.total;
  summary.rows_ok = p.rows_ok;
  summary.rows_skipped = p.rows_skipped;
  summary.files = files;
  if (o.remove_shards) {
    for (ShardOut& s : shards) {
      s.lock.reset();
      fs::remove_all(s.dir, ec);
      if (ec)
        return IoError("merged into " + o.out_dir + ", but removing shard " +
                       s.dir + " failed: " + ec.message());
      // The `--shard auto` parent, once empty.
      const fs::path parent = fs::path(s.dir).parent_path();
      std::error_code not_empty;
      if (parent.filename() == "shards") fs::remove(parent, not_empty);
    }
  }
  return summary;
}

}  // namespace loom
