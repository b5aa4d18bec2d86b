#define PCRE2_CODE_UNIT_WIDTH 8
#include "src/tokenizer/regex.h"

#include <pcre2.h>

#include "src/tokenizer/utf8.h"

namespace loom::tok {

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

Regex::~Regex() = default;

StatusOr<std::unique_ptr<Regex>> Regex::Compile(const std::string& pattern,
                                                bool literal) {
  std::unique_ptr<Regex> re(new Regex());
  re->impl_ = std::make_unique<Impl>();
  re->pattern_ = pattern;
  // PCRE2_LITERAL does not combine with PCRE2_UCP (which only affects classes).
  const uint32_t options =
      literal ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  re->impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()),
                                  pattern.size(), options, &error_code,
                                  &error_offset, nullptr);
  if (re->impl_->code == nullptr) {
    PCRE2_UCHAR buffer[256];
    pcre2_get_error_message(error_code, buffer, sizeof(buffer));
    return InvalidArgumentError("regex /" + pattern +
                                "/: " + reinterpret_cast<const char*>(buffer) +
                                " at offset " + std::to_string(error_offset));
  }
  re->impl_->jit = pcre2_jit_compile(re->impl_->code, PCRE2_JIT_COMPLETE) == 0;
  return re;
}

namespace {
struct MatchData {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  ~MatchData() { pcre2_match_data_free(data); }
};
}  // namespace

void Regex::FindAll(std::string_view subject,
                    std::vector<std::pair<uint32_t, uint32_t>>* out) const {
  thread_local MatchData md;
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  PCRE2_SIZE start = 0;
  while (start < subject.size()) {
    const int rc = impl_->jit
                       ? pcre2_jit_match(impl_->code, s, subject.size(), start,
                                         PCRE2_NO_UTF_CHECK, md.data, nullptr)
                       : pcre2_match(impl_->code, s, subject.size(), start,
                                     PCRE2_NO_UTF_CHECK, md.data, nullptr);
    if (rc < 0)
      break;  // PCRE2_ERROR_NOMATCH or a resource limit: no more matches.
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.data);
    if (ov[1] > ov[0]) {
      out->emplace_back(static_cast<uint32_t>(ov[0]),
                        static_cast<uint32_t>(ov[1]));
      start = ov[1];
    } else {
      // Empty match: step over one character.
      if (ov[0] >= subject.size()) break;
      start = ov[0] + Utf8SeqLen(static_cast<unsigned char>(subject[ov[0]]));
    }
  }
}

}  // namespace loom::tok
