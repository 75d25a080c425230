#include "campaign_summary.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/ledger.h"
#include "lockstep/harness/localize_run.h"
#include "lockstep/harness/run_record.h"

namespace lockstep {

namespace {

// An arm's status from the replayed ledger (a resumed run sends a repeat again: sets, not counts).
std::string ArmStatus(const RunRecord& rec, const std::string& arm) {
  if (rec.not_sent_reason.count(arm)) return "not_sent";
  bool sent = false;
  for (const auto& [a, r] : rec.failed)
    if (a == arm) return "failed";
  for (const auto& [a, r] : rec.sent) {
    if (a != arm) continue;
    sent = true;
    if (!rec.finished.count({a, r})) return "sent";  // sent, not (yet) finished
  }
  return sent ? "finished" : "planned";
}

std::size_t Repeats(const std::set<RunRecord::ArmRepeat>& s, const std::string& arm) {
  return static_cast<std::size_t>(
      std::count_if(s.begin(), s.end(), [&arm](const auto& ar) { return ar.first == arm; }));
}

nlohmann::json PairJson(const ComparisonResult& c) {
  nlohmann::json failed = nlohmann::json::array();
  for (const GateOutcome& g : c.gates)
    if (!g.passed) failed.push_back(g.name);
  nlohmann::json p = {{"arm", c.arm},
                      {"baseline", c.baseline},
                      {"control", c.control},
                      {"passed", c.passed},
                      {"failed_gates", failed}};
  // A positive control must fail a gate on something it compared (verdict.h): "caught" says it
  // did; a control that failed only where nothing was compared was not caught.
  if (c.control) p["caught"] = !c.passed && !c.caught_by.empty();
  // Pairs with a service arm: both sides' service facts, the contrast and bitwise equality.
  if (!c.service.is_null()) p["service"] = c.service;
  return p;
}

}  // namespace

Result<nlohmann::json> CampaignSummaryJson(const std::string& run_dir, const ReportPaths& reports) {
  LOCKSTEP_ASSIGN_OR_RETURN(RunRead run, ReadRun(run_dir));
  const RunRecord& rec = run.record;
  const auto& entries = run.ledger.entries;
  const bool planned = !entries.empty() && entries.front().event == "planned";
  auto or_null = [](bool known, const nlohmann::json& v) { return known ? v : nlohmann::json(); };
  nlohmann::json j;
  j["schema"] = "lockstep.campaign_summary";
  j["schema_version"] = 1;
  j["folder"] = run_dir;
  j["campaign"] = or_null(planned, rec.campaign);
  j["plan_sha256"] = or_null(planned, rec.plan_sha256);
  j["verdict"] = or_null(rec.done, rec.verdict);
  j["reason"] = or_null(rec.done, rec.verdict_reason);
  j["stopped"] = rec.stopped_data;
  // The builds the arms ran on (path, sha256, version, commit, build_type, export_schema).
  j["builds"] = or_null(planned, rec.builds);
  j["passed"] = rec.done && rec.verdict == "pass";
  nlohmann::json arm_list = nlohmann::json::array();
  for (const std::string& name : rec.arm_order) {
    nlohmann::json a = {{"name", name},
                        {"status", ArmStatus(rec, name)},
                        {"repeats_finished", Repeats(rec.ran, name)},
                        {"repeats_failed", Repeats(rec.failed, name)}};
    if (auto it = rec.not_sent_reason.find(name); it != rec.not_sent_reason.end())
      a["not_sent_reason"] = it->second;
    a["build"] = rec.arm_builds.is_object() && rec.arm_builds.contains(name)
                     ? rec.arm_builds[name]
                     : nlohmann::json(nullptr);
    auto svc = rec.first_service.find(name);
    a["service"] = svc == rec.first_service.end() ? nlohmann::json() : svc->second;
    arm_list.push_back(a);
  }
  j["arms"] = arm_list;
  nlohmann::json pairs = nlohmann::json::array();
  for (const std::string& arm : rec.compared_order) {
    const ComparisonResult& c = rec.compared.at(arm);
    nlohmann::json p = PairJson(c);
    // Plan key localize: the allowlisted summary of where the pair's difference is born.
    if (auto t = ReadFile(RunPaths(run_dir).Localize(c.baseline, c.arm, ".json"), 16 << 20);
        t.ok()) {
      const nlohmann::json loc = nlohmann::json::parse(*t, nullptr, false);
      if (loc.is_object())
        p["localize"] = loc.contains("summary") ? AllowlistedLocalizeSummary(loc["summary"])
                                                : nlohmann::json{{"error", "localisation failed"}};
    }
    pairs.push_back(std::move(p));
  }
  j["pairs"] = pairs;
  j["reports"] = {{"md", reports.md}, {"html", reports.html}, {"junit", reports.junit}};
  return j;
}

}  // namespace lockstep
