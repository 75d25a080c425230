// The service texts of the campaign report (campaign_text.h): where each service arm ran (fresh,
// shared or remote engine; cold or warm; engine state; background load), what a pair's service
// contrast did to the result, and the step composition of each matched window beside its verify
// time, so a window slow by itself can be told apart from one whose engine step also carried a
// prefill chunk or other sequences' rows.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "campaign/campaign_text.h"
#include "lockstep/compare/align.h"
#include "lockstep/compare/report.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/median.h"
#include "lockstep/harness/run_record.h"

namespace lockstep::campaign_text {

namespace {

constexpr std::size_t kMaxTableWindows = 64;   // rows of the Markdown table (the chart has all)
constexpr std::size_t kMaxChartWindows = 400;  // windows in the chart
constexpr double kSlowRatio = 2.0;             // "slow": verify >= 2 x the side's median
constexpr std::array<const char*, 2> kArmColours = {"#1f77b4", "#e6550d"};  // as report_html.cpp
constexpr const char* kPrefillColour = "#6a3d9a";

std::string Short(const json& s, const char* key, std::size_t n = 12) {
  const std::string v = s.is_object() && s.contains(key) && s[key].is_string()
                            ? s[key].get<std::string>()
                            : std::string();
  return v.empty() ? "unknown" : v.substr(0, n);
}

std::int64_t Int(const json& s, const char* key, std::int64_t dflt = -1) {
  return s.is_object() && s.contains(key) && s[key].is_number_integer() ? s[key].get<std::int64_t>()
                                                                        : dflt;
}

// Typed fields of a record: a failed arm's service record may hold nulls (unknown).
bool BoolOr(const json& j, const char* k, bool d) {
  return j.is_object() && j.contains(k) && j[k].is_boolean() ? j[k].get<bool>() : d;
}
std::string StringOr(const json& j, const char* k, const std::string& d) {
  return j.is_object() && j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : d;
}

std::string EngineStateText(const std::string& st) {
  if (st == "fresh") return "fresh (a server started for this arm)";
  if (st == "carried") return "carried (the shared server of this run)";
  if (st.starts_with("lost"))
    return "lost: re-primed (the shared server was gone after a resume: a new one was started "
           "and the arm's history sent again; not silently warm)";
  return st.empty() ? "unknown" : st;
}

double VerifyMs(const WindowRecord& w) { return static_cast<double>(w.verify_ns) * 1e-6; }

double MedianVerify(const std::vector<WindowRecord>& ws) {
  std::vector<double> v;
  for (const auto& w : ws)
    if (w.verify_ns >= 0) v.push_back(VerifyMs(w));
  return Median(v);
}

// How the window's engine step was shared: "alone", "with 2 other sequences", "with a 64-row
// prefill chunk" ("step unknown" for an older trace).
std::string Sharing(const WindowRecord& w) {
  if (w.step < 0) return "step unknown";
  if (w.step_prefill_rows > 0)
    return fmt::format("with {} prefill rows{}", w.step_prefill_rows,
                       w.step_seqs > 2 ? fmt::format(" ({} sequences)", w.step_seqs) : "");
  if (w.step_seqs > 1)
    return fmt::format("with {} other sequence{}", w.step_seqs - 1, w.step_seqs > 2 ? "s" : "");
  return "alone";
}

std::string Composition(const WindowRecord& w) {
  if (w.step < 0) return "unknown";
  return fmt::format("{} / {} / {}", w.step_rows, w.step_seqs, w.step_prefill_rows);
}

// What one side's window says: its step's sharing, and whether it was slow for that side.
std::string Reading(const std::string& arm, const WindowRecord& w, double median) {
  const bool slow = median > 0.0 && VerifyMs(w) >= kSlowRatio * median;
  const std::string share = Sharing(w);
  if (!slow && share == "alone") return "";
  if (!slow) return fmt::format("{}: step shared {}", arm, share);
  return fmt::format(
      "{}: slow ({:.1f}x its median), {}", arm, VerifyMs(w) / median,
      share == "alone" ? "step not shared: not explained by batching" : "step shared " + share);
}

// Per side: median verify of windows whose step carried prefill rows, other sequences only, or
// nothing else; counts of each.
struct SharingSummary {
  int prefill = 0, shared = 0, alone = 0, unknown = 0;
  std::vector<double> ms_prefill, ms_shared, ms_alone;
};

SharingSummary Summarise(const std::vector<WindowRecord>& ws, std::size_t n) {
  SharingSummary s;
  for (std::size_t i = 0; i < n && i < ws.size(); ++i) {
    const WindowRecord& w = ws[i];
    if (w.step < 0) {
      ++s.unknown;
    } else if (w.step_prefill_rows > 0) {
      ++s.prefill, s.ms_prefill.push_back(VerifyMs(w));
    } else if (w.step_seqs > 1) {
      ++s.shared, s.ms_shared.push_back(VerifyMs(w));
    } else {
      ++s.alone, s.ms_alone.push_back(VerifyMs(w));
    }
  }
  return s;
}

std::string SummaryText(const std::string& arm, const SharingSummary& s) {
  auto part = [](int n, const std::vector<double>& ms, const char* what) {
    return n == 0 ? std::string()
                  : fmt::format("{} {} (median verify {:.3f} ms)", n, what, Median(ms));
  };
  std::vector<std::string> parts;
  for (const std::string& p :
       {part(s.prefill, s.ms_prefill, "shared with a prefill chunk"),
        part(s.shared, s.ms_shared, "shared with other sequences' rows only"),
        part(s.alone, s.ms_alone, "alone in their step")})
    if (!p.empty()) parts.push_back(p);
  if (s.unknown > 0) parts.push_back(fmt::format("{} without step records", s.unknown));
  return fmt::format("{}: {}", arm,
                     parts.empty() ? "no windows" : fmt::format("{}", fmt::join(parts, "; ")));
}

std::string F(double v) { return fmt::format("{:.1f}", v); }

double NiceTop(double v) {
  if (!(v > 0.0)) return 1.0;
  const double mag = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= v) return m * mag;
  return 10.0 * mag;
}

}  // namespace

