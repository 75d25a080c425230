// HDF5 export (issue "Instrumentation", Must show 1 and 3 in part): a written export opens with
// the HDF5 library and h5ls, every path matches SCHEMA.md and every documented path appears,
// valid rows / capacities are right, no paged tail is written; killed runs leave only .partial;
// a failing disk write exits 3 and keeps the output.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "lockstep/compare/export_reader.h"
#include "lockstep/h5/handle.h"
#include "lockstep/h5/paths.h"
#include "lockstep/h5/rows.h"
#include "lockstep/instrument/export_writer.h"
#include "test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> SchemaTemplates() {
  std::ifstream f(std::string(LOCKSTEP_SOURCE_DIR) + "/instrument/SCHEMA.md");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const auto b = text.find("<!-- schema-paths:begin -->"),
             e = text.find("<!-- schema-paths:end -->");
  EXPECT_NE(b, std::string::npos) << "HINT: SCHEMA.md lost its schema-paths block";
  std::vector<std::string> out;
  std::istringstream lines(text.substr(b, e - b));
  for (std::string l; std::getline(lines, l);)
    if (!l.empty() && l[0] == '/') out.push_back(l);
  return out;
}

std::regex TemplateRegex(std::string t) {
  auto rep = [&](const std::string& from, const std::string& to) {
    for (auto p = t.find(from); p != std::string::npos; p = t.find(from, p + to.size()))
      t.replace(p, from.size(), to);
  };
  rep("{W:05d}", "[0-9]{5}");
  rep("{point}", "(pre_verify|post_verify|commit)");
  rep("{S}", "[0-9]+");
  rep("{L}", "[0-9]+");
  return std::regex("^" + t + "$");
}

struct Visit {
  std::vector<std::string> datasets, groups;
};
herr_t VisitCb(hid_t, const char* name, const H5O_info_t* info, void* data) {
  auto* v = static_cast<Visit*>(data);
  std::string path = std::string("/") + name;
  if (std::string(name) == ".") return 0;
  (info->type == H5O_TYPE_DATASET ? v->datasets : v->groups).push_back(path);
  return 0;
}

std::int64_t IntAttr(hid_t obj, const char* name) {
  H5Handle a(H5Aopen(obj, name, H5P_DEFAULT));
  std::int64_t v = -999;
  if (a.valid()) H5Aread(a.get(), H5T_NATIVE_INT64, &v);
  return v;
}

std::string RunExport(const std::string& name, const std::string& extra,
                      const std::string& preset = "tiny") {
  std::string path = test::NewDir(name) + "/a.h5";
  auto r = test::RunLockstep("generate --model " + test::ModelDir(preset) +
                             " --prompt 'export me, please' --max-new 12 "
                             "--ignore-eos --spec 4 --threads 2 --export " +
                             path + " " + extra);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("items per checkpoint"), std::string::npos) << r.err;
  return path;
}

