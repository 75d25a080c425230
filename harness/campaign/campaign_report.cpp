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
#include "lockstep/harness/campaign.h"
#include "lockstep/harness/ledger.h"

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
using campaign_text::Num;

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
  LOCKSTEP_ASSIGN_OR_RETURN(LedgerLoad ll, Ledger::Read(dir + "/ledger.jsonl"));
  L.entries = std::move(ll.entries);
  if (L.entries.empty() || L.entries.front().event != "planned")
    return Status::InvalidArgument("report '" + dir + "'",
                                   "not a run folder (the ledger has no planned entry)");
  LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(dir + "/plan.toml", std::size_t{16} << 20));
  LOCKSTEP_ASSIGN_OR_RETURN(
      L.c, ParseCampaign(text, "plan.toml", L.entries.front().data.value("plan_dir", "")));
  L.builds = L.entries.front().data.value("builds", json());
  L.arm_builds = L.entries.front().data.value("arm_builds", json());
  for (const auto& e : L.entries) {
    ArmFacts& a = L.arms[e.arm];
    if (e.event == "sent") a.sent = true;
    if (e.event == "finished") a.finished = true;
    if (e.event == "failed") a.failed = true;
    if (e.event == "not_sent") a.not_sent = e.data.value("reason", "");
    if (e.event == "stopped") L.stopped = e.data;
    if (e.event == "done") {
      L.verdict = e.data.value("verdict", "");
      L.verdict_reason = e.data.value("reason", "");
    }
  }
  L.service = campaign_text::ReadServices(dir, L.c.arms, L.entries);
  for (const auto& arm : L.c.arms) {
    ArmFacts& a = L.arms[arm.name];
    const std::string out =
        dir + "/arms/" + arm.name + (arm.mode == "timing" ? "/r0" : "") + "/stdout.json";
    if (auto t = ReadFile(out, std::size_t{64} << 20); t.ok()) {
      try {
        json j = json::parse(*t);
        a.resources = j.value("resources", json::object());
        a.output_tokens = j.value("output_tokens", std::int64_t{-1});
        a.stop_reason = j.value("stop_reason", "");
      } catch (const json::exception&) {
      }
    }
    if (auto t = ReadFile(dir + "/compare/" + arm.name + ".json", std::size_t{256} << 20); t.ok()) {
      try {
        L.records[arm.name] = json::parse(*t);
      } catch (const json::exception&) {
      }
    }
  }
  return L;
}

std::string ModelLine(const Campaign& c, const json& report) {
  std::string sha;
  // null for an arm without an export (a timing arm): the hash is then not known from here.
  if (report.contains("arms") && report["arms"]["a"].contains("model_sha256_12") &&
      report["arms"]["a"]["model_sha256_12"].is_string())
    sha = report["arms"]["a"]["model_sha256_12"].get<std::string>();
  if (!c.model.preset.empty())
    return fmt::format("synthetic preset `{}` (weight seed {}{}){}", c.model.preset, c.model.seed,
                       c.model.induction ? ", induction wiring" : "",
                       sha.empty() ? "" : ", model SHA-256 " + sha);
  return "checkpoint" + (sha.empty() ? std::string(" (hash unknown)") : ", model SHA-256 " + sha);
}

std::string RequestLine(const Campaign& c) {
  const RequestSpec& r = c.request;
  if (r.needle)
    return fmt::format("generated needle-in-a-haystack prompt: {} tokens, {} needles, seed {}",
                       r.needle->tokens, r.needle->needles, r.needle->seed);
  if (!r.prompt.empty())
    return fmt::format("inline prompt of {} tokens (text not published)", r.prompt.size());
  if (!r.prompt_file.empty()) return "prompt file (text not published)";
  if (!r.chat_file.empty()) return "chat messages rendered with the model's chat template";
  return "token-id file";
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

std::string ResourceLine(const std::string& arm, const json& r) {
  if (r.is_null() || r.empty()) return fmt::format("{}: resources not recorded", arm);
  auto mib = [](const json& v) {
    const auto b = v.is_number() ? v.get<std::int64_t>() : -1;
    return b < 0 ? std::string("unknown") : fmt::format("{} MiB", b / 1048576);
  };
  std::string s =
      fmt::format("{}: min host available memory {}, max swap used {}, peak RSS {}, {} samples",
                  arm, mib(r.value("min_host_available_bytes", json(-1))),
                  mib(r.value("max_swap_used_bytes", json(-1))),
                  mib(r.value("max_rss_bytes", json(-1))), r.value("samples", 0));
  if (r.contains("interval_ms"))
    s += fmt::format(" (sampling interval median {} ms, max {} ms)",
                     Num(r["interval_ms"], "median", 1), Num(r["interval_ms"], "max", 1));
  s += r.contains("guard") ? "; the resource guard TRIPPED" : "; no resource-guard trip";
  return s;
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
    return passed ? "NOT CAUGHT: passed every gate (insensitive)"
                  : "failed as expected: caught (" + failed + ")";
  }
  return passed ? "pass" : "FAIL (" + failed + ")";
}

