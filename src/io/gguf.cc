#include "src/io/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "src/base/float16.h"
#include "src/io/file_util.h"

namespace loom {
namespace {

using io_internal::UniqueFd;

constexpr int64_t kMagicBytes = 4;
// Magic, version, tensor count, metadata count.
constexpr int64_t kFixedHeaderBytes = 4 + 4 + 8 + 8;
// The fewest bytes a metadata entry takes: key length, a one-byte key, value
// type, a one-byte value.
constexpr int64_t kMinEntryBytes = 8 + 1 + 4 + 1;
// The fewest bytes a tensor info takes: name length, n_dims, type, offset.
constexpr int64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;

// Bytes of one element of a fixed-size metadata type; 0 for string, array
// and unknown types.
int64_t ScalarBytes(uint32_t type) {
  switch (static_cast<GgufType>(type)) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    default:
      return 0;
  }
}

bool KnownType(uint32_t type) {
  return type <= static_cast<uint32_t>(GgufType::kF64);
}

// Bytes per element of the ggml tensor types read here; 0 for the others.
int64_t TensorElementBytes(uint32_t type) {
  switch (type) {
    case kGgmlTypeF32:
      return 4;
    case kGgmlTypeF16:
    case kGgmlTypeBF16:
      return 2;
    default:
      return 0;
  }
}

uint64_t LoadLe(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Reads the file front to back; every read is bounded by the bytes left.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* bytes, int64_t size)
      : path_(path), bytes_(bytes), size_(size) {}

  int64_t pos() const { return pos_; }
  int64_t left() const { return size_ - pos_; }

  // DataLoss unless `n` more bytes are there: "<path>: truncated: WHAT needs
  // N bytes at offset P, M left".
  Status Need(uint64_t n, const std::string& what) const {
    if (n <= static_cast<uint64_t>(left())) return Status();
    return DataLossError(path_ + ": truncated: " + what + " needs " +
                         std::to_string(n) + " bytes at offset " +
                         std::to_string(pos_) + ", " + std::to_string(left()) +
                         " left");
  }
  // DataLoss: WHAT, `count` items of at least `size` bytes each, cannot fit
  // in the bytes left: "<path>: truncated: WHAT: C x S bytes do not fit in
  // the L bytes left at offset P".
  Status TooMany(uint64_t count, int64_t size, const std::string& what) const {
    return DataLossError(path_ + ": truncated: " + what + ": " +
                         std::to_string(count) + " x " + std::to_string(size) +
                         " bytes do not fit in the " + std::to_string(left()) +
                         " bytes left at offset " + std::to_string(pos_));
  }
  Status Skip(uint64_t n, const std::string& what) {
    RETURN_IF_ERROR(Need(n, what));
    pos_ += static_cast<int64_t>(n);
    return Status();
  }
  StatusOr<uint64_t> Uint(int n, const std::string& what) {
    RETURN_IF_ERROR(Need(static_cast<uint64_t>(n), what));
    const uint64_t v = LoadLe(bytes_ + pos_, n);
    pos_ += n;
    return v;
  }
  StatusOr<uint32_t> U32(const std::string& what) {
    ASSIGN_OR_RETURN(const uint64_t v, Uint(4, what));
    return static_cast<uint32_t>(v);
  }
  StatusOr<uint64_t> U64(const std::string& what) { return Uint(8, what); }
  StatusOr<std::string> String(const std::string& what) {
    ASSIGN_OR_RETURN(const uint64_t n, U64(what + " length"));
    RETURN_IF_ERROR(Need(n, what));
    std::string s(reinterpret_cast<const char*>(bytes_ + pos_),
                  static_cast<size_t>(n));
    pos_ += static_cast<int64_t>(n);
    return s;
  }

 private:
  const std::string& path_;
  const uint8_t* bytes_;
  int64_t size_;
  int64_t pos_ = 0;
};

std::string Quoted(const std::string& s) { return "'" + s + "'"; }

