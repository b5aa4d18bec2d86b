// SafetensorsWriter: builds a safetensors file from named tensors.
//
// Layout matches what the HF `safetensors` library writes: the JSON header
// (`__metadata__` first, then tensors in data order) padded with spaces so the
// data section starts on an 8-byte boundary; tensors packed back to back,
// ordered by element size (largest first) then name, so every tensor is
// aligned to its element size. Files round-trip through SafetensorsFile and
// the Python `safetensors` package.
//
// Streaming: tensor bytes come either from caller memory (written with pwrite,
// never copied) or from a fill callback that writes straight into the output
// file's pages (a shared mapping of that tensor's range), so a multi-GiB file
// is produced without holding its data in memory twice. Space for the whole
// file is reserved up front (posix_fallocate), so a full disk is reported as
// an error before any data is written rather than as SIGBUS.
//
// Crash safety: Write() writes `path + ".tmp"`, fsyncs it, renames it over
// `path` and fsyncs the directory: `path` is either the old file or the
// complete new one. On failure the temporary file is removed.
//
// Ownership: the writer borrows the memory passed to Add() (it must stay valid
// until Write() returns) and owns copies passed to AddOwned(). Not
// thread-safe; a fill callback may itself use many threads.
#ifndef LOOM_IO_SAFETENSORS_WRITER_H_
#define LOOM_IO_SAFETENSORS_WRITER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"
#include "src/core/tensor.h"

namespace loom {

class SafetensorsWriter {
 public:
  // Writes exactly `bytes` bytes of the tensor's data at `dst` (its place in
  // the output; not necessarily aligned beyond the element size). An error
  // aborts Write().
  using FillFn = std::function<Status(uint8_t* dst, int64_t bytes)>;

  SafetensorsWriter() = default;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Sets `__metadata__[key] = value` (a later call replaces the value).
  void SetMetadata(const std::string& key, const std::string& value);

  // Adds a tensor whose bytes are at `data` (borrowed until Write returns).
  // InvalidArgument if the name is empty, "__metadata__" or already added, a
  // dimension is negative, or `bytes` != numel x dtype size.
  Status Add(const std::string& name, DType dtype, const Shape& shape,
             const void* data, int64_t bytes);
  // Same, for a view (borrowed).
  Status Add(const std::string& name, const TensorView& view);
  // Adds a tensor, taking ownership of its bytes.
  Status AddOwned(const std::string& name, DType dtype, const Shape& shape,
                  std::vector<uint8_t> bytes);
  // Adds a tensor whose bytes `fill` produces during Write().
  Status AddFill(const std::string& name, DType dtype, const Shape& shape,
                 FillFn fill);

  int num_tensors() const { return static_cast<int>(tensors_.size()); }
  // Sum of tensor bytes (the data section's size).
  int64_t data_bytes() const;

  // Writes the file (see the crash-safety note above). May be called more
  // than once; fill callbacks run again each time.
  Status Write(const std::string& path) const;
  // The bytes Write() would put in the file, in memory (an HTTP reply);
  // fill callbacks run into the returned string.
  StatusOr<std::string> Serialize() const;

 private:
  struct Pending {
    std::string name;
    DType dtype;
    Shape shape;
    int64_t bytes = 0;
    const void* data = nullptr;  // borrowed or points into `owned`
    std::vector<uint8_t> owned;
    FillFn fill;
  };
  Status Check(const std::string& name, DType dtype, const Shape& shape,
               int64_t* bytes) const;
  // The file's layout: the 8-byte length and JSON header (`prefix`), where
  // the data starts, the whole size, and each tensor's (index into
  // tensors_, offset in the data section). `what` names the output in
  // errors.
  struct Layout {
    std::string prefix;
    int64_t data_start = 0, total = 0;
    std::vector<std::pair<size_t, int64_t>> placed;
  };
  StatusOr<Layout> Plan(const std::string& what) const;

  std::map<std::string, std::string> metadata_;
  std::vector<Pending> tensors_;
  std::map<std::string, size_t> names_;
};

}  // namespace loom

#endif  // LOOM_IO_SAFETENSORS_WRITER_H_
