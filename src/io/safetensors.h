// Safetensors reading: a validated header and zero-copy views into an mmap.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
//    "__metadata__": {"k": "v"}}
// then the data; offsets are relative to the first byte after the header.
//
// Validation on open (each failure is a Status naming the file and tensor):
// header length sane (>= 2, <= 100 MiB) and inside the file, JSON well-formed
// and an object without duplicate keys, every entry an object with dtype
// (string), shape (array of non-negative integers) and data_offsets (two
// non-negative integers, begin <= end), every dtype known, numel x dtype
// size == end - begin (overflow-safe), ranges inside the data section, no two
// non-empty ranges overlapping, `__metadata__` a map of strings.
// Error codes: DataLoss for a corrupt or truncated file, Unimplemented for a
// dtype that safetensors defines but Loom does not support (U16, C64, F4...),
// NotFound for a missing file, IoError for a failing system call (the message
// carries strerror). docs/formats/safetensors-reading.md lists the messages.
//
// Alignment: the data section starts 8 + N bytes into the file (HF pads N to a
// multiple of 8) and tensors are packed back to back, so a view's pointer is
// aligned to the dtype size at best (a BF16 view may be only 2-byte aligned).
// Views are NOT guaranteed 4-, 16- or 64-byte aligned; code that needs more
// must copy. The pointer of an empty view (numel 0) must not be dereferenced.
//
// Views point into a read-only mapping (PROT_READ, MAP_PRIVATE): TensorView's
// pointer is non-const, but writing through it faults.
//
// Ownership: a SafetensorsFile owns its mapping; views stay valid while it
// lives. A Checkpoint owns its files. Both are immutable after Open and safe
// to read from many threads. The free functions are thread-safe.
#ifndef LOOM_IO_SAFETENSORS_H_
#define LOOM_IO_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"
#include "src/core/tensor.h"

namespace loom {

// Largest header accepted (the safetensors reference implementation's limit).
inline constexpr int64_t kMaxSafetensorsHeaderBytes = int64_t{100} << 20;

struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  int64_t begin = 0;  // byte offsets relative to the data section
  int64_t end = 0;
  int64_t bytes() const { return end - begin; }
};

// Parsed header only (no mapping): what planning needs.
struct SafetensorsHeader {
  std::string path;
  int64_t file_size = 0;
  int64_t data_start = 0;           // 8 + header length
  std::vector<TensorInfo> tensors;  // in offset order (ties: by name)
  std::map<std::string, std::string> metadata;

  // Bytes after the header (what data_offsets index into).
  int64_t data_size() const { return file_size - data_start; }
  // Linear search; use SafetensorsFile::Find for repeated lookups.
  const TensorInfo* Find(const std::string& name) const;
};

// Reads and validates the header of `path` (reads only the header bytes with
// pread; no mapping).
StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);
// Validates a header given its bytes (exposed for tests and fuzzing).
// `bytes` holds the file's first min(file_size, 8 + N) bytes, N being the
// length in the first 8 bytes (the whole file will do); `path` is used in
// messages only.
StatusOr<SafetensorsHeader> ParseSafetensorsHeader(const std::string& path,
                                                   const uint8_t* bytes,
                                                   int64_t file_size);

class SafetensorsFile {
 public:
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const SafetensorsHeader& header() const { return header_; }
  const std::string& path() const { return header_.path; }
  // nullptr when absent.
  const TensorInfo* Find(const std::string& name) const;
  // `info` must come from this file's header.
  TensorView View(const TensorInfo& info) const;

  // Paging hints for a tensor's bytes (page-rounded; best effort, errors are
  // ignored): Prefetch starts reading it in (MADV_WILLNEED); Release drops its
  // resident pages (MADV_DONTNEED; they are read again from the file on the
  // next access, so views stay valid).
  void Prefetch(const TensorInfo& info) const;
  void Release(const TensorInfo& info) const;

 private:
  SafetensorsFile() = default;
  SafetensorsHeader header_;
  std::map<std::string, size_t> index_;
  uint8_t* map_ = nullptr;
  int64_t map_size_ = 0;
};

// A model directory's weights: the shards named by
// `model.safetensors.index.json` if that file exists, else
// `model.safetensors` (never every *.safetensors in the directory: golden
// and other safetensors files sit beside the weights).
//
// With an index, Open checks that every shard exists (NotFound naming shard
// and index), that every tensor the index maps to a shard is in that shard's
// header, that every tensor in a shard is mapped by the index to that shard,
// and that no tensor is in two shards (DataLoss otherwise).
class Checkpoint {
 public:
  struct Entry {
    TensorInfo info;
    int file = 0;  // index into files()
  };

  static StatusOr<std::unique_ptr<Checkpoint>> Open(
      const std::string& model_dir);

  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const {
    return files_;
  }
  // All tensors, sorted by name.
  const std::vector<Entry>& entries() const { return entries_; }
  // nullptr when absent.
  const Entry* Find(const std::string& name) const;
  TensorView View(const Entry& e) const { return files_[e.file]->View(e.info); }
  // Sum of tensor bytes (what an index's metadata.total_size counts).
  int64_t total_bytes() const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<Entry> entries_;
  std::map<std::string, size_t> index_;
};

// The weight files of a model directory (see Checkpoint) read header-only,
// with the same index cross-checks as Checkpoint::Open: planning without
// mapping anything. `headers` are in index order (or the single file).
struct CheckpointHeaders {
  std::string index_path;  // empty when the directory has no index
  std::vector<SafetensorsHeader> headers;
};
StatusOr<CheckpointHeaders> ReadCheckpointHeaders(const std::string& model_dir);

// `model.safetensors.index.json` contents, validated: a JSON object with a
// `weight_map` object of tensor name -> shard file name (strings; no
// duplicate names; shard names relative, without ".." components) and an
// optional `metadata` object whose optional `total_size` is a non-negative
// integer. Shard files are not opened.
struct SafetensorsIndex {
  std::string path;
  std::optional<int64_t> total_size;              // metadata.total_size
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file
  std::vector<std::string>
      shards;  // unique shard files, in first-mention order
};
StatusOr<SafetensorsIndex> ReadSafetensorsIndex(const std::string& index_path);

// Planning from the index alone (shard files absent, e.g. before a download):
// the shard file names an index names, in the order they are first mentioned
// in its weight_map, each once. Shapes and dtypes are not in an index; a
// planner takes them from the shard headers when present, else from the
// architecture's declaration.
StatusOr<std::vector<std::string>> ReadIndexShards(
    const std::string& index_path);

}  // namespace loom

#endif  // LOOM_IO_SAFETENSORS_H_
