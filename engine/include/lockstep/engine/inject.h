// Fault injection for testing the harness and the engine's timing paths (DESIGN.md):
//   delay:stage=S:window=W:ms=M   sleep M ms inside stage S's forward of verify window W
//                                 (counted in that stage's compute interval)
// `stage` and `window` may be omitted (= every stage / every window). A malformed or unknown
// injection is kInvalidArgument naming the text. (`perturb:...` arrives with the comparator.)
#pragma once

#include <string>
#include <vector>

#include "lockstep/engine/status.h"

namespace lockstep {

struct Injection {
  enum class Kind { kDelay };
  Kind kind = Kind::kDelay;
  int stage = -1;   // -1: any
  int window = -1;  // -1: any
  double ms = 0.0;
  std::string text;  // as given
};

Result<std::vector<Injection>> ParseInjections(const std::vector<std::string>& specs);

}  // namespace lockstep
