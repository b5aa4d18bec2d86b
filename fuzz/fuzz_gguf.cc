// Harness: GGUF files (src/io/gguf.h), as llama.cpp control vectors reach
// Loom through --control-vector.
//   mode even: ParseGgufHeader on the bytes and GgufFile::Open on the same
//     bytes written to a file must agree; every tensor of a known size is
//     read to f32 and must give its element count of values.
//   mode odd: ControlVectorInterventions of the file for a model of 4 layers
//     of width 4: an accepted file gives vectors of width 4 at layers 1 to 3.
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "src/io/gguf.h"
#include "src/model/control_vectors.h"

namespace loom::fuzz {
namespace {

void FileMode(std::string_view bytes) {
  auto parsed = ParseGgufHeader("input.gguf",
                                reinterpret_cast<const uint8_t*>(bytes.data()),
                                static_cast<int64_t>(bytes.size()));
  const std::string path = WriteScratch("file/input.gguf", bytes);
  auto file = GgufFile::Open(path);
  if (parsed.ok() != file.ok())
    Fail("ParseGgufHeader says " + parsed.status().ToString() +
         " but GgufFile::Open says " + file.status().ToString());
  if (!file.ok()) return;
  const GgufHeader& h = (*file)->header();
  if (h.tensors.size() != parsed->tensors.size())
    Fail("tensor counts differ between parse and open");
  for (const GgufTensorInfo& t : h.tensors) {
    if (t.bytes < 0 || t.numel > (int64_t{1} << 24)) continue;
    auto v = (*file)->ReadF32(t);
    if (!v.ok()) Fail("tensor " + t.name + ": " + v.status().ToString());
    if (static_cast<int64_t>(v->size()) != t.numel)
      Fail("tensor " + t.name + ": " + std::to_string(v->size()) +
           " values for " + std::to_string(t.numel) + " elements");
  }
}

void ControlVectorMode(std::string_view bytes) {
  const std::string path = WriteScratch("cv/input.gguf", bytes);
  ModelConfig config;
  config.num_layers = 4;
  config.hidden_size = 4;
  auto list = ControlVectorInterventions({{path, 0.5f}}, std::nullopt, config);
  if (!list.ok()) return;
  for (const Intervention& iv : *list) {
    if (iv.hook.layer < 1 || iv.hook.layer > 3 || iv.vector.size() != 4)
      Fail("an intervention at layer " + std::to_string(iv.hook.layer) +
           " of width " + std::to_string(iv.vector.size()));
  }
}

}  // namespace
}  // namespace loom::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto in = loom::fuzz::TakeMode(data, size);
  if (in.mode % 2 == 0) {
    loom::fuzz::FileMode(in.rest);
  } else {
    loom::fuzz::ControlVectorMode(in.rest);
  }
  return 0;
}