namespace {

// Whether some window of either side shared its engine step (other sequences, prefill rows).
bool HasStepContext(const std::vector<WindowRecord>& a, const std::vector<WindowRecord>& b) {
  for (const auto* ws : {&a, &b})
    for (const auto& w : *ws)
      if (w.step >= 0 && (w.step_seqs > 1 || w.step_prefill_rows > 0)) return true;
  return false;
}

}  // namespace

std::map<std::string, json> ReadServices(const std::string& dir, const std::vector<ArmSpec>& arms,
                                         const std::vector<LedgerEntry>& entries) {
  std::map<std::string, json> out;
  for (const LedgerEntry& e : entries)
    if (e.event == "finished" && e.data.contains("service") && e.data["service"].is_object())
      out[e.arm] = e.data["service"];
  for (const ArmSpec& a : arms) {
    auto t = ReadFile(RunPaths(dir).ArmFile(a.name, arm_file::kService), std::size_t{16} << 20);
    if (!t.ok()) continue;
    json j = json::parse(*t, nullptr, false);
    if (j.is_object()) out[a.name] = std::move(j);
  }
  return out;
}

void ServiceScopeText(std::ostream& md, const std::vector<ArmSpec>& arms,
                      const std::map<std::string, json>& service) {
  bool any = false;
  for (const ArmSpec& a : arms) any = any || a.server != "process";
  if (!any) return;
  md << "Where each arm's request ran (service arms: `lockstep serve`; a warm request reused "
        "cached prompt tokens from an earlier request on the same engine):\n\n"
        "| arm | server | engine (instance, config) | engine state | request | prompt tokens "
        "reused | snapshot position | primed | requests before | background load |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const ArmSpec& a : arms) {
    auto it = service.find(a.name);
    const json s = it == service.end() ? json() : it->second;
    if (a.server == "process" && !s.is_object()) {
      md << fmt::format(
          "| {} | process | a fresh `lockstep generate` | fresh | cold | 0 | — | no | 0 "
          "| none |\n",
          a.name);
      continue;
    }
    if (!s.is_object()) {
      md << fmt::format("| {} | {} (planned) | not recorded | | | | | | | {} |\n", a.name, a.server,
                        a.load ? "planned: " + std::to_string(a.load->requests) + " requests"
                               : std::string("none"));
      continue;
    }
    std::string load = "none";
    if (const json& l = s.contains("load") ? s["load"] : json(); l.is_object())
      load = fmt::format("{} requests (concurrency {}): {} completed, {} failed; digest {}{}",
                         Int(l, "requests"), Int(l, "concurrency"), Int(l, "completed"),
                         Int(l, "failed"), Short(l, "digest"),
                         !s.contains("load_in_flight") ? ""
                         : BoolOr(s, "load_in_flight", false)
                             ? "; in flight when the request was sent"
                             : "; NOT seen in flight when the request was sent (it may not "
                               "have overlapped)");
    const bool cold = BoolOr(s, "cold", true);
    const std::int64_t snap = Int(s, "snapshot_position");
    md << fmt::format(
        "| {} | {} | {}, config {} | {} | {} | {} | {} | {} | {} | {} |\n", a.name,
        StringOr(s, "server", a.server), Short(s, "instance"), Short(s, "engine_config_sha256"),
        EngineStateText(StringOr(s, "engine_state", "")), cold ? "cold" : "**warm**",
        Int(s, "prompt_tokens_reused", 0), snap < 0 ? "none" : std::to_string(snap),
        BoolOr(s, "primed", false) ? "yes" : "no", Int(s, "requests_before", 0), load);
  }
  md << "\n";
}

