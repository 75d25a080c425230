// Window-record parsing (the JSON-lines trace and --replay-path input): out-of-range and
// non-integer numbers are clear errors, never undefined behaviour or silent wrap-around (found by
// tests/fuzz/trace_fuzz.cpp).
#include "lockstep/engine/window.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace lockstep {
namespace {

std::string Line() {
  WindowRecord w;
  w.idx = 3;
  w.p = 120;
  w.T = 3;
  w.T_mtp = 2;
  w.accepted = 1;
  w.source = DraftSource::kMtp;
  w.draft = {5, 6};
  w.emitted = {5, 9};
  w.verify_ns = 1000;
  return w.ToJsonLine();
}

std::string With(std::string line, const std::string& key, const std::string& value) {
  const std::string k = "\"" + key + "\":";
  const auto at = line.find(k);
  EXPECT_NE(at, std::string::npos) << key;
  const auto end = line.find_first_of(",}", at + k.size());
  return line.replace(at + k.size(), end - at - k.size(), value);
}

TEST(WindowRecord, RoundTrip) {
  auto r = WindowRecord::FromJsonLine(Line(), "t");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->p, 120);
  EXPECT_EQ(r->ToJsonLine(), Line());
}

// Device timings appear in a stage's record only where a device backend measured them; a
// measured-but-unknown field is null, never 0.
TEST(WindowRecord, DeviceStageTimingsOnlyWhenMeasured) {
  WindowRecord w;
  w.stages.resize(2);
  w.stages[1].dev_compute_ns = 1500;
  w.stages[1].dev_wait_ns = 200;
  w.stages[1].dev_copy_ns = 0;
  w.stages[1].init_ns = -1;
  w.stages[1].graph = GraphUse::kReplay;
  const std::string line = w.ToJsonLine();
  const auto s0 = line.find("\"stages\":[{");
  ASSERT_NE(s0, std::string::npos) << line;
  const auto s1 = line.find("},{", s0);
  ASSERT_NE(s1, std::string::npos) << line;
  EXPECT_EQ(line.substr(s0, s1 - s0).find("dev_"), std::string::npos)
      << "cpu stage: no device keys";
  const std::string second = line.substr(s1);
  EXPECT_NE(second.find("\"dev_compute_ns\":1500"), std::string::npos) << second;
  EXPECT_NE(second.find("\"dev_wait_ns\":200"), std::string::npos) << second;
  EXPECT_NE(second.find("\"dev_copy_ns\":0"), std::string::npos) << second;
  EXPECT_NE(second.find("\"init_ns\":null"), std::string::npos) << second;
  EXPECT_NE(second.find("\"graph\":\"replay\""), std::string::npos) << second;
  EXPECT_EQ(line.substr(s0, s1 - s0).find("graph"), std::string::npos) << "cpu stage: no graph key";
}

