#include "lockstep/harness/campaign_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <sstream>

#include "campaign/campaign_text.h"
#include "lockstep/compare/align.h"
#include "lockstep/compare/markdown_html.h"
#include "lockstep/compare/report.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/median.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/harness/campaign_outcome.h"
#include "lockstep/harness/ledger.h"
#include "lockstep/harness/run_record.h"
#include "lockstep/harness/verdict.h"

namespace lockstep {

namespace fs = std::filesystem;

namespace {

using json = nlohmann::json;
using campaign_text::ArmIntervalText;
using campaign_text::ArmPathText;
using campaign_text::ArmStateText;
using campaign_text::ArmTimingVerdictText;
using campaign_text::Cell;
using campaign_text::Cfg;
using campaign_text::ModelLine;
using campaign_text::Num;
using campaign_text::RequestLine;
using campaign_text::ResourceLine;

struct ArmFacts {
  bool sent = false, finished = false, failed = false;
  std::string not_sent;  // reason
  json resources;        // from stdout.json (repeat 0)
  std::int64_t output_tokens = -1;
  std::string stop_reason;
};

struct Loaded {
  Campaign c;
  std::vector<LedgerEntry> entries;
  std::map<std::string, ArmFacts> arms;
  std::map<std::string, json> records;  // compare/<arm>.json
  json stopped;                         // the stopped entry's data (null: none)
  std::string verdict, verdict_reason;
  std::string created_utc;
  std::string dir;          // the run folder (traces are read from it)
  json builds, arm_builds;  // the planned entry's (null: a ledger from before named builds)
  std::map<std::string, json> service;  // service arms' records (campaign_text::ReadServices)
};

Result<Loaded> Load(const std::string& dir) {
  Loaded L;
  L.dir = dir;
  LOCKSTEP_ASSIGN_OR_RETURN(RunRead run, ReadRun(dir));
  L.entries = std::move(run.ledger.entries);
  if (L.entries.empty() || L.entries.front().event != "planned")
    return Status::InvalidArgument("report '" + dir + "'",
                                   "not a run folder (the ledger has no planned entry)");
  LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(dir + "/plan.toml", std::size_t{16} << 20));
  const RunRecord& rec = run.record;
  LOCKSTEP_ASSIGN_OR_RETURN(L.c, ParseCampaign(text, "plan.toml", rec.plan_dir));
  L.builds = rec.builds;
  L.arm_builds = rec.arm_builds;
  for (const auto& ar : rec.sent) L.arms[ar.first].sent = true;
  for (const auto& ar : rec.ran) L.arms[ar.first].finished = true;
  for (const auto& ar : rec.failed) L.arms[ar.first].failed = true;
  for (const auto& [arm, why] : rec.not_sent_reason) L.arms[arm].not_sent = why;
  L.stopped = rec.stopped_data;
  L.verdict = rec.verdict;
  L.verdict_reason = rec.verdict_reason;
  L.service = campaign_text::ReadServices(dir, L.c.arms, L.entries);
  for (const auto& arm : L.c.arms) {
    ArmFacts& a = L.arms[arm.name];
    const std::string out = RunPaths(dir).FirstRunFile(arm, arm_file::kStdout);
    if (auto t = ReadFile(out, std::size_t{64} << 20); t.ok()) {
      try {
        json j = json::parse(*t);
        a.resources = j.value("resources", json::object());
        a.output_tokens = j.value("output_tokens", std::int64_t{-1});
        a.stop_reason = j.value("stop_reason", "");
      } catch (const json::exception&) {
      }
    }
    if (auto t = ReadFile(RunPaths(dir).Compare(arm.name, ".json"), std::size_t{256} << 20);
        t.ok()) {
      try {
        L.records[arm.name] = json::parse(*t);
      } catch (const json::exception&) {
      }
    }
  }
  return L;
}

// Engine keys an arm overrides, allowlisted, as "key=value".
std::string Overrides(const ArmSpec& a) {
  const auto& allowed = ReportConfigKeys();
  std::string s;
  for (auto it = a.engine.begin(); it != a.engine.end(); ++it) {
    if (std::find(allowed.begin(), allowed.end(), it.key()) == allowed.end()) continue;
    s += (s.empty() ? "" : ", ") + it.key() + "=" + Cfg(it.value());
  }
  return s.empty() ? "—" : "`" + s + "`";
}

// The comparisons' limitation lines, deduplicated; lines that differ only in the arms listed in
// their closing parenthesis ("... (A1 and A2).") become one line naming every arm once.
std::vector<std::string> CompactLimitations(const std::vector<std::string>& in) {
  std::vector<std::string> out;
  std::map<std::string, std::vector<std::string>> arms;  // prefix -> arms, in order
  for (const auto& l : in) {
    const auto open = l.rfind('(');
    if (l.ends_with(").") && open != std::string::npos) {
      std::string inner = l.substr(open + 1, l.size() - open - 3);
      std::string lead;
      if (inner.starts_with("not applicable in ")) lead = "not applicable in ", inner.erase(0, 18);
      const std::string prefix = l.substr(0, open + 1) + lead;
      if (!arms.count(prefix)) out.push_back("\x01" + prefix);
      auto& list = arms[prefix];
      for (std::size_t p = 0; p <= inner.size();) {
        std::size_t e = inner.find(" and ", p);
        if (e == std::string::npos) e = inner.size();
        const std::string arm = inner.substr(p, e - p);
        if (std::find(list.begin(), list.end(), arm) == list.end()) list.push_back(arm);
        p = e + 5;
      }
      continue;
    }
    if (std::find(out.begin(), out.end(), l) == out.end()) out.push_back(l);
  }
  for (auto& l : out)
    if (l.starts_with("\x01")) {
      const std::string prefix = l.substr(1);
      l = prefix + fmt::format("{}", fmt::join(arms[prefix], ", ")) + ").";
    }
  return out;
}

// Which arms were sent and how many generation requests ran: the summary and the stop decision
// both say it.
struct RunTally {
  std::vector<std::string> sent_arms, unsent_arms;
  int requests = 0;
};

RunTally Tally(const Loaded& L) {
  RunTally t;
  for (const auto& a : L.c.arms) {
    const ArmFacts& f = L.arms.at(a.name);
    (f.sent ? t.sent_arms : t.unsent_arms).push_back(a.name);
  }
  for (const auto& e : L.entries)
    if (e.event == "finished" || e.event == "failed") ++t.requests;
  return t;
}

// ---- the report's sections, in document order ----

// How a comparison came out, as its row and the box say it: the positive control's expected
// failure reads "failed as expected: caught", never a bare FAIL.
std::string PairResult(const Loaded& L, const ArmSpec& a, const json& cmp) {
  std::string failed;
  for (const auto& g : cmp.value("gates", json::array()))
    if (!g.value("passed", false)) failed += (failed.empty() ? "" : ", ") + g.value("name", "");
  const bool passed = cmp.value("passed", false);
  if (a.control) {
    if (L.verdict == "control_not_applied") return "NOT APPLIED: its injection did not fire";
    if (passed) return "NOT CAUGHT: passed every gate (insensitive)";
    const auto caught = cmp.value("caught_by", std::vector<std::string>{});
    if (caught.empty())
      return "NOT CAUGHT ON ANYTHING: its gates failed with nothing compared (failed gates: " +
             failed + ")";
    // Name the gates that caught it as gates; others that failed (with nothing compared) apart.
    std::vector<std::string> others;
    for (const auto& g : cmp.value("gates", json::array()))
      if (!g.value("passed", false) &&
          std::find(caught.begin(), caught.end(), g.value("name", "")) == caught.end())
        others.push_back(g.value("name", ""));
    std::string names;
    for (const std::string& g : caught) names += (names.empty() ? "'" : ", '") + g + "'";
    return fmt::format("failed as expected: caught by the failed gate{} {}{}",
                       caught.size() > 1 ? "s" : "", names,
                       others.empty() ? std::string()
                                      : fmt::format(" (also failed: {})", fmt::join(others, ", ")));
  }
  return passed ? "pass" : "FAIL (" + failed + ")";
}

// The verdict box: the campaign's verdict, what ran, the first failing comparison, the stop rule
// that fired and what the positive control showed.
VerdictBox CampaignVerdict(const Loaded& L, const RunTally& t) {
  VerdictBox v;
  v.status = L.verdict.empty() ? "not finished" : L.verdict;
  v.tone = CampaignOutcomeTone(ParseCampaignOutcome(L.verdict));
  std::string label = v.status;  // the ledger's verdict: "control_not_applied" reads as words
  std::transform(label.begin(), label.end(), label.begin(), [](unsigned char ch) {
    return ch == '_' ? ' ' : static_cast<char>(std::toupper(ch));
  });
  v.label = label;
  if (!L.verdict_reason.empty()) {
    v.reason = L.verdict_reason;
  } else if (L.verdict == "pass") {
    v.reason = "every comparison passed its gates";
    if (!L.c.control.empty()) v.reason += " and the positive control was caught";
  } else {
    v.reason = L.verdict.empty() ? "the campaign has not finished" : L.verdict;
  }
  v.reason[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(v.reason[0])));
  v.reason += ".";
  std::vector<std::string> pairs;
  for (const auto& a : L.c.arms)
    if (L.records.count(a.name)) pairs.push_back(a.name + " vs " + a.baseline);
  v.compared = campaign_text::LlamaInvarianceLines(L.c, L.records, L.dir);  // first, when any
  v.compared.push_back(fmt::format(
      "Arms: {} of {} sent ({}); {} generation requests.", t.sent_arms.size(), L.c.arms.size(),
      t.sent_arms.empty() ? "none" : fmt::format("{}", fmt::join(t.sent_arms, ", ")), t.requests));
  v.compared.push_back(fmt::format(
      "Comparisons: {}.", pairs.empty() ? "none" : fmt::format("{}", fmt::join(pairs, "; "))));
  for (const auto& a : L.c.arms) {
    auto it = L.records.find(a.name);
    if (it == L.records.end() || a.control) continue;
    const json& cmp = it->second.value("comparison", json::object());
    if (cmp.value("passed", true)) continue;
    std::string first;
    for (const auto& g : cmp.value("gates", json::array()))
      if (!g.value("passed", false) && first.empty())
        first = "gate '" + g.value("name", "") + "' failed: " + g.value("message", "");
    v.details.push_back(
        fmt::format("First failing comparison: {} vs {}, {}.", a.name, a.baseline, first));
    break;
  }
  for (const auto& a : L.c.arms) {  // plan key localize: where each failing pair's diff is born
    if (a.control || !L.records.count(a.name)) continue;
    auto text =
        ReadFile(RunPaths(L.dir).Localize(a.baseline, a.name, ".json"), std::size_t{16} << 20);
    const json loc = text.ok() ? json::parse(*text, nullptr, false) : json();
    if (!loc.is_object()) continue;
    v.details.push_back(loc.contains("summary")
                            ? "Localized: " + loc["summary"].value("sentence", "") + "."
                            : "Localize " + a.baseline + " vs " + a.name +
                                  ": failed (its reason is in the run folder's localize/).");
  }
  if (const auto relaxed = RelaxedThresholds(L.c.thresholds); !relaxed.empty())
    v.compared.push_back(
        fmt::format("Thresholds relaxed by the plan: {}.", fmt::join(relaxed, "; ")));
  for (auto& line :
       campaign_text::ChangeBoxLines(L.c.arms, L.arm_builds, L.records, L.stopped.is_object()))
    v.details.push_back(std::move(line));
  if (L.stopped.is_object())
    v.details.push_back(fmt::format(
        "Stopped by rule '{}' (fired by {}) before arm {}: {}; not sent: {}.",
        L.stopped.value("rule", ""),
        fmt::join(L.stopped.value("fired_by", std::vector<std::string>{}), ", "),
        L.stopped.value("before_arm", "?"), L.stopped.value("message", ""),
        t.unsent_arms.empty() ? "none" : fmt::format("{}", fmt::join(t.unsent_arms, ", "))));
  if (!L.c.control.empty()) {
    auto it = L.records.find("control");
    for (const auto& a : L.c.arms)
      if (a.control)
        v.details.push_back(
            it == L.records.end()
                ? "Positive control: not run."
                : "Positive control (" + L.c.control + "): " +
                      PairResult(L, a, it->second.value("comparison", json::object())) + ".");
  }
  return v;
}

