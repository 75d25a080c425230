// Units of a campaign (units.h): waves, send groups and their order, units.json, and `lockstep
// plan expand`.
#include "lockstep/harness/units.h"

#include <fmt/format.h>

#include <algorithm>
#include <ostream>
#include <set>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/builds.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/harness/process.h"
#include "lockstep/harness/run_record.h"
#include "lockstep/harness/runner.h"
#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

namespace {

// SplitMix64 (Steele, Lea, Flood 2014): the whole generator is these lines, so a seeded order
// is the same with every standard library (std::shuffle's is not specified).
std::uint64_t SplitMix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::size_t ArmIndex(const Campaign& c, const std::string& name) {
  for (std::size_t i = 0; i < c.arms.size(); ++i)
    if (c.arms[i].name == name) return i;
  return c.arms.size();
}

}  // namespace

std::vector<int> ArmWaves(const Campaign& c) {
  std::vector<int> wave(c.arms.size(), 0);
  for (std::size_t i = 0; i < c.arms.size(); ++i) {
    const ArmSpec& a = c.arms[i];
    // Requirements name decisions of earlier arms (the parser checks it), so one pass in plan
    // order sees every wave it depends on already set.
    for (const std::string& req : a.require)
      for (std::size_t j = 0; j < i; ++j)
        if (c.arms[j].decision == req) wave[i] = std::max(wave[i], wave[j] + 1);
    if (const std::size_t b = ArmIndex(c, a.baseline); b < i) wave[i] = std::max(wave[i], wave[b]);
  }
  return wave;
}

std::vector<std::vector<std::size_t>> SendGroups(const Campaign& c) {
  std::vector<std::vector<std::size_t>> groups;
  const std::vector<int> waves = ArmWaves(c);
  for (std::size_t i = 0; i < c.arms.size(); ++i) {
    const ArmSpec& a = c.arms[i];
    if (c.order != "plan" && a.mode == "timing" && !groups.empty()) {
      const std::size_t p = groups.back().back();
      const ArmSpec& prev = c.arms[p];
      if (prev.mode == "timing" && prev.require == a.require && waves[p] == waves[i]) {
        groups.back().push_back(i);
        continue;
      }
    }
    groups.push_back({i});
  }
  return groups;
}

std::vector<std::pair<std::size_t, int>> GroupSendOrder(const Campaign& c,
                                                        const std::vector<std::size_t>& group) {
  std::vector<std::pair<std::size_t, int>> seq;
  if (group.size() < 2 || c.order == "plan") {
    for (std::size_t ai : group)
      for (int r = 0; r < c.arms[ai].repeat; ++r) seq.emplace_back(ai, r);
    return seq;
  }
  std::vector<std::size_t> arms;  // one entry per send, the arm's index
  if (c.order == "abba") {
    int rounds = 0;
    for (std::size_t ai : group) rounds = std::max(rounds, c.arms[ai].repeat);
    for (int k = 0; k < rounds; ++k) {
      std::vector<std::size_t> round;
      for (std::size_t ai : group)
        if (k < c.arms[ai].repeat) round.push_back(ai);
      if (k % 2 == 1) std::reverse(round.begin(), round.end());
      arms.insert(arms.end(), round.begin(), round.end());
    }
  } else {  // random
    for (std::size_t ai : group)
      for (int r = 0; r < c.arms[ai].repeat; ++r) arms.push_back(ai);
    std::uint64_t state = c.order_seed;
    for (std::size_t i = arms.size(); i > 1; --i)
      std::swap(arms[i - 1], arms[SplitMix64(state) % i]);
  }
  std::map<std::size_t, int> next;
  for (std::size_t ai : arms) seq.emplace_back(ai, next[ai]++);
  return seq;
}

std::vector<Unit> ExpandUnits(const Campaign& c) {
  const std::vector<int> waves = ArmWaves(c);
  const int n_waves = waves.empty() ? 0 : *std::max_element(waves.begin(), waves.end()) + 1;
  std::vector<Unit> units;
  std::map<std::string, std::vector<int>> of_arm;
  for (int w = 0; w < n_waves; ++w) {
    for (const auto& group : SendGroups(c)) {
      if (waves[group.front()] != w) continue;  // a group's arms share their wave
      for (const auto& [ai, r] : GroupSendOrder(c, group)) {
        const ArmSpec& a = c.arms[ai];
        Unit u;
        u.index = static_cast<int>(units.size());
        u.arm = a.name;
        u.repeat = r;
        u.wave = w;
        u.same_host_as = a.same_host_as;
        u.spread = a.spread;
        std::set<int> deps;  // the units of the arms whose decisions it requires, and their bases
        for (const std::string& req : a.require)
          for (const ArmSpec& d : c.arms)
            if (d.decision == req)
              for (const std::string& arm : {d.name, d.baseline})
                for (int i : of_arm[arm]) deps.insert(i);
        u.depends_on.assign(deps.begin(), deps.end());
        of_arm[a.name].push_back(u.index);
        units.push_back(std::move(u));
      }
    }
  }
  return units;
}

nlohmann::json UnitsJson(const Campaign& c, const std::vector<Unit>& units) {
  nlohmann::json list = nlohmann::json::array();
  int n_waves = 0;
  for (const Unit& u : units) {
    n_waves = std::max(n_waves, u.wave + 1);
    list.push_back({{"index", u.index},
                    {"arm", u.arm},
                    {"repeat", u.repeat},
                    {"wave", u.wave},
                    {"depends_on", u.depends_on},
                    {"same_host_as",
                     u.same_host_as.empty() ? nlohmann::json() : nlohmann::json(u.same_host_as)},
                    {"spread", u.spread}});
  }
  return {{"schema", "lockstep.units"}, {"version", 1},
          {"campaign", c.name},         {"plan_sha256", c.plan_sha256},
          {"order", c.order},           {"order_seed", c.order_seed},
          {"waves", n_waves},           {"units", std::move(list)}};
}

