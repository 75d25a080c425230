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

nlohmann::json PlannedEntry::Encode() const {
  nlohmann::json d = {{"campaign", campaign}, {"plan_sha256", plan_sha256},
                      {"plan_dir", plan_dir}, {"arms", arms},
                      {"builds", builds},     {"arm_builds", arm_builds}};
  if (!service.is_null()) d["service"] = service;
  if (order != "plan") d["order"] = order, d["order_seed"] = order_seed;
  return d;
}

PlannedEntry PlannedEntry::Decode(const nlohmann::json& d) {
  PlannedEntry p;
  p.campaign = d.value("campaign", "");
  p.plan_sha256 = d.value("plan_sha256", "");
  p.plan_dir = d.value("plan_dir", "");
  p.arms = d.value("arms", std::vector<std::string>{});
  p.builds = d.value("builds", nlohmann::json());  // null: a ledger from before named builds
  p.arm_builds = d.value("arm_builds", nlohmann::json());
  p.service = d.value("service", nlohmann::json());
  p.order = d.value("order", "plan");
  p.order_seed = d.value("order_seed", std::uint64_t{0});
  return p;
}

nlohmann::json SentEntry::Encode() const {
  nlohmann::json d = {{"repeat", repeat},
                      {"mode", mode},
                      {"engine_config_sha256", engine_config_sha256},
                      {"build", build},
                      {"executable_sha256", executable_sha256}};
  if (!server.empty()) d["server"] = server;
  return d;
}

SentEntry SentEntry::Decode(const nlohmann::json& d) {
  SentEntry s;
  s.repeat = d.value("repeat", 0);
  s.mode = d.value("mode", "");
  s.server = d.value("server", "");
  s.engine_config_sha256 = d.value("engine_config_sha256", "");
  s.build = d.value("build", "");
  s.executable_sha256 = d.value("executable_sha256", "");
  return s;
}

nlohmann::json RunEndEntry::Encode() const {
  nlohmann::json d = {
      {"repeat", repeat}, {"exit_code", exit_code}, {"signal", signal}, {"seconds", seconds}};
  if (!service.is_null()) d["service"] = service;
  if (!error.empty()) d["error"] = error;
  if (!unit.is_null()) d["unit"] = unit;
  return d;
}

RunEndEntry RunEndEntry::Decode(const LedgerEntry& e) {
  RunEndEntry r;
  r.failed = e.event == "failed";
  r.repeat = e.data.value("repeat", 0);
  r.exit_code = e.data.value("exit_code", r.failed ? 3 : 0);
  r.signal = e.data.value("signal", 0);
  r.seconds = e.data.value("seconds", 0.0);
  r.service = e.data.value("service", nlohmann::json());
  r.error = e.data.value("error", "");
  r.unit = e.data.value("unit", nlohmann::json());
  return r;
}

nlohmann::json NotSentEntry::Encode() const { return {{"reason", reason}}; }
NotSentEntry NotSentEntry::Decode(const nlohmann::json& d) {
  return NotSentEntry{d.value("reason", "not sent")};
}

nlohmann::json StoppedEntry::Encode() const {
  return {{"rule", rule}, {"message", message}, {"fired_by", fired_by}, {"before_arm", before_arm}};
}
StoppedEntry StoppedEntry::Decode(const nlohmann::json& d) {
  StoppedEntry s;
  s.rule = d.value("rule", "");
  s.message = d.value("message", "");
  s.before_arm = d.value("before_arm", "");
  s.fired_by = d.value("fired_by", std::vector<std::string>{});
  return s;
}

nlohmann::json DecisionEntry::Encode() const { return {{"name", name}, {"value", value}}; }
DecisionEntry DecisionEntry::Decode(const nlohmann::json& d) {
  return DecisionEntry{d.value("name", ""), d.value("value", false)};
}

nlohmann::json DoneEntry::Encode() const { return {{"verdict", verdict}, {"reason", reason}}; }
DoneEntry DoneEntry::Decode(const nlohmann::json& d) {
  return DoneEntry{d.value("verdict", ""), d.value("reason", "")};
}

void RunRecord::Apply(const LedgerEntry& e) {
  if (e.event == PlannedEntry::kEvent) {
    PlannedEntry p = PlannedEntry::Decode(e.data);
    campaign = std::move(p.campaign);
    plan_sha256 = std::move(p.plan_sha256);
    plan_dir = std::move(p.plan_dir);
    arm_order = std::move(p.arms);
    builds = std::move(p.builds);
    arm_builds = std::move(p.arm_builds);
    service = std::move(p.service);
    order = std::move(p.order);
    order_seed = p.order_seed;
  } else if (e.event == "remote_checked") {
    remote_checked = true;
    remote = e.data;
  } else if (e.event == "server_started") {
    shared_started = shared_started || e.data.value("role", "") == "shared";
  } else if (e.event == SentEntry::kEvent) {
    sent.insert({e.arm, SentEntry::Decode(e.data).repeat});
  } else if (e.event == "finished" || e.event == "failed") {
    const RunEndEntry r = RunEndEntry::Decode(e);
    finished.insert({e.arm, r.repeat});
    (r.failed ? failed : ran).insert({e.arm, r.repeat});
    exit_codes[{e.arm, r.repeat}] = r.exit_code;
    if (!r.unit.is_null()) units[{e.arm, r.repeat}] = r.unit;
    if (!r.failed && r.repeat == 0 && !r.service.is_null()) first_service[e.arm] = r.service;
  } else if (e.event == "compared") {
    if (auto cr = ComparisonFromJson(e.data); cr.ok()) {
      if (!compared.count(e.arm)) compared_order.push_back(e.arm);
      compared[e.arm] = *cr;
    }
  } else if (e.event == DecisionEntry::kEvent) {
    const DecisionEntry d = DecisionEntry::Decode(e.data);
    decisions[d.name] = d.value;
  } else if (e.event == StoppedEntry::kEvent) {
    stopped = true;
    stopped_data = e.data;
  } else if (e.event == NotSentEntry::kEvent) {
    not_sent.insert(e.arm);
    not_sent_reason[e.arm] = NotSentEntry::Decode(e.data).reason;
  } else if (e.event == DoneEntry::kEvent) {
    const DoneEntry d = DoneEntry::Decode(e.data);
    done = true;
    verdict = d.verdict;
    verdict_reason = d.reason;
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