// A scalar of fixed-size type `type` (already bounds-checked by the caller).
StatusOr<GgufValue> ReadScalar(Cursor& c, uint32_t type,
                               const std::string& what) {
  GgufValue v;
  v.type = static_cast<GgufType>(type);
  const int n = static_cast<int>(ScalarBytes(type));
  ASSIGN_OR_RETURN(const uint64_t raw, c.Uint(n, what));
  switch (v.type) {
    case GgufType::kI8:
      v.value = int64_t{static_cast<int8_t>(raw)};
      break;
    case GgufType::kI16:
      v.value = int64_t{static_cast<int16_t>(raw)};
      break;
    case GgufType::kI32:
      v.value = int64_t{static_cast<int32_t>(raw)};
      break;
    case GgufType::kI64:
      v.value = static_cast<int64_t>(raw);
      break;
    case GgufType::kF32: {
      float f;
      const uint32_t u = static_cast<uint32_t>(raw);
      std::memcpy(&f, &u, 4);
      v.value = double{f};
      break;
    }
    case GgufType::kF64: {
      double d;
      std::memcpy(&d, &raw, 8);
      v.value = d;
      break;
    }
    case GgufType::kBool:
      v.value = raw != 0;
      break;
    default:  // unsigned
      v.value = raw;
  }
  return v;
}

// An array value after its array type tag: element type, count, elements
// (checked and skipped).
StatusOr<GgufValue> ReadArray(Cursor& c, const std::string& path,
                              const std::string& what) {
  GgufValue v;
  v.type = GgufType::kArray;
  ASSIGN_OR_RETURN(const uint32_t elem, c.U32(what + " element type"));
  if (elem == static_cast<uint32_t>(GgufType::kArray))
    return UnimplementedError(path + ": " + what +
                              ": arrays of arrays are not read");
  if (!KnownType(elem))
    return DataLossError(path + ": " + what + ": unknown element type " +
                         std::to_string(elem) + " (known: 0 to 12)");
  ASSIGN_OR_RETURN(const uint64_t count, c.U64(what + " element count"));
  v.array_type = static_cast<GgufType>(elem);
  v.array_size = count;
  const std::string items = what + " (" + std::to_string(count) + " " +
                            GgufTypeName(elem) + " elements)";
  if (elem != static_cast<uint32_t>(GgufType::kString)) {
    const uint64_t size = static_cast<uint64_t>(ScalarBytes(elem));
    if (count > static_cast<uint64_t>(c.left()) / size)
      return c.TooMany(count, static_cast<int64_t>(size), items);
    RETURN_IF_ERROR(c.Skip(count * size, items));
    return v;
  }
  // Every string takes at least its 8-byte length.
  if (count > static_cast<uint64_t>(c.left()) / 8)
    return c.TooMany(count, 8, items);
  for (uint64_t i = 0; i < count; ++i) {
    const std::string item = what + "[" + std::to_string(i) + "]";
    ASSIGN_OR_RETURN(const uint64_t n, c.U64(item + " length"));
    RETURN_IF_ERROR(c.Skip(n, item));
  }
  return v;
}

StatusOr<GgufValue> ReadValue(Cursor& c, const std::string& path,
                              const std::string& what) {
  ASSIGN_OR_RETURN(const uint32_t type, c.U32(what + " type"));
  if (!KnownType(type))
    return DataLossError(path + ": " + what + ": unknown value type " +
                         std::to_string(type) + " (known: 0 to 12)");
  if (type == static_cast<uint32_t>(GgufType::kArray))
    return ReadArray(c, path, what);
  if (type == static_cast<uint32_t>(GgufType::kString)) {
    GgufValue v;
    v.type = GgufType::kString;
    ASSIGN_OR_RETURN(std::string s, c.String(what));
    v.value = std::move(s);
    return v;
  }
  return ReadScalar(c, type, what);
}

// Magic and version.
Status ReadPreamble(Cursor& c, const std::string& path, GgufHeader* h) {
  RETURN_IF_ERROR(c.Need(kFixedHeaderBytes, "the GGUF header"));
  ASSIGN_OR_RETURN(const uint64_t magic, c.Uint(kMagicBytes, "magic"));
  if (magic != LoadLe(reinterpret_cast<const uint8_t*>("GGUF"), 4)) {
    std::string shown;
    for (int i = 0; i < 4; ++i) {
      const char ch = static_cast<char>(magic >> (8 * i));
      shown += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
    }
    return DataLossError(path + ": not a GGUF file: magic '" + shown +
                         "', expected 'GGUF'");
  }
  ASSIGN_OR_RETURN(h->version, c.U32("version"));
  const std::string v = std::to_string(h->version);
  if (h->version == 2 || h->version == 3) return Status();
  if (h->version == 0) return DataLossError(path + ": GGUF version 0");
  if ((h->version & 0xffffu) == 0)
    return UnimplementedError(path + ": GGUF version " + v +
                              " looks byte-swapped: big-endian GGUF files "
                              "are not read");
  return UnimplementedError(path + ": GGUF version " + v +
                            " is not read (versions 2 and 3 are)");
}

