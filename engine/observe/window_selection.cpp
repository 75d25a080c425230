#include "lockstep/engine/window_selection.h"

#include <charconv>

namespace lockstep {

Result<WindowSelection> WindowSelection::Parse(std::string_view text, std::string_view option) {
  WindowSelection s;
  if (text == "all") {
    s.all_ = true;
    return s;
  }
  if (text == "none" || text.empty()) return s;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    std::string_view part =
        text.substr(start, comma == std::string_view::npos ? text.size() - start : comma - start);
    std::size_t dash = part.find('-');
    int a = 0, b = 0;
    auto num = [](std::string_view v, int* out) {
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
      return ec == std::errc() && p == v.data() + v.size() && !v.empty() && *out >= 0;
    };
    bool ok = dash == std::string_view::npos
                  ? (num(part, &a) && (b = a, true))
                  : (num(part.substr(0, dash), &a) && num(part.substr(dash + 1), &b) && a <= b);
    if (!ok)
      return Status::InvalidArgument(
          option, "expected all, none or a list like 0-2,5 — got '" + std::string(text) + "'");
    s.ranges_.emplace_back(a, b);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return s;
}

bool WindowSelection::Contains(int w) const {
  if (all_) return true;
  for (auto [a, b] : ranges_)
    if (w >= a && w <= b) return true;
  return false;
}

Result<std::set<CheckpointPoint>> ParseExportPoints(std::string_view text,
                                                    std::string_view option) {
  std::set<CheckpointPoint> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    std::string_view part =
        text.substr(start, comma == std::string_view::npos ? text.size() - start : comma - start);
    const std::optional<CheckpointPoint> p = ParseCheckpointPoint(part);
    if (!p) {
      std::string names;
      for (CheckpointPoint q : AllCheckpointPoints())
        names += (names.empty() ? "" : ", ") + std::string(CheckpointPointName(q));
      return Status::InvalidArgument(
          option, "unknown point '" + std::string(part) + "' (expected " + names + ")");
    }
    out.insert(*p);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace lockstep
