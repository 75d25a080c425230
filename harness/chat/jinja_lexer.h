// The tokens of a chat template (jinja_parser.h): Hugging Face's preprocessing (one trailing
// newline dropped, lstrip_blocks, trim_blocks, `{% generation %}` markers removed), then text,
// the open and close markers of `{{ }}` / `{% %}` with their whitespace control applied to the
// neighbouring text, and the tokens inside tags (names, strings with Python's escapes, integers,
// floats, operators). Comments are dropped. Errors (kInvalidArgument, naming the line): an
// unterminated string, comment or tag, an unknown escape or character.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/status.h"

namespace lockstep::jinja {

struct Token {
  enum class Kind {
    kText,
    kOpenExpr,
    kCloseExpr,
    kOpenStmt,
    kCloseStmt,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEnd
  };
  Kind kind = Kind::kEnd;
  std::string text;
  std::int64_t i = 0;
  double f = 0;
  int line = 1;
};

Result<std::vector<Token>> Lex(std::string_view source);

}  // namespace lockstep::jinja