// Verify ms of window `idx` in repeat 0 of `arm`'s trace, and the trace's median verify (-1:
// unknown).
std::pair<double, double> VerifyAt(const Loaded& L, const ArmSpec& arm, int idx) {
  auto w = ReadWindowRecords(RunPaths(L.dir).FirstRunFile(arm, arm_file::kTrace));
  if (!w.ok()) return {-1.0, -1.0};
  double at = -1.0;
  std::vector<double> all;
  for (const WindowRecord& r : *w) {
    if (r.verify_ns < 0) continue;
    all.push_back(static_cast<double>(r.verify_ns) / 1e6);
    if (r.idx == idx) at = all.back();
  }
  if (all.empty()) return {at, -1.0};
  return {at, MiddleValues(all).second};
}

// The injected delays of the plan's arms, tied to the verify time recorded at their window in
// the arm and its baseline, and placed against the first path divergence.
void DelayText(std::ostream& md, const Loaded& L) {
  for (const auto& a : L.c.arms) {
    if (!a.engine.contains("inject") || a.control) continue;
    const ArmSpec* base = nullptr;
    for (const auto& b : L.c.arms)
      if (b.name == a.baseline) base = &b;
    for (const auto& inj : a.engine["inject"]) {
      const std::string spec = inj.is_string() ? inj.get<std::string>() : inj.dump();
      if (!spec.starts_with("delay:")) continue;
      auto param = [&spec](const char* key) {
        const auto p = spec.find(key);
        return p == std::string::npos ? -1.0 : std::atof(spec.c_str() + p + std::strlen(key));
      };
      const int window = static_cast<int>(param("window="));
      const double ms = param("ms=");
      md << fmt::format("Injected: {} carried `{}` (a simulated stall).", a.name, spec);
      const auto [mine, median] = VerifyAt(L, a, window);
      if (window >= 0 && mine >= 0.0) {
        md << fmt::format(" {}'s verify at window {} took {:.1f} ms (its median {:.1f} ms)", a.name,
                          window, mine, median);
        const double theirs = base != nullptr ? VerifyAt(L, *base, window).first : -1.0;
        if (theirs >= 0.0) {
          md << fmt::format(" against {:.1f} ms for {}", theirs, base->name);
          if (ms > 0.0)
            md << (mine - theirs >= 0.8 * ms
                       ? fmt::format(": the injected {:.0f} ms delay accounts for the stall", ms)
                       : fmt::format(": {:.1f} ms more, not the injected {:.0f} ms", mine - theirs,
                                     ms));
        }
        md << ".";
      } else if (window >= 0) {
        md << fmt::format(" {}'s trace has no verify time at window {}.", a.name, window);
      }
      auto it = L.records.find(a.name);
      const json al = it == L.records.end()
                          ? json()
                          : it->second.value("report", json::object()).value("alignment", json());
      if (al.is_object() && al.value("diverged", false) && window >= 0) {
        const int div = al.value("div_idx", -1);
        md << (div > window ? fmt::format(" The paths diverged at window {}, after the delayed "
                                          "window.",
                                          div)
                            : fmt::format(" The paths had already diverged at window {}, before "
                                          "or at the delayed window: that divergence is not the "
                                          "delay's effect.",
                                          div));
      }
      md << "\n\n";
    }
  }
}

