#include "src/io/npy.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <utility>

#include "src/core/tensor.h"
#include "src/io/file_util.h"

namespace loom {
namespace {

using io_internal::UniqueFd;

constexpr char kMagic[] = "\x93NUMPY";  // 6 bytes
constexpr int64_t kAlign = 64;
constexpr int64_t kMaxHeaderBytes = 1 << 20;

struct DescrEntry {
  DType dtype;
  std::string_view descr;
};
constexpr std::array<DescrEntry, 10> kDescrs = {{
    {DType::kF32, "<f4"},
    {DType::kBF16, "<u2"},
    {DType::kF16, "<f2"},
    {DType::kF64, "<f8"},
    {DType::kI64, "<i8"},
    {DType::kI32, "<i4"},
    {DType::kI16, "<i2"},
    {DType::kI8, "|i1"},
    {DType::kU8, "|u1"},
    {DType::kBool, "|b1"},
}};

std::optional<DType> DTypeFromDescr(std::string_view descr) {
  for (const auto& e : kDescrs) {
    if (e.descr == descr) return e.dtype;
    // Single-byte types may be written with '<' or '=' as well.
    if (descr.size() == 3 && e.descr[0] == '|' &&
        (descr[0] == '<' || descr[0] == '=') &&
        descr.substr(1) == e.descr.substr(1)) {
      return e.dtype;
    }
  }
  return std::nullopt;
}

int PrefixBytes(int major) { return major == 1 ? 10 : 12; }

std::string DictText(const std::string& descr, int64_t rows,
                     const std::vector<int64_t>& row_shape) {
  std::string dims = std::to_string(rows);
  if (row_shape.empty()) dims += ",";
  for (int64_t d : row_shape) dims += ", " + std::to_string(d);
  return "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" +
         dims + "), }";
}

// The full header (prefix + dict + padding + '\n') of exactly `total` bytes,
// or an empty string if the dict does not fit.
std::string RenderHeader(int major, const std::string& descr, int64_t rows,
                         const std::vector<int64_t>& row_shape, int64_t total) {
  const std::string dict = DictText(descr, rows, row_shape);
  const int64_t prefix = PrefixBytes(major);
  const int64_t header_len = total - prefix;
  if (static_cast<int64_t>(dict.size()) + 1 > header_len) return {};
  std::string out(kMagic, 6);
  out += static_cast<char>(major);
  out += '\0';
  for (int i = 0; i < prefix - 8; ++i)
    out += static_cast<char>((static_cast<uint64_t>(header_len) >> (8 * i)) &
                             0xff);
  out += dict;
  out.append(static_cast<size_t>(header_len) - dict.size() - 1, ' ');
  out += '\n';
  return out;
}

// Bytes the header needs for any row count up to kNpyMaxRows, 64-aligned.
int64_t HeaderCapacity(int major, const std::string& descr,
                       const std::vector<int64_t>& row_shape) {
  int64_t need =
      PrefixBytes(major) +
      static_cast<int64_t>(DictText(descr, kNpyMaxRows, row_shape).size()) + 1;
  return (need + kAlign - 1) / kAlign * kAlign;
}

// A minimal parser for the header's Python dict literal.
class DictParser {
 public:
  DictParser(std::string_view text, const std::string& path)
      : s_(text), path_(path) {}

  Status Parse(NpyHeader* h) {
    bool have_descr = false, have_order = false, have_shape = false;
    SkipSpace();
    if (!Eat('{')) return Error("expected '{'");
    while (true) {
      SkipSpace();
      if (Eat('}')) break;
      std::string key;
      RETURN_IF_ERROR(String(&key));
      SkipSpace();
      if (!Eat(':')) return Error("expected ':' after '" + key + "'");
      SkipSpace();
      if (key == "descr") {
        if (Peek() != '\'' && Peek() != '"')
          return Error(
              "descr is not a string (structured dtypes are not supported)");
        RETURN_IF_ERROR(String(&h->descr));
        have_descr = true;
      } else if (key == "fortran_order") {
        if (Word("True")) {
          h->fortran_order = true;
        } else if (Word("False")) {
          h->fortran_order = false;
        } else {
          return Error("fortran_order is not True or False");
        }
        have_order = true;
      } else if (key == "shape") {
        RETURN_IF_ERROR(Tuple(&h->shape));
        have_shape = true;
      } else {
        return Error("unexpected key '" + key + "'");
      }
      SkipSpace();
      if (Eat(',')) continue;
      SkipSpace();
      if (Eat('}')) break;
      return Error("expected ',' or '}'");
    }
    SkipSpace();
    if (pos_ != s_.size()) return Error("trailing characters after the dict");
    if (!have_descr || !have_order || !have_shape)
      return Error("missing one of 'descr', 'fortran_order', 'shape'");
    return Status::Ok();
  }