TEST(Export, PathsMatchSchemaBothWays) {
  // All windows, all points, an int8 cache so scale datasets appear too, a (0 ms) injection so
  // /injections does, and op digests with a dump so /ops does.
  const std::string path =
      RunExport("schema",
                "--export-windows all --kv int8 --inject delay:stage=0:window=0:ms=0 "
                "--op-digests 0 --op-dump residual@0");
  EXPECT_FALSE(fs::exists(path + ".partial"));
  H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  ASSERT_TRUE(f.valid());
  Visit v;
  ASSERT_GE(H5Ovisit(f.get(), H5_INDEX_NAME, H5_ITER_INC, VisitCb, &v), 0);
  std::vector<std::string> templates = SchemaTemplates();
  ASSERT_GT(templates.size(), 10u);
  std::vector<std::regex> res;
  for (const auto& t : templates) res.push_back(TemplateRegex(t));
  std::vector<int> used(templates.size(), 0);
  for (const auto& d : v.datasets) {
    bool matched = false;
    for (std::size_t i = 0; i < res.size(); ++i)
      if (std::regex_match(d, res[i])) matched = true, ++used[i];
    EXPECT_TRUE(matched) << "dataset " << d << " is not documented in instrument/SCHEMA.md";
  }
  // Templates that name groups (checkpoint groups) are matched against the groups.
  for (const auto& g : v.groups)
    for (std::size_t i = 0; i < res.size(); ++i)
      if (std::regex_match(g, res[i])) ++used[i];
  for (std::size_t i = 0; i < templates.size(); ++i) {
    // f32-only items: the scale datasets appear with int8 caches (this run); hidden_out and logits
    // at post_verify. The engine-step tables: `generate` runs its request through the scheduler,
    // one step per prefill chunk and per window.
    EXPECT_GT(used[i], 0) << "documented path never written: " << templates[i];
  }
  H5Handle root(H5Gopen2(f.get(), "/", H5P_DEFAULT));
  EXPECT_EQ(IntAttr(root.get(), "schema_version"), 1);
  // Layer events: begin/end pairs for every layer of every pipeline pass.
  H5Handle ev(H5Dopen2(f.get(), "/trace/events", H5P_DEFAULT));
  ASSERT_TRUE(ev.valid());
  H5Handle esp(H5Dget_space(ev.get()));
  hsize_t n_ev = 0;
  H5Sget_simple_extent_dims(esp.get(), &n_ev, nullptr);
  EXPECT_GT(n_ev, 0u);
  EXPECT_EQ(n_ev % 2, 0u) << "begin and end events come in pairs";
}

// The tables' row layouts (h5/rows.h) are the writer's and the reader's: each table of a written
// export has exactly the shared compound type, and that type has the byte layout lockstep.export
// v1 files have always had (sizes and member offsets as recorded before rows.h existed).
TEST(Export, TablesHaveTheSharedRowLayouts) {
  const std::string path = RunExport("rowlayouts", "--export-windows 0-1");
  H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  ASSERT_TRUE(f.valid());
  struct Member {
    const char* name;
    std::size_t offset;
  };
  struct Table {
    const char* path;
    H5Handle type;
    std::size_t size;
    std::vector<Member> members;
  };
  Table tables[] = {
      {"/index/items",
       IndexRowType(),
       216,
       {{"checkpoint", 0},
        {"rel", 32},
        {"kind", 96},
        {"dtype", 112},
        {"stage", 120},
        {"layer", 124},
        {"rank", 128},
        {"dims", 136},
        {"valid_rows", 168},
        {"capacity_rows", 176},
        {"offset", 184},
        {"scale_offset", 192},
        {"scale_dims", 200}}},
      {"/trace/windows",
       RowType(sizeof(TraceWindowRow), kTraceWindowFields),
       96,
       {{"idx", 0},
        {"p", 4},
        {"T", 8},
        {"T_mtp", 12},
        {"merged", 16},
        {"from_sfx", 17},
        {"first_call", 18},
        {"chain_n", 20},
        {"accepted", 24},
        {"begin_ns", 32},
        {"end_ns", 40},
        {"verify_ns", 48},
        {"wait_ns", 56},
        {"compute_ns", 64},
        {"draft_ns", 72},
        {"commit_ns", 80},
        {"export_ns", 88}}},
      {"/trace/stages",
       RowType(sizeof(TraceStageRow), kTraceStageFields),
       72,
       {{"window", 0},
        {"stage", 4},
        {"wait_ns", 8},
        {"compute_ns", 16},
        {"cpu_ns", 24},
        {"dev_wait_ns", 32},
        {"dev_compute_ns", 40},
        {"dev_copy_ns", 48},
        {"init_ns", 56},
        {"graph", 64}}},
      {"/trace/samples",
       RowType(sizeof(HostSampleRow), kHostSampleFields),
       40,
       {{"t_ns", 0},
        {"host_available_bytes", 8},
        {"swap_used_bytes", 16},
        {"rss_bytes", 24},
        {"process_cpu_ns", 32}}},
      {"/trace/device_samples",
       RowType(sizeof(DeviceSampleRow), kDeviceSampleFields),
       48,
       {{"t_ns", 0},
        {"device", 8},
        {"free_bytes", 16},
        {"total_bytes", 24},
        {"temperature_c", 32},
        {"sm_clock_mhz", 36},
        {"pcie_gen", 40},
        {"pcie_width", 44}}},
  };
  // /trace/windows' columns are WindowRecord's scalar fields of the same names (window.h).
  for (const RowField& c : kTraceWindowFields) {
    const WindowField* wf = FindWindowField(c.name);
    ASSERT_NE(wf, nullptr) << c.name;
    EXPECT_NE(wf->kind, WindowFieldKind::kTokens) << c.name;
    EXPECT_NE(wf->kind, WindowFieldKind::kSource) << c.name;
  }
  for (const Table& t : tables) {
    ASSERT_TRUE(t.type.valid()) << t.path;
    H5Handle ds(H5Dopen2(f.get(), t.path, H5P_DEFAULT));
    ASSERT_TRUE(ds.valid()) << t.path;
    H5Handle ft(H5Dget_type(ds.get()));
    EXPECT_GT(H5Tequal(ft.get(), t.type.get()), 0) << t.path << ": not the rows.h type";
    EXPECT_EQ(H5Tget_size(ft.get()), t.size) << t.path;
    ASSERT_EQ(H5Tget_nmembers(ft.get()), static_cast<int>(t.members.size())) << t.path;
    for (std::size_t i = 0; i < t.members.size(); ++i) {
      const int idx = H5Tget_member_index(ft.get(), t.members[i].name);
      ASSERT_EQ(idx, static_cast<int>(i)) << t.path << " " << t.members[i].name;
      EXPECT_EQ(H5Tget_member_offset(ft.get(), static_cast<unsigned>(idx)), t.members[i].offset)
          << t.path << " " << t.members[i].name;
    }
  }
}

