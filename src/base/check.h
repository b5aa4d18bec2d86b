// LOOM_CHECK: aborts on broken internal invariants (never on bad input; bad
// input is a Status). Streams extra context:  LOOM_CHECK(n > 0) << "n=" << n;
#ifndef LOOM_BASE_CHECK_H_
#define LOOM_BASE_CHECK_H_

#include <sstream>

namespace loom::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Makes `cond ? (void)0 : Voidify() & stream` type-check.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace loom::internal

#define LOOM_CHECK(cond)              \
  (cond)                              \
      ? (void)0                       \
      : ::loom::internal::Voidify() & \
            ::loom::internal::CheckFailure(__FILE__, __LINE__, #cond).stream()

#define LOOM_CHECK_EQ(a, b) \
  LOOM_CHECK((a) == (b)) << #a "=" << (a) << " " #b "=" << (b) << " "
#define LOOM_CHECK_LE(a, b) \
  LOOM_CHECK((a) <= (b)) << #a "=" << (a) << " " #b "=" << (b) << " "
#define LOOM_CHECK_LT(a, b) \
  LOOM_CHECK((a) < (b)) << #a "=" << (a) << " " #b "=" << (b) << " "
#define LOOM_CHECK_GE(a, b) \
  LOOM_CHECK((a) >= (b)) << #a "=" << (a) << " " #b "=" << (b) << " "

#ifdef NDEBUG
#define LOOM_DCHECK(cond) \
  while (false) LOOM_CHECK(cond)
#else
#define LOOM_DCHECK(cond) LOOM_CHECK(cond)
#endif

#endif  // LOOM_BASE_CHECK_H_
