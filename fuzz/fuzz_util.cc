#include "fuzz/fuzz_util.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace loom::fuzz {
namespace fs = std::filesystem;

namespace {
void RemoveScratch() {
  std::error_code ec;
  fs::remove_all(ScratchDir(), ec);
}
}  // namespace

const std::string& ScratchDir() {
  static const std::string* dir = [] {
    std::error_code ec;
    fs::path base = fs::temp_directory_path(ec);
    if (ec) base = "/tmp";
    auto* d = new std::string(
        (base / ("loom-fuzz-" + std::to_string(getpid()))).string());
    fs::remove_all(*d, ec);
    fs::create_directories(*d, ec);
    if (ec) Fail("cannot create scratch directory " + *d + ": " + ec.message());
    std::atexit(RemoveScratch);
    return d;
  }();
  return *dir;
}

std::string WriteScratch(const std::string& name, std::string_view bytes) {
  const fs::path path = fs::path(ScratchDir()) / name;
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) Fail("cannot write " + path.string());
  return path.string();
}

void CopyDir(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::remove_all(to, ec);
  fs::create_directories(to, ec);
  for (const auto& e : fs::directory_iterator(from, ec)) {
    if (!e.is_regular_file()) continue;
    fs::copy_file(e.path(), fs::path(to) / e.path().filename(),
                  fs::copy_options::overwrite_existing, ec);
    if (ec) Fail("cannot copy " + e.path().string() + ": " + ec.message());
  }
  if (ec) Fail("cannot list " + from + ": " + ec.message());
}

std::string SourcePath(const std::string& relative) {
  return std::string(LOOM_SOURCE_DIR) + "/" + relative;
}

void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

std::vector<std::string_view> Split(std::string_view text, char sep,
                                    size_t max_parts) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t at = text.find(sep);
    if (at == std::string_view::npos) break;
    parts.push_back(text.substr(0, at));
    text.remove_prefix(at + 1);
  }
  parts.push_back(text);
  return parts;
}

ModeAndRest TakeMode(const uint8_t* data, size_t size) {
  ModeAndRest m;
  if (size == 0) return m;
  m.mode = data[0];
  m.rest = std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1);
  return m;
}

}  // namespace loom::fuzz