TEST(Export, RowsCapacitiesAndCheckpointAttributes) {
  const std::string path = RunExport("rows", "--export-windows 0-3 --kv-page 16");
  H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  ASSERT_TRUE(f.valid());
  // Window records from the trace.
  H5Handle tr(H5Dopen2(f.get(), "/trace/windows", H5P_DEFAULT));
  ASSERT_TRUE(tr.valid());
  H5Handle sp(H5Dget_space(tr.get()));
  hsize_t n = 0;
  H5Sget_simple_extent_dims(sp.get(), &n, nullptr);
  EXPECT_GE(n, 3u);
  struct Row {
    std::int32_t p, T, accepted;
  };
  H5Handle t(H5Tcreate(H5T_COMPOUND, sizeof(Row)));
  H5Tinsert(t.get(), "p", HOFFSET(Row, p), H5T_NATIVE_INT32);
  H5Tinsert(t.get(), "T", HOFFSET(Row, T), H5T_NATIVE_INT32);
  H5Tinsert(t.get(), "accepted", HOFFSET(Row, accepted), H5T_NATIVE_INT32);
  std::vector<Row> rows(n);
  ASSERT_GE(H5Dread(tr.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()), 0);
  for (int w = 0; w < 3; ++w) {
    const Row& r = rows[static_cast<std::size_t>(w)];
    for (const char* point : {"pre_verify", "post_verify", "commit"}) {
      char g[64];
      std::snprintf(g, sizeof(g), "/checkpoints/%05d_%s", w, point);
      H5Handle grp(H5Gopen2(f.get(), g, H5P_DEFAULT));
      ASSERT_TRUE(grp.valid()) << g;
      const std::int64_t committed = IntAttr(grp.get(), "committed_rows");
      EXPECT_EQ(IntAttr(grp.get(), "p"), r.p);
      if (std::string(point) == "commit") {
        EXPECT_EQ(committed, r.p + r.accepted + 1);
        EXPECT_EQ(IntAttr(grp.get(), "recurrent_pos"), r.p + r.accepted + 1);
      } else {
        EXPECT_EQ(committed, r.p);
        EXPECT_EQ(IntAttr(grp.get(), "recurrent_pos"), r.p);
      }
      // Layer 3 is full attention on tiny (stage 1 of 4).
      H5Handle k(H5Dopen2(grp.get(), "stage1/layer3/k", H5P_DEFAULT));
      ASSERT_TRUE(k.valid());
      H5Handle ks(H5Dget_space(k.get()));
      hsize_t dims[3];
      ASSERT_EQ(H5Sget_simple_extent_dims(ks.get(), dims, nullptr), 3);
      EXPECT_EQ(static_cast<std::int64_t>(dims[0]), committed) << "only valid rows are written";
      EXPECT_EQ(IntAttr(k.get(), "valid_rows"), committed);
      const std::int64_t cap = IntAttr(k.get(), "capacity_rows");
      EXPECT_GE(cap, committed);
      EXPECT_EQ(cap % 16, 0) << "capacity is whole pages";
      if (std::string(point) == "post_verify") {
        H5Handle spec(H5Dopen2(grp.get(), "stage1/layer3/k_spec", H5P_DEFAULT));
        ASSERT_TRUE(spec.valid());
        EXPECT_EQ(IntAttr(spec.get(), "valid_rows"), r.T);
      }
    }
  }
}

