// LOCKSTEP_CHECK: programmer-error assertions that stay on in release builds (like GGML_ASSERT).
//
// A failed check logs "file:line func: check `cond` failed: <context>" to stderr and aborts.
// Never use it to validate user input or file contents: those return a Status (exit 2).
#pragma once

#include <sstream>
#include <string>

namespace lockstep::internal {

// Collects the streamed context of a failed check and aborts in its destructor.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* func, const char* cond);
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return os_; }

 private:
  std::ostringstream os_;
};

// Lets `LOCKSTEP_CHECK(c) << ...` compile as one expression in both branches.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace lockstep::internal

#define LOCKSTEP_CHECK(cond)                 \
  (cond) ? (void)0                           \
         : ::lockstep::internal::Voidify() & \
               ::lockstep::internal::CheckFailure(__FILE__, __LINE__, __func__, #cond).stream()

#define LOCKSTEP_CHECK_EQ(a, b) LOCKSTEP_CHECK((a) == (b)) << (a) << " vs " << (b) << " "
#define LOCKSTEP_CHECK_NE(a, b) LOCKSTEP_CHECK((a) != (b)) << (a) << " vs " << (b) << " "
#define LOCKSTEP_CHECK_LT(a, b) LOCKSTEP_CHECK((a) < (b)) << (a) << " vs " << (b) << " "
#define LOCKSTEP_CHECK_LE(a, b) LOCKSTEP_CHECK((a) <= (b)) << (a) << " vs " << (b) << " "
#define LOCKSTEP_CHECK_GE(a, b) LOCKSTEP_CHECK((a) >= (b)) << (a) << " vs " << (b) << " "
