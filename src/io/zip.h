// Reading members of a zip archive (libzip): numpy's .npz, torch's zip
// checkpoints. Members are read whole, capped in size; errors name the
// archive and the member.
#ifndef LOOM_IO_ZIP_H_
#define LOOM_IO_ZIP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/base/status.h"

namespace loom {

class ZipArchive {
 public:
  // Opens `path`; NotFound when it is absent, DataLoss naming it ("not a
  // readable <kind> (zip) archive: ...") when it is no zip.
  static StatusOr<std::unique_ptr<ZipArchive>> Open(const std::string& path,
                                                    const std::string& kind);
  ~ZipArchive();
  ZipArchive(const ZipArchive&) = delete;
  ZipArchive& operator=(const ZipArchive&) = delete;

  const std::string& path() const { return path_; }
  // The members' names, in archive order.
  const std::vector<std::string>& members() const { return members_; }
  bool Has(const std::string& member) const;
  // Member `member` read whole; NotFound when absent, DataLoss naming it
  // when it cannot be read or holds more than `max_bytes`.
  StatusOr<std::string> Read(const std::string& member,
                             int64_t max_bytes) const;

 private:
  ZipArchive() = default;
  struct Handle;
  std::string path_;
  std::unique_ptr<Handle> zip_;
  std::vector<std::string> members_;
};

}  // namespace loom

#endif  // LOOM_IO_ZIP_H_