 private:
  Status Error(const std::string& what) const {
    return DataLossError(fmt::format(
        "{}: npy header: {} at offset {} in \"{}\"", path_, what, pos_, s_));
  }
  char Peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  bool Eat(char c) {
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }
  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' ||
                                s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  bool Word(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }
  Status String(std::string* out) {
    char q = Peek();
    if (q != '\'' && q != '"') return Error("expected a quoted string");
    ++pos_;
    size_t end = s_.find(q, pos_);
    if (end == std::string_view::npos) return Error("unterminated string");
    *out = std::string(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return Status::Ok();
  }
  Status Tuple(std::vector<int64_t>* out) {
    if (!Eat('(')) return Error("shape is not a tuple");
    while (true) {
      SkipSpace();
      if (Eat(')')) return Status::Ok();
      size_t start = pos_;
      int64_t v = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        if (__builtin_mul_overflow(v, 10, &v) ||
            __builtin_add_overflow(v, s_[pos_] - '0', &v)) {
          return Error("shape dimension too large");
        }
        ++pos_;
      }
      if (pos_ == start) return Error("shape has a non-integer dimension");
      if (Peek() == 'L') ++pos_;  // Python 2 long suffix
      out->push_back(v);
      SkipSpace();
      if (Eat(',')) continue;
      if (Eat(')')) return Status::Ok();
      return Error("expected ',' or ')' in shape");
    }
  }

  std::string_view s_;
  const std::string& path_;
  size_t pos_ = 0;
};

// The magic, version and header length of a file's first `have` (<= 12)
// bytes, of a file of `size` bytes; sets h->major/minor and *plen.
Status ParsePrefix(const uint8_t* prefix, int64_t size, const std::string& path,
                   NpyHeader* h, int* plen, uint64_t* header_len) {
  if (size < 10) {
    return DataLossError(fmt::format(
        "{}: file is {} bytes, too short for an npy header", path, size));
  }
  if (std::memcmp(prefix, kMagic, 6) != 0) {
    return DataLossError(fmt::format("{}: not an npy file (bad magic)", path));
  }
  h->major = prefix[6];
  h->minor = prefix[7];
  if (h->major < 1 || h->major > 3) {
    return UnimplementedError(
        fmt::format("{}: npy format version {}.{} is not supported", path,
                    h->major, h->minor));
  }
  *plen = PrefixBytes(h->major);
  *header_len = 0;
  for (int i = *plen - 9; i >= 0; --i)
    *header_len = (*header_len << 8) | prefix[8 + i];
  if (*header_len > static_cast<uint64_t>(kMaxHeaderBytes) ||
      static_cast<int64_t>(*plen + *header_len) > size) {
    return DataLossError(fmt::format(
        "{}: npy header length {} runs past the end of the file ({} bytes)",
        path, *header_len, size));
  }
  return Status::Ok();
}

// The header's dict `text` (after the prefix of `plen` bytes) into `h`.
Status ParseDictText(const std::string& text, int plen, const std::string& path,
                     NpyHeader* h) {
  if (text.empty() || text.back() != '\n') {
    return DataLossError(
        fmt::format("{}: npy header does not end with a newline", path));
  }
  DictParser parser(text, path);
  RETURN_IF_ERROR(parser.Parse(h));
  std::optional<DType> dtype = DTypeFromDescr(h->descr);
  if (!dtype) {
    return UnimplementedError(
        fmt::format("{}: npy dtype '{}' is not supported", path, h->descr));
  }
  h->dtype = *dtype;
  h->data_offset = plen + static_cast<int64_t>(text.size());
  int64_t bytes = DTypeSize(h->dtype);
  for (int64_t d : h->shape) {
    if (__builtin_mul_overflow(bytes, d, &bytes)) {
      return DataLossError(
          fmt::format("{}: npy shape overflows 64-bit byte counts", path));
    }
  }
  return Status::Ok();
}

StatusOr<NpyHeader> ReadHeaderFromFd(int fd, const std::string& path) {
  ASSIGN_OR_RETURN(int64_t size, io_internal::RegularFileSize(fd, path));
  uint8_t prefix[12] = {};
  if (size >= 10)
    RETURN_IF_ERROR(io_internal::PreadFully(fd, path, prefix,
                                            std::min<int64_t>(size, 12), 0));
  NpyHeader h;
  int plen = 0;
  uint64_t header_len = 0;
  RETURN_IF_ERROR(ParsePrefix(prefix, size, path, &h, &plen, &header_len));
  std::string text(header_len, '\0');
  RETURN_IF_ERROR(io_internal::PreadFully(
      fd, path, text.data(), static_cast<int64_t>(header_len), plen));
  RETURN_IF_ERROR(ParseDictText(text, plen, path, &h));
  return h;
}

Status LockFile(int fd, const std::string& path) {
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return FailedPreconditionError(
          fmt::format("{}: another NpyWriter has this file open", path));
    }
    return io_internal::ErrnoStatus(path, "flock", errno);
  }
  return Status::Ok();
}

