#include "src/io/safetensors_writer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "src/io/file_util.h"

namespace loom {
namespace {

using io_internal::UniqueFd;

// Writes one tensor's bytes through a shared mapping of its page range.
Status FillMapped(int fd, const std::string& tmp, const std::string& name,
                  int64_t file_offset, int64_t bytes,
                  const SafetensorsWriter::FillFn& fill) {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  const int64_t map_begin = file_offset / page * page;
  const int64_t skew = file_offset - map_begin;
  const size_t map_len = static_cast<size_t>(skew + bytes);
  void* map = ::mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                     map_begin);
  if (map == MAP_FAILED) {
    // File systems without shared writable mappings: fill a buffer instead.
    std::vector<uint8_t> buf(static_cast<size_t>(bytes));
    Status s = fill(buf.data(), bytes);
    if (!s.ok()) return s.WithContext(fmt::format("{}: tensor {}", tmp, name));
    return io_internal::PwriteFully(fd, tmp, buf.data(), bytes, file_offset);
  }
  ::madvise(map, map_len, MADV_SEQUENTIAL);
  Status s = fill(static_cast<uint8_t*>(map) + skew, bytes);
  ::munmap(map, map_len);
  if (!s.ok()) return s.WithContext(fmt::format("{}: tensor {}", tmp, name));
  return Status::Ok();
}

// Reserves `total` bytes for the file (a full disk fails here, not as SIGBUS
// while filling a mapping).
Status Reserve(int fd, const std::string& tmp, int64_t total) {
  if (total <= 0) return Status::Ok();
  const int err = ::posix_fallocate(fd, 0, total);
  if (err != 0 && err != EOPNOTSUPP && err != EINVAL) {
    return io_internal::ErrnoStatus(
        tmp, fmt::format("reserving {} bytes", total).c_str(), err);
  }
  if (err != 0 && ::ftruncate(fd, total) != 0)
    return io_internal::ErrnoStatus(tmp, "ftruncate", errno);
  return Status::Ok();
}

}  // namespace

void SafetensorsWriter::SetMetadata(const std::string& key,
                                    const std::string& value) {
  metadata_[key] = value;
}

Status SafetensorsWriter::Check(const std::string& name, DType dtype,
                                const Shape& shape, int64_t* bytes) const {
  if (name.empty())
    return InvalidArgumentError("safetensors writer: empty tensor name");
  if (name == "__metadata__") {
    return InvalidArgumentError(
        "safetensors writer: \"__metadata__\" is reserved, not a tensor name");
  }
  if (names_.count(name))
    return InvalidArgumentError(
        fmt::format("safetensors writer: tensor {} added twice", name));
  int64_t n = DTypeSize(dtype);
  for (int64_t d : shape.dims()) {
    if (d < 0) {
      return InvalidArgumentError(fmt::format(
          "safetensors writer: tensor {}: shape {} has a negative dimension",
          name, shape.ToString()));
    }
    if (__builtin_mul_overflow(n, d, &n)) {
      return InvalidArgumentError(
          fmt::format("safetensors writer: tensor {}: shape {} x {} overflows",
                      name, shape.ToString(), DTypeName(dtype)));
    }
  }
  *bytes = n;
  return Status::Ok();
}

Status SafetensorsWriter::Add(const std::string& name, DType dtype,
                              const Shape& shape, const void* data,
                              int64_t bytes) {
  int64_t expected = 0;
  RETURN_IF_ERROR(Check(name, dtype, shape, &expected));
  if (bytes != expected) {
    return InvalidArgumentError(fmt::format(
        "safetensors writer: tensor {}: shape {} x {} = {} bytes, but {} given",
        name, shape.ToString(), DTypeName(dtype), expected, bytes));
  }
  if (bytes > 0 && data == nullptr) {
    return InvalidArgumentError(
        fmt::format("safetensors writer: tensor {}: null data", name));
  }
  Pending p;
  p.name = name;
  p.dtype = dtype;
  p.shape = shape;
  p.bytes = bytes;
  p.data = data;
  names_.emplace(name, tensors_.size());
  tensors_.push_back(std::move(p));
  return Status::Ok();
}

Status SafetensorsWriter::Add(const std::string& name, const TensorView& view) {
  return Add(name, view.dtype, view.shape, view.data, view.bytes());
}