// The stage records read back as written (align's device intervals come from them); traces
// without "stages" (older ones) read as no stages; bad stage fields are errors.
TEST(WindowRecord, StagesRoundTrip) {
  WindowRecord w;
  w.emitted = {4};
  w.stages.resize(3);
  w.stages[0].wait_ns = 11, w.stages[0].compute_ns = 22, w.stages[0].cpu_ns = 33;
  w.stages[1].dev_wait_ns = 200, w.stages[1].dev_compute_ns = 1500, w.stages[1].dev_copy_ns = 0;
  w.stages[1].init_ns = 7, w.stages[1].graph = GraphUse::kCapture;
  w.stages[2].dev_wait_ns = 5;  // measured alone: still written, not dropped with dev_compute
  auto r = WindowRecord::FromJsonLine(w.ToJsonLine(), "t");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->stages.size(), 3u);
  EXPECT_EQ(r->stages[0].wait_ns, 11);
  EXPECT_EQ(r->stages[0].compute_ns, 22);
  EXPECT_EQ(r->stages[0].cpu_ns, 33);
  EXPECT_EQ(r->stages[0].dev_compute_ns, -1);
  EXPECT_EQ(r->stages[0].init_ns, -1);
  EXPECT_EQ(r->stages[0].graph, GraphUse::kNone);
  EXPECT_EQ(r->stages[1].dev_wait_ns, 200);
  EXPECT_EQ(r->stages[1].dev_compute_ns, 1500);
  EXPECT_EQ(r->stages[1].dev_copy_ns, 0);
  EXPECT_EQ(r->stages[1].init_ns, 7);
  EXPECT_EQ(r->stages[1].graph, GraphUse::kCapture);
  EXPECT_EQ(r->stages[2].dev_wait_ns, 5);
  EXPECT_EQ(r->stages[2].dev_compute_ns, -1);
  EXPECT_EQ(r->ToJsonLine(), w.ToJsonLine());

  auto old =
      WindowRecord::FromJsonLine(Line().replace(Line().find(",\"stages\":[]"), 12, ""), "old");
  ASSERT_TRUE(old.ok()) << old.status().message();
  EXPECT_TRUE(old->stages.empty());

  const std::string one = w.ToJsonLine();
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"dev_compute_ns\":1500", "\"dev_compute_ns\":-3"},
           {"\"dev_compute_ns\":1500", "\"dev_compute_ns\":1.5"},
           {"\"graph\":\"capture\"", "\"graph\":\"sometimes\""},
           {"\"stages\":[", "\"stages\":[7,"}}) {
    std::string bad = one;
    bad.replace(bad.find(from), from.size(), to);
    auto b = WindowRecord::FromJsonLine(bad, "bad");
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_NE(b.status().message().find("bad window record field"), std::string::npos)
        << b.status().message();
  }
}

// A trace whose writer was killed mid-record: the whole lines stand, the unterminated tail is
// dropped and reported. A bad line that ends in a newline stays an error.
TEST(WindowRecord, TraceWithATornLastLineKeepsItsWholeLines) {
  const std::string dir = ::testing::TempDir();
  auto record = [](int idx) {
    WindowRecord w;
    w.idx = idx;
    w.p = 10 + idx;
    w.T = 1;
    w.emitted = {7};
    return w.ToJsonLine() + "\n";
  };
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = dir + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  };
  const std::string whole = record(0) + record(1), third = record(2);
  std::string torn;
  auto r = ReadWindowRecords(write("torn.jsonl", whole + third.substr(0, third.size() / 2)), &torn);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->size(), 2u);
  EXPECT_NE(torn.find("torn.jsonl:3"), std::string::npos) << torn;
  EXPECT_NE(torn.find("unfinished record"), std::string::npos) << torn;
  // Complete files report nothing, with or without the last newline.
  r = ReadWindowRecords(write("whole.jsonl", whole + third), &torn);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 3u);
  EXPECT_TRUE(torn.empty()) << torn;
  r = ReadWindowRecords(write("no-newline.jsonl", whole + third.substr(0, third.size() - 1)),
                        &torn);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->size(), 3u);
  EXPECT_TRUE(torn.empty()) << torn;
  // A cut line followed by a newline, or by more lines, is corruption, not a torn tail.
  EXPECT_FALSE(
      ReadWindowRecords(write("cut.jsonl", whole + third.substr(0, third.size() / 2) + "\n"), &torn)
          .ok());
  EXPECT_FALSE(
      ReadWindowRecords(write("middle.jsonl", record(0) + "{\"idx\":1,\n" + record(1)), &torn)
          .ok());
}

TEST(WindowRecord, OutOfRangeAndNonIntegerNumbersAreErrors) {
  for (const char* bad : {"4294967296", "1e300", "8.5", "-1e20", "\"7\""}) {
    auto r = WindowRecord::FromJsonLine(With(Line(), "p", bad), "t");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().exit_code(), 2) << bad;
    EXPECT_NE(r.status().message().find("p"), std::string::npos) << r.status().message();
  }
}