// The file's size, checked to hold `rows` rows of `row_bytes` after the
// header; DataLoss if it is shorter.
StatusOr<int64_t> CheckDataBytes(int fd, const std::string& path,
                                 int64_t data_offset, int64_t rows,
                                 int64_t row_bytes) {
  ASSIGN_OR_RETURN(int64_t size, io_internal::RegularFileSize(fd, path));
  if (size < data_offset + rows * row_bytes) {
    return DataLossError(
        fmt::format("{}: header commits {} rows ({} bytes of data), but the "
                    "file has only {}",
                    path, rows, rows * row_bytes, size - data_offset));
  }
  return size;
}

}  // namespace

std::optional<std::string> NpyDescr(DType dtype) {
  for (const auto& e : kDescrs)
    if (e.dtype == dtype) return std::string(e.descr);
  return std::nullopt;
}

StatusOr<std::string> NpyBytes(DType dtype, const std::vector<int64_t>& shape,
                               const void* data, int64_t bytes) {
  const std::optional<std::string> descr = NpyDescr(dtype);
  if (!descr)
    return InvalidArgumentError(
        fmt::format("npy: dtype {} cannot be stored", DTypeName(dtype)));
  if (shape.empty())
    return InvalidArgumentError("npy: an array needs at least one dimension");
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0)
      return InvalidArgumentError(fmt::format("npy: negative dimension {}", d));
    numel *= d;
  }
  if (bytes != numel * DTypeSize(dtype))
    return InvalidArgumentError(
        fmt::format("npy: {} bytes of data for {} values of {}", bytes, numel,
                    DTypeName(dtype)));
  const std::vector<int64_t> row_shape(shape.begin() + 1, shape.end());
  const int64_t need =
      PrefixBytes(1) +
      static_cast<int64_t>(DictText(*descr, shape[0], row_shape).size()) + 1;
  std::string out = RenderHeader(1, *descr, shape[0], row_shape,
                                 (need + kAlign - 1) / kAlign * kAlign);
  if (out.empty() || out.size() - PrefixBytes(1) > 0xffff)
    return InvalidArgumentError("npy: the shape does not fit a 1.0 header");
  out.append(static_cast<const char*>(data), static_cast<size_t>(bytes));
  return out;
}

int64_t NpyHeader::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

StatusOr<NpyHeader> ReadNpyHeader(const std::string& path) {
  ASSIGN_OR_RETURN(UniqueFd fd, io_internal::OpenFile(path, O_RDONLY));
  return ReadHeaderFromFd(fd.get(), path);
}

StatusOr<NpyArray> ReadNpy(const std::string& path) {
  ASSIGN_OR_RETURN(UniqueFd fd, io_internal::OpenFile(path, O_RDONLY));
  NpyArray a;
  ASSIGN_OR_RETURN(a.header, ReadHeaderFromFd(fd.get(), path));
  ASSIGN_OR_RETURN(int64_t size, io_internal::RegularFileSize(fd.get(), path));
  const int64_t bytes = a.header.data_bytes();
  if (size - a.header.data_offset < bytes) {
    return DataLossError(
        fmt::format("{}: npy header describes {} data bytes, the file has {}",
                    path, bytes, size - a.header.data_offset));
  }
  a.data.resize(static_cast<size_t>(bytes));
  RETURN_IF_ERROR(io_internal::PreadFully(fd.get(), path, a.data.data(), bytes,
                                          a.header.data_offset));
  return a;
}

