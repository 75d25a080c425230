// The text of an errno value ("No such file or directory"): the detail of an IOError, spelled the
// same way by every room. Thread-safe: std::error_code::message() (libstdc++ uses strerror_r);
// strerror() is not. Inline: a one-line wrapper every file reader needs.
#pragma once

#include <string>
#include <system_error>

namespace lockstep {

inline std::string ErrnoText(int err) {
  return std::error_code(err, std::generic_category()).message();
}

}  // namespace lockstep