void ServicePairText(std::ostream& md, const ArmSpec& a, const json& record) {
  const json& cmp = record.value("comparison", json::object());
  const json& sv = cmp.contains("service") ? cmp["service"] : json();
  if (!sv.is_object()) return;
  std::vector<std::string> what;
  for (const auto& c : sv.value("contrast", json::array())) {
    const std::string k = c.get<std::string>();
    what.push_back(k == "cold_warm"      ? "cold against warm"
                   : k == "load"         ? "alone against under background load"
                   : k == "engine_reuse" ? "a fresh engine against one that had served requests"
                                         : k);
  }
  md << fmt::format("Service contrast of {} vs {}: {}. ", a.name, a.baseline,
                    what.empty() ? "none (the same service setting on both sides)"
                                 : fmt::format("{}", fmt::join(what, "; ")));
  const json& rep = record.value("report", json::object());
  const json& st = rep.contains("state") ? rep["state"] : json();
  const json& preds = cmp.value("predicates", json::object());
  const bool output_differs = BoolOr(preds, "output_differs", false);
  md << (output_differs ? "The output differs. " : "Output identical. ");
  if (st.is_object()) {
    const ChangeFacts f = ChangedItems(st);
    if (f.changed == 0 && f.failed == 0)
      md << fmt::format("Every one of the {} compared items is bitwise equal.", f.compared);
    else
      md << fmt::format(
          "{} of {} compared items differ bitwise; the first differing item: {}. Against the "
          "thresholds: {} item{} failed{}.",
          f.changed, f.compared, ChangedItemText(f), f.failed, f.failed == 1 ? "" : "s",
          f.failed == 0 ? " (every difference is within the thresholds)" : "");
  } else {
    md << "No state was compared for this pair.";
  }
  std::vector<std::string> fired;
  for (const char* p : {"warm_differs_from_cold", "load_changes_state", "load_changes_path",
                        "engine_reuse_changes_state"})
    if (BoolOr(preds, p, false)) fired.push_back(std::string("`") + p + "`");
  md << (fired.empty() ? " No service predicate is true."
                       : fmt::format(" True: {}.", fmt::join(fired, ", ")))
     << "\n\n";
}

