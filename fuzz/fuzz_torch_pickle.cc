// Harness: a torch state dict's data.pkl through the restricted unpickler
// (src/io/torch_pickle.h), as a tuned lens's params.pt is read. The input is
// the pickle's bytes; every storage reads as 64 KiB of one byte value (the
// mode). Whatever the bytes, it returns a state dict or an error, never
// crashes or runs anything; a returned tensor holds exactly numel x element
// size bytes of its storage.
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "src/core/dtype.h"
#include "src/io/torch_pickle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom;
  using namespace loom::fuzz;
  const auto in = TakeMode(data, size);
  const std::string storage(64 << 10, static_cast<char>(in.mode));
  auto dict = ParseTorchStateDict(
      std::string(in.rest),
      [&](const std::string&) -> StatusOr<std::string> { return storage; },
      "params.pt");
  if (!dict.ok()) return 0;
  for (const auto& [name, t] : *dict) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (static_cast<int64_t>(t.data.size()) != numel * DTypeSize(t.dtype))
      Fail("tensor '" + name + "' holds " + std::to_string(t.data.size()) +
           " bytes for " + std::to_string(numel) + " elements");
  }
  return 0;
}
