// Status and Result<T>: how every module boundary in lockstep reports success or failure.
//
// A Status is either OK or carries a Code and a message. Each Code maps to exactly one process
// exit code (see exit_code()): input/usage problems exit 2, runtime failures exit 3, a failed
// gate or threshold exits 1. Code that can throw (nlohmann::json, toml++, CLI11, std::stoi) is
// wrapped in an adapter that catches and returns a Status; no exception crosses a module API.
//
// Thread safety: Status and Result are values; distinct objects may be used from any thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace lockstep {

class [[nodiscard]] Status {
 public:
  enum class Code : int {
    kOk = 0,
    kInvalidArgument,  // bad usage or bad input supplied by the user        -> exit 2
    kCorruption,       // a file is malformed (header, offsets, schema)      -> exit 2
    kNotFound,         // a file, tensor, group or key is missing            -> exit 2
    kNotSupported,     // a valid request this build/backend cannot do       -> exit 2
    kIOError,          // reading or writing failed at run time              -> exit 3
    kRuntime,          // anything else that failed while running            -> exit 3
    kGateFailed,       // a gate or threshold failed                         -> exit 1
  };

  Status() = default;  // OK

  static Status Ok() { return Status(); }
  // Named factories. `what` names the thing; `detail` says what was expected / found / a hint.
  static Status InvalidArgument(std::string_view what, std::string_view detail = {}) {
    return Status(Code::kInvalidArgument, what, detail);
  }
  static Status Corruption(std::string_view what, std::string_view detail = {}) {
    return Status(Code::kCorruption, what, detail);
  }
  static Status NotFound(std::string_view what, std::string_view detail = {}) {
    return Status(Code::kNotFound, what, detail);
  }
  static Status NotSupported(std::string_view what, std::string_view detail = {}) {
    return Status(Code::kNotSupported, what, detail);
  }
  static Status IOError(std::string_view what, std::string_view detail = {}) {
    return Status(Code::kIOError, what, detail);
  }
  static Status Runtime(std::string_view what, std::string_view detail = {}) {
    return Status(Code::kRuntime, what, detail);
  }
  static Status GateFailed(std::string_view what, std::string_view detail = {}) {
    return Status(Code::kGateFailed, what, detail);
  }

  bool ok() const { return rep_ == nullptr; }
  Code code() const { return rep_ ? rep_->code : Code::kOk; }
  // "what: detail" (or "OK").
  const std::string& message() const;
  std::string ToString() const;  // "<code name>: <message>"

  // Returns a copy whose message is prefixed with `context` ("context: message"): used to wrap
  // a lower-level error with what the caller was doing, never to replace it.
  Status WithContext(std::string_view context) const;

  // Process exit code for this status: 0 ok, 1 gate failed, 2 bad input/usage, 3 runtime.
  int exit_code() const;

  static std::string_view CodeName(Code c);
  // Rebuilds a status from its code and full message (e.g. received from a child process).
  static Status FromCode(Code code, std::string_view message);

 private:
  struct Rep {
    Code code;
    std::string message;
  };
  Status(Code code, std::string_view what, std::string_view detail);
  std::shared_ptr<const Rep> rep_;  // null == OK; shared so copies are cheap
};

// Result<T>: a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT: implicit on purpose
  Result(Status status) : v_(std::move(status)) {}  // NOLINT: must not be OK

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace lockstep

#define LOCKSTEP_CONCAT_INNER_(a, b) a##b
#define LOCKSTEP_CONCAT_(a, b) LOCKSTEP_CONCAT_INNER_(a, b)

// Propagates a non-OK Status from `expr` (a Status or a Result<T>).
#define LOCKSTEP_RETURN_IF_ERROR(expr)                                                         \
  do {                                                                                         \
    auto&& lockstep_status_or_ = (expr);                                                       \
    if (!lockstep_status_or_.ok()) return ::lockstep::internal::AsStatus(lockstep_status_or_); \
  } while (0)

// `LOCKSTEP_ASSIGN_OR_RETURN(auto x, MakeX());` binds the value or returns the error.
#define LOCKSTEP_ASSIGN_OR_RETURN(lhs, expr)                      \
  auto LOCKSTEP_CONCAT_(lockstep_result_, __LINE__) = (expr);     \
  if (!LOCKSTEP_CONCAT_(lockstep_result_, __LINE__).ok())         \
    return LOCKSTEP_CONCAT_(lockstep_result_, __LINE__).status(); \
  lhs = std::move(LOCKSTEP_CONCAT_(lockstep_result_, __LINE__)).value()

namespace lockstep::internal {
inline Status AsStatus(const Status& s) { return s; }
template <typename T>
Status AsStatus(const Result<T>& r) {
  return r.status();
}
}  // namespace lockstep::internal
