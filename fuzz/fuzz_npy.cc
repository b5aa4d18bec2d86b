// Harness: .npy files, as `open_activations`, the tests and --resume read
// them. The input is a .npy file:
//   - ReadNpyHeader and ReadNpy must agree, and ReadNpy's data has exactly
//     the bytes the header describes; ParseNpy (the same bytes in memory, an
//     .npz member) accepts exactly what ReadNpy accepts, with the same data;
//   - NpyWriter::OpenForAppend (the resume path; with a rollback when the
//     mode byte asks) and, if it opens, one appended and committed row: the
//     file must then read back with one more row.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "src/core/dtype.h"
#include "src/io/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom;
  using namespace loom::fuzz;
  const auto in = TakeMode(data, size);
  const std::string path = WriteScratch("array.npy", in.rest);
  auto header = ReadNpyHeader(path);
  auto array = ReadNpy(path);
  if (array.ok() && !header.ok())
    Fail("ReadNpy succeeded where ReadNpyHeader failed: " +
         header.status().ToString());
  if (array.ok() &&
      static_cast<int64_t>(array->data.size()) != array->header.data_bytes())
    Fail("ReadNpy returned " + std::to_string(array->data.size()) +
         " bytes for a header of " +
         std::to_string(array->header.data_bytes()));
  auto parsed = ParseNpy(in.rest, "member.npy");
  if (parsed.ok() != array.ok())
    Fail("ParseNpy and ReadNpy disagree: " + parsed.status().ToString() +
         " / " + array.status().ToString());
  if (parsed.ok() && (parsed->data != array->data ||
                      parsed->header.shape != array->header.shape))
    Fail("ParseNpy and ReadNpy read different arrays");
  std::optional<int64_t> keep;
  if (in.mode % 2 == 1) keep = in.mode / 2 % 4;
  auto writer = NpyWriter::OpenForAppend(path, keep);
  if (!writer.ok()) return 0;
  if (!header.ok()) Fail("OpenForAppend opened a file ReadNpyHeader refuses");
  const int64_t rows = (*writer)->committed_rows();
  std::vector<uint8_t> row(static_cast<size_t>((*writer)->row_bytes()), 0x3c);
  if ((*writer)->row_bytes() > (1 << 20)) return 0;  // not worth the memory
  if (!(*writer)->AppendRows(row.data(), 1).ok()) return 0;
  if (!(*writer)->Close().ok()) return 0;
  auto after = ReadNpy(path);
  if (!after.ok())
    Fail("an appended file does not read back: " + after.status().ToString());
  if (after->header.shape.empty() || after->header.shape[0] != rows + 1)
    Fail("appended one row to " + std::to_string(rows) +
         " but the file has another count");
  return 0;
}
