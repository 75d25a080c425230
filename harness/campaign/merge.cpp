// `lockstep merge` (units.h): the units' fragments, verified, become the runs of a resumed
// campaign (runner.h RunSource), so the stop rules, requirements, comparisons and the verdict are
// the local runner's own code, in plan order.
#include <fmt/format.h>

#include <filesystem>
#include <ostream>
#include <set>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/builds.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/harness/run_record.h"
#include "lockstep/harness/runner.h"
#include "lockstep/harness/units.h"
#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

namespace fs = std::filesystem;

namespace {

// A scheduler's record of a unit (SchedulerRecordPath), or null.
nlohmann::json ReadSchedulerRecord(const std::string& dir, int index) {
  auto text = ReadFile(SchedulerRecordPath(dir, index), std::size_t{1} << 20);
  if (!text.ok()) return nullptr;
  auto j = nlohmann::json::parse(*text, nullptr, false);
  return j.is_object() ? j : nlohmann::json();
}

class UnitRunSource : public RunSource {
 public:
  UnitRunSource(std::string dir, std::vector<Unit> units, std::string plan_sha256,
                std::string request_sha256)
      : dir_(std::move(dir)),
        units_(std::move(units)),
        plan_sha256_(std::move(plan_sha256)),
        request_sha256_(std::move(request_sha256)) {}

  Result<RunTaken> Take(const ArmSpec& arm, int repeat, const std::string& arm_dir,
                        const RunExpect& expect) override {
    const Unit* u = Find(arm.name, repeat);
    if (u == nullptr)
      return Status::Corruption("units.json", fmt::format("no unit for {} #{}", arm.name, repeat));
    const std::string ud = UnitDir(dir_, u->index);
    auto v = VerifyUnit(ud, arm.mode == "state");
    const nlohmann::json sched = ReadSchedulerRecord(dir_, u->index);
    RunTaken t;
    t.unit = {{"index", u->index}};
    std::error_code ec;
    fs::remove_all(arm_dir, ec);
    if (!v.ok() && v.status().code() != Status::Code::kNotFound)
      notes_.push_back(fmt::format("unit {} ({} #{}): {}: not trusted, to run again", u->index,
                                   arm.name, repeat, v.status().message()));
    if (!v.ok() && sched.is_null()) {  // not run yet, or damaged: to run (again)
      pending_wave_ = u->wave;
      t.pending = true;
      return t;
    }
    if (!sched.is_null()) t.unit["scheduler"] = sched;
    if (!v.ok()) {  // the scheduler ended it and it left nothing verified
      t.failed = true;
      t.exit_code = sched.value("exit_code", 3);
      t.signal = sched.value("signal", 0);
      t.error = fmt::format("the scheduler ended it ({}, exit code {}) with no verified outputs",
                            sched.value("state", "unknown"), sched.value("exit_code_text", "?"));
      t.note = t.error;
      return t;
    }
    const UnitFragment& f = *v;
    t.unit["attempt"] = f.attempt;
    t.unit["host"] = f.host.ToJson();
    t.unit["host_sha256"] = f.host.Digest();
    t.unit["retry_differs"] = f.retry_differs;
    t.exit_code = f.exit_code;
    t.signal = f.signal;
    t.seconds = f.seconds;
    if (const std::string bad = Mismatches(f, expect); !bad.empty()) {
      t.failed = true;
      t.exit_code = 2;
      t.error = "fingerprints differ from the plan's: " + bad;
      t.note = t.error;
      return t;
    }
    if (!sched.is_null()) {  // the scheduler's State is believed over the unit's own exit
      t.failed = true;
      t.exit_code = f.ran() ? 3 : f.exit_code;
      t.error = fmt::format("the scheduler says {} (exit code {}), whatever the unit wrote",
                            sched.value("state", "unknown"), sched.value("exit_code_text", "?"));
      t.note = t.error;
      return t;
    }
    fs::create_directories(arm_dir, ec);
    for (const auto& [name, sha] : f.files) {
      fs::copy_file(ud + "/" + name, arm_dir + "/" + name, fs::copy_options::overwrite_existing,
                    ec);
      if (ec) return Status::IOError("'" + arm_dir + "/" + name + "'", ec.message());
    }
    t.failed = !f.ran();
    if (f.retry_differs.is_object() && f.retry_differs.value("differs", false))
      t.note = fmt::format("attempt {}'s result differs from attempt {}'s ({} then, {} now)",
                           f.attempt, f.retry_differs.value("attempt", 0),
                           f.retry_differs.value("was", ""), f.retry_differs.value("now", ""));
    return t;
  }

  nlohmann::json PairHosts(const ArmSpec& a, const ArmSpec& b, std::string* violation) override {
    for (const ArmSpec* s : {&a, &b}) LoadHosts(s->name);
    for (const ArmSpec* s : {&a, &b}) {
      if (!s->same_host_as.empty() && !SameHosts(s->name, s->same_host_as))
        *violation += fmt::format("{}{} asked for the host of {} (same_host_as) and ran on {}",
                                  violation->empty() ? "" : "; ", s->name, s->same_host_as,
                                  HostsText(s->name));
      if (s->spread && s == &b && SameHosts(a.name, b.name))
        *violation += fmt::format(
            "{}{} asked for another host than {} (placement = spread) and "
            "ran on the same one",
            violation->empty() ? "" : "; ", b.name, a.name);
    }
    if (!hosts_.count(a.name) || !hosts_.count(b.name)) return nullptr;
    const bool same = SameHosts(a.name, b.name);
    const bool aa = b.engine.empty() && ArmBuildName(a) == ArmBuildName(b);
    nlohmann::json j = {{"a", HostsText(a.name)}, {"b", HostsText(b.name)}, {"same", same}};
    j["note"] =
        same ? ""
             : fmt::format(
                   "{} on {}, {} on {}: this {} also measures host "
                   "differences",
                   a.name, HostsText(a.name), b.name, HostsText(b.name), aa ? "A/A" : "comparison");
    return j;
  }