// The verdict box: the campaign's verdict, what ran, the first failing comparison, the stop rule
// that fired and what the positive control showed.
VerdictBox CampaignVerdict(const Loaded& L, const RunTally& t) {
  VerdictBox v;
  v.status = L.verdict.empty() ? "not finished" : L.verdict;
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
  auto w = ReadWindowRecords(L.dir + "/arms/" + arm.name + (arm.mode == "timing" ? "/r0" : "") +
                             "/trace.jsonl");
  if (!w.ok()) return {-1.0, -1.0};
  double at = -1.0;
  std::vector<double> all;
  for (const WindowRecord& r : *w) {
    if (r.verify_ns < 0) continue;
    all.push_back(static_cast<double>(r.verify_ns) / 1e6);
    if (r.idx == idx) at = all.back();
  }
  if (all.empty()) return {at, -1.0};
  std::nth_element(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(all.size() / 2),
                   all.end());
  return {at, all[all.size() / 2]};
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

// The hypothesis is judged by the verdict word it names (campaigns/README.md): "pass", "fail",
// "stop", "insensitive".
void HypothesisText(std::ostream& md, const Loaded& L) {
  if (L.c.hypothesis.empty() || L.verdict.empty()) return;
  std::string h = L.c.hypothesis;
  std::transform(h.begin(), h.end(), h.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  const std::vector<std::pair<std::string, std::string>> words = {
      {"pass", "pass"}, {"stop", "stopped"}, {"insensitive", "insensitive"}, {"fail", "fail"}};
  std::string expected;
  for (const auto& [word, verdict] : words)
    if (h.find(word) != std::string::npos && expected.empty()) expected = verdict;
  if (expected.empty()) {
    md << "Hypothesis check: the hypothesis names no verdict (pass, fail, stop, insensitive); "
          "compare it with the verdict above.\n\n";
    return;
  }
  md << fmt::format(
      "Hypothesis check: the hypothesis expects `{}`; the verdict is `{}`: the "
      "hypothesis {}.\n\n",
      expected, L.verdict, expected == L.verdict ? "held" : "did not hold");
}

void SummarySection(std::ostream& md, const Loaded& L, const RunTally& t) {
  const Campaign& c = L.c;
  const std::vector<std::string>& sent_arms = t.sent_arms;
  const std::vector<std::string>& unsent_arms = t.unsent_arms;
  md << "# " << c.name << ": predeclared A/A diagnostic campaign\n\n";
  md << "## Summary\n\n";
  md << "Question: " << c.question << "\n\n";
  if (!c.hypothesis.empty()) md << "Hypothesis: " << c.hypothesis << "\n\n";
  HypothesisText(md, L);
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
  md << "- Model: " << ModelLine(c, first_report ? *first_report : json()) << ".\n";
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
}

void StateSection(std::ostream& md, const Loaded& L) {
  const Campaign& c = L.c;
  md << "## Early state and output checks\n\n";
  md << fmt::format("Thresholds: NRMSE <= {}", FormatMetric(c.thresholds.nrmse_max));
  for (const auto& [k, v] : c.thresholds.nrmse_by_kind)
    md << fmt::format(" ({} <= {})", k, FormatMetric(v));
  md << fmt::format(", logits KL <= {}; no tolerance was relaxed.\n\n",
                    FormatMetric(c.thresholds.kl_max));
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

void TimingSection(std::ostream& md, const Loaded& L) {
  md << "## Timing and execution-path observations\n\n";
  md << "Timings are CLOCK_MONOTONIC host-side intervals around the instrumented engine calls, not "
        "kernel timings. On a device backend the tables add dev_wait, dev_compute and dev_copy "
        "(CUDA-event spans on each stage's stream, summed over the stages) and init (host time in "
        "one-time set-up).\n\n";
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
      const bool passed = it->second["comparison"].value("passed", true);
      md << (passed ? "The positive control (a known injected perturbation) passed every gate: the "
                      "campaign is "
                      "INSENSITIVE and fails.\n\n"
                    : "The positive control (a known injected perturbation) was caught by the "
                      "gates: the campaign "
                      "can see a difference of that size.\n\n");
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
      return ReadWindowRecords(run_dir + "/arms/" + s.name + (s.mode == "timing" ? "/r0" : "") +
                               "/trace.jsonl");
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
    auto svg = ReadFile(run_dir + "/compare/" + a.name + ".nrmse.svg", std::size_t{16} << 20);
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
  const std::string md = opts.md.empty() ? opts.dir + "/report.md" : opts.md;
  const std::string html = opts.html.empty() ? opts.dir + "/report.html" : opts.html;
  const std::string junit = opts.junit.empty() ? opts.dir + "/junit.xml" : opts.junit;
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(md, d.markdown));
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(html, d.html));
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(junit, d.junit));
  out << "report: " << md << " (" << html << ", " << junit << ")\n";
  return Status::Ok();
}

}  // namespace lockstep
