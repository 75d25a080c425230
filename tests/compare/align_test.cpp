// Window alignment on crafted traces: where the first path divergence is, that timing deltas stay
// inside the matched prefix, unknown intervals stay unknown, and notable windows are per side.
#include "lockstep/compare/align.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace lockstep {
namespace {

std::int64_t MsToNs(double ms) { return std::llround(ms * 1e6); }

// A consistent record (draft/emitted sizes agree with T/accepted) with every interval known.
WindowRecord MakeWindow(int idx, int p, int T, double verify_ms = 10.0) {
  WindowRecord w;
  w.idx = idx;
  w.p = p;
  w.T = T;
  w.T_mtp = T - 1;
  w.source = T > 1 ? DraftSource::kMtp : DraftSource::kNone;
  w.accepted = T - 1;
  w.draft.assign(static_cast<std::size_t>(T - 1), 7);
  w.emitted.assign(static_cast<std::size_t>(T), 7);
  w.verify_ns = MsToNs(verify_ms);
  w.wait_ns = MsToNs(1.0);
  w.compute_ns = MsToNs(verify_ms * 0.9);
  w.draft_ns = MsToNs(0.5);
  w.commit_ns = MsToNs(0.25);
  w.export_ns = MsToNs(2.0);
  return w;
}

// n windows of T=2 that each accept everything, starting at p0, all with the given verify time.
std::vector<WindowRecord> MakeTrace(int n, int p0 = 100, double verify_ms = 10.0) {
  std::vector<WindowRecord> t;
  int p = p0;
  for (int i = 0; i < n; ++i) {
    t.push_back(MakeWindow(i, p, 2, verify_ms));
    p += 2;
  }
  return t;
}

const IntervalDiff& Interval(const AlignResult& r, const std::string& name) {
  for (const IntervalDiff& d : r.timing)
    if (d.name == name) return d;
  ADD_FAILURE() << "no interval " << name;
  static const IntervalDiff kNone;
  return kNone;
}

void SetVerifyMs(std::vector<WindowRecord>& t, const std::vector<double>& ms) {
  for (std::size_t i = 0; i < ms.size(); ++i) t[i].verify_ns = MsToNs(ms[i]);
}

// ---- names and parsing ----

TEST(Align, FieldAndIntervalNames) {
  EXPECT_EQ(AlignableFields(), (std::vector<std::string>{"p", "T", "T_mtp", "merged", "from_sfx",
                                                         "chain_n", "accepted"}));
  EXPECT_EQ(DefaultAlignFields(),
            (std::vector<std::string>{"p", "T", "T_mtp", "merged", "from_sfx", "chain_n"}));
  EXPECT_EQ(TimingIntervals(),
            (std::vector<std::string>{"verify", "wait", "compute", "draft", "commit", "export"}));
  EXPECT_EQ(DeviceTimingIntervals(),
            (std::vector<std::string>{"dev_wait", "dev_compute", "dev_copy", "init"}));
}

// ---- device intervals (summed over stages; only when a trace has them) ----

// Four stages as a device backend records them: stage s waits s ms, computes (s + 1) * c ms,
// copies 0.5 ms on the last stage only, and spends init_ms in set-up on stage 0.
void AddDeviceStages(WindowRecord& w, double c, double init_ms = 0.0) {
  w.stages.clear();
  for (int s = 0; s < 4; ++s) {
    StageTiming st;
    st.dev_wait_ns = MsToNs(s);
    st.dev_compute_ns = MsToNs((s + 1) * c);
    st.dev_copy_ns = s == 3 ? MsToNs(0.5) : 0;
    st.init_ns = s == 0 ? MsToNs(init_ms) : 0;
    w.stages.push_back(st);
  }
}

// The cpu backend's stages: every device field -1 (not measured).
void AddCpuStages(WindowRecord& w) { w.stages.assign(4, StageTiming{}); }

TEST(Align, DeviceIntervalsAreStageSumsOverTheMatchedPrefix) {
  auto a = MakeTrace(3), b = MakeTrace(3);
  for (int i = 0; i < 3; ++i) {
    AddDeviceStages(a[i], 1.0, i == 0 ? 8.0 : 0.0);
    AddDeviceStages(b[i], i == 1 ? 2.0 : 1.0, i == 0 ? 6.0 : 0.0);
  }
  b[2].T = 3;  // diverges at window 2: only windows 0 and 1 are compared
  b[2].T_mtp = 2;
  const AlignResult r = AlignWindows(a, b);
  ASSERT_EQ(r.matched, 2);
  ASSERT_EQ(r.timing.size(), TimingIntervals().size() + DeviceTimingIntervals().size());
  for (std::size_t i = 0; i < DeviceTimingIntervals().size(); ++i)
    EXPECT_EQ(r.timing[TimingIntervals().size() + i].name, DeviceTimingIntervals()[i]);
  const IntervalDiff& c = Interval(r, "dev_compute");  // (1 + 2 + 3 + 4) x c per window
  ASSERT_TRUE(c.known);
  ASSERT_EQ(c.delta_ms.size(), 2u);
  EXPECT_DOUBLE_EQ(c.delta_ms[0], 0.0);
  EXPECT_DOUBLE_EQ(c.delta_ms[1], 10.0);
  EXPECT_DOUBLE_EQ(c.sum_a_ms, 20.0);
  EXPECT_DOUBLE_EQ(c.sum_b_ms, 30.0);
  EXPECT_EQ(c.max_at, 1);
  const IntervalDiff& w = Interval(r, "dev_wait");  // 0 + 1 + 2 + 3 per window
  EXPECT_DOUBLE_EQ(w.sum_a_ms, 12.0);
  EXPECT_DOUBLE_EQ(w.max_abs_delta_ms, 0.0);
  EXPECT_DOUBLE_EQ(Interval(r, "dev_copy").sum_b_ms, 1.0);
  const IntervalDiff& init = Interval(r, "init");
  EXPECT_DOUBLE_EQ(init.sum_a_ms, 8.0);
  EXPECT_DOUBLE_EQ(init.delta_ms[0], -2.0);
}

TEST(Align, DeviceIntervalsAbsentForCpuTracesUnknownAgainstOne) {
  auto a = MakeTrace(3), b = MakeTrace(3);
  for (auto& w : a) AddCpuStages(w);
  for (auto& w : b) AddCpuStages(w);
  // Two cpu traces: no device rows at all (not four "unknown" rows in every cpu report).
  EXPECT_EQ(AlignWindows(a, b).timing.size(), TimingIntervals().size());
  // cuda against cpu: the rows are there and unknown (never a partial sum of one side).
  for (auto& w : b) AddDeviceStages(w, 1.0);
  const AlignResult r = AlignWindows(a, b);
  ASSERT_EQ(r.timing.size(), TimingIntervals().size() + DeviceTimingIntervals().size());
  for (const std::string& name : DeviceTimingIntervals()) {
    EXPECT_FALSE(Interval(r, name).known) << name;
    EXPECT_TRUE(Interval(r, name).delta_ms.empty()) << name;
  }
  EXPECT_TRUE(Interval(r, "verify").known);
  // One stage that did not measure makes that window's sum unknown, so the interval is unknown.
  auto c = b;
  c[1].stages[2].dev_compute_ns = -1;
  const AlignResult r2 = AlignWindows(b, c);
  EXPECT_FALSE(Interval(r2, "dev_compute").known);
  EXPECT_TRUE(Interval(r2, "dev_wait").known);
}

TEST(Align, ParseAlignFieldsAccepts) {
  auto r = ParseAlignFields(" p, T ,T_mtp ");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, (std::vector<std::string>{"p", "T", "T_mtp"}));
  auto all = ParseAlignFields("p,T,T_mtp,merged,from_sfx,chain_n,accepted");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(*all, AlignableFields());
  auto one = ParseAlignFields("accepted");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, std::vector<std::string>{"accepted"});
}

