// Harness: safetensors headers and the checkpoint index.
//   mode even: the input is a .safetensors file. ParseSafetensorsHeader on the
//     bytes and SafetensorsFile::Open on the same bytes written to a file must
//     agree; every tensor of an opened file is read end to end (its view must
//     lie inside the mapping).
//   mode odd: the input is model.safetensors.index.json beside one valid
//     shard: ReadSafetensorsIndex, ReadIndexShards, ReadCheckpointHeaders and
//     Checkpoint::Open (the index cross-checks).
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "src/io/safetensors.h"

namespace loom::fuzz {
namespace {

// A valid two-tensor shard, "shard-1.safetensors", written once.
void WriteShard(const std::string& dir) {
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]}})";
  std::string bytes(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
  bytes += header;
  bytes += std::string(16, '\x01');
  WriteScratch(dir + "/shard-1.safetensors", bytes);
}

void FileMode(std::string_view bytes) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  auto parsed = ParseSafetensorsHeader("input.safetensors", data,
                                       static_cast<int64_t>(bytes.size()));
  const std::string path = WriteScratch("file/model.safetensors", bytes);
  auto file = SafetensorsFile::Open(path);
  if (parsed.ok() != file.ok())
    Fail("ParseSafetensorsHeader says " + parsed.status().ToString() +
         " but SafetensorsFile::Open says " + file.status().ToString());
  if (!file.ok()) return;
  if ((*file)->header().tensors.size() != parsed->tensors.size())
    Fail("tensor counts differ between parse and open");
  uint64_t sum = 0;
  for (const TensorInfo& t : (*file)->header().tensors) {
    const TensorView v = (*file)->View(t);
    if (v.bytes() != t.bytes())
      Fail("tensor " + t.name + ": view of " + std::to_string(v.bytes()) +
           " bytes for a header range of " + std::to_string(t.bytes()));
    const auto* p = static_cast<const uint8_t*>(v.data);
    for (int64_t i = 0; i < t.bytes(); ++i) sum += p[i];
  }
  volatile uint64_t sink = sum;
  (void)sink;
}

void IndexMode(std::string_view bytes) {
  const std::string dir = ScratchDir() + "/index";
  static const bool shard_written = (WriteShard("index"), true);
  (void)shard_written;
  const std::string path =
      WriteScratch("index/model.safetensors.index.json", bytes);
  auto index = ReadSafetensorsIndex(path);
  auto shards = ReadIndexShards(path);
  if (index.ok() != shards.ok())
    Fail("ReadSafetensorsIndex and ReadIndexShards disagree: " +
         index.status().ToString() + " vs " + shards.status().ToString());
  auto headers = ReadCheckpointHeaders(dir);
  auto checkpoint = Checkpoint::Open(dir);
  if (headers.ok() != checkpoint.ok())
    Fail("ReadCheckpointHeaders and Checkpoint::Open disagree: " +
         headers.status().ToString() + " vs " + checkpoint.status().ToString());
}

}  // namespace
}  // namespace loom::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto in = loom::fuzz::TakeMode(data, size);
  if (in.mode % 2 == 0) {
    loom::fuzz::FileMode(in.rest);
  } else {
    loom::fuzz::IndexMode(in.rest);
  }
  return 0;
}
