// Harness: `loom extract --resume`, the path that reads Loom's own files
// after a crash. A job on the bundled model is stopped after its first
// commit (the template); every input is a copy of that job with one file
// replaced by the input (mode byte: manifest.json, rows.jsonl, or an array),
// then resumed. Properties:
//   - a refused resume leaves every file of the job byte-identical;
//   - an accepted resume finishes with output byte-identical to an
//     uninterrupted run (nothing dropped, duplicated or changed).
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz/fuzz_util.h"
#include "src/eval/extract.h"
#include "src/io/npy.h"

namespace loom::fuzz {
namespace {
namespace fs = std::filesystem;

using Files = std::map<std::string, std::string>;

Files ReadFiles(const std::string& dir) {
  Files files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::ifstream f(e.path(), std::ios::binary);
    files[e.path().filename().string()] = std::string(
        std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  return files;
}

// Manifests equal but for the input's path: the input is identified by size
// and sha256, and a seed's template may have been made by another process
// (another scratch directory).
bool SameManifest(const std::string& a, const std::string& b) {
  auto ja = nlohmann::json::parse(a, nullptr, false);
  auto jb = nlohmann::json::parse(b, nullptr, false);
  if (ja.is_discarded() || jb.is_discarded()) return false;
  for (auto* j : {&ja, &jb})
    if (j->contains("input") && (*j)["input"].is_object())
      (*j)["input"]["path"] = "";
  return ja == jb;
}

ExtractOptions Options(const std::string& out) {
  ExtractOptions o;
  o.model_dir = SourcePath("models/stories260K");
  o.input_path = ScratchDir() + "/prompts.txt";
  o.out_dir = out;
  o.hooks = {"blocks.0.hook_resid_post"};
  o.selectors = {"last", "all"};
  o.commit_every = 2;
  o.threads = 1;
  o.precision = Precision::kF32;
  return o;
}

struct Fixture {
  std::string template_dir;  // stopped after one commit
  Files reference;           // an uninterrupted run
  // Per array: the byte range of the rows the template committed.
  std::map<std::string, std::pair<int64_t, int64_t>> committed;
};

const Fixture& Get() {
  static const Fixture* f = [] {
    auto* f = new Fixture;
    WriteScratch("prompts.txt",
                 "Once upon a time\nThe dog ran.\nLily saw a big red ball and "
                 "smiled.\nTom\nThe end of the story was happy.\n");
    const std::string ref = ScratchDir() + "/reference";
    auto s = RunExtract(Options(ref));
    if (!s.ok()) Fail("reference run: " + s.status().ToString());
    f->reference = ReadFiles(ref);
    f->template_dir = ScratchDir() + "/template";
    ExtractOptions o = Options(f->template_dir);
    o.stop_after_commits = 1;
    s = RunExtract(o);
    if (!s.ok()) Fail("template run: " + s.status().ToString());
    for (const char* name :
         {"blocks.0.hook_resid_post.last.npy", "all.offsets.npy"}) {
      auto h = ReadNpyHeader(f->template_dir + "/" + name);
      if (!h.ok()) Fail(h.status().ToString());
      f->committed[name] = {h->data_offset, h->data_offset + h->data_bytes()};
    }
    // fuzz/seeds.py takes its seeds from a copy of the template.
    if (const char* dump = std::getenv("LOOM_FUZZ_DUMP_TEMPLATE"))
      CopyDir(f->template_dir, dump);
    return f;
  }();
  return *f;
}

}  // namespace
}  // namespace loom::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom;
  using namespace loom::fuzz;
  const Fixture& f = Get();
  const auto in = TakeMode(data, size);
  static const char* kTargets[] = {"manifest.json", "rows.jsonl",
                                   "blocks.0.hook_resid_post.last.npy",
                                   "all.offsets.npy"};
  const std::string target = kTargets[in.mode % 4];
  const std::string job = ScratchDir() + "/job";
  CopyDir(f.template_dir, job);
  WriteScratch("job/" + target, in.rest);
  const Files before = ReadFiles(job);
  ExtractOptions o = Options(job);
  o.resume = true;
  auto s = RunExtract(o);
  const Files after = ReadFiles(job);
  if (!s.ok()) {
    if (after != before)
      Fail("a refused resume (" + s.status().ToString() +
           ") changed the job's files");
    return 0;
  }
  // Committed array rows are never read back (a resume reads the arrays'
  // headers and sizes only, docs/formats/activations.md): a change to their
  // bytes stays as it is, and everything else must be as in an
  // uninterrupted run.
  Files expected = f.reference;
  if (auto c = f.committed.find(target); c != f.committed.end()) {
    const auto [begin, end] = c->second;
    if (static_cast<int64_t>(in.rest.size()) < end)
      Fail("a resume accepted " + target + " shorter than its committed rows");
    expected[target].replace(begin, end - begin,
                             in.rest.substr(begin, end - begin));
  }
  std::string which;
  for (const auto& [name, bytes] : expected) {
    auto it = after.find(name);
    if (it == after.end()) {
      which += " " + name + " (missing)";
    } else if (it->second != bytes &&
               !(name == "manifest.json" && SameManifest(it->second, bytes))) {
      which += " " + name;
    }
  }
  if (after.size() != expected.size()) which += " (other files)";
  if (!which.empty()) {
    Fail("a resume accepted a changed " + target +
         " and its output differs from an uninterrupted run in:" + which);
  }
  return 0;
}
