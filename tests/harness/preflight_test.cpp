// `lockstep preflight` on the real binary (issue 25, Must show 5): the default config holds every
// property it claims (exit 0); draft_policy = latency with the injected stall, suffix_index =
// async and batch_invariant = off under load are each named by the static part and found by
// their probe with the first difference (exit 1); `small` takes at most 60 s; bad input is exit 2.
//
// What is deterministic and what is not: the stall (latency) and the load (batch_invariant off)
// probes provoke their difference on every run. The async index's lag is a thread race: the
// index_timing probe compares up to 16 async runs with the caught-up index and finds a
// divergence in most invocations on tiny-induction, not in all; the config fails (exit 1) either
// way, because the static part knows async breaks the property by design. The test asserts that,
// and the shape of the difference whenever one was found.
#include "lockstep/harness/preflight.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "test_util.h"

namespace lockstep {
namespace {

struct PfRun {
  test::CmdResult cmd;
  nlohmann::json json;
};

PfRun Preflight(const std::string& preset, const std::string& args) {
  PfRun r;
  r.cmd =
      test::RunLockstep("preflight --model " + test::ModelDir(preset) + " " + args + " --json -");
  r.json = nlohmann::json::parse(r.cmd.out, nullptr, false);
  return r;
}

const nlohmann::json& Property(const PfRun& r, const std::string& id) {
  for (const auto& p : r.json["properties"])
    if (p["id"] == id) return p;
  static const nlohmann::json none;
  ADD_FAILURE() << "no property " << id;
  return none;
}

const nlohmann::json* Knob(const PfRun& r, const std::string& key) {
  for (const auto& k : r.json["knobs"])
    if (k["knob"] == key) return &k;
  return nullptr;
}

void ExpectNamed(const PfRun& r, const std::string& knob, const std::string& property) {
  const nlohmann::json* k = Knob(r, knob);
  ASSERT_NE(k, nullptr) << knob << " not named:\n" << r.cmd.err;
  EXPECT_TRUE((*k)["active"].get<bool>()) << k->dump();
  EXPECT_EQ((*k)["breaks"], property) << k->dump();
  const auto& p = Property(r, property);
  EXPECT_TRUE(p["claimed"].get<bool>()) << p.dump();
  EXPECT_TRUE(p["fails"].get<bool>()) << p.dump();
  EXPECT_NE(p["broken_by"].dump().find(knob), std::string::npos) << p.dump();
  EXPECT_NE(r.cmd.err.find("preflight: FAIL"), std::string::npos) << "verdict line first";
}

TEST(Preflight, DefaultConfigHoldsEveryPropertyItClaims) {
  const PfRun r = Preflight("tiny", "");
  ASSERT_TRUE(r.json.is_object()) << r.cmd.out << r.cmd.err;
  EXPECT_EQ(r.cmd.exit_code, 0) << r.cmd.err;
  EXPECT_EQ(r.json["schema"], "lockstep.preflight");
  EXPECT_EQ(r.json["schema_version"], 1);
  EXPECT_EQ(r.json["verdict"], "pass");
  EXPECT_EQ(r.cmd.err.rfind("preflight: PASS", 0), 0u) << "the verdict line comes first";
  for (const auto& p : r.json["properties"]) {
    SCOPED_TRACE(p.dump());
    EXPECT_FALSE(p["fails"].get<bool>());
    if (p["id"] == "index_timing") {
      EXPECT_EQ(p["result"], "n/a");  // spec 0: no suffix drafts
    } else if (p["id"] == "threads") {
      // Not claimed (bitwise for a fixed thread count only), and real: prefill's GEMM rounds
      // differently with 1 and 2 threads, within the default thresholds.
      EXPECT_FALSE(p["claimed"].get<bool>());
      EXPECT_EQ(p["result"], "differs");
      EXPECT_EQ(p["first_difference"]["window"], 0);
      EXPECT_TRUE(p["within_default_thresholds"].get<bool>());
    } else if (p["id"] == "engine_age") {
      // Not claimed with slots 1 and the prefix cache off, run anyway: request 2 and 5 (the
      // default --age) of an engine, prefix cache on and off, are bitwise request 1 of a fresh one.
      EXPECT_FALSE(p["claimed"].get<bool>());
      EXPECT_EQ(p["result"], "holds");
      EXPECT_EQ(p["points"].size(), 4u);
      EXPECT_GT(p["items_compared"].get<int>(), 0);
      EXPECT_EQ(p["items_differ"], 0);
    } else {
      // fresh_repeat is claimed; load, cold_warm and verify_single run with the minimal change
      // (slots 4, prefix_cache on, spec 4) and hold bitwise.
      EXPECT_EQ(p["result"], "holds");
      EXPECT_GT(p["items_compared"].get<int>(), 0);
      EXPECT_EQ(p["items_differ"], 0);
      EXPECT_EQ(p["claimed"].get<bool>(), p["id"] == "fresh_repeat");
    }
  }
  EXPECT_NE(Property(r, "cold_warm")["probe"].get<std::string>().find("reused 512 tokens"),
            std::string::npos);
}

TEST(Preflight, LatencyPolicyWithTheStallIsNamedAndFound) {
  const PfRun r = Preflight("tiny", "--spec 4 --draft-policy latency --probes fresh_repeat");
  ASSERT_TRUE(r.json.is_object()) << r.cmd.out << r.cmd.err;
  EXPECT_EQ(r.cmd.exit_code, 1) << r.cmd.err;
  ExpectNamed(r, "draft_policy", "fresh_repeat");
  const auto& p = Property(r, "fresh_repeat");
  EXPECT_EQ(p["result"], "differs") << p.dump();
  const auto& d = p["first_difference"];
  ASSERT_TRUE(d.is_object()) << p.dump();
  EXPECT_EQ(d["what"], "path");
  EXPECT_GE(d["window"].get<int>(), 2) << "after the stall window";
  EXPECT_NE(d["fields"].get<std::string>().find('T'), std::string::npos) << d.dump();
  std::printf("latency: %s\n", d["text"].get<std::string>().c_str());
  // The same probe on the static policy holds: the stall alone changes nothing.
  const PfRun s = Preflight("tiny", "--spec 4 --probes fresh_repeat");
  EXPECT_EQ(s.cmd.exit_code, 0) << s.cmd.err;
  EXPECT_EQ(Property(s, "fresh_repeat")["result"], "holds");
}

TEST(Preflight, AsyncSuffixIndexIsNamedAndItsLagFoundWhenItHappens) {
  int found = 0;
  const int tries = 3;
  for (int i = 0; i < tries; ++i) {
    const PfRun r =
        Preflight("tiny-induction", "--spec 4 --suffix-index async --probes index_timing");
    ASSERT_TRUE(r.json.is_object()) << r.cmd.out << r.cmd.err;
    EXPECT_EQ(r.cmd.exit_code, 1) << r.cmd.err;  // broken by design, found or not
    ExpectNamed(r, "suffix_index", "index_timing");
    const auto& p = Property(r, "index_timing");
    ASSERT_TRUE(p["result"] == "differs" || p["result"] == "not_provoked") << p.dump();
    if (p["result"] == "differs") {
      ++found;
      const auto& d = p["first_difference"];
      EXPECT_EQ(d["what"], "path") << d.dump();
      EXPECT_GE(d["window"].get<int>(), 1) << "window 0 never drafts";
      std::printf("async: %s\n", d["text"].get<std::string>().c_str());
    } else {
      EXPECT_NE(p["reason"].get<std::string>().find("lagging"), std::string::npos) << p.dump();
    }
  }
  std::printf("async index: the lag was provoked in %d of %d preflight runs\n", found, tries);
}

TEST(Preflight, BatchInvariantOffUnderLoadIsNamedAndFound) {
  const PfRun r = Preflight("tiny", "--slots 4 --batch-invariant off --probes load");
  ASSERT_TRUE(r.json.is_object()) << r.cmd.out << r.cmd.err;
  EXPECT_EQ(r.cmd.exit_code, 1) << r.cmd.err;
  ExpectNamed(r, "batch_invariant", "load");
  const auto& p = Property(r, "load");
  EXPECT_EQ(p["result"], "differs") << p.dump();
  const auto& d = p["first_difference"];
  ASSERT_TRUE(d.is_object()) << p.dump();
  EXPECT_EQ(d["what"], "state");
  EXPECT_GE(d["window"].get<int>(), 0);
  EXPECT_GE(d["stage"].get<int>(), 0);
  EXPECT_FALSE(d["item"].get<std::string>().empty());
  EXPECT_GT(d["nrmse"].get<double>(), 0.0);
  EXPECT_TRUE(d["within_default_thresholds"].is_boolean());
  std::printf("batch_invariant off: %s; %d of %d items differ\n",
              d["text"].get<std::string>().c_str(), p["items_differ"].get<int>(),
              p["items_compared"].get<int>());
  // With invariance on the same load leaves the request bitwise itself.
  const PfRun on = Preflight("tiny", "--slots 4 --probes load");
  EXPECT_EQ(on.cmd.exit_code, 0) << on.cmd.err;
  EXPECT_EQ(Property(on, "load")["result"], "holds");
  EXPECT_TRUE(Property(on, "load")["claimed"].get<bool>());
}

TEST(Preflight, StaticPartAloneAndInactiveKnobs) {
  // slots 1: batch_invariant off cannot act (named, inactive), so nothing claimed fails.
  const PfRun off1 = Preflight("tiny", "--batch-invariant off --skip-probes");
  EXPECT_EQ(off1.cmd.exit_code, 0) << off1.cmd.err;
  const nlohmann::json* k = Knob(off1, "batch_invariant");
  ASSERT_NE(k, nullptr);
  EXPECT_FALSE((*k)["active"].get<bool>());
  // An active knob that breaks a claimed property fails without a probe.
  const PfRun lat = Preflight("tiny", "--spec 2 --draft-policy latency --skip-probes");
  EXPECT_EQ(lat.cmd.exit_code, 1) << lat.cmd.err;
  EXPECT_EQ(Property(lat, "fresh_repeat")["result"], "not_run");
  // latency with spec 0 drafts nothing: inactive.
  const PfRun lat0 = Preflight("tiny", "--draft-policy latency --skip-probes");
  EXPECT_EQ(lat0.cmd.exit_code, 0) << lat0.cmd.err;
}

// The static part as a pure function: which knobs act in which configs, and the claims.
TEST(PreflightKnobs, ActiveOnlyWhereTheyCanAct) {
  auto find = [](const std::vector<KnobFinding>& ks, const std::string& key) {
    for (const KnobFinding& k : ks)
      if (k.knob == key) return k;
    ADD_FAILURE() << key << " not listed";
    return KnobFinding{};
  };
  EngineConfig c;
  c.draft_policy = "latency";
  c.suffix_index = "async";
  c.batch_invariant = false;
  c.deterministic = false;
  EXPECT_FALSE(find(StaticKnobs(c, 2), "draft_policy").active) << "spec 0 drafts nothing";
  EXPECT_FALSE(find(StaticKnobs(c, 2), "suffix_index").active);
  EXPECT_FALSE(find(StaticKnobs(c, 2), "batch_invariant").active) << "slots 1";
  EXPECT_FALSE(find(StaticKnobs(c, 2), "deterministic").active) << "cpu";
  EXPECT_EQ(find(StaticKnobs(c, 2), "threads").value, "0 (auto: 2 here)");
  c.spec = 4;
  c.slots = 8;
  c.backend = "cuda";
  EXPECT_TRUE(find(StaticKnobs(c, 2), "draft_policy").active);
  EXPECT_EQ(find(StaticKnobs(c, 2), "draft_policy").breaks, PreflightProperty::kFreshRepeat);
  EXPECT_TRUE(find(StaticKnobs(c, 2), "suffix_index").active);
  EXPECT_EQ(find(StaticKnobs(c, 2), "suffix_index").breaks, PreflightProperty::kIndexTiming);
  EXPECT_TRUE(find(StaticKnobs(c, 2), "batch_invariant").active);
  EXPECT_TRUE(find(StaticKnobs(c, 2), "deterministic").active);
  c.spec_max_suffix = 0;
  EXPECT_FALSE(find(StaticKnobs(c, 2), "suffix_index").active) << "no suffix drafts";
  c.replay_path = "path.jsonl";
  EXPECT_FALSE(find(StaticKnobs(c, 2), "draft_policy").active) << "replayed drafts";
  c.prefill_chunk = 1;
  EXPECT_FALSE(find(StaticKnobs(c, 2), "threads").active) << "no prefill GEMM";
  const EngineConfig d;
  for (const KnobFinding& k : StaticKnobs(d, 2))
    EXPECT_TRUE(!k.breaks || *k.breaks == PreflightProperty::kThreads) << k.knob;
  EXPECT_TRUE(ClaimOf(d, PreflightProperty::kFreshRepeat).claimed);
  EXPECT_FALSE(ClaimOf(d, PreflightProperty::kLoad).claimed);
  EXPECT_FALSE(ClaimOf(d, PreflightProperty::kColdWarm).claimed);
  EXPECT_FALSE(ClaimOf(d, PreflightProperty::kVerifySingle).claimed);
  EXPECT_FALSE(ClaimOf(d, PreflightProperty::kThreads).claimed);
  EXPECT_TRUE(ClaimOf(c, PreflightProperty::kLoad).claimed);
}

// No PASS after checking nothing: a claimed property whose probe ran but could not check it (n/a:
// nothing compared, never shared a step, reused nothing) fails; one not probed at all
// (--skip-probes) passes only as "static part only".
TEST(PreflightKnobs, AClaimedPropertyTheProbeCouldNotCheckIsNotAPass) {
  PreflightReport r;
  PropertyResult p;
  p.property = PreflightProperty::kLoad;
  p.claim.claimed = true;
  p.result = ProbeResult::kHolds;
  r.properties = {p};
  EXPECT_TRUE(r.passed());
  EXPECT_EQ(r.VerdictLine().rfind("preflight: PASS: every property", 0), 0u) << r.VerdictLine();
  r.properties[0].result = ProbeResult::kNotApplicable;
  r.properties[0].reason = "the request never shared a step";
  EXPECT_FALSE(r.passed());
  EXPECT_NE(r.VerdictLine().find("load not verified: the request never shared a step"),
            std::string::npos)
      << r.VerdictLine();
  r.properties[0].result = ProbeResult::kNotRun;
  EXPECT_TRUE(r.passed());
  EXPECT_NE(r.VerdictLine().find("PASS (static part only)"), std::string::npos) << r.VerdictLine();
  r.properties[0].claim.claimed = false;
  r.properties[0].result = ProbeResult::kNotApplicable;
  EXPECT_TRUE(r.passed()) << "an unclaimed property never fails the verdict";
}

TEST(Preflight, BadInputIsExitTwo) {
  for (const std::string& args :
       {std::string("--probes nosuch"), std::string("--probe-tokens 1"),
        std::string("--skip-probes --probes load"), std::string("--snapshot-every 100"),
        std::string("--prompt-tokens /nonexistent/ids")}) {
    const auto r = test::RunLockstep("preflight --model " + test::ModelDir("tiny") + " " + args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
  }
  const auto m = test::RunLockstep("preflight --model /nonexistent/model --skip-probes");
  EXPECT_EQ(m.exit_code, 2) << m.err;
  const auto j = test::RunLockstep("preflight --model " + test::ModelDir("tiny") +
                                   " --skip-probes --json /nonexistent/dir/p.json");
  EXPECT_EQ(j.exit_code, 2) << j.err;
}

// The 60 s bound is wall time on 2 cores. On an idle machine the wall time is at most the CPU
// time plus the time blocked (the stall, at most 3 s; writing the exports, a few seconds), so a
// CPU time under 40 s keeps it under 60 s: that is asserted always. The wall time itself is
// asserted whenever the machine is not oversubscribed (a 1-minute load average under twice its
// cores: on the shared 2-core machine six other builds can hold it at 10, and the wall time then
// measures them).
TEST(Preflight, SmallTakesAtMostAMinute) {
  double load0[1] = {0.0}, load1[1] = {0.0};
  ::getloadavg(load0, 1);
  rusage before{}, after{};
  ::getrusage(RUSAGE_CHILDREN, &before);
  const auto t0 = std::chrono::steady_clock::now();
  const PfRun r = Preflight("small", "");
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::getrusage(RUSAGE_CHILDREN, &after);
  ::getloadavg(load1, 1);
  auto secs = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  const double cpu =
      secs(after.ru_utime) - secs(before.ru_utime) + secs(after.ru_stime) - secs(before.ru_stime);
  ASSERT_TRUE(r.json.is_object()) << r.cmd.out << r.cmd.err;
  EXPECT_EQ(r.cmd.exit_code, 0) << r.cmd.err;
  const double cores = static_cast<double>(std::thread::hardware_concurrency());
  const bool busy = std::max(load0[0], load1[0]) >= 2.0 * cores;
  std::printf("preflight on small: %.1f s wall, %.1f s CPU (load average %.1f on %.0f cores)\n",
              wall, cpu, std::max(load0[0], load1[0]), cores);
  EXPECT_LE(cpu, 40.0);
  if (!busy) {
    EXPECT_LE(wall, 60.0);
  }
}

}  // namespace
}  // namespace lockstep
