// The restricted unpickler of torch state dicts: a hand-built data.pkl (the
// protocol-2 spelling torch.save writes) reads as its tensor; globals other
// than the state dict's, other opcodes, non-contiguous or out-of-storage
// tensors and truncated input are refused naming what they hold.
#include "src/io/torch_pickle.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace loom {
namespace {

using namespace std::string_literals;

// One [2, 2] f32 tensor "w" in storage "0" of 4 elements, at `offset` with
// stride (`s0`, `s1`).
std::string StateDict(char offset = '\x00', char s0 = '\x02',
                      char s1 = '\x01') {
  return "\x80\x02"
         "ccollections\nOrderedDict\nq\x00)Rq\x01("
         "X\x01\x00\x00\x00w"
         "ctorch._utils\n_rebuild_tensor_v2\nq\x02(("
         "X\x07\x00\x00\x00storage"
         "ctorch\nFloatStorage\n"
         "X\x01\x00\x00\x00"
         "0"
         "X\x03\x00\x00\x00"
         "cpuK\x04tQ"
         "K"s +
         offset + "K\x02K\x02\x86K"s + s0 + "K"s + s1 + "\x86\x89h\x00)RtRu."s;
}

StatusOr<std::string> FourFloats(const std::string& key) {
  if (key != "0") return NotFoundError("no storage " + key);
  const float v[4] = {1, 2, 3, 4};
  return std::string(reinterpret_cast<const char*>(v), sizeof(v));
}

std::string ErrorOf(const std::string& pickle) {
  auto d = ParseTorchStateDict(pickle, FourFloats, "params.pt");
  return d.ok() ? "(parsed)" : d.status().ToString();
}

TEST(TorchPickleTest, ReadsAStateDictOfTensors) {
  auto d = ParseTorchStateDict(StateDict(), FourFloats, "params.pt");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_EQ(d->size(), 1u);
  EXPECT_EQ((*d)[0].first, "w");
  const TorchTensor& t = (*d)[0].second;
  EXPECT_EQ(t.dtype, DType::kF32);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 2}));
  ASSERT_EQ(t.data.size(), 16u);
  float v[4];
  std::memcpy(v, t.data.data(), 16);
  EXPECT_EQ(v[3], 4.0f);
}

TEST(TorchPickleTest, RefusesWhatAStateDictDoesNotHold) {
  // Another global is never called.
  EXPECT_NE(ErrorOf("cos\nsystem\n(X\x02\x00\x00\x00lstR."s)
                .find("calls os.system, which Loom does not run"),
            std::string::npos)
      << ErrorOf("cos\nsystem\n(X\x02\x00\x00\x00lstR."s);
  // An opcode outside the set (INST).
  EXPECT_NE(ErrorOf("\x80\x02iabc\n"s).find("opcode 0x69"), std::string::npos);
  // A transposed (non-contiguous) tensor, and one past its storage.
  EXPECT_NE(ErrorOf(StateDict('\x00', '\x01', '\x02')).find("not contiguous"),
            std::string::npos);
  EXPECT_NE(ErrorOf(StateDict('\x01')).find("outside its storage of 4"),
            std::string::npos)
      << ErrorOf(StateDict('\x01'));
  // Truncated anywhere: an error, never a crash.
  const std::string whole = StateDict();
  for (size_t n = 0; n < whole.size(); ++n)
    EXPECT_NE(ErrorOf(whole.substr(0, n)), "(parsed)") << n;
  // Not a dict of tensors.
  EXPECT_NE(ErrorOf("\x80\x02K\x01."s).find("no state dict"),
            std::string::npos);
}

TEST(TorchPickleTest, CyclesAndDeepNestingAreFreedFlat) {
  // A memoized list appended to itself, and a dict set into itself: values
  // live in the unpickler's pool, so no cycle outlives it (LeakSanitizer
  // checks this under the sanitizer suite; fuzz/regressions keeps the input
  // that found it).
  const std::string list = ErrorOf("\x80\x02]q\x00h\x00" "a."s);
  EXPECT_NE(list.find("no state dict"), std::string::npos) << list;
  const std::string dict = ErrorOf("\x80\x02}q\x00h\x00h\x00s."s);
  EXPECT_NE(dict.find("not a name and a tensor"), std::string::npos) << dict;
  // A million nested 1-tuples: freed without recursion.
  const std::string deep = "\x80\x02N"s + std::string(1 << 20, '\x85') + ".";
  EXPECT_NE(ErrorOf(deep).find("no state dict"), std::string::npos);
  // More values than any state dict makes: refused, naming the bound.
  const std::string many = "\x80\x02N"s + std::string(3 << 20, '\x85') + ".";
  EXPECT_NE(ErrorOf(many).find("more than 2097152 values"), std::string::npos)
      << ErrorOf(many);
}

}  // namespace
}  // namespace loom