TEST(Align, ParseAlignFieldsRejects) {
  for (const char* bad : {"", "   ", "p,,T", "p,", ",p", "p,T,p", "t", "p,foo", "p;T"}) {
    auto r = ParseAlignFields(bad);
    EXPECT_FALSE(r.ok()) << "'" << bad << "'";
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << bad;
    }
  }
  auto unknown = ParseAlignFields("p, foo");
  ASSERT_FALSE(unknown.ok());
  // Names the culprit and lists the valid fields so the user can fix the flag.
  EXPECT_NE(unknown.status().message().find("'foo'"), std::string::npos)
      << unknown.status().message();
  EXPECT_NE(unknown.status().message().find("p, T, T_mtp, merged, from_sfx, chain_n, accepted"),
            std::string::npos)
      << unknown.status().message();
  auto dup = ParseAlignFields("T,p,T");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("'T'"), std::string::npos) << dup.status().message();
  EXPECT_NE(dup.status().message().find("twice"), std::string::npos) << dup.status().message();
}

TEST(Align, DescribeWindowAndFieldValue) {
  WindowRecord w = MakeWindow(3, 120, 6);
  w.T_mtp = 6;
  w.merged = false;
  w.from_sfx = true;
  w.chain_n = 2;
  EXPECT_EQ(DescribeWindow(w, DefaultAlignFields()),
            "p=120, T=6, T_mtp=6, merged=false, from_sfx=true, chain_n=2");
  EXPECT_EQ(DescribeWindow(w, {"T", "accepted"}), "T=6, accepted=5");
  EXPECT_EQ(DescribeWindow(w, {}), "");
  EXPECT_EQ(FieldValue(w, "from_sfx"), "true");
  EXPECT_EQ(FieldValue(w, "merged"), "false");
  EXPECT_EQ(FieldValue(w, "p"), "120");
}

