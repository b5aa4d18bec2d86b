// The driver of a harness in builds without libFuzzer: runs
// LLVMFuzzerTestOneInput once on every file named on the command line or
// found (recursively) in a directory named there; arguments starting with
// '-' (libFuzzer flags such as -runs=0) are ignored. Exits non-zero when no
// input was found: a replay that checks nothing must not pass.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

int RunFile(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(f)),
                                std::istreambuf_iterator<char>());
  if (!f.eof() && f.fail()) {
    std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
    return 1;
  }
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()),
                         bytes.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  int inputs = 0, errors = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (!arg.empty() && arg[0] == '-') continue;
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::recursive_directory_iterator(arg, ec))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
      for (const auto& p : files) errors += RunFile(p), ++inputs;
    } else if (fs::exists(arg, ec)) {
      errors += RunFile(arg), ++inputs;
    } else {
      std::fprintf(stderr, "replay: %s does not exist\n", arg.c_str());
      ++errors;
    }
  }
  std::printf("replay: %d inputs, %d unreadable\n", inputs, errors);
  if (inputs == 0) {
    std::fprintf(stderr, "replay: no inputs given\n");
    return 1;
  }
  return errors == 0 ? 0 : 1;
}
