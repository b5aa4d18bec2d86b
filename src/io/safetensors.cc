#include "src/io/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <utility>

#include "src/io/file_util.h"

namespace loom {
namespace {

using json = nlohmann::json;
using io_internal::UniqueFd;

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::string_view kIndexName = "model.safetensors.index.json";
constexpr std::string_view kSingleName = "model.safetensors";

// dtypes the safetensors format defines that Loom does not read.
constexpr std::array<std::string_view, 11> kUnsupportedDTypes = {
    "U16",     "U32",     "U64",         "C64",         "F8_E8M0",  "F4",
    "F6_E2M3", "F6_E3M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E4M3FN"};
constexpr std::string_view kKnownDTypes =
    "F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2";

std::string JsonTypeName(const json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number_float()) return "number";
  return v.type_name();
}

// Parses JSON text, failing on duplicate keys at `dup_depth` (1: top level).
// `parent_key` limits the check for depth > 1 to the object under that
// top-level key. Returns the value or a DataLoss status ("<what> ...").
StatusOr<json> ParseJson(std::string_view text, const std::string& what,
                         int dup_depth, std::string_view parent_key = {}) {
  std::set<std::string> seen;
  std::string current_top;
  std::string duplicate;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && parsed.is_string()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (depth == 1) current_top = key;
      if (depth == dup_depth && (dup_depth == 1 || current_top == parent_key)) {
        if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
      }
    }
    return true;
  };
  json value;
  try {
    value = json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    return DataLossError(
        fmt::format("{} is not valid JSON: {}", what, e.what()));
  }
  if (!duplicate.empty()) {
    return DataLossError(
        fmt::format("{} has the key \"{}\" twice", what, duplicate));
  }
  return value;
}

enum class IntResult { kOk, kNotInteger, kNegative, kTooLarge };

IntResult GetInt64(const json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return IntResult::kTooLarge;
    *out = static_cast<int64_t>(u);
    return IntResult::kOk;
  }
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return *out < 0 ? IntResult::kNegative : IntResult::kOk;
  }
  return IntResult::kNotInteger;
}

// "[1, -2]" from a JSON array of numbers, for messages.
std::string JsonArrayString(const json& a) {
  std::string s = "[";
  bool first = true;
  for (const auto& v : a) {
    if (!first) s += ", ";
    first = false;
    s += v.dump();
  }
  return s + "]";
}