namespace {

void StepCompositionText(std::ostream& md, const ArmSpec& a, const std::vector<WindowRecord>& wa,
                         const std::vector<WindowRecord>& wb, int matched) {
  const std::size_t n = static_cast<std::size_t>(std::max(0, matched));
  const double med_a = MedianVerify(wa), med_b = MedianVerify(wb);
  md << fmt::format(
      "Step composition per matched window ({} vs {}): each window's verify time beside the "
      "engine step it ran in (rows of the step / sequences sharing it / of which prefill rows). "
      "A window whose step also carried a prefill chunk or other sequences' rows is slower for "
      "that reason; a slow window alone in its step is not explained by batching.\n\n",
      a.name, a.baseline);
  md << "- " << SummaryText(a.baseline, Summarise(wa, n)) << ".\n";
  md << "- " << SummaryText(a.name, Summarise(wb, n)) << ".\n\n";
  md << fmt::format(
      "| window | p | T | {0} verify ms | {0} step rows / seqs / prefill | {1} verify ms | {1} "
      "step rows / seqs / prefill | reading |\n|---|---|---|---|---|---|---|---|\n",
      a.baseline, a.name);
  for (std::size_t i = 0; i < n && i < kMaxTableWindows && i < wa.size() && i < wb.size(); ++i) {
    const WindowRecord &x = wa[i], &y = wb[i];
    std::vector<std::string> reading;
    for (const std::string& r : {Reading(a.baseline, x, med_a), Reading(a.name, y, med_b)})
      if (!r.empty()) reading.push_back(r);
    md << fmt::format("| {} | {} | {} | {:.3f} | {} | {:.3f} | {} | {} |\n", i, x.p, x.T,
                      VerifyMs(x), Composition(x), VerifyMs(y), Composition(y),
                      Cell(fmt::format("{}", fmt::join(reading, "; "))));
  }
  if (n > kMaxTableWindows)
    md << fmt::format("\n({} more matched windows: in the HTML chart.)\n", n - kMaxTableWindows);
  md << "\n";
}

std::string SvgStepComposition(const ArmSpec& a, const std::vector<WindowRecord>& wa,
                               const std::vector<WindowRecord>& wb, int div_idx) {
  constexpr int kW = 760, kH = 380, kLeft = 64, kRight = 20;
  constexpr int kTop1 = 36, kBot1 = 176, kTop2 = 212, kBot2 = 332;
  const std::string title = "Verify time and step composition per window";
  const std::size_t n = std::min(kMaxChartWindows, std::max(wa.size(), wb.size()));
  double ms_max = 0.0, rows_max = 0.0;
  for (const auto* ws : {&wa, &wb})
    for (std::size_t i = 0; i < n && i < ws->size(); ++i) {
      ms_max = std::max(ms_max, VerifyMs((*ws)[i]));
      rows_max = std::max(rows_max, static_cast<double>((*ws)[i].step_rows));
    }
  const double ms_top = NiceTop(ms_max), rows_top = NiceTop(rows_max);
  const double pw = kW - kLeft - kRight;
  const double slot = pw / static_cast<double>(std::max<std::size_t>(n, 1));
  auto X = [&](double i) { return kLeft + slot * (i + 0.5); };
  auto Y1 = [&](double ms) { return kBot1 - (kBot1 - kTop1) * ms / ms_top; };
  auto Y2 = [&](double rows) { return kBot2 - (kBot2 - kTop2) * rows / rows_top; };
  std::string s = fmt::format(
      "<svg viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\" role=\"img\" aria-label=\"{2}\" "
      "class=\"step-composition\">\n<title>{2}</title>\n",
      kW, kH, XmlEscape(title));
  s += "<g font-size=\"11\" fill=\"#333\">\n";
  for (int k = 0; k <= 4; ++k) {
    const double ms = ms_top * k / 4, rows = rows_top * k / 4;
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#e5e5e5\"/>",
                     kLeft, F(Y1(ms)), kW - kRight);
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:g}</text>\n", kLeft - 6,
                     F(Y1(ms) + 4), ms);
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#e5e5e5\"/>",
                     kLeft, F(Y2(rows)), kW - kRight);
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:g}</text>\n", kLeft - 6,
                     F(Y2(rows) + 4), rows);
  }
  s += fmt::format(
      "<text x=\"14\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {0})\">verify "
      "ms</text>\n<text x=\"14\" y=\"{1}\" text-anchor=\"middle\" transform=\"rotate(-90 14 "
      "{1})\">step rows</text>\n",
      (kTop1 + kBot1) / 2, (kTop2 + kBot2) / 2);
  s += fmt::format(
      "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">window index (bars: {} left, {} right; "
      "purple: prefill rows of the step)</text>\n",
      kLeft + pw / 2, kH - 10, XmlEscape(a.baseline), XmlEscape(a.name));
  const std::size_t every = std::max<std::size_t>(1, (n + 11) / 12);
  for (std::size_t i = 0; i < n; i += every)
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                     F(X(static_cast<double>(i))), kBot2 + 16, i);
  for (std::size_t k = 0; k < 2; ++k)
    s += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"2\"/>"
        "<text x=\"{4}\" y=\"{5}\">{6}</text>",
        kLeft + 10 + 120 * k, kTop1 - 16, kLeft + 30 + 120 * k, kArmColours[k],
        kLeft + 36 + 120 * k, kTop1 - 12, XmlEscape(k == 0 ? a.baseline : a.name));
  s += "\n</g>\n";
  const std::array<const std::vector<WindowRecord>*, 2> sides = {&wa, &wb};
  const std::array<std::string, 2> names = {a.baseline, a.name};
  const double bw = std::max(1.0, std::min(8.0, slot * 0.4));
  for (std::size_t k = 0; k < 2; ++k) {
    const auto& ws = *sides[k];
    std::string pts;
    for (std::size_t i = 0; i < n && i < ws.size(); ++i) {
      const WindowRecord& w = ws[i];
      pts += F(X(static_cast<double>(i))) + "," + F(Y1(VerifyMs(w))) + " ";
      if (w.step < 0) continue;
      const double x0 = X(static_cast<double>(i)) + (k == 0 ? -bw : 0.0);
      const double other = std::max(0, w.step_rows - w.step_prefill_rows);
      const std::string tip = XmlEscape(fmt::format(
          "{} window {}: verify {:.3f} ms; step {}: {} rows, {} sequences, {} prefill rows",
          names[k], i, VerifyMs(w), w.step, w.step_rows, w.step_seqs, w.step_prefill_rows));
      s += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" "
          "fill-opacity=\"0.7\"><title>{}</title></rect>",
          F(x0), F(Y2(other)), F(bw), F(kBot2 - Y2(other)), kArmColours[k], tip);
      if (w.step_prefill_rows > 0)
        s += fmt::format(
            "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{}</title>"
            "</rect>",
            F(x0), F(Y2(w.step_rows)), F(bw), F(Y2(other) - Y2(w.step_rows)), kPrefillColour, tip);
      s += "\n";
    }
    if (!pts.empty()) {
      pts.pop_back();
      s += fmt::format(
          "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.4\" points=\"{}\"><title>{} "
          "verify ms</title></polyline>\n",
          kArmColours[k], pts, XmlEscape(names[k]));
    }
  }
  if (div_idx >= 0 && static_cast<std::size_t>(div_idx) < n)
    s += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#444\" "
        "stroke-dasharray=\"5,4\"/><text x=\"{3}\" y=\"{4}\" font-size=\"11\" fill=\"#444\">first "
        "path divergence (window {5})</text>\n",
        F(X(div_idx - 0.5)), kTop1 - 4, kBot2, F(X(div_idx - 0.5) + 4), kTop1 - 8, div_idx);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#666\"/>", kLeft,
                   kBot1, kW - kRight);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#666\"/>\n</svg>\n",
                   kLeft, kBot2, kW - kRight);
  return s;
}

}  // namespace

