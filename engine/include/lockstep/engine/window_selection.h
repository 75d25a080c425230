// Selections of verify windows and checkpoint points, shared by the exporter (which windows write
// state) and the comparator (which windows and points to compare).
#pragma once

#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "lockstep/engine/observer.h"
#include "lockstep/engine/status.h"

namespace lockstep {

// "all", "none", or a list of indices and inclusive ranges ("0-2", "0,5,9-12"). A malformed text
// is kInvalidArgument labelled with `option`.
class WindowSelection {
 public:
  static Result<WindowSelection> Parse(std::string_view text,
                                       std::string_view option = "--export-windows");
  bool Contains(int window) const;
  bool none() const { return !all_ && ranges_.empty(); }

 private:
  bool all_ = false;
  std::vector<std::pair<int, int>> ranges_;
};

// "pre_verify,post_verify,commit" (any non-empty subset).
Result<std::set<CheckpointPoint>> ParseExportPoints(std::string_view text,
                                                    std::string_view option = "--export-points");

}  // namespace lockstep