Status ParseEntry(const std::string& path, const std::string& name,
                  const json& entry, int64_t data_size, TensorInfo* info) {
  auto err = [&](const std::string& msg) {
    return DataLossError(fmt::format("{}: tensor {}: {}", path, name, msg));
  };
  if (!entry.is_object()) {
    return err(
        fmt::format("entry is a JSON {}, expected an object with dtype, shape "
                    "and data_offsets",
                    JsonTypeName(entry)));
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) return err(fmt::format("missing \"{}\"", key));
  }
  // dtype
  const json& jdtype = entry["dtype"];
  if (!jdtype.is_string()) {
    return err(fmt::format("dtype is a JSON {}, expected a string",
                           JsonTypeName(jdtype)));
  }
  const std::string& dtype_name = jdtype.get_ref<const std::string&>();
  std::optional<DType> dtype = ParseDType(dtype_name);
  // Sub-byte types (F4) are read only inside U8 tensors (src/core/format.h).
  if (!dtype || DTypeName(*dtype) != dtype_name || DTypeBits(*dtype) < 8) {
    if (std::find(kUnsupportedDTypes.begin(), kUnsupportedDTypes.end(),
                  dtype_name) != kUnsupportedDTypes.end()) {
      return UnimplementedError(fmt::format(
          "{}: tensor {}: dtype {} is not supported (supported: {})", path,
          name, dtype_name, kKnownDTypes));
    }
    return err(fmt::format("unknown dtype \"{}\" (known: {})", dtype_name,
                           kKnownDTypes));
  }
  info->dtype = *dtype;
  // shape
  const json& jshape = entry["shape"];
  if (!jshape.is_array()) {
    return err(fmt::format("shape is a JSON {}, expected an array of integers",
                           JsonTypeName(jshape)));
  }
  std::vector<int64_t> dims;
  dims.reserve(jshape.size());
  for (const auto& d : jshape) {
    int64_t v = 0;
    switch (GetInt64(d, &v)) {
      case IntResult::kOk:
        break;
      case IntResult::kNotInteger:
        return err(
            fmt::format("shape {} has a JSON {} element, expected integers",
                        JsonArrayString(jshape), JsonTypeName(d)));
      case IntResult::kNegative:
        return err(fmt::format("shape {} has negative dimension {}",
                               JsonArrayString(jshape), d.dump()));
      case IntResult::kTooLarge:
        return err(fmt::format("shape {} has dimension {} beyond 2^63",
                               JsonArrayString(jshape), d.dump()));
    }
    dims.push_back(v);
  }
  info->shape = Shape(std::move(dims));
  // data_offsets
  const json& joff = entry["data_offsets"];
  if (!joff.is_array() || joff.size() != 2) {
    return err(fmt::format(
        "data_offsets is {}, expected an array of two integers [begin, end]",
        joff.is_array() ? fmt::format("an array of {} elements", joff.size())
                        : "a JSON " + JsonTypeName(joff)));
  }
  int64_t off[2];
  for (int i = 0; i < 2; ++i) {
    switch (GetInt64(joff[i], &off[i])) {
      case IntResult::kOk:
        break;
      case IntResult::kNotInteger:
        return err(fmt::format(
            "data_offsets {} has a JSON {} element, expected integers",
            JsonArrayString(joff), JsonTypeName(joff[i])));
      case IntResult::kNegative:
        return err(fmt::format("data_offsets {} has a negative offset",
                               JsonArrayString(joff)));
      case IntResult::kTooLarge:
        return err(fmt::format("data_offsets {} has an offset beyond 2^63",
                               JsonArrayString(joff)));
    }
  }
  if (off[0] > off[1]) {
    return err(fmt::format("data_offsets [{}, {}] are reversed (begin > end)",
                           off[0], off[1]));
  }
  info->begin = off[0];
  info->end = off[1];
  // size
  int64_t bytes = DTypeSize(info->dtype);
  for (int64_t d : info->shape.dims()) {
    if (__builtin_mul_overflow(bytes, d, &bytes)) {
      return err(fmt::format("shape {} x {} overflows 64-bit byte counts",
                             info->shape.ToString(), dtype_name));
    }
  }
  if (bytes != info->end - info->begin) {
    return err(fmt::format(
        "shape {} x {} = {} bytes, but data_offsets span {} bytes",
        info->shape.ToString(), dtype_name, bytes, info->end - info->begin));
  }
  if (info->end > data_size) {
    return err(
        fmt::format("data_offsets [{}, {}] run past the end of the data "
                    "section ({} bytes): truncated file?",
                    info->begin, info->end, data_size));
  }
  return Status::Ok();
}

// Reads and validates the header of an open file.
StatusOr<SafetensorsHeader> ReadHeaderFromFd(int fd, const std::string& path) {
  ASSIGN_OR_RETURN(int64_t file_size, io_internal::RegularFileSize(fd, path));
  uint8_t prefix[8] = {};
  int64_t have = std::min<int64_t>(file_size, 8);
  RETURN_IF_ERROR(io_internal::PreadFully(fd, path, prefix, have, 0));
  if (file_size < 8) return ParseSafetensorsHeader(path, prefix, file_size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];
  if (n < 2 || n > static_cast<uint64_t>(kMaxSafetensorsHeaderBytes) ||
      n > static_cast<uint64_t>(file_size - 8)) {
    return ParseSafetensorsHeader(path, prefix,
                                  file_size);  // reports the error
  }
  std::string buf(8 + n, '\0');
  RETURN_IF_ERROR(io_internal::PreadFully(fd, path, buf.data(),
                                          static_cast<int64_t>(buf.size()), 0));
  return ParseSafetensorsHeader(
      path, reinterpret_cast<const uint8_t*>(buf.data()), file_size);
}