void SummarySection(std::ostream& md, const Loaded& L, const RunTally& t) {
  const Campaign& c = L.c;
  const std::vector<std::string>& sent_arms = t.sent_arms;
  const std::vector<std::string>& unsent_arms = t.unsent_arms;
  md << "# " << c.name << ": predeclared A/A diagnostic campaign\n\n";
  md << "## Summary\n\n";
  md << "Question: " << c.question << "\n\n";
  if (!c.hypothesis.empty()) md << "Hypothesis: " << c.hypothesis << "\n\n";
  campaign_text::HypothesisText(md, L.c, L.verdict, L.records);
  DelayText(md, L);
  md << "| comparison | result | pages |\n|---|---|---|\n";
  for (const auto& a : c.arms) {
    auto it = L.records.find(a.name);
    if (it == L.records.end()) continue;
    md << fmt::format("| {} vs {}{} | {} | [HTML](compare/{}.html), [Markdown](compare/{}.md) |\n",
                      a.name, a.baseline, a.control ? " (positive control)" : "",
                      Cell(PairResult(L, a, it->second.value("comparison", json::object()))),
                      a.name, a.name);
  }
  md << "\n";
  md << fmt::format("{} generation requests were executed (arms sent: {}).", t.requests,
                    sent_arms.empty() ? "none" : fmt::format("{}", fmt::join(sent_arms, ", ")));
  if (!unsent_arms.empty())
    md << fmt::format(" We stopped before the planned {} arm(s).", fmt::join(unsent_arms, ", "));
  md << " This is a bounded diagnostic observation, not a confirmed correctness bug, a root-cause "
        "claim, or a "
        "performance result.\n\n";
}