// ---- where the divergence is ----

TEST(Align, EqualTracesUseEveryWindow) {
  auto a = MakeTrace(4);
  auto b = MakeTrace(4);
  SetVerifyMs(a, {10, 20, 30, 40});
  SetVerifyMs(b, {11, 18, 33, 40});
  const AlignResult r = AlignWindows(a, b);
  EXPECT_EQ(r.fields, DefaultAlignFields());
  EXPECT_EQ(r.n_a, 4);
  EXPECT_EQ(r.n_b, 4);
  EXPECT_FALSE(r.diverged);
  EXPECT_EQ(r.div_idx, -1);
  EXPECT_EQ(r.matched, 4);
  EXPECT_FALSE(r.div_a.has_value());
  EXPECT_FALSE(r.div_b.has_value());
  EXPECT_TRUE(r.differing_fields.empty());
  EXPECT_TRUE(r.rest_a.empty());
  EXPECT_TRUE(r.rest_b.empty());
  ASSERT_EQ(r.timing.size(), TimingIntervals().size());
  for (std::size_t i = 0; i < r.timing.size(); ++i) {
    EXPECT_EQ(r.timing[i].name, TimingIntervals()[i]);
    EXPECT_TRUE(r.timing[i].known) << r.timing[i].name;
    EXPECT_EQ(r.timing[i].delta_ms.size(), 4u) << r.timing[i].name;
  }
  const IntervalDiff& v = Interval(r, "verify");
  ASSERT_EQ(v.delta_ms.size(), 4u);
  EXPECT_DOUBLE_EQ(v.delta_ms[0], 1.0);
  EXPECT_DOUBLE_EQ(v.delta_ms[1], -2.0);
  EXPECT_DOUBLE_EQ(v.delta_ms[2], 3.0);
  EXPECT_DOUBLE_EQ(v.delta_ms[3], 0.0);
  EXPECT_DOUBLE_EQ(v.max_abs_delta_ms, 3.0);
  EXPECT_EQ(v.max_at, 2);
  EXPECT_DOUBLE_EQ(v.median_delta_ms, 0.5);      // {-2, 0, 1, 3}
  EXPECT_DOUBLE_EQ(v.median_abs_delta_ms, 1.5);  // {0, 1, 2, 3}
  EXPECT_DOUBLE_EQ(v.sum_a_ms, 100.0);
  EXPECT_DOUBLE_EQ(v.sum_b_ms, 102.0);
  EXPECT_DOUBLE_EQ(v.rel_diff, 0.02);
  const IntervalDiff& w = Interval(r, "wait");  // identical on both sides
  EXPECT_DOUBLE_EQ(w.max_abs_delta_ms, 0.0);
  EXPECT_EQ(w.max_at, 0);
  EXPECT_DOUBLE_EQ(w.sum_a_ms, 4.0);
  EXPECT_DOUBLE_EQ(w.rel_diff, 0.0);
}

