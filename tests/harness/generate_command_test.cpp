// EscapeText (harness/commands/generate_command.cpp): what `lockstep generate` prints is safe on a
// terminal; printable text, UTF-8 included, is unchanged.
#include "lockstep/harness/generate_command.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

TEST(EscapeText, KeepsPrintableTextAndUtf8) {
  EXPECT_EQ(EscapeText("Hello, world.\n\tindented"), "Hello, world.\n\tindented");
  EXPECT_EQ(EscapeText("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");  // é, €, an emoji
  EXPECT_EQ(EscapeText("a\\x08b"), "a\\x08b");             // a backslash is printable
  EXPECT_EQ(EscapeText(""), "");
}

TEST(EscapeText, EscapesControlsAndBrokenUtf8) {
  EXPECT_EQ(EscapeText("a\bb"), "a\\x08b");
  EXPECT_EQ(EscapeText("\x1b[31mred"), "\\x1b[31mred");
  EXPECT_EQ(EscapeText("cr\rdel\x7f"), "cr\\x0ddel\\x7f");
  EXPECT_EQ(EscapeText(std::string("nul\0end", 7)), "nul\\x00end");
  EXPECT_EQ(EscapeText("\xc2\x85"), "\\xc2\\x85");                    // U+0085, a C1 control
  EXPECT_EQ(EscapeText("\xc3"), "\\xc3");                             // truncated sequence
  EXPECT_EQ(EscapeText("\x80x"), "\\x80x");                           // lone continuation byte
  EXPECT_EQ(EscapeText("\xc0\xaf"), "\\xc0\\xaf");                    // overlong '/'
  EXPECT_EQ(EscapeText("\xed\xa0\x80"), "\\xed\\xa0\\x80");           // a surrogate
  EXPECT_EQ(EscapeText("\xf8\x88\x80\x80"), "\\xf8\\x88\\x80\\x80");  // no 5-byte forms
  EXPECT_EQ(EscapeText("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // past U+10FFFF
}

}  // namespace
}  // namespace lockstep
