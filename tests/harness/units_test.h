// Helpers of the campaign-units tests (units_test.cpp, slurm_test.cpp; issue 41): the tiny plans,
// an environment variable set for one scope, and what two run folders must share.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "campaign_files.h"
#include "lockstep/compare/export_reader.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/golden.h"
#include "lockstep/harness/ledger.h"
#include "lockstep/harness/runner.h"
#include "lockstep/harness/units.h"
#include "test_util.h"

namespace lockstep::test {

// The tiny induction model, 8 tokens: an A/A (wave 0) and a B arm that requires it (wave 1).
// `arms_extra` is appended (more arms); `top` goes before the tables (order = ...).
inline std::string UnitsPlan(const std::string& a2_extra = "", const std::string& arms_extra = "",
                             const std::string& top = "") {
  return "name = \"units\"\nquestion = \"q\"\n" + top +
         R"([model]
preset = "tiny"
seed = 7
induction = true
[request]
prompt = "the cat sat on the mat. the cat sat on the mat. the cat sat on the"
[engine]
threads = 1
max_new = 8
spec = 2
[gates]
output = true
state = true
path = { within = 0 }
[[stop]]
name = "unstable_aa"
when = "any"
predicates = ["path_diverged", "state_failed", "output_differs", "arm_failed"]
message = "unstable A/A"
[[arm]]
name = "A1"
[[arm]]
name = "A2"
baseline = "A1"
decision = "aa_stable"
)" + a2_extra +
         R"([[arm]]
name = "B"
baseline = "A1"
require = ["aa_stable"]
[arm.engine]
prefill_chunk = 4
)" + arms_extra;
}

inline std::string WriteUnitsPlan(const std::string& name, const std::string& text) {
  const std::string path = NewDir("plan-" + name) + "/plan.toml";
  EXPECT_TRUE(WriteFileAtomic(path, text).ok());
  return path;
}

// Sets (or, with nullopt, unsets) an environment variable for this scope: the lockstep children
// the test starts inherit it.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const std::optional<std::string>& value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    if (value)
      ::setenv(name_.c_str(), value->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// The ledger's decision content (LedgerDigest) without the comparisons' `hosts` (only units
// record where they ran).
inline std::vector<std::string> DecisionDigest(const std::string& dir) {
  std::vector<LedgerEntry> es = ReadLedger(dir);
  for (LedgerEntry& e : es)
    if (e.event == "compared") e.data.erase("hosts");
  return LedgerDigest(es);
}

// "key dtype [shape] sha" of every state item of an export.
inline std::vector<std::string> ItemDigests(const std::string& export_path) {
  std::vector<std::string> out;
  auto r = ExportReader::Open(export_path);
  EXPECT_TRUE(r.ok()) << export_path << ": " << r.status().message();
  if (!r.ok()) return out;
  auto d = ExportItemDigests(**r);
  EXPECT_TRUE(d.ok()) << d.status().message();
  if (!d.ok()) return out;
  for (const ItemDigest& i : *d) out.push_back(i.key + " " + DigestText(i));
  return out;
}

inline std::string Verdict(const std::string& dir) {
  const auto es = ReadLedger(dir);
  return !es.empty() && es.back().event == "done" ? es.back().data.value("verdict", "") : "";
}

// The ledger's `failed` / `finished` entry of `arm` with its "event" ({} when there is none).
inline nlohmann::json EndOf(const std::string& dir, const std::string& arm) {
  for (const auto& e : ReadLedger(dir))
    if ((e.event == "finished" || e.event == "failed") && e.arm == arm) {
      nlohmann::json j = e.data;
      j["event"] = e.event;
      return j;
    }
  return nlohmann::json::object();
}

// Same verdict, same decision content and the same per-item digests of every state arm's export
// as the local run folder `local`.
inline void ExpectSameCampaign(const std::string& local, const std::string& other,
                               const std::vector<std::string>& state_arms) {
  EXPECT_EQ(Verdict(other), Verdict(local));
  EXPECT_EQ(DecisionDigest(other), DecisionDigest(local));
  for (const std::string& arm : state_arms) {
    const auto a = ItemDigests(local + "/arms/" + arm + "/export.h5");
    EXPECT_GT(a.size(), 10u) << arm;
    EXPECT_EQ(ItemDigests(other + "/arms/" + arm + "/export.h5"), a) << arm;
  }
}

// A run of `plan` in a new folder, expected to exit `want_exit`.
inline std::string RunPlan(const std::string& plan, const std::string& name,
                           const std::string& flags, int want_exit) {
  const std::string dir = NewDir(name) + "/run";
  auto r = RunLockstep("run " + plan + " --out " + dir + " --no-progress " + flags);
  EXPECT_EQ(r.exit_code, want_exit) << name << "\n" << r.out << r.err;
  return dir;
}

inline const std::string& AaPlan() {
  static const std::string p = WriteUnitsPlan("aa", UnitsPlan());
  return p;
}

// The A/A plan run locally, once per process.
inline const std::string& LocalAa() {
  static const std::string d = RunPlan(AaPlan(), "aa-local", "", 0);
  return d;
}

// Two timing arms of two repeats each, interleaved abba, after the A/A: 7 units in 2 waves.
inline const std::string& AbbaPlan() {
  static const std::string p =
      WriteUnitsPlan("abba", UnitsPlan("",
                                       "[[arm]]\nname = \"T1\"\nmode = \"timing\"\nrepeat = 2\n"
                                       "require = [\"aa_stable\"]\n"
                                       "[[arm]]\nname = \"T2\"\nmode = \"timing\"\nrepeat = 2\n"
                                       "baseline = \"T1\"\nrequire = [\"aa_stable\"]\n",
                                       "order = \"abba\"\n"));
  return p;
}

inline const std::string& LocalAbba() {
  static const std::string d = RunPlan(AbbaPlan(), "abba-local", "", 0);
  return d;
}

inline nlohmann::json Fragment(const std::string& dir, int index) {
  return ReadJson(UnitDir(dir, index) + "/fragment.json");
}

}  // namespace lockstep::test