// One row per arm: mode, repeats, baseline, overrides and how far it got.
void ArmTable(std::ostream& md, const Loaded& L) {
  md << "| arm | mode | repeats | baseline | overrides | status |\n|---|---|---|---|---|---|\n";
  for (const auto& a : L.c.arms) {
    const ArmFacts& f = L.arms.at(a.name);
    std::string status = !f.not_sent.empty() ? "not sent: " + f.not_sent
                         : f.failed          ? "failed"
                         : f.finished        ? "finished"
                         : f.sent            ? "sent, not finished"
                                             : "pending";
    md << fmt::format("| {}{} | {} | {} | {} | {} | {} |\n", a.name,
                      a.control ? " (positive control)" : "", a.mode, a.repeat,
                      a.baseline.empty() ? "—" : a.baseline, Overrides(a), status);
  }
  md << "\n";
}

void ScopeSection(std::ostream& md, const Loaded& L) {
  const Campaign& c = L.c;
  const json* first_report = nullptr;
  for (const auto& a : c.arms)
    if (auto it = L.records.find(a.name); it != L.records.end() && it->second.contains("report")) {
      first_report = &it->second["report"];
      break;
    }
  md << "## Tested configuration and scope\n\n";
  md << "- Plan SHA-256: " << c.plan_sha256.substr(0, 12)
     << " (the ledger refuses to resume under a changed plan).\n";
  std::string plan_model;
  for (const auto& [arm, rec] : L.records)
    if (rec.contains("fingerprints") && rec["fingerprints"].is_object())
      plan_model = rec["fingerprints"].value("plan_model_sha256", "");
  md << "- Model: " << ModelLine(c, first_report ? *first_report : json(), plan_model) << ".\n";
  campaign_text::FingerprintText(md, L.records, L.entries);
  md << "- Request: " << RequestLine(c) << ".\n";
  {
    std::string fixed;
    const auto& allowed = ReportConfigKeys();
    for (auto it = c.engine.begin(); it != c.engine.end(); ++it)
      if (std::find(allowed.begin(), allowed.end(), it.key()) != allowed.end())
        fixed += (fixed.empty() ? "" : " ") + fmt::format("{}={}", it.key(), Cfg(it.value()));
    md << "- Fixed engine configuration every arm inherits: "
       << (fixed.empty() ? "engine defaults" : "`" + fixed + "`") << ".\n";
  }
  campaign_text::BuildsText(md, L.builds, L.arm_builds, c.arms);
  bool any_state = false, any_timing = false;
  for (const auto& a : c.arms) (a.mode == "timing" ? any_timing : any_state) = true;
  const auto services = std::count_if(c.arms.begin(), c.arms.end(),
                                      [](const ArmSpec& a) { return a.server != "process"; });
  md << (services == 0 ? "- Each arm ran as a fresh `lockstep generate` process"
         : services == static_cast<std::ptrdiff_t>(c.arms.size())
             ? "- Every arm's request ran on `lockstep serve` (below)"
             : "- Process arms ran as fresh `lockstep generate` processes, service arms on "
               "`lockstep serve` (below)");
  if (any_state)
    md << "; state arms exported windows `" << c.export_plan.windows << "` at "
       << fmt::format("{}", fmt::join(c.export_plan.points, " / "));
  if (any_timing) md << "; timing arms recorded the trace only";
  md << ".\n\n";
  ArmTable(md, L);
  campaign_text::ServiceScopeText(md, c.arms, L.service);
  campaign_text::UnitsScopeText(md, c, L.entries);
}

