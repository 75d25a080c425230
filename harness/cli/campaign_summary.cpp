#include "campaign_summary.h"

#include <map>
#include <set>
#include <vector>

#include "lockstep/harness/ledger.h"
#include "lockstep/harness/run_record.h"

namespace lockstep {

namespace {

// Per arm, the repeats the ledger saw sent, finished and failed (a resumed run sends a repeat
// again: sets, not counts).
struct ArmTally {
  std::set<int> sent, finished, failed;
  std::string not_sent_reason;
  // Service arms: the `service` object of repeat 0's last finished entry (where the request ran,
  // cold or warm, engine state, load); null for process arms.
  nlohmann::json service;
};

std::string ArmStatus(const ArmTally& t) {
  if (!t.not_sent_reason.empty()) return "not_sent";
  if (!t.failed.empty()) return "failed";
  if (t.sent.empty()) return "planned";
  for (int r : t.sent)
    if (!t.finished.count(r)) return "sent";  // sent, not (yet) finished
  return "finished";
}

nlohmann::json PairJson(const nlohmann::json& d) {
  nlohmann::json failed = nlohmann::json::array();
  if (d.contains("gates") && d["gates"].is_array())
    for (const auto& g : d["gates"])
      if (!g.value("passed", true)) failed.push_back(g.value("name", ""));
  nlohmann::json p = {{"arm", d.value("arm", "")},
                      {"baseline", d.value("baseline", "")},
                      {"control", d.value("control", false)},
                      {"passed", d.value("passed", false)},
                      {"failed_gates", failed}};
  // A positive control must fail a gate: "caught" says it did.
  if (p["control"].get<bool>()) p["caught"] = !p["passed"].get<bool>();
  // Pairs with a service arm: both sides' service facts, the contrast and bitwise equality.
  if (d.contains("service")) p["service"] = d["service"];
  return p;
}

}  // namespace

Result<nlohmann::json> CampaignSummaryJson(const std::string& run_dir, const ReportPaths& reports) {
  LOCKSTEP_ASSIGN_OR_RETURN(LedgerLoad load, Ledger::Read(RunPaths(run_dir).Ledger()));
  nlohmann::json j;
  j["schema"] = "lockstep.campaign_summary";
  j["schema_version"] = 1;
  j["folder"] = run_dir;
  j["campaign"] = nullptr;
  j["plan_sha256"] = nullptr;
  j["verdict"] = nullptr;
  j["reason"] = nullptr;
  j["stopped"] = nullptr;
  j["builds"] = nullptr;
  nlohmann::json arm_builds = nlohmann::json::object();
  std::vector<std::string> order;
  std::map<std::string, ArmTally> arms;
  nlohmann::json pairs = nlohmann::json::array();
  for (const LedgerEntry& e : load.entries) {
    if (e.event == "planned") {
      j["campaign"] = e.data.value("campaign", "");
      j["plan_sha256"] = e.data.value("plan_sha256", "");
      // The builds the arms ran on (path, sha256, version, commit, build_type, export_schema).
      j["builds"] = e.data.value("builds", nlohmann::json());
      arm_builds = e.data.value("arm_builds", nlohmann::json::object());
      for (const auto& a : e.data.value("arms", nlohmann::json::array())) {
        order.push_back(a.get<std::string>());
        arms[order.back()];
      }
    } else if (e.event == "sent") {
      arms[e.arm].sent.insert(e.data.value("repeat", 0));
    } else if (e.event == "finished") {
      arms[e.arm].finished.insert(e.data.value("repeat", 0));
      if (e.data.value("repeat", 0) == 0 && e.data.contains("service"))
        arms[e.arm].service = e.data["service"];
    } else if (e.event == "failed") {
      arms[e.arm].failed.insert(e.data.value("repeat", 0));
    } else if (e.event == "not_sent") {
      arms[e.arm].not_sent_reason = e.data.value("reason", "not sent");
    } else if (e.event == "compared") {
      pairs.push_back(PairJson(e.data));
    } else if (e.event == "stopped") {
      j["stopped"] = e.data;
    } else if (e.event == "done") {
      j["verdict"] = e.data.value("verdict", "");
      j["reason"] = e.data.value("reason", "");
    }
  }
  j["passed"] = j["verdict"] == "pass";
  nlohmann::json arm_list = nlohmann::json::array();
  for (const std::string& name : order) {
    const ArmTally& t = arms[name];
    nlohmann::json a = {{"name", name},
                        {"status", ArmStatus(t)},
                        {"repeats_finished", t.finished.size()},
                        {"repeats_failed", t.failed.size()}};
    if (!t.not_sent_reason.empty()) a["not_sent_reason"] = t.not_sent_reason;
    a["build"] = arm_builds.is_object() && arm_builds.contains(name) ? arm_builds[name]
                                                                     : nlohmann::json(nullptr);
    a["service"] = t.service;
    arm_list.push_back(a);
  }
  j["arms"] = arm_list;
  j["pairs"] = pairs;
  j["reports"] = {{"md", reports.md}, {"html", reports.html}, {"junit", reports.junit}};
  return j;
}

}  // namespace lockstep
