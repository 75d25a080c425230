#include "lockstep/harness/run_record.h"

#include "lockstep/harness/campaign.h"

namespace lockstep {

std::string RunPaths::ArmDir(std::string_view arm) const {
  return dir_ + "/arms/" + std::string(arm);
}

std::string RunPaths::RepeatDir(const ArmSpec& arm, int repeat) const {
  std::string d = ArmDir(arm.name);
  if (arm.mode == "timing") d += "/r" + std::to_string(repeat);
  return d;
}

std::string RunPaths::ArmFile(std::string_view arm, std::string_view file) const {
  return ArmDir(arm) + "/" + std::string(file);
}

std::string RunPaths::FirstRunFile(const ArmSpec& arm, std::string_view file) const {
  return RepeatDir(arm, 0) + "/" + std::string(file);
}

std::string RunPaths::Compare(std::string_view arm, std::string_view ext) const {
  return dir_ + "/compare/" + std::string(arm) + std::string(ext);
}

void RunRecord::Apply(const LedgerEntry& e) {
  const int repeat = e.data.value("repeat", 0);
  if (e.event == "planned") {
    campaign = e.data.value("campaign", "");
    plan_sha256 = e.data.value("plan_sha256", "");
    plan_dir = e.data.value("plan_dir", "");
    arm_order = e.data.value("arms", std::vector<std::string>{});
    builds = e.data.value("builds", nlohmann::json());
    arm_builds = e.data.value("arm_builds", nlohmann::json());
    service = e.data.value("service", nlohmann::json());
  } else if (e.event == "remote_checked") {
    remote_checked = true;
    remote = e.data;
  } else if (e.event == "server_started") {
    shared_started = shared_started || e.data.value("role", "") == "shared";
  } else if (e.event == "sent") {
    sent.insert({e.arm, repeat});
  } else if (e.event == "finished" || e.event == "failed") {
    const bool fail = e.event == "failed";
    finished.insert({e.arm, repeat});
    (fail ? failed : ran).insert({e.arm, repeat});
    exit_codes[{e.arm, repeat}] = e.data.value("exit_code", fail ? 3 : 0);
    if (!fail && repeat == 0 && e.data.contains("service"))
      first_service[e.arm] = e.data["service"];
  } else if (e.event == "compared") {
    if (auto cr = ComparisonFromJson(e.data); cr.ok()) {
      if (!compared.count(e.arm)) compared_order.push_back(e.arm);
      compared[e.arm] = *cr;
    }
  } else if (e.event == "decision") {
    decisions[e.data.value("name", "")] = e.data.value("value", false);
  } else if (e.event == "stopped") {
    stopped = true;
    stopped_data = e.data;
  } else if (e.event == "not_sent") {
    not_sent.insert(e.arm);
    not_sent_reason[e.arm] = e.data.value("reason", "not sent");
  } else if (e.event == "done") {
    done = true;
    verdict = e.data.value("verdict", "");
    verdict_reason = e.data.value("reason", "");
  }
}

RunRecord RunRecord::Replay(const std::vector<LedgerEntry>& entries) {
  RunRecord r;
  for (const LedgerEntry& e : entries) r.Apply(e);
  return r;
}

Result<RunRead> ReadRun(const std::string& dir) {
  RunRead run;
  LOCKSTEP_ASSIGN_OR_RETURN(run.ledger, Ledger::Read(RunPaths(dir).Ledger()));
  run.record = RunRecord::Replay(run.ledger.entries);
  return run;
}

Result<Ledger> OpenRunLedger(const std::string& dir, LedgerLoad* loaded) {
  return Ledger::Open(RunPaths(dir).Ledger(), loaded);
}

}  // namespace lockstep