// Rejects shard names that leave the model directory.
Status CheckShardName(const std::string& index_path, const std::string& tensor,
                      const std::string& shard) {
  bool bad = shard.empty() || shard.front() == '/';
  size_t start = 0;
  while (!bad && start <= shard.size()) {
    size_t slash = shard.find('/', start);
    if (slash == std::string::npos) slash = shard.size();
    if (shard.compare(start, slash - start, "..") == 0 && slash - start == 2)
      bad = true;
    start = slash + 1;
  }
  if (bad) {
    return DataLossError(
        fmt::format("{}: weight_map maps tensor {} to \"{}\", expected a file "
                    "name inside the model directory",
                    index_path, tensor, shard));
  }
  return Status::Ok();
}

// Cross-checks an index against its shards' headers (headers[i] is
// index.shards[i]).
Status CheckIndexAgainstShards(
    const SafetensorsIndex& index,
    const std::vector<const SafetensorsHeader*>& headers) {
  std::map<std::string, size_t> owner;
  for (size_t i = 0; i < headers.size(); ++i) {
    const SafetensorsHeader& h = *headers[i];
    for (const TensorInfo& t : h.tensors) {
      auto [it, inserted] = owner.emplace(t.name, i);
      if (!inserted) {
        return DataLossError(
            fmt::format("{}: tensor {} is in two shards, {} and {}", index.path,
                        t.name, index.shards[it->second], index.shards[i]));
      }
      auto w = index.weight_map.find(t.name);
      if (w == index.weight_map.end()) {
        return DataLossError(
            fmt::format("{}: tensor {} is in this shard but not in index {}",
                        h.path, t.name, index.path));
      }
      if (w->second != index.shards[i]) {
        return DataLossError(fmt::format(
            "{}: tensor {} is in this shard ({}) but index {} maps it to {}",
            h.path, t.name, index.shards[i], index.path, w->second));
      }
    }
  }
  for (const auto& [name, shard] : index.weight_map) {
    if (!owner.count(name)) {
      auto pos = std::find(index.shards.begin(), index.shards.end(), shard) -
                 index.shards.begin();
      return DataLossError(fmt::format(
          "{}: tensor {} is mapped to shard {}, but {} has no such tensor",
          index.path, name, shard, headers[pos]->path));
    }
  }
  return Status::Ok();
}

// The weight files of `model_dir`: the index (if any) and the file paths.
struct ResolvedCheckpoint {
  std::optional<SafetensorsIndex> index;
  std::vector<std::string> paths;
};

StatusOr<ResolvedCheckpoint> ResolveCheckpoint(const std::string& model_dir) {
  bool is_dir = false;
  if (!io_internal::PathExists(model_dir, &is_dir)) {
    return NotFoundError(
        fmt::format("{}: model directory does not exist", model_dir));
  }
  if (!is_dir)
    return InvalidArgumentError(fmt::format("{}: not a directory", model_dir));
  ResolvedCheckpoint r;
  std::string index_path =
      io_internal::JoinPath(model_dir, std::string(kIndexName));
  if (io_internal::PathExists(index_path)) {
    ASSIGN_OR_RETURN(SafetensorsIndex index, ReadSafetensorsIndex(index_path));
    for (const std::string& shard : index.shards) {
      std::string p = io_internal::JoinPath(model_dir, shard);
      if (!io_internal::PathExists(p)) {
        return NotFoundError(fmt::format(
            "{}: shard {} named by index {} not found", p, shard, index_path));
      }
      r.paths.push_back(std::move(p));
    }
    r.index = std::move(index);
    return r;
  }
  std::string single =
      io_internal::JoinPath(model_dir, std::string(kSingleName));
  if (io_internal::PathExists(single)) {
    r.paths.push_back(std::move(single));
    return r;
  }
  return NotFoundError(fmt::format("{}: no weights found: looked for {} and {}",
                                   model_dir, kIndexName, kSingleName));
}

}  // namespace

