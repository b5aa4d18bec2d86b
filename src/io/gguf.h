// GGUF reading (the file format of ggml / llama.cpp): the header, the
// metadata, the tensor infos, and f32 copies of F32, F16 and BF16 tensors.
// Loom reads GGUF for llama.cpp control vectors (docs/interventions.md); the
// reader is general, but it does not dequantize.
//
// Format (little endian throughout; docs/formats/gguf-reading.md):
//   "GGUF", version u32 (2 or 3), tensor count u64, metadata count u64,
//   metadata: key (string), value type u32, value;
//   tensor infos: name (string), n_dims u32 (<= 4), dims u64[n_dims]
//     (innermost first), ggml type u32, offset u64 (relative to the data
//     section, a multiple of the alignment);
//   the data section, starting at the first multiple of `general.alignment`
//   (a u32 power of two; default 32) after the tensor infos.
// A string is a u64 byte count and the bytes (no terminator). A value is a
// scalar of its type, a string, or an array: element type u32, count u64,
// the elements.
//
// Validation on open (each failure names the file and the offending field):
// magic, version, every count and length bounded by the bytes left in the
// file (checked before anything is allocated or skipped), value types known,
// keys non-empty and distinct, general.alignment a u32 power of two, tensor
// names distinct, n_dims <= 4, element counts without overflow, and the data
// of every tensor of a known size (F32, F16, BF16) aligned and inside the
// data section. Error codes: DataLoss for a corrupt or truncated file,
// Unimplemented for a valid file Loom does not read (version 1, big-endian
// files, arrays of arrays, reading a quantized tensor), NotFound for a
// missing file, IoError for a failing system call.
//
// Thread-safety: a GgufFile is immutable after Open; the functions keep no
// state.
#ifndef LOOM_IO_GGUF_H_
#define LOOM_IO_GGUF_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "src/base/status.h"

namespace loom {

// The metadata value types of GGUF.
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
// "uint8", ..., "float64"; "type N" for an unknown one.
std::string GgufTypeName(uint32_t type);

// The ggml tensor types read here (others are listed, never read).
inline constexpr uint32_t kGgmlTypeF32 = 0;
inline constexpr uint32_t kGgmlTypeF16 = 1;
inline constexpr uint32_t kGgmlTypeBF16 = 30;

inline constexpr int64_t kGgufDefaultAlignment = 32;
inline constexpr uint32_t kGgufMaxDims = 4;

// One metadata value. Scalars and strings keep their value: unsigned
// integers as uint64_t, signed ones as int64_t, floats as double, bool as
// bool, strings as std::string. An array keeps its element type and count
// only (its elements are checked and skipped).
struct GgufValue {
  GgufType type = GgufType::kU8;
  std::variant<std::monostate, uint64_t, int64_t, double, bool, std::string>
      value;
  GgufType array_type = GgufType::kU8;  // kArray only
  uint64_t array_size = 0;              // kArray only
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // innermost first, as in the file
  uint32_t type = 0;          // ggml type
  int64_t offset = 0;         // relative to the data section
  int64_t numel = 0;
  // Data bytes for F32, F16 and BF16; -1 for the other ggml types (their
  // block sizes are not known here, so their data is not checked).
  int64_t bytes = -1;
};

struct GgufHeader {
  std::string path;
  uint32_t version = 0;
  int64_t file_size = 0;
  int64_t alignment = kGgufDefaultAlignment;
  int64_t data_start = 0;  // the data section's first byte in the file
  std::map<std::string, GgufValue> metadata;
  std::vector<GgufTensorInfo> tensors;  // in file order

  // nullptr when absent (linear search).
  const GgufTensorInfo* Find(std::string_view name) const;
};

// Validates the header of a GGUF file given all of its `size` bytes; `path`
// is used in messages only. Exposed for tests and fuzzing.
StatusOr<GgufHeader> ParseGgufHeader(const std::string& path,
                                     const uint8_t* bytes, int64_t size);

// The values of tensor `info` (of `header`, parsed from the same `bytes`) as
// f32, F16 and BF16 converted exactly. Unimplemented for any other type.
StatusOr<std::vector<float>> GgufTensorToF32(const GgufHeader& header,
                                             const GgufTensorInfo& info,
                                             const uint8_t* bytes);

// A GGUF file mapped read-only and validated.
class GgufFile {
 public:
  static StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const GgufHeader& header() const { return header_; }
  const std::string& path() const { return header_.path; }
  // GgufTensorToF32 of this file's `info`.
  StatusOr<std::vector<float>> ReadF32(const GgufTensorInfo& info) const;

 private:
  GgufFile() = default;
  GgufHeader header_;
  uint8_t* map_ = nullptr;
  int64_t map_size_ = 0;
};

}  // namespace loom

#endif  // LOOM_IO_GGUF_H_
