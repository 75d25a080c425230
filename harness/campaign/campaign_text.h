// Private to harness/campaign/: the per-pair texts of the campaign report (campaign_report.cpp
// builds the document; campaign_text.cpp writes what one comparison record says about state, path
// and timing) and the small formatting helpers both use. Input is a comparison record's JSON
// (compare/<arm>.json: "report" as compare/REPORTS.md, "comparison" as gates.cpp ToJson).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "lockstep/harness/campaign.h"

namespace lockstep::campaign_text {

using json = nlohmann::json;

inline std::string Cfg(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// Text for a Markdown table cell: a '|' would end the cell.
inline std::string Cell(std::string s) {
  std::replace(s.begin(), s.end(), '|', '/');
  return s;
}

// A number of `j[key]` with `digits` decimals; "?" when absent, the value's text when not a number.
inline std::string Num(const json& j, const char* key, int digits = 3) {
  if (!j.contains(key)) return "?";
  const json& v = j[key];
  if (v.is_number()) return fmt::format("{:.{}f}", v.get<double>(), digits);
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// The state comparison of one arm against its baseline (`st`: the report's "state" object).
void ArmStateText(std::ostream& md, const ArmSpec& a, const json& st);
// Where the paths of an arm and its baseline part (`al`: the report's "alignment" object).
void ArmPathText(std::ostream& md, const ArmSpec& a, const json& al);
// The matched prefix's interval table and each side's notable verify windows.
void ArmIntervalText(std::ostream& md, const ArmSpec& a, const json& al);
// The timing verdict of a repeated timing pair (`cmp`: the comparison record): medians over
// every repeat with their 95% intervals, the direction in words, every instability flag named
// with its rule, and the per-window medians.
void ArmTimingVerdictText(std::ostream& md, const ArmSpec& a, const json& cmp);

}  // namespace lockstep::campaign_text