StatusOr<NpyArray> ParseNpy(std::string_view bytes, const std::string& name) {
  const int64_t size = static_cast<int64_t>(bytes.size());
  uint8_t prefix[12] = {};
  if (!bytes.empty())
    std::memcpy(prefix, bytes.data(), std::min<size_t>(bytes.size(), 12));
  NpyArray a;
  int plen = 0;
  uint64_t header_len = 0;
  RETURN_IF_ERROR(
      ParsePrefix(prefix, size, name, &a.header, &plen, &header_len));
  RETURN_IF_ERROR(ParseDictText(std::string(bytes.substr(plen, header_len)),
                                plen, name, &a.header));
  const int64_t need = a.header.data_bytes();
  if (size - a.header.data_offset < need) {
    return DataLossError(
        fmt::format("{}: npy header describes {} data bytes, the array has {}",
                    name, need, size - a.header.data_offset));
  }
  a.data.assign(bytes.begin() + a.header.data_offset,
                bytes.begin() + a.header.data_offset + need);
  return a;
}

// ---------------------------------------------------------------- NpyWriter

StatusOr<std::unique_ptr<NpyWriter>> NpyWriter::Create(
    const std::string& path, DType dtype,
    const std::vector<int64_t>& row_shape) {
  std::optional<std::string> descr = NpyDescr(dtype);
  if (!descr) {
    return InvalidArgumentError(
        fmt::format("{}: dtype {} cannot be stored in an npy file", path,
                    DTypeName(dtype)));
  }
  int64_t row_bytes = DTypeSize(dtype);
  for (int64_t d : row_shape) {
    if (d <= 0 || __builtin_mul_overflow(row_bytes, d, &row_bytes)) {
      return InvalidArgumentError(
          fmt::format("{}: row shape has dimension {}: rows must be non-empty "
                      "and fit in 64 bits",
                      path, d));
    }
  }
  std::unique_ptr<NpyWriter> w(new NpyWriter());
  w->path_ = path;
  w->dtype_ = dtype;
  w->row_shape_ = row_shape;
  w->row_bytes_ = row_bytes;
  w->major_ = 1;
  int64_t capacity = HeaderCapacity(1, *descr, row_shape);
  if (capacity - 10 > 0xffff) {
    w->major_ = 2;
    capacity = HeaderCapacity(2, *descr, row_shape);
  }
  w->data_offset_ = capacity;

  // The lock is taken before the rename, so `path` is never seen unlocked.
  ASSIGN_OR_RETURN(
      UniqueFd fd,
      io_internal::ReplaceFileDurably(
          path, [&](int tmp_fd, const std::string& tmp) -> Status {
            RETURN_IF_ERROR(LockFile(tmp_fd, tmp));
            const std::string header =
                RenderHeader(w->major_, *descr, 0, row_shape, capacity);
            LOOM_CHECK(static_cast<int64_t>(header.size()) == capacity);
            return io_internal::PwriteFully(tmp_fd, tmp, header.data(),
                                            capacity, 0);
          }));
  w->fd_ = fd.Release();
  return w;
}