TEST(Export, TraceOnlyAndBadSelections) {
  const std::string path = RunExport("none", "--export-windows none");
  H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  ASSERT_TRUE(f.valid());
  EXPECT_GT(H5Lexists(f.get(), "/trace/windows", H5P_DEFAULT), 0);
  EXPECT_LE(H5Lexists(f.get(), "/checkpoints", H5P_DEFAULT), 0);
  auto r = test::RunLockstep("generate --model " + test::ModelDir("tiny") +
                             " --prompt x --export /tmp/unused.h5 "
                             "--export-windows 3-1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--export-windows"), std::string::npos) << r.err;
  r = test::RunLockstep("generate --model " + test::ModelDir("tiny") +
                        " --prompt x --export /tmp/unused.h5 "
                        "--export-points commit,sometimes");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("sometimes"), std::string::npos) << r.err;
}

TEST(Export, OpensWithH5ls) {
  if (std::system("command -v h5ls >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "h5ls not installed (hdf5-tools)";
  const std::string path = RunExport("h5ls", "--export-windows 0");
  const std::string out = test::NewDir("h5ls") + "/ls.txt";
  ASSERT_EQ(std::system(("h5ls -r " + path + " > " + out).c_str()), 0);
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find("/checkpoints/00000_commit/stage1/layer3/k"), std::string::npos);
  EXPECT_NE(ss.str().find("/trace/windows"), std::string::npos);
}

// A run killed while exporting leaves at most FILE.partial, never FILE.
TEST(Export, KilledRunLeavesOnlyPartial) {
  for (int i = 0; i < 4; ++i) {
    const std::string dir = test::NewDir("kill");
    const std::string path = dir + "/k.h5";
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const std::string model = test::ModelDir("tiny");
      execl(LOCKSTEP_BIN_PATH, "lockstep", "generate", "--model", model.c_str(), "--prompt",
            "kill me while I export", "--max-new", "100000", "--ignore-eos", "--spec", "4",
            "--threads", "1", "--export", path.c_str(), "--export-windows", "all",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    // Kill it while it exports: once the .partial file exists (a loaded machine may need a while to
    // get there), plus a varying delay.
    for (int wait = 0; wait < 1000 && !fs::exists(path + ".partial"); ++wait)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(50 + 100 * i));
    kill(pid, SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
    EXPECT_TRUE(WIFSIGNALED(st));
    EXPECT_FALSE(fs::exists(path)) << "a killed run must not leave a complete-looking file";
    EXPECT_TRUE(fs::exists(path + ".partial"));
  }
}

// A failing write (RLIMIT_FSIZE) exits 3 with a clear message, keeps the generated output, and
// does not publish the file.
TEST(Export, DiskWriteFailureExits3AndKeepsOutput) {
  const std::string dir = test::NewDir("fsize");
  const std::string path = dir + "/big.h5";
  const std::string out = dir + "/out.txt", err = dir + "/err.txt";
  const std::string run = "bash -c 'ulimit -f 64; exec " + std::string(LOCKSTEP_BIN_PATH) +
                          " generate --model " + test::ModelDir("tiny") +
                          " --prompt \"disk full\" --max-new 40 --ignore-eos --spec 4 --export " +
                          path + " --export-windows all' >" + out + " 2>" + err;
  const int st = std::system(run.c_str());
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 3);
  std::ifstream fe(err), fo(out);
  std::stringstream se, so;
  se << fe.rdbuf();
  so << fo.rdbuf();
  EXPECT_NE(se.str().find("export"), std::string::npos) << se.str();
  EXPECT_NE(se.str().find("File too large"), std::string::npos) << se.str();
  EXPECT_FALSE(so.str().empty()) << "the generated output is still printed";
  EXPECT_FALSE(fs::exists(path));
}

// The JSON-lines trace of a run killed at a random window: every whole line parses, in order. The
// record being written when SIGKILL lands may be torn (a write() of a line that crosses a page
// can stop part-way); ReadWindowRecords drops only such an unterminated tail.
TEST(Trace, JsonlSurvivesSigkill) {
  const std::string model = test::ModelDir("tiny");
  int total_lines = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string path = test::NewDir("jsonl") + "/t.jsonl";
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      execl(LOCKSTEP_BIN_PATH, "lockstep", "generate", "--model", model.c_str(), "--prompt",
            "trace until killed", "--max-new", "1000000", "--ignore-eos", "--spec", "3",
            "--threads", "1", "--trace-jsonl", path.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    // Kill at a different point each time (40..340 ms).
    std::this_thread::sleep_for(std::chrono::milliseconds(40 + (i * 53) % 300));
    kill(pid, SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
    ASSERT_TRUE(WIFSIGNALED(st));
    if (!fs::exists(path)) continue;  // killed before the trace was opened
    std::string torn;
    auto windows = ReadWindowRecords(path, &torn);
    ASSERT_TRUE(windows.ok()) << "kill " << i << ": " << windows.status().ToString();
    std::ifstream f(path);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const auto whole_lines = std::count(text.begin(), text.end(), '\n');
    const bool ends_whole = text.empty() || text.back() == '\n';
    // Every whole line is a window; an unterminated tail is one more (cut just before its
    // newline) or the torn record, reported.
    EXPECT_EQ(static_cast<long>(windows->size()),
              static_cast<long>(whole_lines) + (ends_whole || !torn.empty() ? 0 : 1))
        << "kill " << i;
    if (ends_whole) {
      EXPECT_TRUE(torn.empty()) << "kill " << i << ": " << torn;
    }
    total_lines += static_cast<int>(windows->size());
  }
  EXPECT_GT(total_lines, 16) << "the runs were killed before writing any window";
}

TEST(Resources, GuardEndsTheRequestCleanlyAndSamplesAreExported) {
  const std::string dir = test::NewDir("guard");
  auto r = test::RunLockstep("generate --model " + test::ModelDir("tiny") +
                             " --prompt 'guard me' --max-new 30 "
                             "--ignore-eos --json --guard-min-free-mib 1000000000 --export " +
                             dir + "/g.h5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["stop_reason"], "resource_guard");
  EXPECT_LT(j["output_tokens"].get<int>(), 30);
  EXPECT_TRUE(j["resources"]["guard"]["tripped"].get<bool>());
  EXPECT_EQ(j["resources"]["guard"]["source"], "host");
  H5Handle f(H5Fopen((dir + "/g.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  ASSERT_TRUE(f.valid());
  H5Handle s(H5Dopen2(f.get(), "/trace/samples", H5P_DEFAULT));
  ASSERT_TRUE(s.valid());
  H5Handle sp(H5Dget_space(s.get()));
  hsize_t n = 0;
  H5Sget_simple_extent_dims(sp.get(), &n, nullptr);
  EXPECT_GE(n, 1u);
  H5Handle a(H5Aopen(s.get(), "nvml", H5P_DEFAULT));
  ASSERT_TRUE(a.valid());
  H5Handle t(H5Aget_type(a.get()));
  std::string nvml(H5Tget_size(t.get()), '\0');
  H5Aread(a.get(), t.get(), nvml.data());
  if (j["resources"]["devices"].empty()) {
    EXPECT_EQ(nvml.rfind("unknown: ", 0), 0u)
        << "no GPU: fields are recorded as unknown with the reason";
  }
  // A normal run does not trip and reports sampler intervals.
  auto ok = test::RunLockstep("generate --model " + test::ModelDir("tiny") +
                              " --prompt 'fine' --max-new 4 --json");
  ASSERT_EQ(ok.exit_code, 0);
  auto jo = nlohmann::json::parse(ok.out);
  EXPECT_NE(jo["stop_reason"], "resource_guard");
  EXPECT_GE(jo["resources"]["samples"].get<int>(), 1);
}

TEST(Trace, ChromeTraceFromTheCli) {
  const std::string path = test::NewDir("chrome") + "/t.json";
  auto r = test::RunLockstep("generate --model " + test::ModelDir("tiny") +
                             " --prompt 'perfetto' --max-new 10 "
                             "--spec 3 --trace-json " +
                             path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream f(path);
  auto j = nlohmann::json::parse(f);
  int stage_tracks = 0, computes = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name" &&
        e["args"]["name"].get<std::string>().rfind("stage", 0) == 0)
      ++stage_tracks;
    if (e["ph"] == "X" && e["name"] == "compute") ++computes;
  }
  EXPECT_EQ(stage_tracks, 4);
  EXPECT_GT(computes, 0);
}

// ---- engine steps (issue 22): request_id, /trace/steps, /trace/window_steps ----

// Two windows of a request that ran in engine steps 3 (prefill), 5 and 8 (windows 0 and 1).
struct SteppedRun {
  std::vector<StepRecord> steps;
  std::vector<WindowRecord> windows;
};
SteppedRun ThreeSteps() {
  SteppedRun r;
  auto step = [](std::int64_t n, int rows, int seqs, int verify, int prefill) {
    StepRecord s;
    s.step = n, s.begin_ns = 1'000 * n, s.end_ns = 1'000 * n + 700;
    s.rows = rows, s.seqs = seqs, s.verify_rows = verify, s.prefill_rows = prefill;
    s.queue_depth = static_cast<int>(n % 3), s.live = seqs + 1;
    s.weight_bytes = 150'000'000ull * static_cast<std::uint64_t>(n);
    s.flops = 300'000'000ull * static_cast<std::uint64_t>(rows);
    s.slots = {0, 2};
    return s;
  };
  r.steps = {step(3, 48, 3, 16, 32), step(5, 17, 2, 1, 16), step(8, 4, 4, 4, 0)};
  for (int i = 0; i < 2; ++i) {
    WindowRecord w;
    w.idx = i, w.p = 40 + i, w.T = 1, w.accepted = 0;
    w.begin_ns = 5'000 + 3'000 * i, w.end_ns = w.begin_ns + 900, w.export_ns = 0;
    w.step = i == 0 ? 5 : 8;
    r.windows.push_back(w);
  }
  return r;
}

// Writes a trace-only export of `run` through the exporter (no engine): steps only when given.
std::string WriteSteppedExport(const std::string& name, const SteppedRun& run, bool with_steps,
                               const std::string& request_id) {
  const std::string path = test::NewDir(name) + "/s.h5";
  ExportOptions o;
  o.path = path;
  auto e = H5Exporter::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return path;
  if (with_steps) {
    (*e)->OnStep(run.steps[0]);
    for (std::size_t i = 0; i < run.windows.size(); ++i) {
      (*e)->OnStep(run.steps[i + 1]);
      (*e)->OnWindow(run.windows[i]);
    }
  } else {
    for (const WindowRecord& w : run.windows) (*e)->OnWindow(w);
  }
  ExportRunInfo meta;
  meta.run_id = "0123456789abcdef";
  meta.request_id = request_id;
  meta.request_tokens = {1, 2, 3};
  meta.output_tokens = {4, 5};
  meta.max_new = 2;
  meta.stop_reason = "length";
  meta.config_json = "{}";
  meta.counters.push_back({});
  const Status s = (*e)->Finish(meta);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return path;
}

Result<std::unique_ptr<ExportReader>> OpenExport(const std::string& path, bool isolate) {
  ReaderLimits lim;
  lim.isolate = isolate;
  return ExportReader::Open(path, lim);
}

// The steps and the window -> step map come back as written, through the isolated reader and in
// process alike; both tables have the rows.h layouts and their paths are SCHEMA.md's.
TEST(Export, StepsRoundTrip) {
  const SteppedRun run = ThreeSteps();
  const std::string path = WriteSteppedExport("steps", run, true, "req-7");
  for (bool isolate : {true, false}) {
    auto r = OpenExport(path, isolate);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const ExportMeta& m = (*r)->meta();
    EXPECT_EQ(m.request_id, "req-7");
    ASSERT_EQ(m.steps.size(), 3u);
    for (std::size_t i = 0; i < 3; ++i) {
      const StepRecord& want = run.steps[i];
      const ExportStep& got = m.steps[i];
      EXPECT_EQ(got.step, want.step);
      EXPECT_EQ(got.begin_ns, want.begin_ns);
      EXPECT_EQ(got.end_ns, want.end_ns);
      EXPECT_EQ(got.rows, want.rows);
      EXPECT_EQ(got.seqs, want.seqs);
      EXPECT_EQ(got.verify_rows, want.verify_rows);
      EXPECT_EQ(got.prefill_rows, want.prefill_rows);
      EXPECT_EQ(got.queue_depth, want.queue_depth);
      EXPECT_EQ(got.live, want.live);
      EXPECT_EQ(got.weight_bytes, static_cast<std::int64_t>(want.weight_bytes));
      EXPECT_EQ(got.flops, static_cast<std::int64_t>(want.flops));
    }
    ASSERT_EQ(m.windows.size(), 2u);
    EXPECT_EQ(m.windows[0].step, 5);
    EXPECT_EQ(m.windows[0].step_rows, 17);
    EXPECT_EQ(m.windows[0].step_seqs, 2);
    EXPECT_EQ(m.windows[0].step_prefill_rows, 16);
    EXPECT_EQ(m.windows[1].step, 8);
    EXPECT_EQ(m.windows[1].step_rows, 4);
    EXPECT_EQ(m.windows[1].step_prefill_rows, 0);
  }
  H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  ASSERT_TRUE(f.valid());
  Visit v;
  ASSERT_GE(H5Ovisit(f.get(), H5_INDEX_NAME, H5_ITER_INC, VisitCb, &v), 0);
  for (const char* want : {"/trace/steps", "/trace/window_steps"}) {
    EXPECT_NE(std::find(v.datasets.begin(), v.datasets.end(), want), v.datasets.end()) << want;
    const auto templates = SchemaTemplates();
    EXPECT_NE(std::find(templates.begin(), templates.end(), want), templates.end())
        << want << " is not documented in instrument/SCHEMA.md";
  }
  // Layouts: sizes and member offsets of the rows.h structs.
  const std::pair<const char*, H5Handle> tables[] = {
      {"/trace/steps", RowType(sizeof(TraceStepRow), kTraceStepFields)},
      {"/trace/window_steps", RowType(sizeof(TraceWindowStepRow), kTraceWindowStepFields)}};
  const std::size_t sizes[] = {64, 16};
  for (std::size_t i = 0; i < 2; ++i) {
    H5Handle ds(H5Dopen2(f.get(), tables[i].first, H5P_DEFAULT));
    H5Handle ft(H5Dget_type(ds.get()));
    EXPECT_GT(H5Tequal(ft.get(), tables[i].second.get()), 0) << tables[i].first;
    EXPECT_EQ(H5Tget_size(ft.get()), sizes[i]) << tables[i].first;
  }
}

// An export without engine steps (a one-request run, and every file written before steps
// existed) has neither table nor a request_id, and reads with no steps and unknown window steps.
TEST(Export, ExportWithoutStepsWritesNothingNewAndReads) {
  const SteppedRun run = ThreeSteps();
  const std::string path = WriteSteppedExport("nosteps", run, false, "");
  H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  ASSERT_TRUE(f.valid());
  EXPECT_LE(H5Lexists(f.get(), "/trace/steps", H5P_DEFAULT), 0);
  EXPECT_LE(H5Lexists(f.get(), "/trace/window_steps", H5P_DEFAULT), 0);
  EXPECT_LE(H5Aexists_by_name(f.get(), "/", "request_id", H5P_DEFAULT), 0);
  f.reset();
  // An old export: a stepped one with the new tables and attribute deleted.
  const std::string old = WriteSteppedExport("oldexport", run, true, "req-9");
  {
    H5Handle g(H5Fopen(old.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    ASSERT_TRUE(g.valid());
    ASSERT_GE(H5Ldelete(g.get(), "/trace/steps", H5P_DEFAULT), 0);
    ASSERT_GE(H5Ldelete(g.get(), "/trace/window_steps", H5P_DEFAULT), 0);
    ASSERT_GE(H5Adelete_by_name(g.get(), "/", "request_id", H5P_DEFAULT), 0);
  }
  for (const std::string& p : {path, old})
    for (bool isolate : {true, false}) {
      auto r = OpenExport(p, isolate);
      ASSERT_TRUE(r.ok()) << p << ": " << r.status().ToString();
      const ExportMeta& m = (*r)->meta();
      EXPECT_EQ(m.request_id, "");
      EXPECT_TRUE(m.steps.empty());
      ASSERT_EQ(m.windows.size(), 2u);
      for (const WindowRecord& w : m.windows) {
        EXPECT_EQ(w.step, -1) << p;
        EXPECT_EQ(w.step_rows, 0) << p;
      }
    }
}

// Damaged step tables are refused with the path: one table without the other, steps out of
// order, a window naming a step the table lacks.
TEST(Export, DamagedStepTablesAreRefused) {
  SteppedRun run = ThreeSteps();
  const std::string lone = WriteSteppedExport("lonesteps", run, true, "");
  {
    H5Handle g(H5Fopen(lone.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    ASSERT_GE(H5Ldelete(g.get(), "/trace/window_steps", H5P_DEFAULT), 0);
  }
  auto r = OpenExport(lone, false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("/trace/window_steps"), std::string::npos)
      << r.status().ToString();

  SteppedRun unordered = run;
  std::swap(unordered.steps[0], unordered.steps[1]);
  r = OpenExport(WriteSteppedExport("unordered", unordered, true, ""), false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("out of order"), std::string::npos) << r.status().ToString();

  SteppedRun stray = run;
  stray.windows[1].step = 9;
  r = OpenExport(WriteSteppedExport("stray", stray, true, ""), true);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("step 9 is not a row of /trace/steps"), std::string::npos)
      << r.status().ToString();
}

TEST(Export, WindowSelectionParsing) {
  auto s = WindowSelection::Parse("0-2,5,9-10");
  ASSERT_TRUE(s.ok());
  for (int w : {0, 1, 2, 5, 9, 10}) EXPECT_TRUE(s->Contains(w)) << w;
  for (int w : {3, 4, 6, 11}) EXPECT_FALSE(s->Contains(w)) << w;
  EXPECT_TRUE(WindowSelection::Parse("all")->Contains(123456));
  EXPECT_TRUE(WindowSelection::Parse("none")->none());
  EXPECT_FALSE(WindowSelection::Parse("2-1").ok());
  EXPECT_FALSE(WindowSelection::Parse("a").ok());
  EXPECT_EQ(ItemPath(3, CheckpointPoint::kCommit, 1, 7, ItemKind::kK),
            "checkpoints/00003_commit/stage1/layer7/k");
  EXPECT_EQ(ItemPath(0, CheckpointPoint::kPostVerify, 3, -1, ItemKind::kLogits),
            "checkpoints/00000_post_verify/stage3/logits");
  EXPECT_EQ(ItemPath(0, CheckpointPoint::kPreVerify, 3, -1, ItemKind::kMtpV),
            "checkpoints/00000_pre_verify/stage3/mtp/v");
}

}  // namespace
}  // namespace lockstep
