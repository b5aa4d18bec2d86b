// .npy files: an append-only, crash-safe row writer and a small reader.
//
// Format (numpy's NEP 1, version 1.0): "\x93NUMPY", major 1, minor 0, a
// little-endian uint16 header length H, then H bytes of a Python dict literal
//   {'descr': '<f4', 'fortran_order': False, 'shape': (rows, d1, ...), }
// padded with spaces and ending in '\n', so that 10 + H is a multiple of 64;
// then the data, C order. Version 2.0/3.0 files (uint32 H) are read, and
// appended to in their own version.
//
// dtypes: F32 '<f4', F16 '<f2', F64 '<f8', I64 '<i8', I32 '<i4', I16 '<i2',
// I8 '|i1', U8 '|u1', BOOL '|b1'. numpy has no bfloat16: BF16 arrays are
// stored as '<u2' holding the raw bf16 bits (numpy sees uint16; convert with
// `(a.astype(np.uint32) << 16).view(np.float32)`), and ReadNpyHeader maps
// '<u2' back to DType::kBF16. FP8 dtypes are not supported.
//
// Append-only streaming and crash safety (docs/formats/safetensors-reading.md):
// the header is written once with padding sized for a row count of up to
// kNpyMaxRows, so updating the count rewrites only the header bytes in place.
// Append() writes whole rows at the end of the file. Commit() fdatasyncs the
// data, rewrites the header with the new row count, and fdatasyncs again: the
// header never counts rows that are not durable. After a crash the file holds
// the committed rows plus possibly uncommitted bytes after them; numpy.load
// (with or without mmap_mode) reads exactly the committed rows, and
// OpenForAppend() truncates the rest (O(1): committed rows are never read or
// rewritten) and continues.
//
// Ownership and thread-safety: an NpyWriter owns its file descriptor and
// holds an exclusive flock on the file while open (a second writer on the
// same file gets FailedPrecondition). It is not thread-safe; use one writer
// per file from one thread at a time. The reader functions are thread-safe.
#ifndef LOOM_IO_NPY_H_
#define LOOM_IO_NPY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"

namespace loom {

// Largest row count an NpyWriter header has room for.
inline constexpr int64_t kNpyMaxRows = 1'000'000'000'000'000;

// The numpy descr for `dtype` ('<f4', '<u2' for BF16, ...); nullopt if the
// dtype cannot be stored.
std::optional<std::string> NpyDescr(DType dtype);

// The bytes of a whole version 1.0 .npy file holding `data` (C order,
// `bytes` = numel x the dtype's size) of `shape` (at least one dimension):
// the same header NpyWriter writes, sized for this shape (64-aligned). For
// arrays that are not files (an HTTP reply). InvalidArgument for a dtype
// NpyDescr cannot store, no or a negative dimension, or a size mismatch.
StatusOr<std::string> NpyBytes(DType dtype, const std::vector<int64_t>& shape,
                               const void* data, int64_t bytes);

struct NpyHeader {
  int major = 1;
  int minor = 0;
  std::string descr;  // as written, e.g. "<f4"
  DType dtype = DType::kF32;
  bool fortran_order = false;
  std::vector<int64_t> shape;
  int64_t data_offset = 0;  // bytes before the data (prefix + header)

  int64_t numel() const;
  int64_t data_bytes() const { return numel() * DTypeSize(dtype); }
};

// Parses the header of a .npy file. DataLoss for a malformed header (naming
// the file), Unimplemented for dtypes other than those listed above
// (including big-endian ones), NotFound / IoError for OS errors.
StatusOr<NpyHeader> ReadNpyHeader(const std::string& path);

// A whole array read into memory (tests and small files).
struct NpyArray {
  NpyHeader header;
  std::vector<uint8_t> data;  // header.data_bytes() bytes, C order
};
// Reads the header and exactly the bytes it describes; DataLoss if the file
// is shorter. Bytes after them (uncommitted rows) are ignored.
StatusOr<NpyArray> ReadNpy(const std::string& path);
// The same from the bytes of a whole .npy file in memory (an .npz member);
// `name` names it in errors.
StatusOr<NpyArray> ParseNpy(std::string_view bytes, const std::string& name);

class NpyWriter {
 public:
  // Creates (or replaces) `path` holding an empty array of shape
  // [0, row_shape...]: the header is written to `path + ".tmp"`, fsynced and
  // renamed, so `path` is never a partial header. InvalidArgument for an
  // unsupported dtype or a row of zero bytes (a 0 or negative dimension).
  static StatusOr<std::unique_ptr<NpyWriter>> Create(
      const std::string& path, DType dtype,
      const std::vector<int64_t>& row_shape);
  // Reopens a file for appending after its committed rows: truncates any
  // bytes past them. DataLoss if the file is shorter than its committed rows;
  // FailedPrecondition if its header has no room for kNpyMaxRows rows (a file
  // not written by NpyWriter) or another writer holds it; Unimplemented for
  // Fortran order or an unsupported dtype.
  // With `keep_rows`, the array is first rolled back to that many rows (a
  // job whose own commit record is behind the file's); DataLoss if fewer are
  // committed.
  static StatusOr<std::unique_ptr<NpyWriter>> OpenForAppend(
      const std::string& path, std::optional<int64_t> keep_rows = std::nullopt);

  // Closes the file without committing: rows appended since the last Commit
  // are not part of the array (the next OpenForAppend removes them).
  ~NpyWriter();
  NpyWriter(const NpyWriter&) = delete;
  NpyWriter& operator=(const NpyWriter&) = delete;

  // Writes whole rows at the end of the file; `bytes` must be a multiple of
  // row_bytes(). On failure the file is cut back to the rows before the call.
  Status Append(const void* data, int64_t bytes);
  Status AppendRows(const void* data, int64_t num_rows) {
    return Append(data, num_rows * row_bytes());
  }
  // Makes all appended rows durable and part of the array (see above).
  Status Commit();
  // Commit() and close; later calls return FailedPrecondition.
  Status Close();

  const std::string& path() const { return path_; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& row_shape() const { return row_shape_; }
  int64_t row_bytes() const { return row_bytes_; }
  int64_t rows() const { return rows_; }  // appended, committed or not
  int64_t committed_rows() const { return committed_rows_; }

 private:
  NpyWriter() = default;
  Status WriteHeader(int64_t rows);

  std::string path_;
  int fd_ = -1;
  int major_ = 1;
  DType dtype_ = DType::kF32;
  std::vector<int64_t> row_shape_;
  int64_t row_bytes_ = 0;
  int64_t data_offset_ = 0;
  int64_t rows_ = 0;
  int64_t committed_rows_ = 0;
};

}  // namespace loom

#endif  // LOOM_IO_NPY_H_
