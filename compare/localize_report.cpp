// Localize's reports (localize.h): the verdict line, JSON (lockstep.localize v1), Markdown and
// HTML, verdict first.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "lockstep/compare/localize.h"
#include "lockstep/compare/markdown_html.h"

namespace lockstep {

namespace {

std::string Where(const OpSite& s) {
  std::string t = "window " + (s.window < 0 ? std::string("prefill") : std::to_string(s.window)) +
                  ", stage " + std::to_string(s.stage);
  if (s.layer >= 0) t += ", layer " + std::to_string(s.layer);
  t += ", " + s.op;
  if (s.index >= 0) t += " [" + std::to_string(s.index) + "]";
  if (s.row >= 0) t += ", row " + std::to_string(s.row);
  t += " (position " + std::to_string(s.position) + ")";
  return t;
}

std::string Hex(std::int64_t d) {
  char b[24];
  std::snprintf(b, sizeof(b), "%016llx", static_cast<unsigned long long>(d));
  return b;
}

std::string Num(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.3g", v);
  return b;
}

nlohmann::json SiteJson(const OpSite& s) {
  return {{"window", s.window},
          {"stage", s.stage},
          {"layer", s.layer},
          {"op", s.op},
          {"index", s.index},
          {"row", s.row},
          {"position", s.position},
          {"digest_a", Hex(s.digest_a)},
          {"digest_b", Hex(s.digest_b)},
          {"l2_a", s.l2_a},
          {"l2_b", s.l2_b}};
}

std::string Shared(const LocalizeResult& r) {
  if (r.step_rows_a < 0 && r.step_rows_b < 0) return "";
  auto one = [](int rows, int seqs) {
    return rows < 0 ? std::string("unknown")
                    : std::to_string(rows) + " rows of " + std::to_string(seqs) + " sequences";
  };
  return "the window's engine step carried " + one(r.step_rows_a, r.step_seqs_a) + " in A, " +
         one(r.step_rows_b, r.step_seqs_b) + " in B";
}

}  // namespace

std::string LocalizeVerdictLine(const LocalizeResult& r) {
  switch (r.verdict) {
    case LocalizeVerdict::kNoDifference:
      return std::string(r.kind == "did not reproduce" ? "did not reproduce: "
                                                       : "no difference: ") +
             std::to_string(r.compared) + " op records compared, all equal";
    case LocalizeVerdict::kNothing:
      return "nothing comparable: " + r.why;
    case LocalizeVerdict::kBorn:
      return "born at " + Where(r.first) + " (" + r.kind + ")";
    case LocalizeVerdict::kCarried: {
      std::string t = "carried, not born: the first difference is state item " + r.item +
                      " as window " + std::to_string(r.first.window) + " reads it";
      if (r.origin_window_equal >= -1)
        t += " (equal when window " +
             (r.origin_window_equal < 0 ? std::string("prefill")
                                        : std::to_string(r.origin_window_equal)) +
             " read it)";
      if (!r.origin_injection.empty()) t += "; changed by --inject " + r.origin_injection;
      return t;
    }
    case LocalizeVerdict::kPath:
      return "path differs, no op born: " +
             (r.first.op.empty() ? std::string("one run has more records")
                                 : "A runs " + Where(r.first) +
                                       (r.first_b.op.empty() ? std::string(", B nothing")
                                                             : ", B runs " + Where(r.first_b)));
  }
  return "?";
}

std::string LocalizeJson(const LocalizeResult& r, const std::string& a_name,
                         const std::string& b_name) {
  nlohmann::json j;
  j["schema"] = "lockstep.localize";
  j["schema_version"] = 1;
  j["verdict"] = LocalizeVerdictName(r.verdict);
  j["verdict_line"] = LocalizeVerdictLine(r);
  j["exit_code"] = LocalizeExitCode(r);
  j["kind"] = r.kind;
  j["why"] = r.why;
  j["a"] = a_name;
  j["b"] = b_name;
  j["compared"] = r.compared;
  j["records_a"] = r.records_a;
  j["records_b"] = r.records_b;
  if (r.verdict != LocalizeVerdict::kNoDifference && r.verdict != LocalizeVerdict::kNothing) {
    j["first"] = SiteJson(r.first);
    if (r.verdict == LocalizeVerdict::kPath && !r.first_b.op.empty())
      j["first_b"] = SiteJson(r.first_b);
  }
  nlohmann::json ins = nlohmann::json::array();
  for (const LocalizeInput& in : r.inputs) {
    nlohmann::json x{{"name", in.name}, {"recorded", in.recorded}};
    if (in.recorded) x["site"] = SiteJson(in.site);
    ins.push_back(std::move(x));
  }
  j["inputs"] = std::move(ins);
  j["inputs_unrecorded"] = r.inputs_unrecorded;
  if (r.has_dump)
    j["dump"] = {{"nrmse", r.nrmse},
                 {"max_abs", r.max_abs},
                 {"first_element", r.first_element},
                 {"a", r.element_a},
                 {"b", r.element_b}};
  if (r.verdict == LocalizeVerdict::kCarried)
    j["carried"] = {
        {"item", r.item},
        {"window", r.first.window},
        {"equal_at_window", r.origin_window_equal >= -1 ? nlohmann::json(r.origin_window_equal)
                                                        : nlohmann::json(nullptr)},
        {"injection", r.origin_injection}};
  j["step"] = {{"rows_a", r.step_rows_a},
               {"seqs_a", r.step_seqs_a},
               {"rows_b", r.step_rows_b},
               {"seqs_b", r.step_seqs_b}};
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerDivergence& l : r.layers)
    layers.push_back(
        {{"stage", l.stage}, {"layer", l.layer}, {"in", l.in}, {"out", l.out}, {"added", l.added}});
  j["divergence_metric"] = r.divergence_metric;
  j["layers"] = std::move(layers);
  return j.dump(2) + "\n";
}

