// Issue 21's damaged-export test: 500 seeded copies of a small valid export, each damaged only in
// its HDF5 metadata (bit flips, overwritten 8-byte fields, zeroed runs, truncation inside the
// metadata, a block copied over another; the raw data ranges, located with libhdf5, are left
// alone), each given to `diff D U`, `diff U D`, `align D U`, `summarize D U` and `report` (a
// campaign folder whose arm export is the damaged file). Every run must end with exit 0, 1 or 2
// within its time limit (never a signal, never a hang), and a damaged file's diff that exits 0
// must have compared exactly the undamaged file's items with the same bytes. Two processes run at
// a time; the whole test must take under 2 minutes on 2 cores (it prints its time).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "lockstep/engine/atomic_file.h"
#include "test_util.h"

extern char** environ;

namespace lockstep {
namespace {

namespace fs = std::filesystem;

constexpr int kCopies = 502;         // 2 undamaged, 500 damaged
constexpr double kRunLimitS = 20.0;  // one command; its isolated reader has 10 s per file

std::string Slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Outcome {
  int exit_code = -1;
  int signal = 0;
  bool timed_out = false;
};

// argv with stdout / stderr to `log`, killed at kRunLimitS.
Outcome Spawn(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  Outcome r;
  const int e = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (e != 0) return r;
  const auto t0 = std::chrono::steady_clock::now();
  int st = 0;
  for (;;) {
    const pid_t w = ::waitpid(pid, &st, WNOHANG);
    if (w == pid) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > kRunLimitS) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  if (WIFEXITED(st)) r.exit_code = WEXITSTATUS(st);
  if (WIFSIGNALED(st)) r.signal = WTERMSIG(st);
  return r;
}

// [offset, end) of every dataset's raw data (contiguous storage), located with libhdf5.
std::vector<std::pair<std::int64_t, std::int64_t>> DataRanges(const std::string& path) {
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(f, 0);
  auto visit = [](hid_t obj, const char* name, const H5O_info_t* info, void* data) -> herr_t {
    if (info->type != H5O_TYPE_DATASET) return 0;
    auto* out = static_cast<std::vector<std::pair<std::int64_t, std::int64_t>>*>(data);
    const hid_t ds = H5Dopen2(obj, name, H5P_DEFAULT);
    const haddr_t off = H5Dget_offset(ds);
    const hsize_t size = H5Dget_storage_size(ds);
    if (off != HADDR_UNDEF && size > 0)
      out->emplace_back(static_cast<std::int64_t>(off), static_cast<std::int64_t>(off + size));
    H5Dclose(ds);
    return 0;
  };
  EXPECT_GE(H5Ovisit2(f, H5_INDEX_NAME, H5_ITER_INC, visit, &ranges, H5O_INFO_BASIC), 0);
  H5Fclose(f);
  std::sort(ranges.begin(), ranges.end());
  return ranges;
}

// SplitMix64: the damage of copy i is a function of i alone.
struct Rng {
  std::uint64_t s;
  std::uint64_t Next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  std::int64_t Below(std::int64_t n) {
    return static_cast<std::int64_t>(Next() % static_cast<std::uint64_t>(n));
  }
};

// The metadata of a file: every byte outside the data ranges, as segments [a, b).
struct Metadata {
  std::vector<std::pair<std::int64_t, std::int64_t>> segs;
  std::int64_t bytes = 0;
  // The metadata byte number k (0 <= k < bytes) -> its offset and the end of its segment.
  std::pair<std::int64_t, std::int64_t> At(std::int64_t k) const {
    for (const auto& [a, b] : segs) {
      if (k < b - a) return {a + k, b};
      k -= b - a;
    }
    return {segs.back().second - 1, segs.back().second};
  }
};

Metadata MetadataOf(std::int64_t size,
                    const std::vector<std::pair<std::int64_t, std::int64_t>>& data) {
  Metadata m;
  std::int64_t at = 0;
  for (const auto& [a, b] : data) {
    if (a > at) m.segs.emplace_back(at, a);
    at = std::max(at, b);
  }
  if (at < size) m.segs.emplace_back(at, size);
  for (const auto& [a, b] : m.segs) m.bytes += b - a;
  return m;
}

// Copy `i` of `base`, damaged in its metadata only; the kind of damage is i % 5.
std::string Damage(const std::string& base, const Metadata& md, int i, std::string* what) {
  std::string f = base;
  Rng rng{0x1d5eedULL * 1000003ULL + static_cast<std::uint64_t>(i)};
  auto pick = [&] { return md.At(rng.Below(md.bytes)); };
  switch (i % 5) {
    case 0: {  // bit flips
      const int n = 1 + static_cast<int>(rng.Below(8));
      for (int k = 0; k < n; ++k)
        f[static_cast<std::size_t>(pick().first)] ^= static_cast<char>(1u << rng.Below(8));
      *what = std::to_string(n) + " bit flips";
      break;
    }
    case 1: {  // overwritten 8-byte fields (addresses, lengths, sizes)
      const int n = 1 + static_cast<int>(rng.Below(3));
      for (int k = 0; k < n; ++k) {
        auto [off, end] = pick();
        const std::uint64_t vals[] = {0,
                                      ~0ULL,
                                      rng.Next(),
                                      1ULL << rng.Below(63),
                                      static_cast<std::uint64_t>(base.size()) + rng.Below(64),
                                      static_cast<std::uint64_t>(rng.Below(256))};
        const std::uint64_t v = vals[rng.Below(6)];
        for (int b = 0; b < 8 && off + b < end; ++b)
          f[static_cast<std::size_t>(off + b)] = static_cast<char>(v >> (8 * b));
      }
      *what = std::to_string(n) + " overwritten 8-byte fields";
      break;
    }
    case 2: {  // a zeroed run
      auto [off, end] = pick();
      const std::int64_t len = std::min<std::int64_t>(8 + rng.Below(505), end - off);
      std::fill(f.begin() + off, f.begin() + off + len, '\0');
      *what = "zeroed " + std::to_string(len) + " bytes";
      break;
    }
    case 3: {  // truncation inside the metadata
      const std::int64_t off = pick().first;
      f.resize(static_cast<std::size_t>(std::max<std::int64_t>(off, 1)));
      *what = "truncated at " + std::to_string(off);
      break;
    }
    default: {  // a block copied over another
      auto [src, src_end] = pick();
      auto [dst, dst_end] = pick();
      const std::int64_t len = std::min({16 + rng.Below(241), src_end - src, dst_end - dst});
      std::copy(base.begin() + src, base.begin() + src + len, f.begin() + dst);
      *what = "copied " + std::to_string(len) + " bytes from " + std::to_string(src) + " to " +
              std::to_string(dst);
      break;
    }
  }
  return f;
}

// The items a diff compared, by identity and size, and whether every one matched bit for bit.
using ItemKey = std::tuple<std::string, std::string, std::string, std::int64_t, std::int64_t>;
std::set<ItemKey> Items(const nlohmann::json& j, bool* all_equal) {
  std::set<ItemKey> s;
  *all_equal = true;
  for (const auto& it : j.at("state").at("items")) {
    s.emplace(it.at("checkpoint").get<std::string>(), it.at("rel").get<std::string>(),
              it.at("dtype").get<std::string>(), it.at("rows").get<std::int64_t>(),
              it.at("elements").get<std::int64_t>());
    if (it.value("n_diff", std::int64_t{-1}) != 0 || it.value("verdict", "") != "pass")
      *all_equal = false;
  }
  return s;
}

std::string FindExport(const std::string& run, const std::string& arm) {
  for (const auto& e : fs::recursive_directory_iterator(run))
    if (e.path().filename() == "export.h5" &&
        e.path().parent_path().filename().string().rfind(arm, 0) == 0)
      return e.path().string();
  return "";
}

TEST(DamagedExports, EveryCommandEndsWithAnExitCodeNeverASignalOrAHang) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string dir = test::NewDir("damaged");
  const std::string bin = LOCKSTEP_BIN_PATH;
  // A tiny A/A campaign: A1's export is the undamaged reference U, A2's the file to damage.
  ASSERT_TRUE(WriteFileAtomic(dir + "/p.toml", R"(name = "damaged"
question = "q"
[model]
preset = "tiny"
seed = 7
[request]
prompt = "abcabcabc"
[engine]
threads = 1
max_new = 3
spec = 2
[export]
windows = "0"
points = ["commit"]
[gates]
state = true
[[arm]]
name = "A1"
[[arm]]
name = "A2"
baseline = "A1"
)")
                  .ok());
  const std::string run = dir + "/run";
  Outcome made =
      Spawn({bin, "run", dir + "/p.toml", "--out", run, "--no-progress"}, dir + "/run.log");
  ASSERT_EQ(made.exit_code, 0) << Slurp(dir + "/run.log");
  const std::string u = FindExport(run, "A1"), a2 = FindExport(run, "A2");
  ASSERT_FALSE(u.empty() || a2.empty());
  const std::string base = Slurp(a2);
  const Metadata md = MetadataOf(static_cast<std::int64_t>(base.size()), DataRanges(a2));
  ASSERT_GT(md.bytes, 1000);
  ASSERT_LT(md.bytes, static_cast<std::int64_t>(base.size()));
  // The undamaged diff: what a passing damaged diff must have compared.
  ASSERT_EQ(Spawn({bin, "diff", a2, u, "--quiet", "--json", dir + "/ref.json"}, dir + "/ref.log")
                .exit_code,
            0);
  bool ref_equal = false;
  const std::set<ItemKey> ref = Items(nlohmann::json::parse(Slurp(dir + "/ref.json")), &ref_equal);
  ASSERT_TRUE(ref_equal);
  ASSERT_GT(ref.size(), 5u);