TEST(Align, EmptyTraces) {
  const AlignResult r = AlignWindows({}, {});
  EXPECT_FALSE(r.diverged);
  EXPECT_EQ(r.div_idx, -1);
  EXPECT_EQ(r.matched, 0);
  EXPECT_EQ(r.timing.size(), TimingIntervals().size());
  EXPECT_DOUBLE_EQ(r.median_verify_ms_a, 0.0);

  const AlignResult one = AlignWindows({}, MakeTrace(2));
  EXPECT_TRUE(one.diverged);
  EXPECT_EQ(one.div_idx, 0);
  EXPECT_FALSE(one.div_a.has_value());
  ASSERT_TRUE(one.div_b.has_value());
  EXPECT_EQ(one.rest_b.size(), 2u);
}

TEST(Align, DivergenceAtZeroHasNoTiming) {
  auto a = MakeTrace(5);
  auto b = MakeTrace(5);
  b[0].T = 3;
  b[0].T_mtp = 2;
  SetVerifyMs(b, {500, 600, 700, 800, 900});
  const AlignResult r = AlignWindows(a, b);
  EXPECT_TRUE(r.diverged);
  EXPECT_EQ(r.div_idx, 0);
  EXPECT_EQ(r.matched, 0);
  ASSERT_TRUE(r.div_a.has_value());
  ASSERT_TRUE(r.div_b.has_value());
  EXPECT_EQ(r.div_a->T, 2);
  EXPECT_EQ(r.div_b->T, 3);
  EXPECT_EQ(r.differing_fields, (std::vector<std::string>{"T", "T_mtp"}));
  EXPECT_EQ(r.rest_a.size(), 5u);
  EXPECT_EQ(r.rest_b.size(), 5u);
  ASSERT_EQ(r.timing.size(), TimingIntervals().size());
  for (const IntervalDiff& d : r.timing) {
    EXPECT_TRUE(d.known) << d.name;  // nothing unknown was compared: known but empty
    EXPECT_TRUE(d.delta_ms.empty()) << d.name;
    EXPECT_EQ(d.max_at, -1) << d.name;
    EXPECT_DOUBLE_EQ(d.max_abs_delta_ms, 0.0) << d.name;
    EXPECT_DOUBLE_EQ(d.median_delta_ms, 0.0) << d.name;
    EXPECT_DOUBLE_EQ(d.sum_a_ms, 0.0) << d.name;
    EXPECT_DOUBLE_EQ(d.sum_b_ms, 0.0) << d.name;
    EXPECT_DOUBLE_EQ(d.rel_diff, 0.0) << d.name;
  }
}

TEST(Align, DivergenceAtLastWindow) {
  auto a = MakeTrace(5);
  auto b = MakeTrace(5);
  b[4].from_sfx = true;
  b[4].merged = true;
  const AlignResult r = AlignWindows(a, b);
  EXPECT_TRUE(r.diverged);
  EXPECT_EQ(r.div_idx, 4);
  EXPECT_EQ(r.matched, 4);
  EXPECT_EQ(r.differing_fields,
            (std::vector<std::string>{"merged", "from_sfx"}));  // in field order
  ASSERT_EQ(r.rest_a.size(), 1u);
  ASSERT_EQ(r.rest_b.size(), 1u);
  EXPECT_EQ(r.rest_a[0].idx, 4);
  EXPECT_TRUE(r.rest_b[0].from_sfx);
  EXPECT_EQ(Interval(r, "verify").delta_ms.size(), 4u);
}