  bool pending() const override { return pending_wave_ >= 0; }
  int pending_wave() const { return pending_wave_; }
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  const Unit* Find(const std::string& arm, int repeat) const {
    for (const Unit& u : units_)
      if (u.arm == arm && u.repeat == repeat) return &u;
    return nullptr;
  }

  // The hosts of every unit of `arm` with a fragment (merged in this merge or an earlier one:
  // a comparison's baseline may come from an earlier wave). Its fragments were verified when
  // they were taken; one unreadable now adds no host.
  void LoadHosts(const std::string& arm) {
    std::vector<HostFingerprint>& hosts = hosts_[arm];
    hosts.clear();
    for (const Unit& u : units_) {
      if (u.arm != arm) continue;
      auto text = ReadFile(UnitDir(dir_, u.index) + "/fragment.json", std::size_t{16} << 20);
      if (!text.ok()) continue;
      if (auto f = UnitFragment::FromJson(nlohmann::json::parse(*text, nullptr, false)); f.ok())
        hosts.push_back(f->host);
    }
    if (hosts.empty()) hosts_.erase(arm);
  }

  std::string Mismatches(const UnitFragment& f, const RunExpect& e) const {
    std::string bad;
    auto check = [&bad](const char* what, const std::string& got, const std::string& want) {
      if (got != want)
        bad += fmt::format("{}{} {} (the plan's: {})", bad.empty() ? "" : "; ", what,
                           got.empty() ? "unknown" : got.substr(0, 12), want.substr(0, 12));
    };
    check("plan SHA-256", f.plan_sha256, plan_sha256_);
    check("executable SHA-256", f.executable_sha256, e.executable_sha256);
    check("engine config SHA-256", f.engine_config_sha256, e.engine_config_sha256);
    check("model SHA-256", f.model_sha256, e.model_sha256);
    check("request SHA-256", f.request_sha256, request_sha256_);
    return bad;
  }

  // Every merged unit of both arms ran on one host (false when either has none merged).
  bool SameHosts(const std::string& a, const std::string& b) const {
    std::set<std::string> digests;
    for (const std::string& arm : {a, b}) {
      auto it = hosts_.find(arm);
      if (it == hosts_.end()) return false;
      for (const HostFingerprint& h : it->second) digests.insert(h.Digest());
    }
    return digests.size() == 1;
  }

  std::string HostsText(const std::string& arm) const {
    std::set<std::string> labels;
    if (auto it = hosts_.find(arm); it != hosts_.end())
      for (const HostFingerprint& h : it->second) labels.insert(h.Label());
    if (labels.empty()) return "an unknown host";
    return fmt::format("{}", fmt::join(labels, " and "));
  }

  std::string dir_;
  std::vector<Unit> units_;
  std::string plan_sha256_, request_sha256_;
  std::map<std::string, std::vector<HostFingerprint>> hosts_;  // by arm (LoadHosts)
  int pending_wave_ = -1;
  std::vector<std::string> notes_;
};

}  // namespace

Status MergeUnits(const std::string& dir, std::ostream& out, MergeResult* result) {
  *result = MergeResult{};
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Unit> units, ReadUnits(dir));
  RunRecord rec;
  LOCKSTEP_ASSIGN_OR_RETURN(Campaign c, LoadRunFolderPlan(dir, &rec));
  LOCKSTEP_ASSIGN_OR_RETURN(std::string request_sha, Sha256File(RunPaths(dir).RequestTokens()));
  UnitRunSource src(dir, units, rec.plan_sha256, request_sha);
  RunOptions ro;
  ro.out_dir = dir;
  ro.resume = true;
  ro.progress = 0;
  ro.source = &src;
  const Status s = RunCampaign(ro, out);
  for (const std::string& n : src.notes()) out << "  " << n << "\n";
  if (!s.ok() || !src.pending()) return s;
  // The wave to run: its units without a verified fragment, of the arms still to be sent.
  LOCKSTEP_ASSIGN_OR_RETURN(RunRead after, ReadRun(dir));
  result->pending = true;
  result->wave = src.pending_wave();
  for (const Unit& u : units) {
    if (u.wave != result->wave || after.record.not_sent.count(u.arm) ||
        after.record.finished.count({u.arm, u.repeat}))
      continue;
    const ArmSpec* arm = nullptr;
    for (const ArmSpec& a : c.arms)
      if (a.name == u.arm) arm = &a;
    if (arm && !VerifyUnit(UnitDir(dir, u.index), arm->mode == "state").ok())
      result->indices.push_back(u.index);
  }
  out << fmt::format("next: wave {}, units {} (lockstep run-unit {} --index N; then merge again)\n",
                     result->wave, IndexRanges(result->indices), dir);
  return Status::Ok();
}

}  // namespace lockstep