Status SafetensorsWriter::AddOwned(const std::string& name, DType dtype,
                                   const Shape& shape,
                                   std::vector<uint8_t> bytes) {
  RETURN_IF_ERROR(Add(name, dtype, shape, bytes.data(),
                      static_cast<int64_t>(bytes.size())));
  Pending& p = tensors_.back();
  p.owned = std::move(bytes);  // the vector's buffer does not move
  p.data = p.owned.data();
  return Status::Ok();
}

Status SafetensorsWriter::AddFill(const std::string& name, DType dtype,
                                  const Shape& shape, FillFn fill) {
  int64_t bytes = 0;
  RETURN_IF_ERROR(Check(name, dtype, shape, &bytes));
  if (!fill)
    return InvalidArgumentError(fmt::format(
        "safetensors writer: tensor {}: empty fill callback", name));
  Pending p;
  p.name = name;
  p.dtype = dtype;
  p.shape = shape;
  p.bytes = bytes;
  p.fill = std::move(fill);
  names_.emplace(name, tensors_.size());
  tensors_.push_back(std::move(p));
  return Status::Ok();
}

int64_t SafetensorsWriter::data_bytes() const {
  int64_t total = 0;
  for (const Pending& p : tensors_) total += p.bytes;
  return total;
}

StatusOr<SafetensorsWriter::Layout> SafetensorsWriter::Plan(
    const std::string& what) const {
  // Layout: element size descending, then name (what the HF library does).
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    int64_t sa = DTypeSize(tensors_[a].dtype),
            sb = DTypeSize(tensors_[b].dtype);
    if (sa != sb) return sa > sb;
    return tensors_[a].name < tensors_[b].name;
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  Layout out;
  int64_t offset = 0;
  for (size_t i : order) {
    const Pending& p = tensors_[i];
    out.placed.push_back({i, offset});
    header[p.name] = {{"dtype", std::string(DTypeName(p.dtype))},
                      {"shape", p.shape.dims()},
                      {"data_offsets", {offset, offset + p.bytes}}};
    offset += p.bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (
      const nlohmann::ordered_json::exception& e) {  // invalid UTF-8 in a name
    return InvalidArgumentError(
        fmt::format("{}: cannot encode header: {}", what, e.what()));
  }
  while (text.size() % 8 != 0) text += ' ';
  out.data_start = 8 + static_cast<int64_t>(text.size());
  out.total = out.data_start + offset;
  out.prefix.assign(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i)
    out.prefix[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.prefix += text;
  return out;
}

StatusOr<std::string> SafetensorsWriter::Serialize() const {
  ASSIGN_OR_RETURN(Layout layout, Plan("safetensors bytes"));
  std::string out = std::move(layout.prefix);
  out.resize(static_cast<size_t>(layout.total), '\0');
  for (const auto& [tensor, begin] : layout.placed) {
    const Pending& p = tensors_[tensor];
    if (p.bytes == 0) continue;
    uint8_t* dst =
        reinterpret_cast<uint8_t*>(out.data()) + layout.data_start + begin;
    if (p.fill) {
      Status s = p.fill(dst, p.bytes);
      if (!s.ok()) return s.WithContext(fmt::format("tensor {}", p.name));
    } else {
      std::memcpy(dst, p.data, static_cast<size_t>(p.bytes));
    }
  }
  return out;
}

Status SafetensorsWriter::Write(const std::string& path) const {
  ASSIGN_OR_RETURN(Layout layout, Plan(path));
  const std::string& prefix = layout.prefix;
  const int64_t data_start = layout.data_start, total = layout.total;
  return io_internal::ReplaceFileDurably(
             path,
             [&](int fd, const std::string& tmp) -> Status {
               RETURN_IF_ERROR(Reserve(fd, tmp, total));
               RETURN_IF_ERROR(io_internal::PwriteFully(
                   fd, tmp, prefix.data(), static_cast<int64_t>(prefix.size()),
                   0));
               for (const auto& [tensor, begin] : layout.placed) {
                 const Pending& p = tensors_[tensor];
                 if (p.bytes == 0) continue;
                 RETURN_IF_ERROR(
                     p.fill ? FillMapped(fd, tmp, p.name, data_start + begin,
                                         p.bytes, p.fill)
                            : io_internal::PwriteFully(fd, tmp, p.data, p.bytes,
                                                       data_start + begin));
               }
               return Status::Ok();
             })
      .status();
}

}  // namespace loom
