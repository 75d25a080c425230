// `lockstep preflight --sweep` and the engine_age probe on the real binary (issue 40, Must show 1,
// 4 and 5): on `small` with spec 4 and the prefix cache on, the probe beside k = 0, 1, 3, 7, 15,
// 31, 63 co-resident background requests and with prefill chunks straddling every CPU tile
// boundary is bitwise its solo run on every exported item with batch_invariant on; with off the
// table names the first point where anything differs. Request 1 on a fresh engine equals the
// same request as request 2, 5 and 20 on every item, prefix cache on and off. A point that
// compared nothing is a failure (unit cases at the end). Label `slow` (sweep_tests): the two
// sweeps take minutes on 2 cores (figures in harness/README.md, "Sweeps").
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "lockstep/engine/cpu_tiles.h"
#include "lockstep/harness/preflight.h"
#include "test_util.h"

namespace lockstep {
namespace {

struct PfRun {
  test::CmdResult cmd;
  nlohmann::json json;
  double wall = 0.0, cpu = 0.0;
};

double Secs(const timeval& t) {
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
}

PfRun Preflight(const std::string& preset, const std::string& args) {
  PfRun r;
  rusage before{}, after{};
  ::getrusage(RUSAGE_CHILDREN, &before);
  const auto t0 = std::chrono::steady_clock::now();
  r.cmd =
      test::RunLockstep("preflight --model " + test::ModelDir(preset) + " " + args + " --json -");
  r.wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::getrusage(RUSAGE_CHILDREN, &after);
  r.cpu =
      Secs(after.ru_utime) - Secs(before.ru_utime) + Secs(after.ru_stime) - Secs(before.ru_stime);
  r.json = nlohmann::json::parse(r.cmd.out, nullptr, false);
  std::printf("preflight %s: %.1f s wall, %.1f s CPU\n", args.c_str(), r.wall, r.cpu);
  return r;
}

// The spec-on, prefix-cache-on config of Must show 1 on `small`, 64 slots, short probes.
const std::string kSweepArgs =
    "--slots 64 --spec 4 --prefix-cache on --probe-tokens 4 --sweep 0,1,3,7,15,31,63";

std::set<int> Values(const nlohmann::json& points, const std::string& axis) {
  std::set<int> v;
  for (const auto& p : points)
    if (p["axis"] == axis) v.insert(p["value"].get<int>());
  return v;
}

TEST(PreflightSweep, SmallIsBitwiseAtEveryPointWithInvarianceOn) {
  const PfRun r = Preflight("small", kSweepArgs);
  ASSERT_TRUE(r.json.is_object()) << r.cmd.out << r.cmd.err;
  EXPECT_EQ(r.cmd.exit_code, 0) << r.cmd.err;
  const auto& s = r.json["sweep"];
  ASSERT_TRUE(s.is_object()) << r.json.dump();
  EXPECT_TRUE(s["passed"].get<bool>());
  EXPECT_TRUE(s["first_failing"].is_null());
  EXPECT_EQ(Values(s["points"], "k"), (std::set<int>{0, 1, 3, 7, 15, 31, 63}));
  const std::vector<int> rows = StraddlingRows(CpuRowTiles());
  EXPECT_EQ(Values(s["points"], "rows"), std::set<int>(rows.begin(), rows.end()));
  // The boundaries themselves are in the table: 64 (the GDN chunk) and the invariant block.
  EXPECT_TRUE(Values(s["points"], "rows").count(64));
  EXPECT_TRUE(Values(s["points"], "rows").count(65));
  int k_total = -1;
  for (const auto& p : s["points"]) {
    SCOPED_TRACE(p.dump());
    EXPECT_EQ(p["result"], "holds");
    EXPECT_EQ(p["items_differ"], 0);
    EXPECT_TRUE(p["output_equal"].get<bool>());
    // Every exported item of the solo run was paired and compared.
    EXPECT_GT(p["items_total"].get<int>(), 0);
    EXPECT_EQ(p["items_compared"], p["items_total"]);
    if (p["axis"] == "k") {
      if (k_total < 0) k_total = p["items_total"].get<int>();
      EXPECT_EQ(p["items_total"].get<int>(), k_total) << "the k points share one solo run";
      // All k background requests were co-resident with one of the probe's windows.
      EXPECT_EQ(p["seqs_max"].get<int>(), p["value"].get<int>() + 1);
      if (p["value"].get<int>() > 0) {
        EXPECT_GT(p["shared_windows"].get<int>(), 0);
      }
    } else {
      EXPECT_GT(p["shared_windows"].get<int>(), 0) << "the background shared the probe's steps";
    }
  }
  EXPECT_NE(r.cmd.err.find("every point is bitwise the solo run"), std::string::npos) << r.cmd.err;
}

TEST(PreflightSweep, SmallWithInvarianceOffNamesWhereDifferencesStart) {
  const PfRun r = Preflight("small", kSweepArgs + " --batch-invariant off");
  ASSERT_TRUE(r.json.is_object()) << r.cmd.out << r.cmd.err;
  EXPECT_EQ(r.cmd.exit_code, 1) << r.cmd.err;
  const auto& s = r.json["sweep"];
  ASSERT_TRUE(s.is_object()) << r.json.dump();
  EXPECT_FALSE(s["passed"].get<bool>());
  ASSERT_TRUE(s["first_failing"].is_string()) << s.dump();
  const std::string first = s["first_failing"];
  // The named point is the first in the table that differs, and every point before it holds.
  bool seen = false;
  int differing = 0;
  for (const auto& p : s["points"]) {
    SCOPED_TRACE(p.dump());
    EXPECT_GT(p["items_compared"].get<int>(), 0);
    differing += p["result"] == "differs";
    if (p["point"] == first) {
      seen = true;
      EXPECT_EQ(p["result"], "differs");
      EXPECT_GT(p["items_differ"].get<int>(), 0);
      EXPECT_TRUE(p["first_difference"].is_object());
    } else if (!seen) {
      EXPECT_EQ(p["result"], "holds");
    }
  }
  EXPECT_TRUE(seen) << first;
  EXPECT_NE(first, "k=0") << "alone, off changes nothing";
  EXPECT_NE(r.cmd.err.find("first point where anything differs: " + first), std::string::npos)
      << r.cmd.err;
  std::printf("batch_invariant off: differences start at %s; %d of %zu points differ\n",
              first.c_str(), differing, s["points"].size());
}

// Must show 4: request 1 on a fresh engine == the same request as request k = 2, 5, 20, on every
// item, prefix cache on and off (the probe runs both).
TEST(PreflightAge, RequestKIsBitwiseRequestOne) {
  const PfRun r = Preflight("small",
                            "--slots 4 --spec 4 --prefix-cache on --probe-tokens 4 "
                            "--probes engine_age --age 2,5,20");
  ASSERT_TRUE(r.json.is_object()) << r.cmd.out << r.cmd.err;
  EXPECT_EQ(r.cmd.exit_code, 0) << r.cmd.err;
  const nlohmann::json* age = nullptr;
  for (const auto& p : r.json["properties"])
    if (p["id"] == "engine_age") age = &p;
  ASSERT_NE(age, nullptr);
  EXPECT_TRUE((*age)["claimed"].get<bool>());
  EXPECT_EQ((*age)["result"], "holds") << age->dump();
  std::set<std::pair<std::string, int>> seen;
  for (const auto& p : (*age)["points"]) {
    SCOPED_TRACE(p.dump());
    seen.insert({p["axis"].get<std::string>(), p["value"].get<int>()});
    EXPECT_EQ(p["result"], "holds");
    EXPECT_EQ(p["items_differ"], 0);
    EXPECT_GT(p["items_total"].get<int>(), 0);
    EXPECT_EQ(p["items_compared"], p["items_total"]);
  }
  const std::set<std::pair<std::string, int>> want = {{"age_cache_on", 2},  {"age_cache_on", 5},
                                                      {"age_cache_on", 20}, {"age_cache_off", 2},
                                                      {"age_cache_off", 5}, {"age_cache_off", 20}};
  EXPECT_EQ(seen, want);
}

// A bare --sweep takes the default k set, clipped to slots - 1 (here 0, 1, 2: tiny, 3 slots).
TEST(PreflightSweep, BareSweepTakesTheDefaultSetClipped) {
  const PfRun r = Preflight("tiny", "--slots 3 --sweep --sweep-rows none --probe-tokens 4");
  ASSERT_TRUE(r.json.is_object()) << r.cmd.out << r.cmd.err;
  EXPECT_EQ(r.cmd.exit_code, 0) << r.cmd.err;
  const auto& s = r.json["sweep"];
  EXPECT_EQ(s["k_declared"], nlohmann::json({0, 1, 2}));
  EXPECT_EQ(Values(s["points"], "k"), (std::set<int>{0, 1, 2}));
  EXPECT_TRUE(Values(s["points"], "rows").empty());
  const PfRun c = Preflight("tiny", "--slots 3 --sweep 0,2,7 --sweep-rows none --probe-tokens 4");
  EXPECT_EQ(c.json["sweep"]["k_clipped"], nlohmann::json({7}));
  EXPECT_EQ(Values(c.json["sweep"]["points"], "k"), (std::set<int>{0, 2}));
}

TEST(PreflightSweep, BadInputIsExitTwo) {
  for (const std::string& args :
       {std::string("--sweep 1,x"), std::string("--sweep 300"),
        std::string("--sweep --sweep-rows 0"), std::string("--sweep-rows 4"),
        std::string("--sweep --skip-probes"), std::string("--sweep --backend cuda"),
        std::string("--age 1"), std::string("--age 2,y")}) {
    const auto r = test::RunLockstep("preflight --model " + test::ModelDir("tiny") + " " + args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
  }
}

// The report's rules as pure functions: a point that compared nothing fails the sweep, a sweep
// with no point fails, the default k set is clipped to slots - 1 and the rows straddle each tile.
TEST(PreflightSweepReport, NothingComparedIsNeverAPass) {
  SweepReport s;
  EXPECT_FALSE(s.passed()) << "did not run";
  s.ran = true;
  EXPECT_FALSE(s.passed()) << "no point";
  SweepPoint p;
  p.axis = "k";
  p.value = 3;
  p.result = ProbeResult::kHolds;
  s.points = {p, p};
  EXPECT_TRUE(s.passed());
  s.points[1].result = ProbeResult::kNotApplicable;
  s.points[1].value = 7;
  EXPECT_FALSE(s.passed());
  ASSERT_NE(s.FirstFailing(), nullptr);
  EXPECT_EQ(s.FirstFailing()->Label(), "k=7");
  PreflightReport r;
  r.sweep = s;
  EXPECT_FALSE(r.passed());
  EXPECT_NE(r.VerdictLine().find("sweep did not verify k=7"), std::string::npos) << r.VerdictLine();
}

TEST(PreflightSweepReport, DefaultKAndTileRows) {
  EXPECT_EQ(DefaultSweepK(64), (std::vector<int>{0, 1, 2, 3, 7, 8, 15, 16, 31, 32, 63}));
  EXPECT_EQ(DefaultSweepK(256), (std::vector<int>{0, 1, 2, 3, 7, 8, 15, 16, 31, 32, 63, 64, 255}));
  EXPECT_EQ(DefaultSweepK(5), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(DefaultSweepK(1), (std::vector<int>{0}));
  const std::vector<RowTile> tiles = CpuRowTiles();
  std::set<std::string> names;
  for (const RowTile& t : tiles) names.insert(t.name);
  EXPECT_EQ(names, (std::set<std::string>{"gemv", "invariant_rows", "gemm_panel", "gemm_tile",
                                          "gdn_chunk"}));
  const std::vector<int> rows = StraddlingRows(tiles);
  for (const RowTile& t : tiles)
    for (int r : {t.rows - 1, t.rows, t.rows + 1})
      if (r >= 1) {
        EXPECT_NE(std::find(rows.begin(), rows.end(), r), rows.end()) << t.name << r;
      }
  EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()));
}

}  // namespace
}  // namespace lockstep