TEST(Align, StrictPrefixDivergesWhereTheShorterEnds) {
  const auto a = MakeTrace(3);
  const auto b = MakeTrace(5);
  const AlignResult r = AlignWindows(a, b);
  EXPECT_TRUE(r.diverged);
  EXPECT_EQ(r.div_idx, 3);
  EXPECT_EQ(r.matched, 3);
  EXPECT_FALSE(r.div_a.has_value());
  ASSERT_TRUE(r.div_b.has_value());
  EXPECT_EQ(r.div_b->idx, 3);
  EXPECT_TRUE(r.differing_fields.empty());
  EXPECT_TRUE(r.rest_a.empty());
  ASSERT_EQ(r.rest_b.size(), 2u);
  EXPECT_EQ(r.rest_b[0].idx, 3);
  EXPECT_EQ(r.rest_b[1].idx, 4);
  EXPECT_EQ(Interval(r, "verify").delta_ms.size(), 3u);

  // And the other way round.
  const AlignResult s = AlignWindows(b, a);
  EXPECT_EQ(s.div_idx, 3);
  ASSERT_TRUE(s.div_a.has_value());
  EXPECT_FALSE(s.div_b.has_value());
  EXPECT_EQ(s.rest_a.size(), 2u);
  EXPECT_TRUE(s.rest_b.empty());
}

TEST(Align, DifferenceOnlyInUnselectedFieldsIsNoDivergence) {
  auto a = MakeTrace(4);
  auto b = MakeTrace(4);
  // accepted is alignable but not a default field; source, draft and emitted are not path fields
  // the alignment looks at.
  b[1].accepted = 0;
  b[1].emitted.resize(1);
  b[2].source = DraftSource::kSuffix;
  b[2].draft = {9};
  const AlignResult r = AlignWindows(a, b);
  EXPECT_FALSE(r.diverged);
  EXPECT_EQ(r.matched, 4);

  // Select it, and it is the divergence.
  AlignOptions opts;
  opts.fields = {"p", "accepted"};
  const AlignResult s = AlignWindows(a, b, opts);
  EXPECT_TRUE(s.diverged);
  EXPECT_EQ(s.div_idx, 1);
  EXPECT_EQ(s.fields, opts.fields);
  EXPECT_EQ(s.differing_fields, std::vector<std::string>{"accepted"});

  // A different p is ignored when only T is selected.
  b[0].p = 999;
  opts.fields = {"T"};
  EXPECT_FALSE(AlignWindows(a, b, opts).diverged);
}

TEST(Align, TimingNeverPastDivergence) {
  auto a = MakeTrace(8);
  auto b = MakeTrace(8);
  SetVerifyMs(a, {10, 10, 10, 10, 1, 1, 1, 1});
  SetVerifyMs(b, {12, 9, 10, 11, 90000, 1, 80000, 1});
  for (std::size_t i = 4; i < 8; ++i) {
    // Huge differences in every interval after the divergence, and one unknown export.
    b[i].wait_ns = b[i].compute_ns = b[i].draft_ns = b[i].commit_ns = MsToNs(50000);
    a[i].export_ns = -1;
  }
  b[4].T = 4;  // divergence at 4
  b[4].T_mtp = 3;
  const AlignResult r = AlignWindows(a, b);
  ASSERT_EQ(r.div_idx, 4);
  const IntervalDiff& v = Interval(r, "verify");
  ASSERT_EQ(v.delta_ms.size(), 4u);
  EXPECT_DOUBLE_EQ(v.max_abs_delta_ms, 2.0);
  EXPECT_EQ(v.max_at, 0);
  EXPECT_DOUBLE_EQ(v.median_delta_ms, 0.5);      // {-1, 0, 1, 2}
  EXPECT_DOUBLE_EQ(v.median_abs_delta_ms, 1.0);  // {0, 1, 1, 2}
  EXPECT_DOUBLE_EQ(v.sum_a_ms, 40.0);
  EXPECT_DOUBLE_EQ(v.sum_b_ms, 42.0);
  for (const char* name : {"wait", "compute", "draft", "commit"}) {
    const IntervalDiff& d = Interval(r, name);
    EXPECT_TRUE(d.known) << name;
    EXPECT_EQ(d.delta_ms.size(), 4u) << name;
    EXPECT_LT(d.max_abs_delta_ms, 10.0) << name;
    EXPECT_LT(d.sum_b_ms, 1000.0) << name;
    EXPECT_DOUBLE_EQ(d.rel_diff, 0.0) << name;  // only verify differs in the prefix
  }
  // The unknown export values all lie after the divergence, so the matched prefix is known.
  EXPECT_TRUE(Interval(r, "export").known);
  EXPECT_EQ(Interval(r, "export").delta_ms.size(), 4u);
  // The rest still carries them, per side.
  ASSERT_EQ(r.rest_b.size(), 4u);
  EXPECT_EQ(r.rest_b[0].verify_ns, MsToNs(90000));
}