const TensorInfo* SafetensorsHeader::Find(const std::string& name) const {
  for (const TensorInfo& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

StatusOr<SafetensorsHeader> ParseSafetensorsHeader(const std::string& path,
                                                   const uint8_t* bytes,
                                                   int64_t file_size) {
  if (file_size < 8) {
    return DataLossError(fmt::format(
        "{}: file is {} bytes, too short for the 8-byte header length", path,
        file_size));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  if (n < 2) {
    return DataLossError(fmt::format(
        "{}: header length {} is below the minimum of 2 bytes", path, n));
  }
  if (n > static_cast<uint64_t>(kMaxSafetensorsHeaderBytes)) {
    return DataLossError(
        fmt::format("{}: header length {} exceeds the limit of {} bytes (not a "
                    "safetensors file?)",
                    path, n, kMaxSafetensorsHeaderBytes));
  }
  if (n > static_cast<uint64_t>(file_size - 8)) {
    return DataLossError(
        fmt::format("{}: header length {} runs past the end of the file ({} "
                    "bytes, {} after the length): truncated?",
                    path, n, file_size, file_size - 8));
  }
  SafetensorsHeader h;
  h.path = path;
  h.file_size = file_size;
  h.data_start = 8 + static_cast<int64_t>(n);
  std::string_view text(reinterpret_cast<const char*>(bytes + 8), n);
  ASSIGN_OR_RETURN(json root, ParseJson(text, path + ": header", 1));
  if (!root.is_object()) {
    return DataLossError(
        fmt::format("{}: header is a JSON {}, expected an object", path,
                    JsonTypeName(root)));
  }
  const int64_t data_size = h.data_size();
  h.tensors.reserve(root.size());
  for (const auto& [name, entry] : root.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object()) {
        return DataLossError(fmt::format(
            "{}: __metadata__ is a JSON {}, expected an object of strings",
            path, JsonTypeName(entry)));
      }
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) {
          return DataLossError(fmt::format(
              "{}: __metadata__ key {}: value is a JSON {}, expected a string",
              path, k, JsonTypeName(v)));
        }
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    TensorInfo info;
    info.name = name;
    RETURN_IF_ERROR(ParseEntry(path, name, entry, data_size, &info));
    h.tensors.push_back(std::move(info));
  }
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              if (a.begin != b.begin) return a.begin < b.begin;
              if (a.end != b.end) return a.end < b.end;
              return a.name < b.name;
            });
  // Empty tensors occupy no bytes and overlap nothing.
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : h.tensors) {
    if (t.bytes() == 0) continue;
    if (prev && t.begin < prev->end) {
      return DataLossError(fmt::format(
          "{}: tensor {}: data_offsets [{}, {}] overlap tensor {} [{}, {}]",
          path, t.name, t.begin, t.end, prev->name, prev->begin, prev->end));
    }
    prev = &t;
  }
  return h;
}

StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path) {
  ASSIGN_OR_RETURN(UniqueFd fd, io_internal::OpenFile(path, O_RDONLY));
  return ReadHeaderFromFd(fd.get(), path);
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  ASSIGN_OR_RETURN(UniqueFd fd, io_internal::OpenFile(path, O_RDONLY));
  ASSIGN_OR_RETURN(SafetensorsHeader header, ReadHeaderFromFd(fd.get(), path));
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  void* map = ::mmap(nullptr, static_cast<size_t>(header.file_size), PROT_READ,
                     MAP_PRIVATE, fd.get(), 0);
  if (map == MAP_FAILED) return io_internal::ErrnoStatus(path, "mmap", errno);
  f->map_ = static_cast<uint8_t*>(map);
  f->map_size_ = header.file_size;
  // Weights can be many GiB: keep them out of core dumps. Access patterns vary
  // (one pass to repack, or repeated reads in place), so the kernel's default
  // read-ahead stays; Prefetch/Release give callers finer control.
  ::madvise(map, static_cast<size_t>(f->map_size_), MADV_DONTDUMP);
  f->header_ = std::move(header);
  for (size_t i = 0; i < f->header_.tensors.size(); ++i)
    f->index_.emplace(f->header_.tensors[i].name, i);
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, static_cast<size_t>(map_size_));
}

