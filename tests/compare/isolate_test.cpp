// The isolated export reader (compare/include/lockstep/compare/export_reader.h, "Isolation"): an
// isolated and an in-process Open() agree on every ExportMeta field and every byte; planted
// crashes, hangs and memory exhaustion in the child are exit 2 with one line naming the file; the
// parent never calls libhdf5 (an LD_PRELOAD trap aborts it if it does); a campaign whose
// comparison child crashes records the failed comparison and finishes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "export_index.h"  // compare/'s private headers: the wire itself
#include "isolated_wire.h"
#include "lockstep/compare/export_reader.h"
#include "lockstep/engine/atomic_file.h"
#include "test_util.h"

namespace lockstep {
namespace {

using test::RunLockstep;

std::string Export(const std::string& name, const std::string& extra) {
  const std::string path = test::NewDir("iso-" + name) + "/" + name + ".h5";
  auto r = RunLockstep("generate --model " + test::ModelDir("tiny-induction") +
                       " --prompt 'the cat sat on the mat. the cat sat on the' --max-new 8"
                       " --threads 1 --spec 3 --export-windows 0-1 --arm " +
                       name + " --export " + path + " " + extra);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return path;
}

const std::string& Plain() {
  static const std::string p = Export("plain", "");
  return p;
}
// Chunked + compressed int8 items with scales: the child reads them through libhdf5 and hands
// the rows over in its spill file.
const std::string& Lz4() {
  static const std::string p = Export("lz4", "--kv int8 --export-compress lz4");
  return p;
}

// `lockstep <args>` with `env` (VAR=value ...) in front, through the shell like RunLockstep.
test::CmdResult RunWith(const std::string& env, const std::string& args) {
  test::CmdResult r;
  const std::string out = test::NewDir("cmd") + "/out";
  const std::string cmd =
      env + " " + LOCKSTEP_BIN_PATH + " " + args + " >" + out + " 2>" + out + ".err </dev/null";
  const int st = std::system(cmd.c_str());
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  auto slurp = [](const std::string& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  r.out = slurp(out);
  r.err = slurp(out + ".err");
  return r;
}

std::unique_ptr<ExportReader> OpenOrDie(const std::string& path, bool isolate) {
  ReaderLimits limits;
  limits.isolate = isolate;
  auto r = ExportReader::Open(path, limits);
  EXPECT_TRUE(r.ok()) << path << ": " << r.status().message();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Every item's rows (and scales) of one reader, concatenated.
std::string AllBytes(const ExportReader& r) {
  std::string bytes;
  for (const auto& cp : r.meta().checkpoints)
    for (const auto& it : cp.items) {
      std::string buf(static_cast<std::size_t>(it.rows() * it.row_elems()) * it.elem_bytes(), '\0');
      EXPECT_TRUE(r.ReadRows(cp, it, 0, it.rows(), buf.data()).ok()) << it.rel;
      bytes += buf;
      if (it.has_scales) {
        std::vector<float> s(static_cast<std::size_t>(it.rows() * it.scale_row_elems));
        EXPECT_TRUE(r.ReadScaleRows(cp, it, 0, it.rows(), s.data()).ok()) << it.rel;
        bytes.append(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(float));
      }
    }
  return bytes;
}

TEST(IsolatedOpen, SameMetaAndBytesAsInProcess) {
  for (const std::string& path : {Plain(), Lz4()}) {
    auto iso = OpenOrDie(path, true);
    auto in = OpenOrDie(path, false);
    ASSERT_TRUE(iso && in);
    const std::string d = DumpExportMeta(iso->meta());
    EXPECT_EQ(d, DumpExportMeta(in->meta())) << path;
    // The dump reaches the nested structs' last fields (a dump that stopped early would agree).
    for (const char* key :
         {"meta.file_bytes=", "meta.injections.size=", "meta.sampler.pcie_width=",
          "meta.windows[0].stages.size=", "meta.checkpoints[0].items[0].scale_row_elems=",
          "meta.counters[\"stage0\"][\"first_call_ns\"]="})
      EXPECT_NE(d.find(key), std::string::npos) << key;
    const std::string a = AllBytes(*iso), b = AllBytes(*in);
    EXPECT_GT(a.size(), 1000u);
    EXPECT_TRUE(a == b) << path << ": rows differ between the isolated and in-process reader";
    const auto& cp = iso->meta().checkpoints.at(0);
    EXPECT_EQ(iso->ReadsDirectly(cp, cp.items.at(0)), path == Plain()) << path;
  }
}

// The parent trusts nothing the child sends: every truncation of a real message is refused as
// malformed (never a partial meta), and flipped bytes never crash the decoder.
TEST(IsolationWire, TruncatedOrFlippedMessagesAreRefused) {
  ReaderLimits limits;
  limits.isolate = false;
  auto impl = OpenInProcess(Plain(), limits);
  ASSERT_TRUE(impl.ok()) << impl.status().message();
  const std::string wire = EncodeOpenResult(Status::Ok(), impl->get());
  {
    ExportReader::Impl back;
    bool malformed = true;
    ASSERT_TRUE(DecodeOpenResult(wire, "f", &back, &malformed).ok());
    EXPECT_FALSE(malformed);
    EXPECT_EQ(DumpExportMeta(back.meta), DumpExportMeta((*impl)->meta));
    EXPECT_EQ(back.locs.size(), (*impl)->locs.size());
  }
  for (std::size_t n = 0; n < wire.size(); n += 1 + n / 64) {
    ExportReader::Impl back;
    bool malformed = false;
    const Status s = DecodeOpenResult(std::string_view(wire).substr(0, n), "f", &back, &malformed);
    EXPECT_TRUE(malformed && !s.ok() && s.exit_code() == 2) << "prefix of " << n << " bytes";
  }
  EXPECT_TRUE([&] {
    ExportReader::Impl back;
    bool malformed = false;
    return !DecodeOpenResult(wire + "x", "f", &back, &malformed).ok() && malformed;
  }()) << "trailing bytes accepted";
  std::uint64_t x = 42;
  for (int i = 0; i < 2000; ++i) {
    std::string w = wire;
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    w[static_cast<std::size_t>((x >> 20) % w.size())] ^= static_cast<char>(1 + (x >> 8) % 255);
    ExportReader::Impl back;
    bool malformed = false;
    (void)DecodeOpenResult(w, "f", &back, &malformed);  // must not crash or allocate absurdly
  }
}

TEST(IsolatedOpen, BadInputIsTheSameStatusAsInProcess) {
  const std::string dir = test::NewDir("iso-bad");
  ASSERT_TRUE(WriteFileAtomic(dir + "/text.h5", "not hdf5").ok());
  std::string head = "\x89HDF\r\n\x1a\n";
  head += std::string(100, '\0');
  ASSERT_TRUE(WriteFileAtomic(dir + "/trunc.h5", head).ok());
  for (const std::string& p : {dir + "/missing.h5", dir + "/text.h5", dir + "/trunc.h5", dir}) {
    ReaderLimits iso, in;
    in.isolate = false;
    auto a = ExportReader::Open(p, iso);
    auto b = ExportReader::Open(p, in);
    ASSERT_FALSE(a.ok() || b.ok()) << p;
    EXPECT_EQ(a.status().code(), b.status().code()) << p;
    EXPECT_EQ(a.status().message(), b.status().message()) << p;
  }
}

// The test-only hook of export_reader.h: the child crashes, hangs or exhausts its memory limit.
TEST(IsolatedOpen, PlantedFaultsAreExitTwoNamingTheFile) {
  struct Case {
    const char* fault;
    const char* what;
  };
  for (const Case& c : {Case{"crash", "crashed while reading its metadata (signal 11: "},
                        Case{"hang", "did not finish reading its metadata within 0.5 s"},
                        Case{"oom", "ran out of memory reading its metadata"}}) {
    ::setenv("LOCKSTEP_TEST_ISOLATE_FAULT", c.fault, 1);
    ReaderLimits limits;
    limits.isolate_timeout_s = 0.5;
    limits.isolate_memory_bytes = std::int64_t{256} << 20;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = ExportReader::Open(Plain(), limits);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ::unsetenv("LOCKSTEP_TEST_ISOLATE_FAULT");
    ASSERT_FALSE(r.ok()) << c.fault;
    EXPECT_EQ(r.status().exit_code(), 2) << c.fault;
    const std::string& m = r.status().message();
    EXPECT_EQ(m.rfind(Plain() + ": the HDF5 library ", 0), 0u) << m;
    EXPECT_NE(m.find(c.what), std::string::npos) << m;
    EXPECT_NE(m.find("the file is damaged or not a lockstep export"), std::string::npos) << m;
    EXPECT_LT(s, 10.0) << c.fault;
  }
  // Through the commands: one line on stderr, exit 2; --no-isolate never runs the child's hook.
  for (const char* fault : {"crash", "hang"}) {
    const std::string env = std::string("LOCKSTEP_TEST_ISOLATE_FAULT=") + fault;
    for (const std::string& cmd :
         {"diff " + Plain() + " " + Plain(), "align " + Plain() + " " + Plain(),
          "summarize " + Plain() + " " + Plain()}) {
      // --allow-self: one file on both sides is enough to reach the parser.
      auto r = RunWith(env, cmd + " --allow-self --isolate-timeout 0.5");
      EXPECT_EQ(r.exit_code, 2) << fault << " " << cmd << ": " << r.err;
      EXPECT_NE(r.err.find(Plain() + ": the HDF5 library"), std::string::npos) << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    }
    auto trusted = RunWith(env, "diff --no-isolate --allow-self " + Plain() + " " + Plain());
    EXPECT_EQ(trusted.exit_code, 0) << trusted.err;
  }
}

// The parent never enters libhdf5 for an isolated file: under the trap (tests/compare/
// h5_parent_trap.cpp) the commands succeed, and with --no-isolate the same commands abort.
TEST(IsolatedOpen, TheParentNeverCallsHdf5) {
  const std::string trap = std::string("LD_PRELOAD=") + H5_PARENT_TRAP;
  for (const std::string& f : {Plain(), Lz4()}) {
    for (const std::string& cmd :
         {"diff " + f + " " + f, "align " + f + " " + f, "summarize " + f + " " + f}) {
      auto ok = RunWith(trap, cmd + " --allow-self");
      EXPECT_EQ(ok.exit_code, 0) << cmd << ": " << ok.err;
      auto trusted = RunWith(trap, cmd + " --allow-self --no-isolate");
      EXPECT_EQ(trusted.exit_code, 128 + SIGABRT) << cmd << ": " << trusted.err;
      EXPECT_NE(trusted.err.find("h5_parent_trap: the parent process called H5"), std::string::npos)
          << trusted.err;
    }
  }
}

// A campaign whose comparison child crashes: the comparison is recorded as failed ("exports
// readable" with the one-line reason) in the ledger and the report, and the run still finishes.
TEST(IsolatedOpen, CampaignRecordsACrashedComparison) {
  const std::string dir = test::NewDir("iso-campaign");
  ASSERT_TRUE(WriteFileAtomic(dir + "/p.toml", R"(name = "iso"
question = "q"
[model]
preset = "tiny"
seed = 7
[request]
prompt = "abcabcabcabc"
[engine]
threads = 1
max_new = 4
spec = 2
[export]
windows = "0"
[gates]
state = true
[[arm]]
name = "A1"
[[arm]]
name = "A2"
baseline = "A1"
)")
                  .ok());
  auto r = RunWith("LOCKSTEP_TEST_ISOLATE_FAULT=crash",
                   "run " + dir + "/p.toml --out " + dir + "/run --no-progress");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  std::ifstream f(dir + "/run/ledger.jsonl");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string ledger = ss.str();
  EXPECT_NE(ledger.find("\"compared\""), std::string::npos) << ledger;
  EXPECT_NE(ledger.find("exports readable"), std::string::npos) << ledger;
  EXPECT_NE(ledger.find("the HDF5 library crashed while reading its metadata"), std::string::npos)
      << ledger;
  EXPECT_TRUE(std::filesystem::exists(dir + "/run/report.md"));
}

}  // namespace
}  // namespace lockstep