TEST(Align, UnknownIntervalIsNotZero) {
  auto a = MakeTrace(4);
  auto b = MakeTrace(4);
  b[2].export_ns = -1;
  const AlignResult r = AlignWindows(a, b);
  const IntervalDiff& e = Interval(r, "export");
  EXPECT_FALSE(e.known);
  EXPECT_TRUE(e.delta_ms.empty());
  EXPECT_EQ(e.max_at, -1);
  EXPECT_DOUBLE_EQ(e.sum_a_ms, 0.0);
  EXPECT_DOUBLE_EQ(e.sum_b_ms, 0.0);
  // Other intervals are unaffected.
  EXPECT_TRUE(Interval(r, "verify").known);
  EXPECT_EQ(Interval(r, "verify").delta_ms.size(), 4u);

  // Unknown on side A in every window (no observer) is also unknown.
  for (auto& w : a) w.export_ns = -1;
  b[2].export_ns = MsToNs(2.0);
  EXPECT_FALSE(Interval(AlignWindows(a, b), "export").known);
}

TEST(Align, MedianOddEvenAndSigned) {
  auto a = MakeTrace(3);
  auto b = MakeTrace(3);
  SetVerifyMs(a, {10, 10, 10});
  SetVerifyMs(b, {6, 11, 12});  // deltas {-4, 1, 2}
  const IntervalDiff v3 = Interval(AlignWindows(a, b), "verify");
  EXPECT_DOUBLE_EQ(v3.median_delta_ms, 1.0);
  EXPECT_DOUBLE_EQ(v3.median_abs_delta_ms, 2.0);
  EXPECT_DOUBLE_EQ(v3.max_abs_delta_ms, 4.0);
  EXPECT_EQ(v3.max_at, 0);

  a = MakeTrace(4);
  b = MakeTrace(4);
  SetVerifyMs(a, {10, 10, 10, 10});
  SetVerifyMs(b, {20, 11, 13, 12});  // deltas {10, 1, 3, 2}: median of an even count is the mean
  const IntervalDiff v4 = Interval(AlignWindows(a, b), "verify");
  EXPECT_DOUBLE_EQ(v4.median_delta_ms, 2.5);
  EXPECT_DOUBLE_EQ(v4.median_abs_delta_ms, 2.5);

  a = MakeTrace(1);
  b = MakeTrace(1);
  SetVerifyMs(b, {7});  // a single window: median is that window
  EXPECT_DOUBLE_EQ(Interval(AlignWindows(a, b), "verify").median_delta_ms, -3.0);
}

TEST(Align, MaxTiesGoToLowestIndex) {
  auto a = MakeTrace(4);
  auto b = MakeTrace(4);
  SetVerifyMs(a, {10, 10, 10, 10});
  SetVerifyMs(b, {11, 7, 13, 7});  // |delta| {1, 3, 3, 3}
  const IntervalDiff v = Interval(AlignWindows(a, b), "verify");
  EXPECT_DOUBLE_EQ(v.max_abs_delta_ms, 3.0);
  EXPECT_EQ(v.max_at, 1);
}

TEST(Align, RelDiffEdgeCases) {
  auto a = MakeTrace(2);
  auto b = MakeTrace(2);
  for (auto* t : {&a, &b}) {
    for (auto& w : *t) w.draft_ns = w.commit_ns = 0;
  }
  b[1].commit_ns = MsToNs(1.0);
  const AlignResult r = AlignWindows(a, b);
  EXPECT_DOUBLE_EQ(Interval(r, "draft").rel_diff, 0.0);  // both sums zero
  EXPECT_EQ(Interval(r, "commit").rel_diff, std::numeric_limits<double>::infinity());
  SetVerifyMs(b, {0, 0});
  EXPECT_DOUBLE_EQ(Interval(AlignWindows(a, b), "verify").rel_diff, -1.0);
}

// ---- the seed issue's shape ----

TEST(Align, SeedLikeDivergenceAndNotableWindow) {
  // 26 matched windows, a path difference at window 26, and on side B a 395.988 ms T=2 verify at
  // its own window 45 that must be reported for B alone, after the divergence.
  auto a = MakeTrace(60, 130657, 20.0);
  auto b = MakeTrace(60, 130657, 20.0);
  a[0].T = b[0].T = 1;  // first verify: the last prompt token, no draft
  a[0].T_mtp = b[0].T_mtp = 0;
  b[1].verify_ns = a[1].verify_ns + MsToNs(591.667);
  a[26].T = 6, a[26].T_mtp = 6, a[26].from_sfx = true;
  b[26].T = 4, b[26].T_mtp = 4, b[26].from_sfx = false;
  b[45].T = 2;
  b[45].verify_ns = MsToNs(395.988);
  const AlignResult r = AlignWindows(a, b);
  ASSERT_TRUE(r.diverged);
  EXPECT_EQ(r.div_idx, 26);
  EXPECT_EQ(r.matched, 26);
  EXPECT_EQ(r.differing_fields, (std::vector<std::string>{"T", "T_mtp", "from_sfx"}));
  EXPECT_EQ(DescribeWindow(*r.div_a, r.fields),
            "p=130709, T=6, T_mtp=6, merged=false, from_sfx=true, chain_n=0");
  EXPECT_EQ(DescribeWindow(*r.div_b, r.fields),
            "p=130709, T=4, T_mtp=4, merged=false, from_sfx=false, chain_n=0");
  EXPECT_EQ(r.rest_a.size(), 34u);
  EXPECT_EQ(r.rest_b.size(), 34u);
  EXPECT_EQ(r.rest_b[45 - 26].verify_ns, MsToNs(395.988));

  const IntervalDiff& v = Interval(r, "verify");
  EXPECT_EQ(v.delta_ms.size(), 26u);
  EXPECT_NEAR(v.max_abs_delta_ms, 591.667, 1e-9);
  EXPECT_EQ(v.max_at, 1);

  EXPECT_DOUBLE_EQ(r.median_verify_ms_a, 20.0);
  EXPECT_DOUBLE_EQ(r.median_verify_ms_b, 20.0);
  EXPECT_TRUE(r.notable_a.empty());
  ASSERT_EQ(r.notable_b.size(), 2u);
  EXPECT_EQ(r.notable_b[0].idx, 1);  // 611.667 ms, before the divergence
  EXPECT_FALSE(r.notable_b[0].after_divergence);
  const NotableWindow& n = r.notable_b[1];
  EXPECT_EQ(n.idx, 45);
  EXPECT_EQ(n.T, 2);
  EXPECT_EQ(n.p, b[45].p);
  EXPECT_NEAR(n.verify_ms, 395.988, 1e-9);
  EXPECT_NEAR(n.ratio_to_median, 395.988 / 20.0, 1e-9);
  EXPECT_TRUE(n.after_divergence);
}

