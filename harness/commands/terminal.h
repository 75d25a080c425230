// Terminal output of the CLI: colour only where a person is reading. Colour is on when the stream
// is a TTY, NO_COLOR (https://no-color.org) is unset or empty, and TERM is not "dumb".
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace lockstep {

enum class Tint { kGreen, kRed, kYellow, kBold };

// True when text written to `stream` should be coloured (see above).
bool ColorEnabled(std::FILE* stream);
// `text` wrapped in the ANSI sequence of `tint` when `on`, else `text` unchanged.
std::string Paint(std::string_view text, Tint tint, bool on);

}  // namespace lockstep
