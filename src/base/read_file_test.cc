#include "src/base/read_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace loom {
namespace {

namespace fs = std::filesystem;

TEST(ReadFileTest, ReadsTheBytesOrNamesThePathAndTheOsError) {
  const fs::path dir = fs::temp_directory_path() /
                       ("loom_read_file_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "sub");
  const std::string bytes("a\0b\n", 4);
  std::ofstream((dir / "f").string(), std::ios::binary) << bytes;
  std::ofstream((dir / "empty").string(), std::ios::binary).close();
  EXPECT_EQ(*ReadFileToString((dir / "f").string()), bytes);
  EXPECT_EQ(*ReadFileToString((dir / "empty").string()), "");

  const std::string missing = (dir / "missing").string();
  const Status absent = ReadFileToString(missing).status();
  EXPECT_EQ(absent.code(), StatusCode::kNotFound);
  EXPECT_EQ(absent.message(), missing + ": open: " + std::strerror(ENOENT));
  // A directory opens, then fails to read: an error, not an empty text.
  const std::string sub = (dir / "sub").string();
  const Status directory = ReadFileToString(sub).status();
  EXPECT_EQ(directory.code(), StatusCode::kIoError);
  EXPECT_EQ(directory.message(), sub + ": read: " + std::strerror(EISDIR));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom
