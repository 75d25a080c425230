// Tests for instrument/chrome_trace.{h,cpp}: ChromeTraceJson and WriteChromeTrace.
//
// Three synthetic windows with hand-picked CLOCK_MONOTONIC timestamps (4 stages) are rendered;
// every expected ts/dur below was computed by hand from them. All values are multiples of 1/8 us,
// so they are exact doubles and the comparisons are exact (EXPECT_EQ, not NEAR).
#include "lockstep/instrument/chrome_trace.h"

#include <gtest/gtest.h>
#include <stdlib.h>  // mkdtemp

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/engine/window.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kStages = 4;
constexpr std::int64_t kT0 = 987'654'321'000;  // a plausible CLOCK_MONOTONIC value (ns)

// Window layouts (ns relative to kT0), with the verify start each one implies:
//   w0: begin 0, draft 2000, verify 40000, commit 3000, export unknown, end 50000
//       verify_begin = 50000 - 3000 - 40000 - 0 = 7000 (>= 0 + 2000): slack before verify
//   w1: begin 52500, draft 3500, verify 30000, export 4500, commit 2500, end 97500
//       verify_begin = 97500 - 2500 - 30000 - 4500 = 60500 (>= 56000)
//   w2: begin 97500 (touches w1), draft 1250, verify 20000, export 0, commit 1750, end 120500
//       verify_begin = 120500 - 1750 - 20000 - 0 = 98750 (== 97500 + 1250: no slack)
std::vector<WindowRecord> ThreeWindows() {
  std::vector<WindowRecord> ws(3);
  auto timing = [](std::int64_t wait, std::int64_t compute, std::int64_t cpu) {
    StageTiming t;
    t.wait_ns = wait;
    t.compute_ns = compute;
    t.cpu_ns = cpu;
    return t;
  };
  auto finish = [](WindowRecord& w) {
    for (const auto& s : w.stages) w.wait_ns += s.wait_ns, w.compute_ns += s.compute_ns;
  };

  WindowRecord& w0 = ws[0];
  w0.idx = 0, w0.p = 11, w0.T = 1, w0.T_mtp = 0, w0.merged = false, w0.from_sfx = false;
  w0.chain_n = 0, w0.accepted = 0, w0.source = DraftSource::kNone, w0.first_call = true;
  w0.begin_ns = kT0 + 0, w0.end_ns = kT0 + 50'000;
  w0.draft_ns = 2'000, w0.verify_ns = 40'000, w0.commit_ns = 3'000, w0.export_ns = -1;
  w0.stages = {timing(0, 9'000, 8'500), timing(9'000, 10'000, 9'750), timing(19'000, 8'000, 7'000),
               timing(27'000, 11'000, 10'500)};
  finish(w0);

  WindowRecord& w1 = ws[1];
  w1.idx = 1, w1.p = 12, w1.T = 4, w1.T_mtp = 3, w1.merged = false, w1.from_sfx = false;
  w1.chain_n = 0, w1.accepted = 3, w1.source = DraftSource::kMtp, w1.first_call = true;
  w1.draft = {5, 6, 7}, w1.emitted = {5, 6, 7, 8};
  w1.begin_ns = kT0 + 52'500, w1.end_ns = kT0 + 97'500;
  w1.draft_ns = 3'500, w1.verify_ns = 30'000, w1.commit_ns = 2'500, w1.export_ns = 4'500;
  w1.stages = {timing(0, 7'000, 6'000), timing(7'000, 7'500, 7'250), timing(14'500, 6'000, 5'500),
               timing(20'500, 8'250, 8'000)};
  finish(w1);

  WindowRecord& w2 = ws[2];
  w2.idx = 2, w2.p = 16, w2.T = 6, w2.T_mtp = 2, w2.merged = true, w2.from_sfx = true;
  w2.chain_n = 1, w2.accepted = 2, w2.source = DraftSource::kMerged, w2.first_call = false;
  w2.draft = {9, 10, 11, 12, 13}, w2.emitted = {9, 10, 14};
  w2.begin_ns = kT0 + 97'500, w2.end_ns = kT0 + 120'500;
  w2.draft_ns = 1'250, w2.verify_ns = 20'000, w2.commit_ns = 1'750, w2.export_ns = 0;
  w2.stages = {timing(0, 4'125, 4'000), timing(4'125, 5'000, 4'875), timing(9'125, 4'375, 4'250),
               timing(13'500, 5'125, 5'000)};
  finish(w2);
  return ws;
}

json Parse(const std::string& text) {
  EXPECT_FALSE(text.empty());
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "not valid JSON:\n" << text;
  return j;
}

json Trace(const std::vector<WindowRecord>& ws, int n_stages = kStages,
           const ChromeTraceOptions& opts = {}) {
  return Parse(ChromeTraceJson(ws, n_stages, opts));
}

// Complete (ph "X") events on track `tid` named `name` for window `idx`.
std::vector<json> Spans(const json& trace, int tid, const std::string& name, int idx) {
  std::vector<json> out;
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "X" && e.at("tid") == tid && e.at("name") == name &&
        e.at("args").at("idx") == idx)
      out.push_back(e);
  return out;
}

// The one span matching; fails the test if there is not exactly one.
json One(const json& trace, int tid, const std::string& name, int idx) {
  const std::vector<json> s = Spans(trace, tid, name, idx);
  EXPECT_EQ(s.size(), 1u) << "tid " << tid << " '" << name << "' window " << idx;
  return s.empty() ? json{{"ts", -1.0}, {"dur", -1.0}, {"args", json::object()}} : s.front();
}

void ExpectSpan(const json& trace, int tid, const std::string& name, int idx, double ts,
                double dur) {
  const json s = One(trace, tid, name, idx);
  EXPECT_EQ(s.at("ts").get<double>(), ts) << "tid " << tid << " '" << name << "' window " << idx;
  EXPECT_EQ(s.at("dur").get<double>(), dur) << "tid " << tid << " '" << name << "' window " << idx;
}

std::vector<json> AllSpans(const json& trace) {
  std::vector<json> out;
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "X") out.push_back(e);
  return out;
}

// A fresh folder under $TMPDIR (or /tmp), removed by the destructor.
class TempDir {
 public:
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                       "/lockstep_chrome_trace_XXXXXX";
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---- metadata ----

TEST(ChromeTrace, MetadataNamesDriverAndEveryStage) {
  const json t = Trace(ThreeWindows());
  std::map<int, std::string> names;
  std::string process;
  for (const auto& e : t.at("traceEvents")) {
    if (e.at("ph") != "M") continue;
    EXPECT_EQ(e.at("pid"), 1);
    if (e.at("name") == "thread_name") names[e.at("tid").get<int>()] = e.at("args").at("name");
    if (e.at("name") == "process_name") process = e.at("args").at("name");
  }
  EXPECT_EQ(process, "lockstep");
  const std::map<int, std::string> want = {
      {0, "driver"}, {1, "stage 0"}, {2, "stage 1"}, {3, "stage 2"}, {4, "stage 3"}};
  EXPECT_EQ(names, want);
  EXPECT_EQ(t.at("displayTimeUnit"), "ms");
  for (const auto& e : AllSpans(t)) EXPECT_EQ(e.at("pid"), 1);
}

TEST(ChromeTrace, OtherDataCarriesSchemaHeader) {
  const json t = Trace(ThreeWindows());
  const json& o = t.at("otherData");
  EXPECT_EQ(o.at("schema"), "lockstep.chrome_trace");
  EXPECT_EQ(o.at("schema_version"), 1);
  EXPECT_EQ(o.at("clock"), "CLOCK_MONOTONIC");
  EXPECT_EQ(o.at("time_origin_ns"), kT0);
  EXPECT_EQ(o.at("n_windows"), 3);
  EXPECT_EQ(o.at("n_stages"), kStages);
  EXPECT_EQ(o.at("clamped_spans"), 0);
  EXPECT_EQ(o.at("stage_count_mismatch_windows"), 0);
  EXPECT_FALSE(o.contains("arm"));
}

// ---- timing ----

TEST(ChromeTrace, StageSpansMatchHandComputedMicroseconds) {
  const json t = Trace(ThreeWindows());
  struct Want {
    int idx, stage;
    double wait_ts, wait_dur, compute_ts, compute_dur;  // us from kT0
  };
  const Want want[] = {
      // w0: verify starts at 7 us
      {0, 0, 7.0, 0.0, 7.0, 9.0},
      {0, 1, 7.0, 9.0, 16.0, 10.0},
      {0, 2, 7.0, 19.0, 26.0, 8.0},
      {0, 3, 7.0, 27.0, 34.0, 11.0},
      // w1: verify starts at 60.5 us
      {1, 0, 60.5, 0.0, 60.5, 7.0},
      {1, 1, 60.5, 7.0, 67.5, 7.5},
      {1, 2, 60.5, 14.5, 75.0, 6.0},
      {1, 3, 60.5, 20.5, 81.0, 8.25},
      // w2: verify starts at 98.75 us
      {2, 0, 98.75, 0.0, 98.75, 4.125},
      {2, 1, 98.75, 4.125, 102.875, 5.0},
      {2, 2, 98.75, 9.125, 107.875, 4.375},
      {2, 3, 98.75, 13.5, 112.25, 5.125},
  };
  for (const Want& w : want) {
    SCOPED_TRACE("window " + std::to_string(w.idx) + " stage " + std::to_string(w.stage));
    ExpectSpan(t, 1 + w.stage, "wait", w.idx, w.wait_ts, w.wait_dur);
    ExpectSpan(t, 1 + w.stage, "compute", w.idx, w.compute_ts, w.compute_dur);
  }
  // Exactly one wait and one compute per window per stage, and nothing else on stage tracks.
  for (int tid = 1; tid <= kStages; ++tid) {
    int n = 0;
    for (const auto& e : AllSpans(t)) n += e.at("tid") == tid;
    EXPECT_EQ(n, 3 * 2) << "tid " << tid;
  }
}

TEST(ChromeTrace, DriverSpansMatchHandComputedMicroseconds) {
  const json t = Trace(ThreeWindows());
  ExpectSpan(t, 0, "window 0", 0, 0.0, 50.0);
  ExpectSpan(t, 0, "draft", 0, 0.0, 2.0);
  ExpectSpan(t, 0, "verify", 0, 7.0, 40.0);
  ExpectSpan(t, 0, "commit", 0, 47.0, 3.0);

  ExpectSpan(t, 0, "window 1", 1, 52.5, 45.0);
  ExpectSpan(t, 0, "draft", 1, 52.5, 3.5);
  ExpectSpan(t, 0, "verify", 1, 60.5, 30.0);
  ExpectSpan(t, 0, "export", 1, 90.5, 4.5);
  ExpectSpan(t, 0, "commit", 1, 95.0, 2.5);

  ExpectSpan(t, 0, "window 2", 2, 97.5, 23.0);
  ExpectSpan(t, 0, "draft", 2, 97.5, 1.25);
  ExpectSpan(t, 0, "verify", 2, 98.75, 20.0);
  ExpectSpan(t, 0, "export", 2, 118.75, 0.0);
  ExpectSpan(t, 0, "commit", 2, 118.75, 1.75);
}

TEST(ChromeTrace, ExportSpansOnlyWhenMeasured) {
  const json t = Trace(ThreeWindows());
  EXPECT_TRUE(Spans(t, 0, "export", 0).empty());  // export_ns = -1: unknown, not zero
  ASSERT_EQ(Spans(t, 0, "export", 1).size(), 1u);
  ASSERT_EQ(Spans(t, 0, "export", 2).size(), 1u);  // export_ns = 0 is measured: a 0-us span
  EXPECT_EQ(One(t, 0, "window 0", 0).at("args").at("export_ns"), nullptr);
  EXPECT_EQ(One(t, 0, "window 1", 1).at("args").at("export_ns"), 4'500);
  EXPECT_EQ(t.at("otherData").at("export"), "partly unknown");
  EXPECT_EQ(t.at("otherData").at("export_unknown_windows"), 1);

  std::vector<WindowRecord> ws = ThreeWindows();
  for (auto& w : ws) w.export_ns = -1;
  const json unknown = Trace(ws);
  EXPECT_EQ(unknown.at("otherData").at("export"), "unknown");
  for (const auto& e : AllSpans(unknown)) EXPECT_NE(e.at("name"), "export");

  ws = ThreeWindows();
  ws[0].export_ns = 0;
  EXPECT_EQ(Trace(ws).at("otherData").at("export"), "measured");
}

TEST(ChromeTrace, SpansNestInsideTheirWindow) {
  const json t = Trace(ThreeWindows());
  for (int idx = 0; idx < 3; ++idx) {
    const json win = One(t, 0, "window " + std::to_string(idx), idx);
    const double lo = win.at("ts").get<double>();
    const double hi = lo + win.at("dur").get<double>();
    for (const auto& e : AllSpans(t)) {
      if (e.at("args").at("idx") != idx) continue;
      const double ts = e.at("ts").get<double>();
      EXPECT_GE(ts, lo) << e.dump();
      EXPECT_LE(ts + e.at("dur").get<double>(), hi) << e.dump();
    }
  }
  // On the driver track, draft < verify < export < commit without overlap.
  for (int idx = 0; idx < 3; ++idx) {
    double cursor = -1.0;
    for (const char* name : {"draft", "verify", "export", "commit"}) {
      for (const auto& e : Spans(t, 0, name, idx)) {
        EXPECT_GE(e.at("ts").get<double>(), cursor) << e.dump();
        cursor = e.at("ts").get<double>() + e.at("dur").get<double>();
      }
    }
  }
}

// Per track: no negative duration, and every span of window k ends before window k+1 starts.
void ExpectNoNegativeAndNoOverlap(const json& t) {
  std::map<int, std::map<int, std::pair<double, double>>> range;  // tid -> idx -> [min ts, max end]
  for (const auto& e : AllSpans(t)) {
    const double ts = e.at("ts").get<double>();
    const double dur = e.at("dur").get<double>();
    EXPECT_GE(dur, 0.0) << e.dump();
    EXPECT_GE(ts, 0.0) << e.dump();
    auto [it, fresh] =
        range[e.at("tid").get<int>()].try_emplace(e.at("args").at("idx").get<int>(), ts, ts + dur);
    if (!fresh) {
      it->second.first = std::min(it->second.first, ts);
      it->second.second = std::max(it->second.second, ts + dur);
    }
  }
  for (const auto& [tid, by_idx] : range) {
    std::vector<std::pair<double, double>> r;
    for (const auto& [idx, lr] : by_idx) r.push_back(lr);
    std::sort(r.begin(), r.end());
    for (std::size_t k = 0; k + 1 < r.size(); ++k)
      EXPECT_LE(r[k].second, r[k + 1].first) << "tid " << tid << " windows overlap";
  }
}

TEST(ChromeTrace, NoNegativeDurationsAndNoOverlapBetweenWindows) {
  ExpectNoNegativeAndNoOverlap(Trace(ThreeWindows()));
}

// ---- args ----

TEST(ChromeTrace, ArgsCarryThePathFields) {
  const std::vector<WindowRecord> ws = ThreeWindows();
  const json t = Trace(ws);
  for (const auto& e : AllSpans(t)) {
    const json& a = e.at("args");
    const WindowRecord& w = ws.at(a.at("idx").get<std::size_t>());
    SCOPED_TRACE(e.dump());
    EXPECT_EQ(a.at("p"), w.p);
    EXPECT_EQ(a.at("T"), w.T);
    EXPECT_EQ(a.at("T_mtp"), w.T_mtp);
    EXPECT_EQ(a.at("merged"), w.merged);
    EXPECT_EQ(a.at("from_sfx"), w.from_sfx);
    EXPECT_EQ(a.at("chain_n"), w.chain_n);
    EXPECT_EQ(a.at("accepted"), w.accepted);
    EXPECT_EQ(a.at("source"), DraftSourceName(w.source));
    EXPECT_EQ(a.at("first_call"), w.first_call);
    EXPECT_FALSE(a.contains("clamped"));
  }
  EXPECT_EQ(One(t, 0, "draft", 2).at("args").at("source"), "merged");
  // cpu_ms = cpu_ns / 1e6 on compute spans only.
  EXPECT_EQ(One(t, 2, "compute", 0).at("args").at("cpu_ms").get<double>(), 0.00975);
  EXPECT_EQ(One(t, 4, "compute", 1).at("args").at("cpu_ms").get<double>(), 0.008);
  EXPECT_EQ(One(t, 2, "compute", 0).at("args").at("stage"), 1);
  EXPECT_FALSE(One(t, 2, "wait", 0).at("args").contains("cpu_ms"));
  EXPECT_EQ(One(t, 0, "window 1", 1).at("args").at("verify_ns"), 30'000);
}

// Device stages carry their event split and how they ran the layers (graph use); cpu stages none.
TEST(ChromeTrace, DeviceArgsOnlyOnDeviceStages) {
  std::vector<WindowRecord> ws = ThreeWindows();
  StageTiming& st = ws[0].stages[1];
  st.dev_compute_ns = 2'500'000;
  st.dev_wait_ns = 500'000;
  st.dev_copy_ns = 0;
  st.init_ns = 1'000'000;
  st.graph = GraphUse::kCapture;
  const json t = Trace(ws);
  const json a = One(t, 2, "compute", 0).at("args");
  ASSERT_EQ(a.at("stage"), 1);
  EXPECT_EQ(a.at("dev_compute_ms").get<double>(), 2.5);
  EXPECT_EQ(a.at("dev_wait_ms").get<double>(), 0.5);
  EXPECT_EQ(a.at("init_ms").get<double>(), 1.0);
  EXPECT_EQ(a.at("graph"), "capture");
  const json cpu = One(t, 1, "compute", 0).at("args");
  EXPECT_FALSE(cpu.contains("dev_compute_ms"));
  EXPECT_FALSE(cpu.contains("graph"));
}

TEST(ChromeTrace, ArmNamesTheProcessAndOtherData) {
  ChromeTraceOptions opts;
  opts.arm = "spec4";
  const json t = Trace(ThreeWindows(), kStages, opts);
  EXPECT_EQ(t.at("otherData").at("arm"), "spec4");
  bool found = false;
  for (const auto& e : t.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "process_name") {
      EXPECT_EQ(e.at("args").at("name"), "lockstep (spec4)");
      found = true;
    }
  EXPECT_TRUE(found);

  opts.process_name = "run";
  opts.arm = "bad \xff utf8";  // replaced, never thrown on
  const std::string text = ChromeTraceJson(ThreeWindows(), kStages, opts);
  const json bad = Parse(text);
  EXPECT_EQ(bad.at("otherData").at("arm"), "bad \xEF\xBF\xBD utf8");
}

// ---- edge cases ----

TEST(ChromeTrace, EmptyWindowListGivesOnlyMetadata) {
  const json t = Trace({});
  ASSERT_TRUE(t.at("traceEvents").is_array());
  int thread_names = 0;
  for (const auto& e : t.at("traceEvents")) {
    EXPECT_EQ(e.at("ph"), "M") << e.dump();
    thread_names += e.at("name") == "thread_name";
  }
  EXPECT_EQ(thread_names, 1 + kStages);
  EXPECT_EQ(t.at("otherData").at("n_windows"), 0);
  EXPECT_EQ(t.at("otherData").at("time_origin_ns"), nullptr);
  EXPECT_EQ(t.at("otherData").at("export"), "unknown");
}

TEST(ChromeTrace, InconsistentRecordsAreClampedNeverNegative) {
  std::vector<WindowRecord> ws = ThreeWindows();
  // w0 over-full: draft + verify + commit exceed end - begin, and a stage computes past the end.
  ws[0].verify_ns = 49'000;
  ws[0].stages[3].compute_ns = 90'000;
  // w1 ends after w2 begins (overlapping records) and has negative durations.
  ws[1].end_ns = kT0 + 110'000;
  ws[1].commit_ns = -5;
  ws[1].stages[0].wait_ns = -1'000;
  // Records out of order: drawn in time order all the same.
  std::swap(ws[0], ws[2]);
  const json t = Trace(ws);
  ExpectNoNegativeAndNoOverlap(t);
  EXPECT_GT(t.at("otherData").at("clamped_spans").get<int>(), 0);
  EXPECT_EQ(t.at("otherData").at("time_origin_ns"), kT0);

  // w0: verify starts after the draft (the formula would put it before) and is cut at the end.
  ExpectSpan(t, 0, "verify", 0, 2.0, 48.0);
  EXPECT_EQ(One(t, 0, "verify", 0).at("args").at("clamped"), true);
  ExpectSpan(t, 0, "commit", 0, 50.0, 0.0);
  ExpectSpan(t, 4, "compute", 0, 29.0, 21.0);  // 2 + 27 = 29 us, cut at 50 us
  // w1: cut where w2 begins (97.5 us).
  ExpectSpan(t, 0, "window 1", 1, 52.5, 45.0);
  EXPECT_EQ(One(t, 0, "window 1", 1).at("args").at("clamped"), true);
  ExpectSpan(t, 1, "wait", 1, One(t, 0, "verify", 1).at("ts").get<double>(), 0.0);

  // Absurd values (a corrupt JSONL record) neither overflow nor go negative.
  WindowRecord huge = ThreeWindows()[0];
  huge.begin_ns = std::numeric_limits<std::int64_t>::min();
  huge.end_ns = std::numeric_limits<std::int64_t>::max();
  huge.draft_ns = std::numeric_limits<std::int64_t>::max();
  huge.verify_ns = std::numeric_limits<std::int64_t>::min();
  huge.export_ns = std::numeric_limits<std::int64_t>::max();
  ExpectNoNegativeAndNoOverlap(Trace({huge}));
}

TEST(ChromeTrace, MissingStageTimingsAreNotDrawn) {
  std::vector<WindowRecord> ws = ThreeWindows();
  ws[1].stages.resize(2);
  const json t = Trace(ws);
  EXPECT_EQ(Spans(t, 2, "compute", 1).size(), 1u);
  EXPECT_TRUE(Spans(t, 3, "compute", 1).empty());
  EXPECT_TRUE(Spans(t, 4, "wait", 1).empty());
  EXPECT_EQ(t.at("otherData").at("stage_count_mismatch_windows"), 1);
  // Fewer tracks than timings: only the tracks asked for.
  const json two = Trace(ThreeWindows(), 2);
  for (const auto& e : two.at("traceEvents")) EXPECT_LE(e.at("tid").get<int>(), 2) << e.dump();
}

TEST(ChromeTrace, OutputIsDeterministic) {
  EXPECT_EQ(ChromeTraceJson(ThreeWindows(), kStages), ChromeTraceJson(ThreeWindows(), kStages));
}

// ---- file ----

// A missing folder is bad input (issue 20): exit 2, not a runtime failure.
// ---- engine steps ----

// Steps 7 (before the first window: the request's prefill), 8 (w0's verify) and 9 (end before
// begin: drawn with dur 0, clamped), on the "steps" track after the stage tracks.
TEST(ChromeTrace, StepsTrackOnlyWithSteps) {
  const json plain = Trace(ThreeWindows());
  EXPECT_FALSE(plain.at("otherData").contains("n_steps"));
  for (const auto& e : plain.at("traceEvents")) EXPECT_NE(e.at("tid"), 1 + kStages);

  ChromeTraceOptions o;
  auto step = [](std::int64_t n, std::int64_t b, std::int64_t e, int rows, int prefill) {
    StepRecord s;
    s.step = n, s.begin_ns = kT0 + b, s.end_ns = kT0 + e;
    s.rows = rows, s.seqs = 2, s.verify_rows = rows - prefill, s.prefill_rows = prefill;
    s.queue_depth = 1, s.live = 2, s.weight_bytes = 123, s.flops = 456, s.slots = {0, 3};
    return s;
  };
  o.steps = {step(7, -10'000, -2'000, 48, 32), step(8, 7'000, 47'000, 17, 16),
             step(9, 60'000, 59'000, 2, 0)};
  const json t = Trace(ThreeWindows(), kStages, o);
  // The origin moves to the first step; windows shift by 10 us.
  EXPECT_EQ(t.at("otherData").at("time_origin_ns"), kT0 - 10'000);
  EXPECT_EQ(t.at("otherData").at("n_steps"), 3);
  EXPECT_EQ(t.at("otherData").at("clamped_spans"), 1);
  ExpectSpan(t, 0, "window 0", 0, 10.0, 50.0);
  std::map<std::string, json> spans;
  std::string track;
  for (const auto& e : t.at("traceEvents")) {
    if (e.at("tid") != 1 + kStages) continue;
    if (e.at("ph") == "M" && e.at("name") == "thread_name") track = e.at("args").at("name");
    if (e.at("ph") == "X") spans[e.at("name")] = e;
  }
  EXPECT_EQ(track, "steps");
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans["step 7"].at("ts").get<double>(), 0.0);
  EXPECT_EQ(spans["step 7"].at("dur").get<double>(), 8.0);
  EXPECT_EQ(spans["step 8"].at("ts").get<double>(), 17.0);
  EXPECT_EQ(spans["step 8"].at("dur").get<double>(), 40.0);
  EXPECT_EQ(spans["step 9"].at("dur").get<double>(), 0.0);
  EXPECT_EQ(spans["step 9"].at("args").at("clamped"), true);
  const json& a = spans["step 8"].at("args");
  EXPECT_EQ(a.at("step"), 8);
  EXPECT_EQ(a.at("rows"), 17);
  EXPECT_EQ(a.at("seqs"), 2);
  EXPECT_EQ(a.at("verify_rows"), 1);
  EXPECT_EQ(a.at("prefill_rows"), 16);
  EXPECT_EQ(a.at("queue_depth"), 1);
  EXPECT_EQ(a.at("live"), 2);
  EXPECT_EQ(a.at("weight_bytes"), 123);
  EXPECT_EQ(a.at("flops"), 456);
  EXPECT_EQ(a.at("slots"), json::array({0, 3}));
  EXPECT_FALSE(spans["step 8"].at("args").contains("clamped"));
  // Steps alone (no windows): the origin is the first step's begin.
  const json only = Trace({}, kStages, o);
  EXPECT_EQ(only.at("otherData").at("time_origin_ns"), kT0 - 10'000);
}

TEST(ChromeTrace, WriteToMissingFolderIsInvalidArgument) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string path = dir.path() + "/no/such/folder/trace.json";
  const Status s = WriteChromeTrace(path, ThreeWindows(), kStages);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_FALSE(fs::exists(path));
}

TEST(ChromeTrace, WriteProducesTheSameText) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string path = dir.path() + "/trace.json";
  ChromeTraceOptions opts;
  opts.arm = "baseline";
  const Status s = WriteChromeTrace(path, ThreeWindows(), kStages, opts);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::ifstream in(path, std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  EXPECT_EQ(buf.str(), ChromeTraceJson(ThreeWindows(), kStages, opts));
  EXPECT_EQ(fs::directory_iterator(dir.path())->path().filename(), "trace.json");  // no temp left
}

}  // namespace
}  // namespace lockstep
