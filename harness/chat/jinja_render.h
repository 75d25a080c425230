// Runs a parsed chat template (jinja_parser.h) over its variables and returns the text.
// Semantics are Jinja2's (Python's) where the Qwen-family templates depend on them: `set` inside
// a for loop is local to the iteration, namespace() attributes outlive it, undefined names are
// falsy and print as "", `loop.index0 / index / first / last / length / revindex`. Filters:
// length count tojson(indent) trim upper lower capitalize title default(d) join first last
// string int float list items reverse replace safe abs; tests: defined undefined none string
// number integer float boolean mapping iterable sequence true false odd even eq ne lt gt
// divisibleby in; methods of strings (strip lstrip rstrip split startswith endswith upper
// lower title capitalize replace join) and dicts (items keys values get); globals namespace,
// range, raise_exception. Anything else is kInvalidArgument naming it and the line.
// Bounded: every statement and expression evaluated is a step (over `max_steps`: an error, so
// nested loops cannot hang; one range() holds at most 100,000 items), and no string or the
// output grows over `max_output_bytes`; recursion depth is bounded by the parser's nesting limit.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja_parser.h"
#include "chat/jinja_value.h"
#include "lockstep/engine/status.h"

namespace lockstep::jinja {

struct RenderLimits {
  std::size_t max_output_bytes = 4u << 20;
  std::int64_t max_steps = 4'000'000;
};

Result<std::string> Render(const Body& body,
                           const std::vector<std::pair<std::string, Value>>& globals,
                           const RenderLimits& limits);

}  // namespace lockstep::jinja
