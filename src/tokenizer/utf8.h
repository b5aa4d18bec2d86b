// UTF-8 helpers shared by the tokenizer module: strict decoding, validation
// with the offset of the first bad byte, lossy repair the way Hugging Face
// (Rust String::from_utf8_lossy / Python errors="replace") does it, and the
// GPT-2 byte <-> printable code point table used by byte-level BPE.
#ifndef LOOM_SRC_TOKENIZER_UTF8_H_
#define LOOM_SRC_TOKENIZER_UTF8_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::tok {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Decodes the code point starting at s[i]. Returns its length in bytes (1-4)
// and stores it in *cp, or returns 0 when the bytes at i are not a valid,
// shortest-form UTF-8 sequence.
int DecodeUtf8(std::string_view s, size_t i, char32_t* cp);

// Length of the (valid) UTF-8 sequence that starts with `lead`.
inline int Utf8SeqLen(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

void AppendUtf8(char32_t cp, std::string* out);

// Byte offset of the first invalid UTF-8 sequence, or std::string_view::npos.
size_t FindInvalidUtf8(std::string_view s);

// Replaces every maximal invalid subsequence by U+FFFD. When `src` is given,
// it receives one entry per output byte: the input byte range it came from.
std::string LossyUtf8(
    std::string_view s,
    std::vector<std::pair<uint32_t, uint32_t>>* src = nullptr);

// GPT-2's reversible byte -> code point map (as UTF-8 strings), and its
// inverse (-1 when a code point is not in the table).
const std::array<std::string, 256>& ByteLevelAlphabet();
int ByteLevelCharToByte(char32_t cp);

}  // namespace loom::tok

#endif  // LOOM_SRC_TOKENIZER_UTF8_H_