std::string LocalizeMarkdown(const LocalizeResult& r, const std::string& a_name,
                             const std::string& b_name) {
  std::string md = "# lockstep localize\n\n";
  md += "**" + LocalizeVerdictLine(r) + "**\n\n";
  md += "- A: `" + a_name + "`, B: `" + b_name + "`\n";
  md += "- " + std::to_string(r.compared) + " op records compared (A holds " +
        std::to_string(r.records_a) + ", B " + std::to_string(r.records_b) + ")\n";
  if (!r.why.empty()) md += "- " + r.why + "\n";
  if (r.verdict == LocalizeVerdict::kBorn || r.verdict == LocalizeVerdict::kCarried)
    md += "- digests: A `" + Hex(r.first.digest_a) + "`, B `" + Hex(r.first.digest_b) +
          "`; row L2 A " + Num(r.first.l2_a) + ", B " + Num(r.first.l2_b) + "\n";
  if (r.has_dump)
    md += "- dumped row: NRMSE " + Num(r.nrmse) + ", max abs " + Num(r.max_abs) +
          ", first differing element " + std::to_string(r.first_element) + " (A " +
          Num(r.element_a) + ", B " + Num(r.element_b) + ")\n";
  const std::string shared = Shared(r);
  if (!shared.empty() && r.verdict != LocalizeVerdict::kNoDifference) md += "- " + shared + "\n";
  if (!r.inputs.empty()) {
    md += "\n## Inputs\n\n| input | recorded | equal at |\n|---|---|---|\n";
    for (const LocalizeInput& in : r.inputs)
      md += "| `" + in.name + "` | " + (in.recorded ? "yes" : "no") + " | " +
            (in.recorded ? Where(in.site) : std::string("-")) + " |\n";
  }
  if (!r.layers.empty()) {
    md += "\n## Added divergence per layer (window " + std::to_string(r.first.window) + ", " +
          r.divergence_metric +
          ")\n\n| stage | layer | input | output | added |\n|---|---|---|---|---|\n";
    for (const LayerDivergence& l : r.layers)
      md += "| " + std::to_string(l.stage) + " | " + std::to_string(l.layer) + " | " + Num(l.in) +
            " | " + Num(l.out) + " | " + Num(l.added) + " |\n";
  }
  return md;
}

std::string LocalizeHtml(const LocalizeResult& r, const std::string& a_name,
                         const std::string& b_name) {
  const char* cls = r.verdict == LocalizeVerdict::kNoDifference ? "verdict-pass"
                    : r.verdict == LocalizeVerdict::kNothing    ? "verdict-warn"
                                                                : "verdict-fail";
  std::string md = LocalizeMarkdown(r, a_name, b_name);
  std::string body = MarkdownToHtml(md);
  // The verdict box first: the verdict line again, in the box's colour.
  const std::string box = "<div id=\"verdict\" class=\"verdict " + std::string(cls) + "\">" +
                          MarkdownToHtml(LocalizeVerdictLine(r)) + "</div>\n";
  return HtmlDocument("lockstep localize", box + body);
}

}  // namespace lockstep
