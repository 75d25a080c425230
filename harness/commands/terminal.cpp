#include "commands/terminal.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace lockstep {

bool ColorEnabled(std::FILE* stream) {
  const char* no_color = std::getenv("NO_COLOR");
  if (no_color != nullptr && no_color[0] != '\0') return false;
  const char* term = std::getenv("TERM");
  if (term != nullptr && std::strcmp(term, "dumb") == 0) return false;
  return ::isatty(::fileno(stream)) == 1;
}

std::string Paint(std::string_view text, Tint tint, bool on) {
  if (!on) return std::string(text);
  const char* code = tint == Tint::kGreen    ? "32;1"
                     : tint == Tint::kRed    ? "31;1"
                     : tint == Tint::kYellow ? "33;1"
                                             : "1";
  return std::string("\x1b[") + code + "m" + std::string(text) + "\x1b[0m";
}

}  // namespace lockstep
