// Issue 25 Must show 1 and 2: the shipped serving plans end to end on tiny.
//   aa-serving (batch_invariant on): fresh, shared-warm and under-load arms all bitwise equal to
//   A1; the ledger and the report record cold / warm, the tokens reused and the load (digests,
//   never text); the report plots each window's step composition.
//   aa-serving-nondet (batch_invariant off): under load the comparison finds bitwise
//   differences, the report names the first differing item, and whether the differences pass
//   the thresholds is printed as measured.
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "campaign_files.h"
#include "lockstep/engine/window.h"
#include "lockstep/harness/background_load.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/instrument/fingerprint.h"
#include "test_util.h"

namespace lockstep {
namespace {

using json = nlohmann::json;
using test::ReadJson;
using test::ReadLedger;
using test::RunLockstep;
using test::Slurp;

const std::string kCampaigns = std::string(LOCKSTEP_SOURCE_DIR) + "/campaigns";

struct CampaignRun {
  std::string dir;
  int exit_code = -1;
  std::string out;
};

const CampaignRun& ServingRun(const std::string& plan) {
  static std::map<std::string, CampaignRun> runs;
  auto it = runs.find(plan);
  if (it != runs.end()) return it->second;
  CampaignRun r;
  r.dir = test::NewDir(plan) + "/run";
  const auto res =
      RunLockstep("run " + kCampaigns + "/" + plan + ".toml --out " + r.dir + " --no-progress");
  r.exit_code = res.exit_code;
  r.out = res.out + res.err;
  return runs[plan] = r;
}

// The finished entries' service objects by arm.
std::map<std::string, json> Services(const std::vector<LedgerEntry>& es) {
  std::map<std::string, json> out;
  for (const auto& e : es)
    if (e.event == "finished") out[e.arm] = e.data.value("service", json());
  return out;
}

// Items of a comparison record's state diff that differ in some bits.
int ChangedItems(const json& rec) {
  int n = 0;
  for (const auto& it : rec["report"]["state"]["items"])
    n += (it["n_diff"].is_number() && it["n_diff"].get<long>() > 0) ||
         (it["code_diff"].is_number() && it["code_diff"].get<long>() > 0);
  return n;
}

// The line of the report that starts with `prefix` ("" when none).
std::string Line(const std::string& md, const std::string& prefix) {
  const auto at = md.find(prefix);
  return at == std::string::npos ? "" : md.substr(at, md.find('\n', at) - at);
}

TEST(ServingCampaign, AaServingIsBitwiseEqualFreshWarmAndUnderLoad) {
  const CampaignRun& r = ServingRun("aa-serving");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto es = ReadLedger(r.dir);
  ASSERT_FALSE(es.empty());
  EXPECT_EQ(es.back().data["verdict"], "pass");
  EXPECT_EQ(test::Events(es, "compared"),
            (std::vector<std::string>{"A2", "A3", "A4", "B-warm-under-load", "control"}));

  // The ledger: fresh cold A1 / A2, shared warm A3 (primed, tokens reused), A4 under 8 requests.
  auto svc = Services(es);
  for (const char* a : {"A1", "A2", "A4"}) {
    EXPECT_EQ(svc[a]["server"], "fresh") << a;
    EXPECT_EQ(svc[a]["engine_state"], "fresh") << a;
    EXPECT_TRUE(svc[a]["cold"].get<bool>()) << a;
    EXPECT_EQ(svc[a]["prompt_tokens_reused"], 0) << a;
  }
  EXPECT_NE(svc["A1"]["instance"], svc["A2"]["instance"]) << "a fresh engine per arm";
  EXPECT_EQ(svc["A3"]["server"], "shared");
  EXPECT_EQ(svc["A3"]["engine_state"], "carried");
  EXPECT_FALSE(svc["A3"]["cold"].get<bool>());
  EXPECT_TRUE(svc["A3"]["primed"].get<bool>());
  const int reused = svc["A3"]["prompt_tokens_reused"].get<int>();
  EXPECT_GE(reused, 32);
  EXPECT_EQ(svc["A3"]["snapshot_position"], reused) << "reuse ends on the 32-position grid";
  EXPECT_GE(svc["A3"]["requests_before"].get<int>(), 1);
  const json& load = svc["A4"]["load"];
  ASSERT_TRUE(load.is_object()) << svc["A4"].dump();
  EXPECT_EQ(load["requests"], 8);
  EXPECT_EQ(load["completed"], 8);
  EXPECT_EQ(load["failed"], 0);
  ASSERT_EQ(load["digests"].size(), 8u);
  // Digests, never text: each is recomputable from the plan's load spec alone.
  auto plan = LoadCampaign(kCampaigns + "/aa-serving.toml");
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const LoadSpec spec = *plan->arms[3].load;
  const int vocab = ReadJson(r.dir + "/model/config.json")["vocab_size"].get<int>();
  for (int k = 0; k < 8; ++k)
    EXPECT_TRUE(load["digests"][k].get<std::string>().starts_with(
        Sha256Tokens(LoadPrompt(spec, vocab, k)) + ":"))
        << k;
  EXPECT_TRUE(svc["B-warm-under-load"]["load"].is_object());
  EXPECT_FALSE(svc["B-warm-under-load"]["cold"].get<bool>());

  // The load overlapped A4's request: some of its windows shared their engine step.
  auto a4 = ReadWindowRecords(r.dir + "/arms/A4/trace.jsonl");
  ASSERT_TRUE(a4.ok());
  int shared = 0, with_prefill = 0;
  for (const auto& w : *a4) shared += w.step_seqs > 1, with_prefill += w.step_prefill_rows > 0;
  EXPECT_GT(shared, 0) << "A4 ran alone: the load did not overlap it";
  std::cout << "[ measured ] aa-serving A4: " << shared << " of " << a4->size()
            << " windows shared their step, " << with_prefill << " with a prefill chunk\n";

  // Every A/A pair bitwise equal: output, every compared item, the path.
  for (const char* a : {"A2", "A3", "A4", "B-warm-under-load"}) {
    const json rec = ReadJson(r.dir + "/compare/" + std::string(a) + ".json");
    EXPECT_TRUE(rec["comparison"]["passed"].get<bool>()) << a;
    EXPECT_GT(rec["report"]["state"]["compared"].get<int>(), 100) << a;
    EXPECT_EQ(rec["report"]["state"]["skipped"], 0) << a;
    EXPECT_EQ(ChangedItems(rec), 0) << a;
    EXPECT_FALSE(rec["report"]["state"]["output_differs"].get<bool>()) << a;
    EXPECT_FALSE(rec["report"]["alignment"]["diverged"].get<bool>()) << a;
    EXPECT_TRUE(rec["comparison"]["service"]["bitwise_equal"].get<bool>()) << a;
    for (const char* p : {"warm_differs_from_cold", "load_changes_state", "load_changes_path",
                          "engine_reuse_changes_state"})
      EXPECT_FALSE(rec["comparison"]["predicates"][p].get<bool>()) << a << " " << p;
  }
  const json ctl = ReadJson(r.dir + "/compare/control.json");
  EXPECT_FALSE(ctl["comparison"]["passed"].get<bool>()) << "the positive control is caught";

  // The report: cold / warm, tokens reused, the load, and the step composition plotted.
  const std::string md = Slurp(r.dir + "/report.md");
  EXPECT_TRUE(md.starts_with("> **PASS**")) << md.substr(0, 200);
  EXPECT_NE(Line(md, "| A3 | shared |").find("| **warm** | " + std::to_string(reused) + " |"),
            std::string::npos)
      << Line(md, "| A3 | shared |");
  EXPECT_NE(Line(md, "| A1 | fresh |").find("| cold | 0 |"), std::string::npos);
  EXPECT_NE(Line(md, "| A4 | fresh |")
                .find("8 requests (concurrency 8): 8 completed, 0 failed; digest " +
                      load["digest"].get<std::string>().substr(0, 12)),
            std::string::npos)
      << Line(md, "| A4 | fresh |");
  EXPECT_NE(Line(md,
                 "Service contrast of A4 vs A1: alone against under background load. Output "
                 "identical. Every one of the"),
            "");
  EXPECT_NE(md.find("Step composition per matched window (A4 vs A1)"), std::string::npos);
  EXPECT_NE(md.find("| window | p | T | A1 verify ms | A1 step rows / seqs / prefill | A4 verify "
                    "ms | A4 step rows / seqs / prefill | reading |"),
            std::string::npos);
  EXPECT_NE(md.find("A4: step shared with"), std::string::npos) << "a window read as shared";
  const std::string html = Slurp(r.dir + "/report.html");
  EXPECT_NE(html.find("A4 vs A1: verify time and step composition per window</h3>\n<svg"),
            std::string::npos);
  EXPECT_NE(html.find("class=\"step-composition\""), std::string::npos);
}

// The --json campaign summary carries each service arm's record and each pair's service contrast
// (what a script reading `lockstep report --json` needs to tell warm from cold and load from none).
TEST(ServingCampaign, SummaryJsonCarriesTheServiceRecords) {
  const CampaignRun& r = ServingRun("aa-serving");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto rep = RunLockstep("report " + r.dir + " --json -");
  ASSERT_EQ(rep.exit_code, 0) << rep.err;
  const json j = json::parse(rep.out);
  std::map<std::string, json> arms;
  for (const auto& a : j["arms"]) arms[a["name"].get<std::string>()] = a["service"];
  EXPECT_EQ(arms["A1"]["server"], "fresh");
  EXPECT_TRUE(arms["A1"]["cold"].get<bool>());
  EXPECT_EQ(arms["A3"]["server"], "shared");
  EXPECT_FALSE(arms["A3"]["cold"].get<bool>());
  EXPECT_GT(arms["A3"]["prompt_tokens_reused"].get<int>(), 0);
  ASSERT_TRUE(arms["A4"]["load"].is_object()) << arms["A4"].dump();
  EXPECT_EQ(arms["A4"]["load"]["completed"], 8);
  int with_service = 0;
  for (const auto& p : j["pairs"])
    if (p.contains("service")) {
      ++with_service;
      EXPECT_TRUE(p["service"]["bitwise_equal"].get<bool>() || p["control"].get<bool>())
          << p.dump();
    }
  EXPECT_EQ(with_service, 5) << "every pair of this plan has service arms";
  // The run's own lines say it too.
  EXPECT_NE(r.out.find("A4: finished in"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(fresh server, cold); under load: 8 of 8 background requests completed"),
            std::string::npos)
      << r.out;
}

TEST(ServingCampaign, AaServingNondetFindsBitwiseDifferencesUnderLoad) {
  const CampaignRun& r = ServingRun("aa-serving-nondet");
  ASSERT_TRUE(r.exit_code == 0 || r.exit_code == 1) << r.out;
  const auto es = ReadLedger(r.dir);
  ASSERT_FALSE(es.empty());
  const std::string verdict = es.back().data.value("verdict", "");
  // The fresh A/A alone does not share steps: batch_invariant off cannot change it.
  const json a2 = ReadJson(r.dir + "/compare/A2.json");
  EXPECT_EQ(ChangedItems(a2), 0);
  // Under load the products of A4's steps fuse with the load's: bitwise differences.
  const json a4 = ReadJson(r.dir + "/compare/A4.json");
  const int changed = ChangedItems(a4);
  const int compared = a4["report"]["state"]["compared"].get<int>();
  const int failed = a4["report"]["state"]["failed"].get<int>();
  EXPECT_GT(changed, 0) << "batch_invariant off under load changed no bit";
  EXPECT_TRUE(a4["comparison"]["predicates"]["load_changes_state"].get<bool>());
  EXPECT_FALSE(a4["comparison"]["service"]["bitwise_equal"].get<bool>());
  // The report names the first differing item, and the threshold result as measured.
  const std::string md = Slurp(r.dir + "/report.md");
  const std::string line = Line(md, "Service contrast of A4 vs A1:");
  EXPECT_NE(line.find(std::to_string(changed) + " of " + std::to_string(compared) +
                      " compared items differ bitwise; the first differing item: window "),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("Against the thresholds: " + std::to_string(failed) + " item"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("`load_changes_state`"), std::string::npos) << line;
  const json a3 = ReadJson(r.dir + "/compare/A3.json");
  std::cout << "[ measured ] aa-serving-nondet: verdict " << verdict
            << "; A4 vs A1 (under load): " << changed << " of " << compared
            << " compared items differ bitwise, " << failed
            << " fail the thresholds (NRMSE / KL), output "
            << (a4["report"]["state"]["output_differs"].get<bool>() ? "differs" : "identical")
            << ", path "
            << (a4["report"]["alignment"]["diverged"].get<bool>() ? "diverged" : "identical")
            << "; A3 vs A1 (warm): " << ChangedItems(a3) << " items differ\n"
            << "[ measured ] " << line << "\n";
}

}  // namespace
}  // namespace lockstep