  // Two workers, one campaign folder each (`report` reads its folder; the damaged file goes in
  // as A2's export).
  std::mutex mu;
  std::vector<std::string> failures;
  std::map<std::string, std::array<int, 3>> exits;  // command -> count of exit 0 / 1 / 2
  std::atomic<int> passing_diffs{0};
  int runs = 0;  // damaged-file runs (under mu)
  auto worker = [&](int slot) {
    const std::string wdir = dir + "/w" + std::to_string(slot);
    fs::create_directories(wdir);
    const std::string camp = wdir + "/run";
    fs::copy(run, camp, fs::copy_options::recursive);
    const std::string camp_export = FindExport(camp, "A2");
    for (int i = slot; i < kCopies; i += 2) {
      std::string what;
      const std::string d = wdir + "/d" + std::to_string(i) + ".h5";
      // Copies 0 and 1 are the undamaged file: every command must pass on it (a command that
      // failed on any input would make every run below "end with an exit code").
      const std::string bytes = i < 2 ? base : Damage(base, md, i, &what);
      {
        std::ofstream(d, std::ios::binary) << bytes;
        std::ofstream(camp_export, std::ios::binary | std::ios::trunc) << bytes;
      }
      const std::string j1 = wdir + "/j1.json", j2 = wdir + "/j2.json";
      fs::remove(j1);
      fs::remove(j2);
      const std::vector<std::pair<std::string, std::vector<std::string>>> cmds = {
          {"diff D U", {bin, "diff", d, u, "--quiet", "--isolate-timeout", "10", "--json", j1}},
          {"diff U D", {bin, "diff", u, d, "--quiet", "--isolate-timeout", "10", "--json", j2}},
          {"align", {bin, "align", d, u, "--isolate-timeout", "10"}},
          {"summarize", {bin, "summarize", d, u, "--isolate-timeout", "10"}},
          {"report", {bin, "report", camp}}};
      for (const auto& [name, argv] : cmds) {
        const Outcome r = Spawn(argv, wdir + "/log");
        if (i < 2 && (r.exit_code != 0 || r.signal != 0)) {  // copies 0, 1: undamaged (below)
          std::lock_guard<std::mutex> lock(mu);
          failures.push_back("undamaged: " + name + ": " + Slurp(wdir + "/log"));
        }
        if (i < 2) continue;
        std::lock_guard<std::mutex> lock(mu);
        ++runs;
        const std::string where = "copy " + std::to_string(i) + " (" + what + "): " + name;
        if (r.timed_out || r.signal != 0 || r.exit_code < 0 || r.exit_code > 2) {
          failures.push_back(where + ": " +
                             (r.timed_out ? "hung"
                              : r.signal  ? "signal " + std::to_string(r.signal)
                                          : "exit " + std::to_string(r.exit_code)) +
                             ": " + Slurp(wdir + "/log"));
          continue;
        }
        ++exits[name][static_cast<std::size_t>(r.exit_code)];
        if (r.exit_code != 0 || name.rfind("diff", 0) != 0) continue;
        // A passing diff of a damaged file compared every item of the undamaged one, bit-exactly.
        bool equal = false;
        const std::set<ItemKey> got =
            Items(nlohmann::json::parse(Slurp(name == "diff D U" ? j1 : j2)), &equal);
        if (got != ref || !equal)
          failures.push_back(where + ": passed with " + std::to_string(got.size()) + " items (" +
                             std::to_string(ref.size()) + " undamaged)" +
                             (equal ? "" : ", not bit-exact"));
        else
          ++passing_diffs;
      }
      fs::remove(d);
    }
  };
  std::thread w0(worker, 0), w1(worker, 1);
  w0.join();
  w1.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& [name, n] : exits)
    std::printf("%-10s exit 0: %4d  exit 1: %4d  exit 2: %4d\n", name.c_str(), n[0], n[1], n[2]);
  std::printf(
      "%d damaged copies (%lld metadata bytes of %zu), %d passing diffs checked against "
      "the undamaged one; %.1f s\n",
      kCopies - 2, static_cast<long long>(md.bytes), base.size(), passing_diffs.load(), seconds);
  EXPECT_TRUE(failures.empty()) << failures.size() << " failures, first: "
                                << (failures.empty() ? "" : failures.front());
  EXPECT_EQ(runs, 5 * (kCopies - 2));
  EXPECT_LT(seconds, 120.0) << "the damaged-export test must take under 2 minutes on 2 cores";
  // Some damage must reach the reader (exit 2): a harness that damaged nothing would pass too.
  EXPECT_GT(exits["diff D U"][2], (kCopies - 2) / 4);
}

}  // namespace
}  // namespace lockstep