Result<std::vector<Unit>> ReadUnits(const std::string& dir) {
  const std::string path = dir + "/units.json";
  if (!std::filesystem::exists(path))
    return Status::NotFound(
        "'" + path + "'", "no units (expand the plan first: lockstep plan expand PLAN --out DIR)");
  LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(path, std::size_t{64} << 20));
  std::vector<Unit> units;
  try {
    const auto j = nlohmann::json::parse(text);
    if (j.value("schema", "") != "lockstep.units")
      return Status::Corruption("'" + path + "'", "not a lockstep.units file");
    for (const auto& e : j.at("units")) {
      Unit u;
      u.index = e.at("index").get<int>();
      u.arm = e.at("arm").get<std::string>();
      u.repeat = e.at("repeat").get<int>();
      u.wave = e.at("wave").get<int>();
      u.depends_on = e.at("depends_on").get<std::vector<int>>();
      if (e.at("same_host_as").is_string()) u.same_host_as = e["same_host_as"].get<std::string>();
      u.spread = e.at("spread").get<bool>();
      if (u.index != static_cast<int>(units.size()))
        return Status::Corruption("'" + path + "'", "unit indices are not 0, 1, 2, ...");
      units.push_back(std::move(u));
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption("'" + path + "'", e.what());
  }
  return units;
}

std::vector<int> UnitsOfWave(const std::vector<Unit>& units, int wave) {
  std::vector<int> out;
  for (const Unit& u : units)
    if (u.wave == wave) out.push_back(u.index);
  return out;
}

std::string IndexRanges(const std::vector<int>& indices) {
  std::string out;
  for (std::size_t i = 0; i < indices.size();) {
    std::size_t j = i;
    while (j + 1 < indices.size() && indices[j + 1] == indices[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(indices[i]);
    if (j > i) out += "-" + std::to_string(indices[j]);
    i = j + 1;
  }
  return out;
}

std::string UnitDir(const std::string& dir, int index) {
  return dir + "/units/" + std::to_string(index);
}

std::string SchedulerRecordPath(const std::string& dir, int index) {
  return UnitDir(dir, index) + ".scheduler.json";
}

namespace {

// Units run `lockstep generate` children only: a service arm's server belongs to one runner.
Status CheckUnitsPlan(const Campaign& c, const std::string& source) {
  for (const ArmSpec& a : c.arms)
    if (a.server != "process")
      return Status::NotSupported("'" + source + "' arm '" + a.name + "'",
                                  "a service arm (server = \"" + a.server +
                                      "\") runs under `lockstep run` only, not as units");
  return Status::Ok();
}

}  // namespace

Result<Campaign> LoadRunFolderPlan(const std::string& dir, RunRecord* record) {
  LOCKSTEP_ASSIGN_OR_RETURN(RunRead run, ReadRun(dir));
  *record = std::move(run.record);
  const std::string plan = RunPaths(dir).Plan();
  LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(plan, std::size_t{16} << 20));
  if (Sha256Hex(text) != record->plan_sha256)
    return Status::Corruption("'" + plan + "'",
                              "does not hash as the ledger's plan: the run folder was edited");
  return ParseCampaign(text, plan, record->plan_dir);
}

Status ExpandPlan(const ExpandOptions& o, std::ostream& out) {
  LOCKSTEP_ASSIGN_OR_RETURN(Campaign probe, LoadCampaign(o.plan));
  LOCKSTEP_RETURN_IF_ERROR(CheckUnitsPlan(probe, o.plan));
  std::string exe = o.exe;
  if (exe.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(exe, SelfExecutable());
  }
  RunOptions ro;
  ro.plan = o.plan;
  ro.out_dir = o.out_dir;
  ro.builds = o.builds;
  Campaign c;
  std::map<std::string, ArmBuild> builds;
  LOCKSTEP_RETURN_IF_ERROR(CreateRunFolder(ro, exe, &c, &builds));
  // The model and the request exist before any unit runs: units on many nodes only read them.
  LOCKSTEP_ASSIGN_OR_RETURN(const std::string model_dir, ProvisionPlanModel(c, o.out_dir));
  LOCKSTEP_RETURN_IF_ERROR(ProvisionPlanRequest(c, model_dir, RunPaths(o.out_dir).RequestTokens()));
  const std::vector<Unit> units = ExpandUnits(c);
  LOCKSTEP_RETURN_IF_ERROR(
      WriteFileAtomic(o.out_dir + "/units.json", UnitsJson(c, units).dump(2) + "\n"));
  int n_waves = 0;
  for (const Unit& u : units) n_waves = std::max(n_waves, u.wave + 1);
  out << fmt::format("campaign {}: {} units in {} waves, run folder {}\n", c.name, units.size(),
                     n_waves, o.out_dir);
  for (int w = 0; w < n_waves; ++w)
    out << fmt::format("  wave {}: units {}\n", w, IndexRanges(UnitsOfWave(units, w)));
  return Status::Ok();
}

Result<int> WaveUnitCount(const std::string& plan, int wave) {
  LOCKSTEP_ASSIGN_OR_RETURN(Campaign c, LoadCampaign(plan));
  LOCKSTEP_RETURN_IF_ERROR(CheckUnitsPlan(c, plan));
  return static_cast<int>(UnitsOfWave(ExpandUnits(c), wave).size());
}

}  // namespace lockstep