namespace {

std::string TracePath(const std::string& dir, const ArmSpec& a) {
  return RunPaths(dir).FirstRunFile(a, arm_file::kTrace);
}

// Both traces of a pair when the step composition says something: either side is a service arm,
// or some window shared its step. False otherwise (or when a trace cannot be read).
bool PairTraces(const std::string& dir, const ArmSpec& a, const ArmSpec& base,
                std::vector<WindowRecord>* wa, std::vector<WindowRecord>* wb) {
  auto ra = ReadWindowRecords(TracePath(dir, base));
  auto rb = ReadWindowRecords(TracePath(dir, a));
  if (!ra.ok() || !rb.ok()) return false;
  *wa = std::move(*ra);
  *wb = std::move(*rb);
  return a.server != "process" || base.server != "process" || HasStepContext(*wa, *wb);
}

}  // namespace

void PairStepText(std::ostream& md, const std::string& run_dir, const ArmSpec& a,
                  const ArmSpec& base) {
  std::vector<WindowRecord> wa, wb;
  if (!PairTraces(run_dir, a, base, &wa, &wb)) return;
  StepCompositionText(md, a, wa, wb, AlignWindows(wa, wb).matched);
}

std::string PairStepChart(const std::string& run_dir, const ArmSpec& a, const ArmSpec& base) {
  std::vector<WindowRecord> wa, wb;
  if (!PairTraces(run_dir, a, base, &wa, &wb)) return "";
  const AlignResult al = AlignWindows(wa, wb);
  return "<h3>" + HtmlEscape(a.name + " vs " + a.baseline) +
         ": verify time and step composition per window</h3>\n" +
         SvgStepComposition(a, wa, wb, al.diverged ? al.div_idx : -1);
}

}  // namespace lockstep::campaign_text