const TensorInfo* SafetensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

TensorView SafetensorsFile::View(const TensorInfo& info) const {
  LOOM_CHECK(info.begin >= 0 && info.end <= header_.data_size())
      << header_.path << ": " << info.name;
  TensorView v;
  v.data = map_ + header_.data_start + info.begin;
  v.dtype = info.dtype;
  v.shape = info.shape;
  return v;
}

namespace {
void AdviseRange(uint8_t* map, int64_t map_size, int64_t begin, int64_t end,
                 int advice) {
  if (end <= begin) return;
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  int64_t b = begin / page * page;
  int64_t e = std::min(map_size, (end + page - 1) / page * page);
  ::madvise(map + b, static_cast<size_t>(e - b), advice);
}
}  // namespace

void SafetensorsFile::Prefetch(const TensorInfo& info) const {
  AdviseRange(map_, map_size_, header_.data_start + info.begin,
              header_.data_start + info.end, MADV_WILLNEED);
}

void SafetensorsFile::Release(const TensorInfo& info) const {
  // Only whole pages inside the tensor: a neighbour sharing a page keeps it.
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  int64_t b = (header_.data_start + info.begin + page - 1) / page * page;
  int64_t e = (header_.data_start + info.end) / page * page;
  if (header_.data_start + info.end == map_size_) e = map_size_;
  if (e > b) ::madvise(map_ + b, static_cast<size_t>(e - b), MADV_DONTNEED);
}

// ---------------------------------------------------------------- Checkpoint

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(
    const std::string& model_dir) {
  ASSIGN_OR_RETURN(ResolvedCheckpoint r, ResolveCheckpoint(model_dir));
  std::unique_ptr<Checkpoint> c(new Checkpoint());
  for (const std::string& p : r.paths) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f,
                     SafetensorsFile::Open(p));
    c->files_.push_back(std::move(f));
  }
  if (r.index) {
    std::vector<const SafetensorsHeader*> headers;
    for (const auto& f : c->files_) headers.push_back(&f->header());
    RETURN_IF_ERROR(CheckIndexAgainstShards(*r.index, headers));
  }
  for (size_t i = 0; i < c->files_.size(); ++i) {
    for (const TensorInfo& t : c->files_[i]->header().tensors) {
      c->entries_.push_back(Entry{t, static_cast<int>(i)});
    }
  }
  std::sort(
      c->entries_.begin(), c->entries_.end(),
      [](const Entry& a, const Entry& b) { return a.info.name < b.info.name; });
  for (size_t i = 0; i < c->entries_.size(); ++i)
    c->index_.emplace(c->entries_[i].info.name, i);
  return c;
}

const Checkpoint::Entry* Checkpoint::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

int64_t Checkpoint::total_bytes() const {
  int64_t total = 0;
  for (const Entry& e : entries_) total += e.info.bytes();
  return total;
}

StatusOr<CheckpointHeaders> ReadCheckpointHeaders(
    const std::string& model_dir) {
  ASSIGN_OR_RETURN(ResolvedCheckpoint r, ResolveCheckpoint(model_dir));
  CheckpointHeaders out;
  for (const std::string& p : r.paths) {
    ASSIGN_OR_RETURN(SafetensorsHeader h, ReadSafetensorsHeader(p));
    out.headers.push_back(std::move(h));
  }
  if (r.index) {
    std::vector<const SafetensorsHeader*> headers;
    for (const auto& h : out.headers) headers.push_back(&h);
    RETURN_IF_ERROR(CheckIndexAgainstShards(*r.index, headers));
    out.index_path = r.index->path;
  }
  return out;
}

// ---------------------------------------------------------------- Index