void StateSection(std::ostream& md, const Loaded& L) {
  const Campaign& c = L.c;
  md << "## Early state and output checks\n\n";
  md << fmt::format("Thresholds: NRMSE <= {}", FormatMetric(c.thresholds.nrmse_max));
  for (const auto& [k, v] : c.thresholds.nrmse_by_kind)
    md << fmt::format(" ({} <= {})", k, FormatMetric(v));
  const auto relaxed = RelaxedThresholds(c.thresholds);
  md << fmt::format(", logits KL <= {}; {}.\n\n", FormatMetric(c.thresholds.kl_max),
                    relaxed.empty()
                        ? std::string("no tolerance was relaxed")
                        : fmt::format("relaxed by the plan: {}", fmt::join(relaxed, "; ")));
  md << "Unused paged tails were excluded; speculative rows were compared only against speculative "
        "rows of the same "
        "(p, T), never as committed state.\n\n";
  bool any_state = false;
  for (const auto& a : c.arms) {
    auto it = L.records.find(a.name);
    if (it == L.records.end()) continue;
    const json& rep = it->second.value("report", json::object());
    const json& st = rep.contains("state") ? rep["state"] : json();
    if (!st.is_null()) {
      any_state = true;
      ArmStateText(md, a, st);
    }
    campaign_text::ServicePairText(md, a, it->second);
  }
  if (!any_state) md << "No state comparison was made (no pair of state arms finished).\n\n";
  for (const auto& a : c.arms) {
    const ArmFacts& f = L.arms.at(a.name);
    if (f.output_tokens >= 0)
      md << fmt::format("- {}: {} output tokens, stop reason `{}`.\n", a.name, f.output_tokens,
                        f.stop_reason);
  }
  md << "\nThese checks establish equality at the exported checkpoints only; they do not establish "
        "equality of all "
        "later hidden states.\n\n";
}

// Whether any arm runs on a device backend (the campaign's [engine] or the arm's override).
bool AnyDeviceArm(const Campaign& c) {
  auto device = [](const json& e) {
    return e.contains("backend") && e["backend"].is_string() && e["backend"] != "cpu";
  };
  if (device(c.engine)) return true;
  return std::any_of(c.arms.begin(), c.arms.end(),
                     [&device](const ArmSpec& a) { return device(a.engine); });
}