TEST(Align, NotableSortedCappedAndThresholded) {
  auto a = MakeTrace(16, 0, 2.0);
  auto b = MakeTrace(16, 0, 2.0);
  // Median 2 ms (ten of sixteen windows): >= 10 ms is notable at ratio 5.
  SetVerifyMs(a, {2, 30, 2, 10, 2, 30, 2, 50, 9.9, 2, 20, 2, 2, 2, 2, 2});
  AlignOptions opts;
  opts.max_notable = 4;
  const AlignResult r = AlignWindows(a, b, opts);
  EXPECT_FALSE(r.diverged);
  ASSERT_EQ(r.notable_a.size(),
            4u);  // 50, 30, 30, 20 (10 is cut by max_notable; 9.9 is below ratio)
  EXPECT_EQ(r.notable_a[0].idx, 7);
  EXPECT_EQ(r.notable_a[1].idx, 1);  // tie at 30 ms: lower index first
  EXPECT_EQ(r.notable_a[2].idx, 5);
  EXPECT_EQ(r.notable_a[3].idx, 10);
  for (const NotableWindow& n : r.notable_a) EXPECT_FALSE(n.after_divergence);
  EXPECT_TRUE(r.notable_b.empty());

  opts.max_notable = 0;
  EXPECT_TRUE(AlignWindows(a, b, opts).notable_a.empty());

  // Far above the median but under the absolute floor: not notable.
  auto small = MakeTrace(6, 0, 0.1);
  small[3].verify_ns = MsToNs(0.8);
  const AlignResult s = AlignWindows(small, small);
  EXPECT_TRUE(s.notable_a.empty());
  opts.max_notable = 5;
  opts.notable_min_ms = 0.5;
  const AlignResult s2 = AlignWindows(small, small, opts);
  ASSERT_EQ(s2.notable_a.size(), 1u);
  EXPECT_EQ(s2.notable_a[0].idx, 3);
  EXPECT_NEAR(s2.notable_a[0].ratio_to_median, 8.0, 1e-9);
}

}  // namespace
}  // namespace lockstep

namespace lockstep {
namespace {

// ---- no vacuous verdicts (issue 20) ----

TEST(AlignVacuous, AllTOneWindowsLeaveThePathUnchecked) {
  std::vector<WindowRecord> a, b;
  for (int i = 0; i < 4; ++i) a.push_back(MakeWindow(i, 10 + i, 1)), b.push_back(a.back());
  AlignResult r = AlignWindows(a, b);
  EXPECT_FALSE(r.diverged);
  EXPECT_NE(r.path_unchecked.find("every one of the 4 windows has T = 1 and no draft"),
            std::string::npos)
      << r.path_unchecked;
  // One drafted window is enough for the path to be checked.
  a[2] = MakeWindow(2, 12, 2), b[2] = a[2];
  EXPECT_TRUE(AlignWindows(a, b).path_unchecked.empty());
  // A divergence is a real finding, whatever T was.
  b.pop_back();
  EXPECT_TRUE(AlignWindows(a, b).path_unchecked.empty());
  EXPECT_NE(AlignWindows({}, {}).path_unchecked.find("neither trace holds a verify window"),
            std::string::npos);
}

TEST(AlignVacuous, FingerprintDifferencesAsDiffChecksThem) {
  ExportMeta a, b;
  a.model_sha256 = b.model_sha256 = "m1";
  a.request_sha256 = b.request_sha256 = "r1";
  a.request_tokens = b.request_tokens = {1, 2, 3};
  a.config_json = R"({"spec":4,"model":"/x"})";
  b.config_json = R"({"spec":4,"model":"/y"})";
  AlignResult r;
  r.fingerprint_differences = FingerprintDifferences(a, b);
  EXPECT_TRUE(r.fingerprint_differences.empty());  // the model path is not the model
  EXPECT_TRUE(r.comparable());
  b.config_json = R"({"spec":2,"model":"/y"})";
  r.fingerprint_differences = FingerprintDifferences(a, b);
  ASSERT_EQ(r.fingerprint_differences.size(), 1u);
  EXPECT_EQ(r.fingerprint_differences[0], "config: spec: 4 | 2");
  EXPECT_TRUE(r.comparable());  // two configs' paths are what align compares
  b.model_sha256 = "m2";
  b.request_tokens = {1, 2};
  r.fingerprint_differences = FingerprintDifferences(a, b, /*configs=*/false);
  ASSERT_EQ(r.fingerprint_differences.size(), 2u);
  EXPECT_EQ(r.fingerprint_differences[0].rfind("the models differ: model_sha256 m1 | m2", 0), 0u);
  EXPECT_EQ(r.fingerprint_differences[1].rfind("the requests differ:", 0), 0u);
  EXPECT_FALSE(r.comparable());
}

}  // namespace
}  // namespace lockstep