// The metadata entries; general.alignment into h->alignment.
Status ReadMetadata(Cursor& c, const std::string& path, uint64_t count,
                    GgufHeader* h) {
  if (count > static_cast<uint64_t>(c.left()) / kMinEntryBytes)
    return c.TooMany(count, kMinEntryBytes, "metadata count");
  for (uint64_t i = 0; i < count; ++i) {
    const std::string at = "metadata[" + std::to_string(i) + "]";
    ASSIGN_OR_RETURN(std::string key, c.String(at + " key"));
    if (key.empty()) return DataLossError(path + ": " + at + ": empty key");
    const std::string what = "metadata " + Quoted(key);
    if (h->metadata.count(key))
      return DataLossError(path + ": " + what + " appears twice");
    ASSIGN_OR_RETURN(GgufValue value, ReadValue(c, path, what));
    h->metadata.emplace(std::move(key), std::move(value));
  }
  auto it = h->metadata.find("general.alignment");
  if (it == h->metadata.end()) return Status();
  if (it->second.type != GgufType::kU32)
    return DataLossError(path + ": metadata 'general.alignment' has type " +
                         GgufTypeName(static_cast<uint32_t>(it->second.type)) +
                         ", expected uint32");
  const uint64_t a = std::get<uint64_t>(it->second.value);
  if (a == 0 || (a & (a - 1)) != 0)
    return DataLossError(path + ": metadata 'general.alignment' is " +
                         std::to_string(a) + ", not a power of two");
  h->alignment = static_cast<int64_t>(a);
  return Status();
}

// One tensor info (name, dims, type, offset), its element count and, for
// the types read here, its byte count.
StatusOr<GgufTensorInfo> ReadTensorInfo(Cursor& c, const std::string& path,
                                        uint64_t index) {
  GgufTensorInfo t;
  const std::string at = "tensor info " + std::to_string(index);
  ASSIGN_OR_RETURN(t.name, c.String(at + " name"));
  const std::string what = "tensor " + Quoted(t.name);
  ASSIGN_OR_RETURN(const uint32_t n_dims, c.U32(what + " n_dims"));
  if (n_dims > kGgufMaxDims)
    return DataLossError(path + ": " + what + ": n_dims " +
                         std::to_string(n_dims) + " is more than " +
                         std::to_string(kGgufMaxDims));
  uint64_t numel = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    const std::string dim = what + " dims[" + std::to_string(d) + "]";
    ASSIGN_OR_RETURN(const uint64_t n, c.U64(dim));
    const uint64_t limit = std::numeric_limits<int64_t>::max();
    if (n > limit || (n != 0 && numel > limit / n))
      return DataLossError(path + ": " + dim + ": " + std::to_string(n) +
                           " makes the element count overflow");
    t.dims.push_back(static_cast<int64_t>(n));
    numel *= n;
  }
  t.numel = static_cast<int64_t>(numel);
  ASSIGN_OR_RETURN(t.type, c.U32(what + " type"));
  ASSIGN_OR_RETURN(const uint64_t offset, c.U64(what + " offset"));
  if (offset > static_cast<uint64_t>(c.left()) + c.pos())
    return DataLossError(path + ": " + what + ": offset " +
                         std::to_string(offset) + " is past the end of the " +
                         std::to_string(c.pos() + c.left()) + "-byte file");
  t.offset = static_cast<int64_t>(offset);
  const int64_t elem = TensorElementBytes(t.type);
  if (elem > 0) {
    if (t.numel > std::numeric_limits<int64_t>::max() / elem)
      return DataLossError(path + ": " + what + ": " + std::to_string(t.numel) +
                           " elements overflow a byte count");
    t.bytes = t.numel * elem;
  }
  return t;
}