void TimingSection(std::ostream& md, const Loaded& L) {
  md << "## Timing and execution-path observations\n\n";
  md << "Timings are CLOCK_MONOTONIC host-side intervals around the instrumented engine calls, not "
        "kernel timings.";
  if (AnyDeviceArm(L.c))
    md << " On a device backend the tables add dev_wait, dev_compute and dev_copy (CUDA-event "
          "spans on each stage's stream, summed over the stages) and init (host time in one-time "
          "set-up).";
  md << "\n\n";
  for (const auto& a : L.c.arms) {
    auto it = L.records.find(a.name);
    if (it == L.records.end() || !it->second.contains("report")) continue;
    const json& al = it->second["report"].value("alignment", json());
    if (!al.is_object()) continue;
    ArmPathText(md, a, al);
    const json& cmp = it->second.value("comparison", json::object());
    if (cmp.contains("timing")) {
      // The medians over every repeat (or why there are none) lead; repeat 0 alone is labelled.
      ArmTimingVerdictText(md, a, cmp);
      md << "\nRepeat 0 of each arm alone (one process per arm, not the medians above):\n\n";
    }
    ArmIntervalText(md, a, al);
    md << "\n";
    for (const auto& b : L.c.arms)
      if (b.name == a.baseline) campaign_text::PairStepText(md, L.dir, a, b);
  }
}

void GatesSection(std::ostream& md, const Loaded& L) {
  md << "## Gates\n\n| comparison | gate | result | detail |\n|---|---|---|---|\n";
  for (const auto& a : L.c.arms) {
    auto it = L.records.find(a.name);
    if (it == L.records.end()) continue;
    for (const auto& g : it->second["comparison"].value("gates", json::array()))
      md << fmt::format("| {} vs {} | {} | {} | {} |\n", a.name, a.baseline, g.value("name", ""),
                        g.value("passed", false) ? "pass"
                        : a.control              ? "failed as expected"
                                                 : "FAIL",
                        Cell(g.value("message", "")));
  }
  md << "\n";
}

// The stop rule that fired (or that none did) and what the positive control showed.
void StopDecisionText(std::ostream& md, const Loaded& L, const RunTally& t) {
  const std::vector<std::string>& sent_arms = t.sent_arms;
  const std::vector<std::string>& unsent_arms = t.unsent_arms;
  if (L.stopped.is_object()) {
    md << fmt::format(
        "Before sending arm {}, the predeclared rule `{}` fired on {}: we stopped the campaign "
        "under the "
        "\"{}\" rule.",
        L.stopped.value("before_arm", "?"), L.stopped.value("rule", ""),
        fmt::format("{}", fmt::join(L.stopped.value("fired_by", std::vector<std::string>{}), ", ")),
        L.stopped.value("message", ""));
    md << fmt::format(" The request ledger contains only {}; not sent: {}.\n\n",
                      fmt::format("{}", fmt::join(sent_arms, ", ")),
                      fmt::format("{}", fmt::join(unsent_arms, ", ")));
  } else {
    md << "No stop rule fired.";
    if (!unsent_arms.empty()) md << fmt::format(" Not sent: {}.", fmt::join(unsent_arms, ", "));
    md << "\n\n";
  }
  if (!L.c.control.empty()) {
    auto it = L.records.find("control");
    if (L.verdict == "control_not_applied") {
      md << "The positive control's injection did not fire: the control was not applied, so the "
            "campaign cannot say what size of difference it would catch, and it fails.\n\n";
    } else if (it == L.records.end()) {
      md << "The positive control was not run.\n\n";
    } else if (!it->second["comparison"].value("control_applied", true)) {
      md << "The positive control's injection did not fire: control not applied (neither caught "
            "nor insensitive); the gates' sensitivity was not tested and the campaign fails.\n\n";
    } else {
      const json& cmp = it->second["comparison"];
      const bool passed = cmp.value("passed", true);
      const auto caught = cmp.value("caught_by", std::vector<std::string>{});
      md << (passed ? std::string("The positive control (a known injected perturbation) passed "
                                  "every gate: the campaign is INSENSITIVE and fails.\n\n")
             : caught.empty()
                 ? std::string("The positive control's gates failed with nothing compared: it was "
                               "caught on nothing, so the gates' sensitivity was not tested and "
                               "the campaign is NOT CHECKED.\n\n")
                 : fmt::format("The positive control (a known injected perturbation) was caught "
                               "by the gates ({}): the campaign can see a difference of that "
                               "size.\n\n",
                               fmt::join(caught, ", ")));
    }
  }
}

