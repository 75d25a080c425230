// The chat-template subset of Jinja, parsed: text, `{{ expr }}`, `{% if / elif / else %}`,
// `{% for a[, b] in expr [if cond] %}...{% else %}`, `{% set name = expr %}`,
// `{% set ns.attr = expr %}`, comments, and whitespace control (`{%-`, `-%}`, `{{-`, `-}}`), with
// Hugging Face's environment: trim_blocks and lstrip_blocks on, one trailing newline of the
// template dropped, `{% generation %}` markers removed. Expressions: literals (strings with
// Python escapes, integers, floats, true/false/none in either case, lists, dicts), names,
// `.attr`, `[index]`, `[a:b:c]` slices, calls with keyword arguments, filters `|name(args)`,
// tests `is [not] name(args)`, unary not / -, and the binary operators of Jinja with its
// precedence (or, and, not, comparisons and [not] in, + -, ~, * / // %, **), and `a if c else b`.
// Anything else (macros, blocks, includes, call, filter blocks, break/continue) is refused by
// name: kNotSupported "chat template: unsupported tag 'macro' at line 3".
// Nesting (blocks and expressions) deeper than `max_depth` is kInvalidArgument, so a hostile
// template cannot overflow the stack.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja_value.h"
#include "lockstep/engine/status.h"

namespace lockstep::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Expr {
  enum class Kind {
    kLiteral,  // value
    kName,     // name
    kList,     // args
    kDict,     // kwargs (keys are expressions in args, pairwise: key, value)
    kAttr,     // args[0].name
    kIndex,    // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (null = omitted)
    kCall,     // args[0](args[1..], kwargs)
    kFilter,   // args[0] | name(args[1..], kwargs)
    kTest,     // args[0] is [not] name(args[1..])
    kUnary,    // name ("not", "-", "+") args[0]
    kBinary,   // args[0] name args[1]
    kCond,     // args[0] if args[1] else args[2] (args[2] null: undefined)
  };
  Kind kind = Kind::kLiteral;
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negate = false;  // `is not`
  int line = 0;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;
struct Stmt {
  enum class Kind { kText, kOutput, kIf, kFor, kSet };
  Kind kind = Kind::kText;
  std::string text;                  // kText
  ExprPtr expr;                      // output value, if condition, for iterable, set value
  ExprPtr filter;                    // for ... if filter
  std::vector<std::string> targets;  // for loop names; set: the name
  std::string attr;                  // set targets[0].attr = ...
  Body body, else_body;              // if: then / else (elif nests); for: body / empty-else
  int line = 0;
};

Result<Body> ParseTemplate(std::string_view source, int max_depth);

}  // namespace lockstep::jinja