StatusOr<std::unique_ptr<NpyWriter>> NpyWriter::OpenForAppend(
    const std::string& path, std::optional<int64_t> keep_rows) {
  ASSIGN_OR_RETURN(UniqueFd fd, io_internal::OpenFile(path, O_RDWR));
  RETURN_IF_ERROR(LockFile(fd.get(), path));
  ASSIGN_OR_RETURN(NpyHeader h, ReadHeaderFromFd(fd.get(), path));
  if (h.fortran_order) {
    return UnimplementedError(
        fmt::format("{}: cannot append to a Fortran-order npy file", path));
  }
  if (h.shape.empty()) {
    return InvalidArgumentError(
        fmt::format("{}: cannot append rows to a 0-d npy array", path));
  }
  std::unique_ptr<NpyWriter> w(new NpyWriter());
  w->path_ = path;
  w->major_ = h.major;
  w->dtype_ = h.dtype;
  w->row_shape_.assign(h.shape.begin() + 1, h.shape.end());
  w->row_bytes_ = DTypeSize(h.dtype);
  for (int64_t d : w->row_shape_)
    w->row_bytes_ *= d;  // no overflow: checked by the reader
  if (w->row_bytes_ <= 0) {
    return InvalidArgumentError(
        fmt::format("{}: rows of shape {} hold no bytes; cannot append", path,
                    Shape(w->row_shape_).ToString()));
  }
  w->data_offset_ = h.data_offset;
  const std::string descr = *NpyDescr(h.dtype);
  if (RenderHeader(h.major, descr, kNpyMaxRows, w->row_shape_, h.data_offset)
          .empty()) {
    return FailedPreconditionError(
        fmt::format("{}: npy header ({} bytes) has no room for a growing row "
                    "count (not written by NpyWriter?)",
                    path, h.data_offset));
  }
  if (h.shape[0] > kNpyMaxRows) {
    return DataLossError(fmt::format("{}: npy header has {} rows, more than {}",
                                     path, h.shape[0], kNpyMaxRows));
  }
  if (keep_rows && (*keep_rows < 0 || *keep_rows > h.shape[0])) {
    return DataLossError(
        fmt::format("{}: {} rows are committed, cannot resume at row {}", path,
                    h.shape[0], *keep_rows));
  }
  // Checked before anything is written: a failed open changes no byte.
  ASSIGN_OR_RETURN(int64_t size, CheckDataBytes(fd.get(), path, h.data_offset,
                                                keep_rows.value_or(h.shape[0]),
                                                w->row_bytes_));
  w->fd_ = fd.get();
  if (keep_rows && *keep_rows < h.shape[0]) {
    // Roll back rows past the caller's commit point (written after its last
    // durable record); only the header and the file end change.
    Status st = w->WriteHeader(*keep_rows);
    if (st.ok()) st = io_internal::Fdatasync(fd.get(), path);
    if (!st.ok()) {
      w->fd_ = -1;  // `fd` still owns the descriptor
      return st;
    }
    h.shape[0] = *keep_rows;
  }
  w->fd_ = -1;
  w->rows_ = w->committed_rows_ = h.shape[0];
  const int64_t committed_end = h.data_offset + h.data_bytes();
  if (size > committed_end) {
    // Uncommitted rows (or part of one) from an interrupted writer.
    if (::ftruncate(fd.get(), committed_end) != 0)
      return io_internal::ErrnoStatus(path, "ftruncate", errno);
    RETURN_IF_ERROR(io_internal::Fdatasync(fd.get(), path));
  }
  w->fd_ = fd.Release();
  return w;
}

NpyWriter::~NpyWriter() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

Status NpyWriter::Append(const void* data, int64_t bytes) {
  if (fd_ < 0)
    return FailedPreconditionError(
        fmt::format("{}: NpyWriter is closed", path_));
  if (bytes < 0 || bytes % row_bytes_ != 0) {
    return InvalidArgumentError(fmt::format(
        "{}: append of {} bytes is not a whole number of {}-byte rows", path_,
        bytes, row_bytes_));
  }
  const int64_t n = bytes / row_bytes_;
  if (n > kNpyMaxRows - rows_) {
    return OutOfRangeError(
        fmt::format("{}: {} + {} rows exceed the limit of {}", path_, rows_, n,
                    kNpyMaxRows));
  }
  if (n == 0) return Status::Ok();
  const int64_t end = data_offset_ + rows_ * row_bytes_;
  Status s = io_internal::PwriteFully(fd_, path_, data, bytes, end);
  if (!s.ok()) {
    if (::ftruncate(fd_, end) !=
        0) {  // keep the file at whole rows; best effort
      return Status(
          s.code(),
          fmt::format("{} (and truncating back to {} bytes failed: {})",
                      s.message(), end, std::strerror(errno)));
    }
    return s;
  }
  rows_ += n;
  return Status::Ok();
}

Status NpyWriter::WriteHeader(int64_t rows) {
  const std::string header =
      RenderHeader(major_, *NpyDescr(dtype_), rows, row_shape_, data_offset_);
  LOOM_CHECK(static_cast<int64_t>(header.size()) == data_offset_) << path_;
  return io_internal::PwriteFully(fd_, path_, header.data(), data_offset_, 0);
}

Status NpyWriter::Commit() {
  if (fd_ < 0)
    return FailedPreconditionError(
        fmt::format("{}: NpyWriter is closed", path_));
  if (rows_ == committed_rows_) return Status::Ok();
  // 1. The rows reach the disk (with the file size) before any header counts
  // them.
  RETURN_IF_ERROR(io_internal::Fdatasync(fd_, path_));
  // 2. The header, same length, rewritten in place; 3. made durable.
  RETURN_IF_ERROR(WriteHeader(rows_));
  RETURN_IF_ERROR(io_internal::Fdatasync(fd_, path_));
  committed_rows_ = rows_;
  return Status::Ok();
}

Status NpyWriter::Close() {
  if (fd_ < 0)
    return FailedPreconditionError(
        fmt::format("{}: NpyWriter is closed", path_));
  Status s = Commit();
  ::close(fd_);
  fd_ = -1;
  return s;
}

}  // namespace loom
