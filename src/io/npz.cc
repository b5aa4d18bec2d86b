#include "src/io/npz.h"

#include <zip.h>

#include <algorithm>
#include <filesystem>

namespace loom {

struct NpzFile::Zip {
  zip_t* archive = nullptr;
  ~Zip() {
    if (archive != nullptr) zip_discard(archive);
  }
};

NpzFile::~NpzFile() = default;

StatusOr<std::unique_ptr<NpzFile>> NpzFile::Open(const std::string& path) {
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
    return DataLossError(path + ": not a readable .npz (zip) archive: " + what);
  }
  std::unique_ptr<NpzFile> f(new NpzFile());
  f->path_ = path;
  f->zip_ = std::make_unique<Zip>();
  f->zip_->archive = z;
  const zip_int64_t n = zip_get_num_entries(z, 0);
  for (zip_int64_t i = 0; i < n; ++i) {
    const char* name = zip_get_name(z, static_cast<zip_uint64_t>(i), 0);
    if (name == nullptr) continue;
    std::string s(name);
    if (s.size() > 4 && s.compare(s.size() - 4, 4, ".npy") == 0)
      s.resize(s.size() - 4);
    f->names_.push_back(s);
    f->index_.push_back(i);
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
  const zip_uint64_t index =
      static_cast<zip_uint64_t>(index_[it - names_.begin()]);
  const std::string member = path_ + ": " + name + ".npy";
  zip_stat_t st;
  zip_stat_init(&st);
  if (zip_stat_index(zip_->archive, index, 0, &st) != 0 ||
      (st.valid & ZIP_STAT_SIZE) == 0)
    return DataLossError(member + ": cannot read its size");
  if (st.size > static_cast<zip_uint64_t>(max_bytes))
    return DataLossError(member + ": " + std::to_string(st.size) +
                         " bytes, more than " + std::to_string(max_bytes));
  zip_file_t* file = zip_fopen_index(zip_->archive, index, 0);
  if (file == nullptr)
    return DataLossError(member + ": " + zip_strerror(zip_->archive));
  std::string bytes(static_cast<size_t>(st.size), '\0');
  zip_uint64_t done = 0;
  while (done < st.size) {
    const zip_int64_t got =
        zip_fread(file, bytes.data() + done, st.size - done);
    if (got <= 0) break;
    done += static_cast<zip_uint64_t>(got);
  }
  const std::string error = done < st.size ? zip_file_strerror(file) : "";
  zip_fclose(file);
  if (done < st.size)
    return DataLossError(member + ": read " + std::to_string(done) + " of " +
                         std::to_string(st.size) + " bytes: " + error);
  return ParseNpy(bytes, member);
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
