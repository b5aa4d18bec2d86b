// Status and StatusOr<T>: the error model for everything that depends on
// files, user input or device capacity. Loom code throws no exceptions;
// a library's exceptions are caught at the boundary and turned into Status.
//
// A message names the object and both values, e.g.
//   tensor model.layers.3.mlp.up_proj.weight: shape [11008, 4096] in file,
//   expected [4096, 11008]
//
// Thread-safety: Status and StatusOr are values; distinct objects may be used
// from different threads.
#ifndef LOOM_BASE_STATUS_H_
#define LOOM_BASE_STATUS_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "src/base/check.h"

namespace loom {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad user input (flags, prompts, hook names)
  kNotFound,         // missing file, tensor, key
  kDataLoss,         // corrupt or truncated file
  kFailedPrecondition,
  kOutOfRange,         // index/size beyond a limit (e.g. prompt too long)
  kResourceExhausted,  // does not fit in the memory caps
  kUnimplemented,      // recognised but not supported (e.g. architecture)
  kInternal,
  kIoError,
  kCancelled,    // stopped on request (Ctrl-C in the Python module)
  kUnavailable,  // a device asked for is not on this machine or build
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  const std::string& message() const;
  // "CODE: message", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is "context: message" (no-op when OK).
  Status WithContext(std::string_view context) const;

  void IgnoreError() const {}

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;
};

Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status DataLossError(std::string message);
Status FailedPreconditionError(std::string message);
Status OutOfRangeError(std::string message);
Status ResourceExhaustedError(std::string message);
Status UnimplementedError(std::string message);
Status InternalError(std::string message);
Status IoError(std::string message);
Status CancelledError(std::string message);
Status UnavailableError(std::string message);

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : status_(status) {  // NOLINT
    LOOM_CHECK(!status_.ok()) << "StatusOr constructed from an OK status";
  }
  StatusOr(Status&& status) : status_(std::move(status)) {  // NOLINT
    LOOM_CHECK(!status_.ok()) << "StatusOr constructed from an OK status";
  }
  // The value is constructed in place: a StatusOr<std::optional<X>> made
  // from std::nullopt holds an empty optional (not no value).
  StatusOr(const T& value) : value_(std::in_place, value) {}        // NOLINT
  StatusOr(T&& value) : value_(std::in_place, std::move(value)) {}  // NOLINT
  template <typename U>
  requires std::is_convertible_v<U&&, T> &&
      (!std::is_same_v<std::decay_t<U>, T>)&&(
          !std::is_same_v<std::decay_t<U>, Status>)StatusOr(U&& value)
      : value_(std::in_place, std::forward<U>(value)) {}  // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  const T& value() const& {
    LOOM_CHECK(ok()) << status_.ToString();
    return *value_;
  }
  T& value() & {
    LOOM_CHECK(ok()) << status_.ToString();
    return *value_;
  }
  T&& value() && {
    LOOM_CHECK(ok()) << status_.ToString();
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

namespace internal {
inline const Status& AsStatus(const Status& s) { return s; }
template <typename T>
const Status& AsStatus(const StatusOr<T>& s) {
  return s.status();
}
}  // namespace internal

}  // namespace loom

#define LOOM_STATUS_CONCAT_INNER(a, b) a##b
#define LOOM_STATUS_CONCAT(a, b) LOOM_STATUS_CONCAT_INNER(a, b)

// Returns from the current function if `expr` (a Status or StatusOr) is not OK.
#define RETURN_IF_ERROR(expr)                                             \
  do {                                                                    \
    const ::loom::Status _loom_status = ::loom::internal::AsStatus(expr); \
    if (!_loom_status.ok()) return _loom_status;                          \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): evaluates the StatusOr `expr`; on error returns
// its status, otherwise moves the value into `lhs` (which may be a
// declaration).
#define ASSIGN_OR_RETURN(lhs, expr)                                         \
  LOOM_ASSIGN_OR_RETURN_IMPL(LOOM_STATUS_CONCAT(_loom_statusor_, __LINE__), \
                             lhs, expr)
#define LOOM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

#endif  // LOOM_BASE_STATUS_H_