// The JSON-lines bytes of a record with every field set, as lockstep.window v1 has always written
// them (recorded from the writer before the field table): key order, null for an unknown
// export_ns, the per-stage objects.
TEST(WindowRecord, JsonLineBytesAreTheSchemas) {
  WindowRecord w;
  w.idx = 3, w.p = 120, w.T = 3, w.T_mtp = 2, w.merged = true, w.from_sfx = true, w.chain_n = 4;
  w.accepted = 1, w.source = DraftSource::kMerged, w.draft = {5, 6}, w.emitted = {5, 9};
  w.begin_ns = -5, w.end_ns = 1, w.draft_ns = 2, w.verify_ns = 1000, w.wait_ns = 3;
  w.compute_ns = 4, w.commit_ns = 5, w.export_ns = 77, w.first_call = true;
  StageTiming st;
  st.wait_ns = 1, st.compute_ns = 2, st.cpu_ns = 3, st.dev_compute_ns = 9,
  st.graph = GraphUse::kReplay;
  w.stages = {st, StageTiming{}};
  EXPECT_EQ(
      w.ToJsonLine(),
      R"({"schema":"lockstep.window","v":1,"idx":3,"p":120,"T":3,"T_mtp":2,"merged":true,)"
      R"("from_sfx":true,"chain_n":4,"accepted":1,"source":"merged","draft":[5,6],"emitted":[5,9],)"
      R"("begin_ns":-5,"end_ns":1,"draft_ns":2,"verify_ns":1000,"wait_ns":3,"compute_ns":4,)"
      R"("commit_ns":5,"export_ns":77,"first_call":true,"stages":[{"compute_ns":2,"cpu_ns":3,)"
      R"("dev_compute_ns":9,"dev_copy_ns":null,"dev_wait_ns":null,"graph":"replay",)"
      R"("init_ns":null,"wait_ns":1},{"compute_ns":0,"cpu_ns":0,"wait_ns":0}]})");
  EXPECT_EQ(WindowRecord{}.ToJsonLine(),
            R"({"schema":"lockstep.window","v":1,"idx":0,"p":0,"T":1,"T_mtp":0,"merged":false,)"
            R"("from_sfx":false,"chain_n":0,"accepted":0,"source":"none","draft":[],"emitted":[],)"
            R"("begin_ns":0,"end_ns":0,"draft_ns":0,"verify_ns":0,"wait_ns":0,"compute_ns":0,)"
            R"("commit_ns":0,"export_ns":null,"first_call":false,"stages":[]})");
}

// The field table is the record: every field by name, in JSON-lines order, each scalar's getter
// and setter the member's, SamePath comparing exactly the non-timing fields.
TEST(WindowRecord, FieldTableCoversEveryField) {
  std::vector<std::string> names;
  for (const WindowField& f : WindowFields()) {
    names.emplace_back(f.name);
    EXPECT_EQ(FindWindowField(f.name), &f);
  }
  EXPECT_EQ(
      names,
      (std::vector<std::string>{
          "idx",       "p",          "T",         "T_mtp",     "merged",     "from_sfx",
          "chain_n",   "accepted",   "source",    "draft",     "emitted",    "begin_ns",
          "end_ns",    "draft_ns",   "verify_ns", "wait_ns",   "compute_ns", "commit_ns",
          "export_ns", "first_call", "step",      "step_rows", "step_seqs",  "step_prefill_rows"}));
  EXPECT_EQ(FindWindowField("stages"), nullptr);
  EXPECT_EQ(FindWindowField("P"), nullptr);
  WindowRecord base;
  base.T = 3, base.draft = {1, 2}, base.emitted = {1};
  std::int64_t v = 2;
  for (const WindowField& f : WindowFields()) {
    WindowRecord w = base;
    if (f.kind == WindowFieldKind::kTokens) {
      (w.*f.tokens).push_back(7);
    } else {
      const std::int64_t x = f.kind == WindowFieldKind::kBool     ? 1
                             : f.kind == WindowFieldKind::kSource ? 3
                                                                  : v++;
      f.set(w, x);
      EXPECT_EQ(f.get(w), x) << f.name;
      // The value lands in the member of that name: it shows in the JSON line under the key.
      const std::string line = w.ToJsonLine();
      const std::string shown = f.kind == WindowFieldKind::kBool     ? "true"
                                : f.kind == WindowFieldKind::kSource ? "\"merged\""
                                                                     : std::to_string(x);
      EXPECT_NE(line.find("\"" + std::string(f.name) + "\":" + shown), std::string::npos) << line;
    }
    EXPECT_EQ(w.SamePath(base),
              f.role == WindowFieldRole::kTiming || f.role == WindowFieldRole::kContext)
        << f.name;
  }
}

}  // namespace
}  // namespace lockstep