// Each sent arm's resources, the comparisons' limitations, and whether timing was characterised.
void LimitationsText(std::ostream& md, const Loaded& L, const RunTally& t) {
  const Campaign& c = L.c;
  std::vector<std::string> lims;
  for (const auto& a : c.arms) {
    if (L.arms.at(a.name).sent)
      md << "- " << ResourceLine(a.name, L.arms.at(a.name).resources) << ".\n";
    if (auto it = L.records.find(a.name); it != L.records.end() && it->second.contains("report"))
      for (const auto& l : it->second["report"].value("limitations", json::array())) {
        const std::string line = l.get<std::string>();
        // A timing arm's comparison has no export: the campaign says so once, below, and its
        // resources come from each process's output (above), so "unknown" would be false here.
        if (line.find(" no export data in this report (windows only)") == std::string::npos)
          lims.push_back(line);
      }
  }
  for (const auto& l : CompactLimitations(lims)) md << "- " << l << "\n";
  std::vector<std::string> timing;
  for (const auto& a : c.arms)
    if (a.mode == "timing" && L.arms.at(a.name).sent) timing.push_back(a.name);
  if (!timing.empty())
    md << fmt::format(
        "- Timing arms ({}) record the trace only: no state, hashes or engine configuration are "
        "compared for them; their resources above are from repeat 0.\n",
        fmt::join(timing, ", "));
  int timing_arms = 0;
  for (const auto& a : c.arms)
    timing_arms += a.mode == "timing" && a.repeat >= c.min_timing_repeats;
  if (timing_arms == 0)
    md << fmt::format(
        "- {} runs are not a statistical characterization: no timing arm with at least {} repeats "
        "ran.\n",
        t.requests, c.min_timing_repeats);
}

void StopSection(std::ostream& md, const Loaded& L, const RunTally& t) {
  md << "## Stop decision and measurement limitations\n\n";
  StopDecisionText(md, L, t);
  LimitationsText(md, L, t);
}

void ConclusionSection(std::ostream& md, const Loaded& L) {
  md << "\n## Conclusion\n\n";
  md << "Verdict: **" << (L.verdict.empty() ? "not finished" : L.verdict) << "**"
     << (L.verdict_reason.empty() ? "" : " (" + L.verdict_reason + ")") << ".\n\n";
  md << "Only allowlisted configuration fields, hashes and aggregate diagnostic measurements are "
        "included here. No "
        "hostnames, filesystem paths, user names or raw request text are published. No fix is "
        "claimed.\n";
}

// The document after its verdict box (the HTML renders the box itself, coloured).
std::string RenderMarkdownBody(const Loaded& L) {
  const RunTally tally = Tally(L);
  std::ostringstream md;
  SummarySection(md, L, tally);
  campaign_text::ChangeSection(md, L.c.arms, L.records);
  ScopeSection(md, L);
  StateSection(md, L);
  TimingSection(md, L);
  GatesSection(md, L);
  StopSection(md, L, tally);
  ConclusionSection(md, L);
  return md.str();
}

std::string RenderJUnitDoc(const Loaded& L) {
  std::ostringstream cases;
  int tests = 0, failures = 0, skipped = 0;
  for (const auto& a : L.c.arms) {
    const ArmFacts& f = L.arms.at(a.name);
    if (!f.not_sent.empty()) {
      ++tests, ++skipped;
      cases << fmt::format(
          "    <testcase classname=\"arm\" name=\"{}\"><skipped message=\"{}\"/></testcase>\n",
          XmlEscape(a.name), XmlEscape("not sent: " + f.not_sent));
      continue;
    }
    auto it = L.records.find(a.name);
    if (it == L.records.end()) continue;
    const std::string cls = XmlEscape(a.name + "_vs_" + a.baseline);
    if (a.control) {
      const bool applied = it->second["comparison"].value("control_applied", true);
      const bool caught = !it->second["comparison"].value("passed", true) && applied;
      ++tests;
      cases << fmt::format("    <testcase classname=\"{}\" name=\"positive control caught\">", cls);
      if (!caught) {
        ++failures;
        cases << (applied
                      ? "<failure message=\"the injected perturbation passed every gate: "
                        "insensitive\"/>"
                      : "<failure message=\"the injection did not fire: control not applied\"/>");
      }
      cases << "</testcase>\n";
      continue;
    }
    for (const auto& g : it->second["comparison"].value("gates", json::array())) {
      ++tests;
      cases << fmt::format("    <testcase classname=\"{}\" name=\"{}\">", cls,
                           XmlEscape(g.value("name", "")));
      if (!g.value("passed", false)) {
        ++failures;
        cases << fmt::format("<failure message=\"{}\"/>", XmlEscape(g.value("message", "")));
      }
      cases << "</testcase>\n";
    }
  }
  ++tests;
  cases << "    <testcase classname=\"campaign\" name=\"verdict\">";
  if (L.verdict != "pass") {
    ++failures;
    cases << fmt::format("<failure message=\"{}\"/>",
                         XmlEscape(L.verdict + ": " + L.verdict_reason));
  }
  cases << "</testcase>\n";
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n  <testsuite "
      "name=\"lockstep.campaign.{}\" tests=\"{}\" "
      "failures=\"{}\" skipped=\"{}\">\n{}  </testsuite>\n</testsuites>\n",
      XmlEscape(L.c.name), tests, failures, skipped, cases.str());
}

