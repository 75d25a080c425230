#include "lockstep/engine/status.h"

#include <cstdio>
#include <cstdlib>

#include "util/check.h"

namespace lockstep {

Status::Status(Code code, std::string_view what, std::string_view detail) {
  std::string msg(what);
  if (!detail.empty()) {
    msg += ": ";
    msg += detail;
  }
  rep_ = std::make_shared<const Rep>(Rep{code, std::move(msg)});
}

const std::string& Status::message() const {
  static const std::string kOkMessage = "OK";
  return rep_ ? rep_->message : kOkMessage;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(code())) + ": " + message();
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  Status s;
  s.rep_ = std::make_shared<const Rep>(Rep{code(), std::string(context) + ": " + message()});
  return s;
}

Status Status::FromCode(Code code, std::string_view message) {
  Status s;
  if (code != Code::kOk) s.rep_ = std::make_shared<const Rep>(Rep{code, std::string(message)});
  return s;
}

int Status::exit_code() const {
  switch (code()) {
    case Code::kOk:
      return 0;
    case Code::kGateFailed:
      return 1;
    case Code::kInvalidArgument:
    case Code::kCorruption:
    case Code::kNotFound:
    case Code::kNotSupported:
      return 2;
    case Code::kIOError:
    case Code::kRuntime:
      return 3;
  }
  return 3;
}

std::string_view Status::CodeName(Code c) {
  switch (c) {
    case Code::kOk:
      return "OK";
    case Code::kInvalidArgument:
      return "invalid argument";
    case Code::kCorruption:
      return "corrupt input";
    case Code::kNotFound:
      return "not found";
    case Code::kNotSupported:
      return "not supported";
    case Code::kIOError:
      return "I/O error";
    case Code::kRuntime:
      return "runtime error";
    case Code::kGateFailed:
      return "gate failed";
  }
  return "unknown";
}

namespace internal {

CheckFailure::CheckFailure(const char* file, int line, const char* func, const char* cond) {
  os_ << file << ":" << line << " " << func << ": check `" << cond << "` failed: ";
}

CheckFailure::~CheckFailure() {
  std::string s = os_.str();
  std::fprintf(stderr, "%s\n", s.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace internal
}  // namespace lockstep