// The tensor infos, the data section's start, and each tensor's data range.
Status ReadTensorInfos(Cursor& c, const std::string& path, uint64_t count,
                       GgufHeader* h) {
  if (count > static_cast<uint64_t>(c.left()) / kMinTensorInfoBytes)
    return c.TooMany(count, kMinTensorInfoBytes, "tensor count");
  std::set<std::string> names;
  for (uint64_t i = 0; i < count; ++i) {
    ASSIGN_OR_RETURN(GgufTensorInfo t, ReadTensorInfo(c, path, i));
    if (!names.insert(t.name).second)
      return DataLossError(path + ": tensor " + Quoted(t.name) +
                           " appears twice");
    h->tensors.push_back(std::move(t));
  }
  const int64_t a = h->alignment;
  // pos <= file size < 2^62 here, so this cannot overflow.
  h->data_start = (c.pos() + a - 1) / a * a;
  if (count == 0) return Status();
  if (h->data_start > h->file_size)
    return DataLossError(path + ": the data section would start at byte " +
                         std::to_string(h->data_start) + ", past the end of " +
                         "the " + std::to_string(h->file_size) + "-byte file");
  const int64_t data_size = h->file_size - h->data_start;
  for (const GgufTensorInfo& t : h->tensors) {
    const std::string what = path + ": tensor " + Quoted(t.name);
    if (t.offset % a != 0)
      return DataLossError(what + ": offset " + std::to_string(t.offset) +
                           " is not a multiple of the alignment " +
                           std::to_string(a));
    if (t.bytes < 0) continue;  // size unknown here
    if (t.offset > data_size || t.bytes > data_size - t.offset)
      return DataLossError(what + ": data [" + std::to_string(t.offset) +
                           ", +" + std::to_string(t.bytes) +
                           ") is outside the data section of " +
                           std::to_string(data_size) + " bytes");
  }
  return Status();
}

}  // namespace

std::string GgufTypeName(uint32_t type) {
  static const char* const kNames[] = {
      "uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
      "bool",  "string", "array",  "uint64", "int64",  "float64"};
  if (KnownType(type)) return kNames[type];
  return "type " + std::to_string(type);
}

const GgufTensorInfo* GgufHeader::Find(std::string_view name) const {
  for (const GgufTensorInfo& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

StatusOr<GgufHeader> ParseGgufHeader(const std::string& path,
                                     const uint8_t* bytes, int64_t size) {
  GgufHeader h;
  h.path = path;
  h.file_size = size;
  Cursor c(path, bytes, size);
  RETURN_IF_ERROR(ReadPreamble(c, path, &h));
  ASSIGN_OR_RETURN(const uint64_t n_tensors, c.U64("tensor count"));
  ASSIGN_OR_RETURN(const uint64_t n_kv, c.U64("metadata count"));
  RETURN_IF_ERROR(ReadMetadata(c, path, n_kv, &h));
  RETURN_IF_ERROR(ReadTensorInfos(c, path, n_tensors, &h));
  return h;
}

StatusOr<std::vector<float>> GgufTensorToF32(const GgufHeader& header,
                                             const GgufTensorInfo& info,
                                             const uint8_t* bytes) {
  const std::string what = header.path + ": tensor " + Quoted(info.name);
  if (info.bytes < 0 || TensorElementBytes(info.type) == 0)
    return UnimplementedError(what + " has ggml type " +
                              std::to_string(info.type) +
                              "; only F32 (0), F16 (1) and BF16 (30) are read");
  const int64_t data_size = header.file_size - header.data_start;
  if (info.offset < 0 || info.offset > data_size ||
      info.bytes > data_size - info.offset)
    return InvalidArgumentError(what + " is not a tensor of this header");
  const uint8_t* p = bytes + header.data_start + info.offset;
  std::vector<float> out(static_cast<size_t>(info.numel));
  for (size_t i = 0; i < out.size(); ++i) {
    if (info.type == kGgmlTypeF32) {
      const uint32_t u = static_cast<uint32_t>(LoadLe(p + 4 * i, 4));
      std::memcpy(&out[i], &u, 4);
    } else {
      const uint16_t u = static_cast<uint16_t>(LoadLe(p + 2 * i, 2));
      out[i] = info.type == kGgmlTypeF16 ? F16ToF32(u) : Bf16ToF32(u);
    }
  }
  return out;
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(UniqueFd fd, io_internal::OpenFile(path, O_RDONLY));
  ASSIGN_OR_RETURN(const int64_t size,
                   io_internal::RegularFileSize(fd.get(), path));
  if (size < kFixedHeaderBytes)
    return DataLossError(path + ": truncated: " + std::to_string(size) +
                         " bytes, a GGUF header needs " +
                         std::to_string(kFixedHeaderBytes));
  void* map = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE,
                     fd.get(), 0);
  if (map == MAP_FAILED) return io_internal::ErrnoStatus(path, "mmap", errno);
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->map_ = static_cast<uint8_t*>(map);
  f->map_size_ = size;
  ASSIGN_OR_RETURN(f->header_, ParseGgufHeader(path, f->map_, size));
  return f;
}

GgufFile::~GgufFile() {
  if (map_) ::munmap(map_, static_cast<size_t>(map_size_));
}

StatusOr<std::vector<float>> GgufFile::ReadF32(
    const GgufTensorInfo& info) const {
  return GgufTensorToF32(header_, info, map_);
}

}  // namespace loom
