#include "src/tokenizer/utf8.h"

namespace loom::tok {
namespace {

// Valid range of the second byte for a given lead byte (Unicode Table 3-7).
bool SecondByteOk(unsigned char lead, unsigned char b) {
  switch (lead) {
    case 0xE0:
      return b >= 0xA0 && b <= 0xBF;
    case 0xED:
      return b >= 0x80 && b <= 0x9F;
    case 0xF0:
      return b >= 0x90 && b <= 0xBF;
    case 0xF4:
      return b >= 0x80 && b <= 0x8F;
    default:
      return b >= 0x80 && b <= 0xBF;
  }
}

int ExpectedLen(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Number of bytes of the maximal valid prefix at s[i] (>= 1 for an invalid
// start), and whether the whole sequence is complete.
int ScanSequence(std::string_view s, size_t i, bool* complete) {
  const auto lead = static_cast<unsigned char>(s[i]);
  const int n = ExpectedLen(lead);
  if (n == 0) {
    *complete = false;
    return 1;
  }
  if (n == 1) {
    *complete = true;
    return 1;
  }
  int k = 1;
  while (k < n && i + k < s.size()) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    const bool ok = (k == 1) ? SecondByteOk(lead, b) : (b >= 0x80 && b <= 0xBF);
    if (!ok) break;
    ++k;
  }
  *complete = (k == n);
  return k;
}

std::array<std::string, 256> BuildAlphabet() {
  std::array<std::string, 256> table;
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable =
        (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    char32_t cp = printable ? static_cast<char32_t>(b)
                            : static_cast<char32_t>(256 + extra++);
    AppendUtf8(cp, &table[b]);
  }
  return table;
}

}  // namespace

int DecodeUtf8(std::string_view s, size_t i, char32_t* cp) {
  bool complete = false;
  const int n = ScanSequence(s, i, &complete);
  if (!complete) return 0;
  const auto lead = static_cast<unsigned char>(s[i]);
  char32_t c;
  switch (n) {
    case 1:
      c = lead;
      break;
    case 2:
      c = ((lead & 0x1F) << 6) | (s[i + 1] & 0x3F);
      break;
    case 3:
      c = ((lead & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
      break;
    default:
      c = ((lead & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) |
          ((s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
      break;
  }
  *cp = c;
  return n;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t FindInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    bool complete = false;
    const int n = ScanSequence(s, i, &complete);
    if (!complete) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string LossyUtf8(std::string_view s,
                      std::vector<std::pair<uint32_t, uint32_t>>* src) {
  std::string out;
  out.reserve(s.size());
  if (src != nullptr) {
    src->clear();
    src->reserve(s.size());
  }
  size_t i = 0;
  while (i < s.size()) {
    bool complete = false;
    const int n = ScanSequence(s, i, &complete);
    if (complete) {
      out.append(s.data() + i, n);
      if (src != nullptr) {
        for (int k = 0; k < n; ++k) {
          src->emplace_back(static_cast<uint32_t>(i + k),
                            static_cast<uint32_t>(i + k + 1));
        }
      }
    } else {
      const size_t before = out.size();
      AppendUtf8(kReplacementChar, &out);
      if (src != nullptr) {
        for (size_t k = before; k < out.size(); ++k) {
          src->emplace_back(static_cast<uint32_t>(i),
                            static_cast<uint32_t>(i + n));
        }
      }
    }
    i += n;
  }
  return out;
}

const std::array<std::string, 256>& ByteLevelAlphabet() {
  static const std::array<std::string, 256> table = BuildAlphabet();
  return table;
}

int ByteLevelCharToByte(char32_t cp) {
  static const std::vector<int> inverse = [] {
    std::vector<int> inv(512, -1);
    const auto& table = ByteLevelAlphabet();
    for (int b = 0; b < 256; ++b) {
      char32_t c = 0;
      DecodeUtf8(table[b], 0, &c);
      inv[c] = b;
    }
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

}  // namespace loom::tok
