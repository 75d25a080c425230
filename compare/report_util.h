// Private helpers shared by the report files: report.cpp (what a report says: config keys, arm
// summaries, limitations, escapes), report_json.cpp, report_markdown.cpp, report_junit.cpp,
// report_redact.cpp and report_html.cpp. Not installed; compare/ only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/compare/report.h"

namespace lockstep::report_internal {

// Free text from an export or a flag with every forbidden snippet (FindForbiddenText) replaced by
// "(redacted)" (report_redact.cpp).
std::string Redact(std::string_view text);
// The arm's name, redacted, or `fallback` when it has none.
std::string ArmName(const ArmInfo& arm, const char* fallback);
// A threshold with as few digits as represent it exactly ("2e-04", "2.5e-04").
std::string FormatThreshold(double v);
// "1 item" / "3 items".
std::string Plural(std::int64_t n, const char* one, const char* many);
// The item was compared value by value (not skipped, not failed before any value).
bool HasMetric(const ItemResult& it);
// What made an item fail, as "NRMSE 3.1e-02 > 2e-04" (metric and the threshold applied).
std::string FailureDetail(const ItemResult& it);
// Config differences: allowlisted keys with their values, other keys by name only.
std::vector<std::string> ConfigDifferences(const ReportInput& in);

}  // namespace lockstep::report_internal
