// Safetensors reading: a validated header and zero-copy views into an mmap.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
//    "__metadata__": {"k": "v"}}
// then the data; offsets are relative to the first byte after the header.
//
// Validation on open (each failure is a Status naming the file and tensor):
// header length sane and inside the file, JSON well-formed, every dtype known,
// shape non-negative, numel x dtype size == end - begin, ranges inside the
// data section, no two ranges overlapping.
//
// Ownership: a SafetensorsFile owns its mapping; views stay valid while it
// lives. A Checkpoint owns its files. Both are immutable after Open and safe
// to read from many threads.
#ifndef LOOM_IO_SAFETENSORS_H_
#define LOOM_IO_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"
#include "src/core/tensor.h"

namespace loom {

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
  int64_t data_start = 0;  // 8 + header length
  std::vector<TensorInfo> tensors;  // in offset order
  std::map<std::string, std::string> metadata;
};

// Reads and validates the header of `path` (reads only the header bytes).
StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);
// Validates a header given its bytes (exposed for tests and fuzzing).
StatusOr<SafetensorsHeader> ParseSafetensorsHeader(const std::string& path, const uint8_t* bytes,
                                                   int64_t file_size);

class SafetensorsFile {
 public:
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const SafetensorsHeader& header() const { return header_; }
  const std::string& path() const { return header_.path; }
  const TensorInfo* Find(const std::string& name) const;
  TensorView View(const TensorInfo& info) const;

 private:
  SafetensorsFile() = default;
  SafetensorsHeader header_;
  std::map<std::string, size_t> index_;
  uint8_t* map_ = nullptr;
  int64_t map_size_ = 0;
};

// A model directory's weights: `model.safetensors`, or the shards named by
// `model.safetensors.index.json` (never every *.safetensors in the directory).
class Checkpoint {
 public:
  struct Entry {
    TensorInfo info;
    int file = 0;  // index into files()
  };

  static StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& model_dir);

  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  // All tensors, sorted by name.
  const std::vector<Entry>& entries() const { return entries_; }
  const Entry* Find(const std::string& name) const;
  TensorView View(const Entry& e) const { return files_[e.file]->View(e.info); }
  // Sum of tensor bytes (what an index's metadata.total_size counts).
  int64_t total_bytes() const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<Entry> entries_;
  std::map<std::string, size_t> index_;
};

// Weight metadata without data (planning): from the safetensors headers if
// the files exist, else from the index's weight_map with `assume_dtype` for
// every tensor... (shapes then come from the architecture's declaration).
// Returns the list of file names an index names (in index order, unique).
StatusOr<std::vector<std::string>> ReadIndexShards(const std::string& index_path);

}  // namespace loom

#endif  // LOOM_IO_SAFETENSORS_H_