StatusOr<SafetensorsIndex> ReadSafetensorsIndex(const std::string& index_path) {
  ASSIGN_OR_RETURN(UniqueFd fd, io_internal::OpenFile(index_path, O_RDONLY));
  ASSIGN_OR_RETURN(int64_t size,
                   io_internal::RegularFileSize(fd.get(), index_path));
  if (size > kMaxSafetensorsHeaderBytes) {
    return DataLossError(
        fmt::format("{}: index is {} bytes, more than the limit of {}",
                    index_path, size, kMaxSafetensorsHeaderBytes));
  }
  std::string text(static_cast<size_t>(size), '\0');
  RETURN_IF_ERROR(
      io_internal::PreadFully(fd.get(), index_path, text.data(), size, 0));
  // ordered_json keeps the weight_map's order for `shards`.
  std::set<std::string> seen;
  std::string top, duplicate;
  auto callback = [&](int depth, nlohmann::ordered_json::parse_event_t event,
                      nlohmann::ordered_json& parsed) {
    if (event == nlohmann::ordered_json::parse_event_t::key &&
        parsed.is_string()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (depth == 1) {
        if (key == "weight_map" && top == key && duplicate.empty())
          duplicate = key;
        top = key;
      } else if (depth == 2 && top == "weight_map" &&
                 !seen.insert(key).second && duplicate.empty()) {
        duplicate = key;
      }
    }
    return true;
  };
  nlohmann::ordered_json root;
  try {
    root = nlohmann::ordered_json::parse(text, callback);
  } catch (const nlohmann::ordered_json::exception& e) {
    return DataLossError(
        fmt::format("{}: index is not valid JSON: {}", index_path, e.what()));
  }
  if (!duplicate.empty()) {
    return DataLossError(fmt::format("{}: weight_map has tensor {} twice",
                                     index_path, duplicate));
  }
  if (!root.is_object()) {
    return DataLossError(
        fmt::format("{}: index is a JSON {}, expected an object", index_path,
                    root.type_name()));
  }
  SafetensorsIndex index;
  index.path = index_path;
  if (root.contains("metadata")) {
    const auto& meta = root["metadata"];
    if (!meta.is_object()) {
      return DataLossError(
          fmt::format("{}: metadata is a JSON {}, expected an object",
                      index_path, meta.type_name()));
    }
    if (meta.contains("total_size")) {
      const auto& ts = meta["total_size"];
      if (ts.is_number_unsigned() &&
          ts.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)) {
        index.total_size = static_cast<int64_t>(ts.get<uint64_t>());
      } else if (ts.is_number_float() && ts.get<double>() >= 0 &&
                 ts.get<double>() < 9.2e18 &&
                 ts.get<double>() == static_cast<double>(static_cast<int64_t>(
                                         ts.get<double>()))) {
        index.total_size =
            static_cast<int64_t>(ts.get<double>());  // some writers emit 1234.0
      } else if (!ts.is_null()) {
        return DataLossError(fmt::format(
            "{}: metadata.total_size is {}, expected a non-negative integer",
            index_path, ts.dump()));
      }
    }
  }
  if (!root.contains("weight_map")) {
    return DataLossError(
        fmt::format("{}: index has no \"weight_map\"", index_path));
  }
  const auto& wm = root["weight_map"];
  if (!wm.is_object()) {
    return DataLossError(
        fmt::format("{}: weight_map is a JSON {}, expected an object",
                    index_path, wm.type_name()));
  }
  std::set<std::string> shard_set;
  for (const auto& [name, shard] : wm.items()) {
    if (!shard.is_string()) {
      return DataLossError(
          fmt::format("{}: weight_map entry for tensor {} is a JSON {}, "
                      "expected a file name",
                      index_path, name, shard.type_name()));
    }
    const std::string& s = shard.get_ref<const std::string&>();
    RETURN_IF_ERROR(CheckShardName(index_path, name, s));
    index.weight_map.emplace(name, s);
    if (shard_set.insert(s).second) index.shards.push_back(s);
  }
  return index;
}

StatusOr<std::vector<std::string>> ReadIndexShards(
    const std::string& index_path) {
  ASSIGN_OR_RETURN(SafetensorsIndex index, ReadSafetensorsIndex(index_path));
  return std::move(index.shards);
}

}  // namespace loom
