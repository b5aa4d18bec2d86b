// .npz archives (numpy.savez / savez_compressed): a zip of NAME.npy members,
// stored or deflated, read with libzip. Gemma Scope's params.npz.
#ifndef LOOM_IO_NPZ_H_
#define LOOM_IO_NPZ_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/io/npy.h"
#include "src/io/zip.h"

namespace loom {

class NpzFile {
 public:
  // Opens `path`; DataLoss naming it when it is not a zip archive, NotFound
  // when it is absent.
  static StatusOr<std::unique_ptr<NpzFile>> Open(const std::string& path);
  ~NpzFile();
  NpzFile(const NpzFile&) = delete;
  NpzFile& operator=(const NpzFile&) = delete;

  const std::string& path() const { return path_; }
  // The arrays' names (the members' names without ".npy"), in archive order.
  const std::vector<std::string>& names() const { return names_; }
  bool Has(const std::string& name) const;
  // Array `name` read whole (its .npy parsed: ParseNpy). NotFound listing
  // the names when absent; DataLoss naming the member when it cannot be
  // read or holds more than `max_bytes`.
  StatusOr<NpyArray> Read(const std::string& name,
                          int64_t max_bytes = int64_t{1} << 36) const;

 private:
  NpzFile() = default;
  std::string path_;
  std::unique_ptr<ZipArchive> zip_;
  std::vector<std::string> names_;  // members without ".npy", in order
};

// One array of WriteNpz: `bytes` bytes of `dtype` x `shape` at `data`.
struct NpzMember {
  std::string name;  // without ".npy"
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
  int64_t bytes;
};
// Writes `members` as an .npz at `path` (each a .npy as NpyBytes makes it),
// deflated (numpy.savez_compressed) or stored (numpy.savez). For tests and
// tools that build archives; Loom itself only reads them.
Status WriteNpz(const std::string& path, const std::vector<NpzMember>& members,
                bool deflate);

}  // namespace loom

#endif  // LOOM_IO_NPZ_H_
