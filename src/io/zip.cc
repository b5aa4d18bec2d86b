#include "src/io/zip.h"

#include <zip.h>

#include <algorithm>
#include <filesystem>

namespace loom {

struct ZipArchive::Handle {
  zip_t* archive = nullptr;
  ~Handle() {
    if (archive != nullptr) zip_discard(archive);
  }
};

ZipArchive::~ZipArchive() = default;

StatusOr<std::unique_ptr<ZipArchive>> ZipArchive::Open(
    const std::string& path, const std::string& kind) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return NotFoundError(path + ": no such file");
  int error = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_RDONLY, &error);
  if (z == nullptr) {
    zip_error_t e;
    zip_error_init_with_code(&e, error);
    const std::string what = zip_error_strerror(&e);
    zip_error_fini(&e);
    return DataLossError(path + ": not a readable " + kind +
                         " (zip) archive: " + what);
  }
  std::unique_ptr<ZipArchive> a(new ZipArchive());
  a->path_ = path;
  a->zip_ = std::make_unique<Handle>();
  a->zip_->archive = z;
  const zip_int64_t n = zip_get_num_entries(z, 0);
  for (zip_int64_t i = 0; i < n; ++i) {
    const char* name = zip_get_name(z, static_cast<zip_uint64_t>(i), 0);
    a->members_.push_back(name != nullptr ? name : "");
  }
  return a;
}

bool ZipArchive::Has(const std::string& member) const {
  return std::find(members_.begin(), members_.end(), member) != members_.end();
}

StatusOr<std::string> ZipArchive::Read(const std::string& member,
                                       int64_t max_bytes) const {
  const auto it = std::find(members_.begin(), members_.end(), member);
  const std::string where = path_ + ": " + member;
  if (it == members_.end()) return NotFoundError(where + ": no such member");
  const auto index = static_cast<zip_uint64_t>(it - members_.begin());
  zip_stat_t st;
  zip_stat_init(&st);
  if (zip_stat_index(zip_->archive, index, 0, &st) != 0 ||
      (st.valid & ZIP_STAT_SIZE) == 0)
    return DataLossError(where + ": cannot read its size");
  if (st.size > static_cast<zip_uint64_t>(max_bytes))
    return DataLossError(where + ": " + std::to_string(st.size) +
                         " bytes, more than " + std::to_string(max_bytes));
  zip_file_t* file = zip_fopen_index(zip_->archive, index, 0);
  if (file == nullptr)
    return DataLossError(where + ": " + zip_strerror(zip_->archive));
  // The size field is the archive's claim, not a fact: the buffer starts
  // at what the archive file can hold (a stored member's exact size) and
  // grows, doubling, with the bytes actually inflated, so a member that
  // claims gigabytes over a few bytes costs what it really holds.
  std::error_code ec;
  const auto file_bytes =
      static_cast<zip_uint64_t>(std::filesystem::file_size(path_, ec));
  zip_uint64_t first = zip_uint64_t{1} << 20;
  if (!ec && (st.valid & ZIP_STAT_COMP_SIZE) != 0)
    first = std::max(first, std::min(st.comp_size, file_bytes));
  std::string bytes;
  zip_uint64_t done = 0;
  while (done < st.size) {
    if (done == bytes.size())
      bytes.resize(
          static_cast<size_t>(std::min(st.size, std::max(first, 2 * done))));
    const zip_int64_t got =
        zip_fread(file, bytes.data() + done, bytes.size() - done);
    if (got <= 0) break;
    done += static_cast<zip_uint64_t>(got);
  }
  const std::string error = done < st.size ? zip_file_strerror(file) : "";
  zip_fclose(file);
  if (done < st.size)
    return DataLossError(where + ": read " + std::to_string(done) + " of " +
                         std::to_string(st.size) + " bytes: " + error);
  return bytes;
}

}  // namespace loom