// The HTML charts of one compared pair: medians with their 95% band for a repeated timing pair
// (never repeat 0 as if it were the distribution), the verify time per window of repeat 0
// otherwise, and the NRMSE heat map the runner wrote when the pair failed.
std::string PairCharts(const Loaded& L, const std::string& run_dir, const ArmSpec& a,
                       const ArmSpec& base) {
  const json& rec = L.records.at(a.name);
  const json& cmp = rec.value("comparison", json::object());
  const std::string pair = a.name + " vs " + a.baseline;
  std::string h;
  if (a.mode == "timing" && a.repeat > 1 && cmp.contains("timing")) {
    auto bands = [](const json& v) {
      std::vector<MedianBand> out;
      for (const auto& w : v)
        out.push_back({w.value("median", 0.0), w.value("lo95", 0.0), w.value("hi95", 0.0)});
      return out;
    };
    const std::string title = "Median verify time per window over every repeat (band: 95%)";
    h += "<h3>" + HtmlEscape(pair) + ": " + HtmlEscape(title) + "</h3>\n" +
         SvgMedianBandChart(bands(cmp["timing"].value("window_a", json::array())),
                            bands(cmp["timing"].value("window_b", json::array())), a.baseline,
                            a.name, title);
  } else {
    auto trace = [&](const ArmSpec& s) {
      return ReadWindowRecords(RunPaths(run_dir).FirstRunFile(s, arm_file::kTrace));
    };
    auto wa = trace(base);
    auto wb = trace(a);
    if (wa.ok() && wb.ok()) {
      AlignResult al = AlignWindows(*wa, *wb);
      h += "<h3>" + HtmlEscape(pair) + ": verify time per window</h3>\n" +
           SvgVerifyChart(al, *wa, *wb, a.baseline, a.name);
    }
    h += campaign_text::PairStepChart(run_dir, a, base);
  }
  if (!cmp.value("passed", true)) {
    // The runner's own file; only a bare <svg> document is inlined.
    auto svg = ReadFile(RunPaths(run_dir).Compare(a.name, ".nrmse.svg"), std::size_t{16} << 20);
    if (svg.ok() && svg->starts_with("<svg") && svg->find("<script") == std::string::npos &&
        svg->find("<foreignObject") == std::string::npos)
      h += "<h3>" + HtmlEscape(pair) + ": NRMSE per item group and checkpoint</h3>\n" + *svg;
  }
  return h;
}

}  // namespace

Result<CampaignDocuments> RenderCampaign(const std::string& run_dir) {
  LOCKSTEP_ASSIGN_OR_RETURN(Loaded L, Load(run_dir));
  CampaignDocuments d;
  d.verdict = L.verdict;
  const VerdictBox box = CampaignVerdict(L, Tally(L));
  const std::string body_md = RenderMarkdownBody(L);
  d.markdown = MarkdownVerdictBox(box) + body_md;
  d.junit = RenderJUnitDoc(L);
  std::string charts;
  for (const auto& a : L.c.arms) {
    if (a.baseline.empty() || !L.records.count(a.name)) continue;
    for (const auto& b : L.c.arms)
      if (b.name == a.baseline) charts += PairCharts(L, run_dir, a, b);
  }
  std::string body = MarkdownToHtml(body_md);
  const std::string anchor = "<h2>Gates</h2>";
  if (auto pos = body.find(anchor); pos != std::string::npos && !charts.empty())
    body.insert(pos, charts);
  d.html = HtmlDocument(L.c.name, HtmlVerdictBox(box) + body);
  return d;
}

Status RunCampaignReport(const ReportOptions& opts, std::ostream& out) {
  LOCKSTEP_ASSIGN_OR_RETURN(CampaignDocuments d, RenderCampaign(opts.dir));
  const RunPaths run(opts.dir);
  const std::string md = opts.md.empty() ? run.ReportMd() : opts.md;
  const std::string html = opts.html.empty() ? run.ReportHtml() : opts.html;
  const std::string junit = opts.junit.empty() ? run.Junit() : opts.junit;
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(md, d.markdown));
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(html, d.html));
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(junit, d.junit));
  out << "report: " << md << " (" << html << ", " << junit << ")\n";
  return Status::Ok();
}

}  // namespace lockstep
