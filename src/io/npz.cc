#include "src/io/npz.h"

#include <zip.h>

#include <algorithm>
#include <filesystem>

namespace loom {

NpzFile::~NpzFile() = default;

StatusOr<std::unique_ptr<NpzFile>> NpzFile::Open(const std::string& path) {
  std::unique_ptr<NpzFile> f(new NpzFile());
  ASSIGN_OR_RETURN(f->zip_, ZipArchive::Open(path, ".npz"));
  f->path_ = path;
  for (const std::string& member : f->zip_->members()) {
    std::string s = member;
    if (s.size() > 4 && s.compare(s.size() - 4, 4, ".npy") == 0)
      s.resize(s.size() - 4);
    f->names_.push_back(s);
  }
  return f;
}

bool NpzFile::Has(const std::string& name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

StatusOr<NpyArray> NpzFile::Read(const std::string& name,
                                 int64_t max_bytes) const {
  const auto it = std::find(names_.begin(), names_.end(), name);
  if (it == names_.end()) {
    std::string list;
    for (const std::string& n : names_) list += (list.empty() ? "" : ", ") + n;
    return NotFoundError(path_ + ": no array '" + name + "' (it holds: " +
                         (list.empty() ? "none" : list) + ")");
  }
  const std::string& member = zip_->members()[it - names_.begin()];
  ASSIGN_OR_RETURN(const std::string bytes, zip_->Read(member, max_bytes));
  return ParseNpy(bytes, path_ + ": " + member);
}

Status WriteNpz(const std::string& path, const std::vector<NpzMember>& members,
                bool deflate) {
  std::vector<std::string> files;  // alive until zip_close has written them
  files.reserve(members.size());
  for (const NpzMember& m : members) {
    ASSIGN_OR_RETURN(std::string bytes,
                     NpyBytes(m.dtype, m.shape, m.data, m.bytes));
    files.push_back(std::move(bytes));
  }
  int error = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
  if (z == nullptr)
    return IoError(path + ": cannot create (libzip error " +
                   std::to_string(error) + ")");
  for (size_t i = 0; i < members.size(); ++i) {
    zip_source_t* src =
        zip_source_buffer(z, files[i].data(), files[i].size(), 0);
    const zip_int64_t index =
        src == nullptr ? -1
                       : zip_file_add(z, (members[i].name + ".npy").c_str(),
                                      src, ZIP_FL_OVERWRITE);
    if (index < 0 || zip_set_file_compression(
                         z, static_cast<zip_uint64_t>(index),
                         deflate ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0) != 0) {
      if (src != nullptr && index < 0) zip_source_free(src);
      const std::string what = zip_strerror(z);
      zip_discard(z);
      return IoError(path + ": " + members[i].name + ": " + what);
    }
  }
  if (zip_close(z) != 0) {
    const std::string what = zip_strerror(z);
    zip_discard(z);
    return IoError(path + ": " + what);
  }
  return Status();
}

}  // namespace loom
