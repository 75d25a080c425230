// `lockstep diff` memory is bounded by --mem-limit, not by the size of the exports (state_diff.h:
// items are streamed in row blocks, each worker holds two blocks). Two valid exports of 256+ MiB
// each, made from a real tiny export by replacing one `k` item with a 256 MiB one, are diffed by
// the built binary with --mem-limit 32M in a child process; its peak RSS (wait4's ru_maxrss) must
// stay far below the bytes it compared. The two big items differ in their very last element only,
// so the exit code 1 and that element's index in the JSON report prove the whole item was read.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/compare/export_reader.h"
#include "lockstep/h5/handle.h"
#include "test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kBigBytes = std::int64_t{256} << 20;  // the replaced item, per file
constexpr std::int64_t kMaxRssBytes = std::int64_t{150} << 20;

void SetInt(hid_t ds, const char* name, std::int64_t v) {
  if (H5Aexists(ds, name) > 0) H5Adelete(ds, name);
  H5Handle sp(H5Screate(H5S_SCALAR));
  H5Handle a(H5Acreate2(ds, name, H5T_STD_I64LE, sp.get(), H5P_DEFAULT, H5P_DEFAULT));
  ASSERT_TRUE(a.valid()) << name;
  ASSERT_GE(H5Awrite(a.get(), H5T_NATIVE_INT64, &v), 0) << name;
}

void SetStr(hid_t ds, const char* name, const std::string& v) {
  if (H5Aexists(ds, name) > 0) H5Adelete(ds, name);
  H5Handle t(H5Tcopy(H5T_C_S1));
  H5Tset_size(t.get(), v.size());
  H5Handle sp(H5Screate(H5S_SCALAR));
  H5Handle a(H5Acreate2(ds, name, t.get(), sp.get(), H5P_DEFAULT, H5P_DEFAULT));
  ASSERT_TRUE(a.valid()) << name;
  ASSERT_GE(H5Awrite(a.get(), t.get(), v.data()), 0) << name;
}

// Deterministic values in [-0.5, 0.5), never all zero (NRMSE is relative to A's norm).
float Value(std::uint64_t i) {
  return static_cast<float>(static_cast<std::uint32_t>(i * 2654435761u) >> 8) * 0x1p-24f - 0.5f;
}

// Replaces the item at `path` (f32, rows first) by a contiguous f32 dataset of `rows` rows of
// `row_shape`, with the item attributes the reader checks, written in 4 MiB slabs so this process
// never holds more than one.
void ReplaceWithBig(const std::string& file, const std::string& path, const ExportItem& item,
                    std::int64_t rows) {
  H5Handle f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  ASSERT_TRUE(f.valid()) << file;
  ASSERT_GE(H5Ldelete(f.get(), path.c_str(), H5P_DEFAULT), 0) << path;
  // The edited file's /index/items no longer describes it: drop it so the reader walks the
  // datasets.
  if (H5Lexists(f.get(), "/index", H5P_DEFAULT) > 0) {
    ASSERT_GE(H5Ldelete(f.get(), "/index", H5P_DEFAULT), 0);
  }
  std::vector<hsize_t> dims{static_cast<hsize_t>(rows)};
  for (std::size_t d = 1; d < item.shape.size(); ++d)
    dims.push_back(static_cast<hsize_t>(item.shape[d]));
  H5Handle sp(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  H5Handle ds(H5Dcreate2(f.get(), path.c_str(), H5T_IEEE_F32LE, sp.get(), H5P_DEFAULT, H5P_DEFAULT,
                         H5P_DEFAULT));
  ASSERT_TRUE(ds.valid()) << path;
  SetStr(ds.get(), "kind", ItemKindName(item.kind));
  SetInt(ds.get(), "stage", item.stage);
  SetInt(ds.get(), "layer", item.layer);
  SetInt(ds.get(), "valid_rows", rows);
  SetInt(ds.get(), "capacity_rows", rows);
  SetStr(ds.get(), "dtype", "f32");
  const std::int64_t row_elems = item.row_elems();
  const std::int64_t slab_rows =
      std::max<std::int64_t>(1, (std::int64_t{4} << 20) / (row_elems * 4));
  std::vector<float> buf(static_cast<std::size_t>(slab_rows * row_elems));
  for (std::int64_t r0 = 0; r0 < rows; r0 += slab_rows) {
    const std::int64_t n = std::min(slab_rows, rows - r0);
    for (std::int64_t i = 0; i < n * row_elems; ++i)
      buf[static_cast<std::size_t>(i)] = Value(static_cast<std::uint64_t>(r0 * row_elems + i));
    std::vector<hsize_t> start(dims.size(), 0), count = dims;
    start[0] = static_cast<hsize_t>(r0);
    count[0] = static_cast<hsize_t>(n);
    H5Handle fs_sel(H5Dget_space(ds.get()));
    ASSERT_GE(H5Sselect_hyperslab(fs_sel.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(),
                                  nullptr),
              0);
    H5Handle ms(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
    ASSERT_GE(H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, ms.get(), fs_sel.get(), H5P_DEFAULT, buf.data()),
              0);
  }
}

// Overwrites the last element of the dataset at `path` with `v`.
void SetLastElement(const std::string& file, const std::string& path, float v) {
  H5Handle f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  H5Handle ds(H5Dopen2(f.get(), path.c_str(), H5P_DEFAULT));
  ASSERT_TRUE(ds.valid()) << path;
  H5Handle sp(H5Dget_space(ds.get()));
  const int rank = H5Sget_simple_extent_ndims(sp.get());
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank)), count(dims.size(), 1);
  H5Sget_simple_extent_dims(sp.get(), dims.data(), nullptr);
  for (auto& d : dims) --d;  // the last index in every dimension
  ASSERT_GE(
      H5Sselect_hyperslab(sp.get(), H5S_SELECT_SET, dims.data(), nullptr, count.data(), nullptr),
      0);
  const hsize_t one = 1;
  H5Handle ms(H5Screate_simple(1, &one, nullptr));
  ASSERT_GE(H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, ms.get(), sp.get(), H5P_DEFAULT, &v), 0);
}

// This process's resident set (VmRSS), bytes; -1 if unreadable.
std::int64_t SelfRss() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

struct Child {
  int exit_code = -1;
  std::int64_t max_rss_bytes = -1;
  std::string err;
};

// Runs the lockstep binary with `args` (stdout and stderr to files) and reports its peak RSS.
// fork (not posix_spawn/vfork): exec records the replaced address space's high-water mark in the
// child's ru_maxrss, and a forked copy's mark is only this process's current RSS (small here),
// whereas a vfork child would carry this process's historic peak.
Child RunMeasured(const std::vector<std::string>& args, const std::string& dir) {
  std::vector<std::string> all{LOCKSTEP_BIN_PATH};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string out = dir + "/stdout.txt", err = dir + "/stderr.txt";
  Child c;
  const pid_t pid = ::fork();
  if (pid == 0) {  // only async-signal-safe calls until exec
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0 || ::dup2(o, 1) < 0 || ::dup2(e, 2) < 0) ::_exit(126);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  if (pid < 0) return c;
  int status = 0;
  struct rusage ru {};
  if (::wait4(pid, &status, 0, &ru) != pid) return c;
  c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  c.max_rss_bytes = static_cast<std::int64_t>(ru.ru_maxrss) * 1024;  // Linux: KiB
  std::ifstream in(err);
  std::stringstream ss;
  ss << in.rdbuf();
  c.err = ss.str();
  return c;
}

TEST(DiffMemory, TwoBigExportsDiffUnderTheMemoryLimit) {
  const std::string dir = test::NewDir("diff-memory");
  const std::string base = dir + "/base.h5";
  auto g = test::RunLockstep(
      "generate --model " + test::ModelDir("tiny") +
      " --prompt 'hello hello hello' --max-new 4 --spec 2 --threads 1 --export-windows 0"
      " --export " +
      base);
  ASSERT_EQ(g.exit_code, 0) << g.err;

  // The first committed `k` of window 0: f32 [rows, heads_kv, head_dim], 256 bytes a row for tiny.
  std::string path, cp_name;
  ExportItem item;
  {
    auto r = ExportReader::Open(base);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (const auto& cp : (*r)->meta().checkpoints)
      for (const auto& it : cp.items)
        if (path.empty() && cp.point == CheckpointPoint::kCommit && it.kind == ItemKind::kK &&
            it.dtype == DType::kF32) {
          cp_name = cp.name;
          path = "/checkpoints/" + cp.name + "/" + it.rel;
          item = it;
        }
  }
  ASSERT_FALSE(path.empty()) << "no f32 k item at a commit checkpoint in " << base;
  const std::int64_t row_bytes = item.row_elems() * 4;
  const std::int64_t rows = kBigBytes / row_bytes;

  const std::string a = dir + "/A.h5", b = dir + "/B.h5";
  fs::copy_file(base, a);
  ReplaceWithBig(a, path, item, rows);
  if (HasFatalFailure()) return;
  fs::copy_file(a, b);
  SetLastElement(b, path, 1000.0f);
  if (HasFatalFailure()) return;
  ASSERT_GT(fs::file_size(a), static_cast<std::uintmax_t>(kBigBytes));
  ASSERT_GT(fs::file_size(b), static_cast<std::uintmax_t>(kBigBytes));
  {
    // The reader accepts the modified file and reads the big item with pread (no HDF5 buffering).
    auto r = ExportReader::Open(a);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    bool found = false;
    for (const auto& cp : (*r)->meta().checkpoints)
      for (const auto& it : cp.items)
        if (cp.name == cp_name && it.rel == item.rel) {
          found = true;
          EXPECT_EQ(it.rows(), rows);
          EXPECT_TRUE((*r)->ReadsDirectly(cp, it));
        }
    EXPECT_TRUE(found);
  }

  const std::string json = dir + "/report.json";
  const std::int64_t parent_rss = SelfRss();
  const Child c = RunMeasured(
      {"diff", a, b, "--mem-limit", "32M", "--quiet", "--json", json, "--allow-self"}, dir);
  EXPECT_EQ(c.exit_code, 1) << c.err;  // gate failed: exactly the big item differs
  ASSERT_GT(c.max_rss_bytes, 0);
  EXPECT_LT(c.max_rss_bytes, kMaxRssBytes)
      << "peak RSS " << (c.max_rss_bytes >> 20) << " MiB diffing 2 x " << (fs::file_size(a) >> 20)
      << " MiB (the test process was " << (parent_rss >> 20) << " MiB at fork)";
  std::printf("lockstep diff --mem-limit 32M over 2 x %ju MiB: peak RSS %lld MiB\n",
              static_cast<std::uintmax_t>(fs::file_size(a) >> 20),
              static_cast<long long>(c.max_rss_bytes >> 20));

  // The report: only the big item failed, at its last element, after all of it was compared.
  std::ifstream in(json);
  ASSERT_TRUE(in.good()) << json;
  const auto j = nlohmann::json::parse(in);
  const auto& st = j.at("state");
  EXPECT_EQ(st.at("failed").get<int>(), 1);
  EXPECT_EQ(st.at("first_failure").at("checkpoint").get<std::string>(), cp_name);
  EXPECT_EQ(st.at("first_failure").at("rel").get<std::string>(), item.rel);
  const std::int64_t elements = rows * item.row_elems();
  bool seen = false;
  for (const auto& it : st.at("items")) {
    if (it.at("checkpoint").get<std::string>() != cp_name ||
        it.at("rel").get<std::string>() != item.rel)
      continue;
    seen = true;
    EXPECT_EQ(it.at("verdict").get<std::string>(), "fail");
    EXPECT_EQ(it.at("rows").get<std::int64_t>(), rows);
    EXPECT_EQ(it.at("elements").get<std::int64_t>(), elements);
    EXPECT_EQ(it.at("n_diff").get<std::int64_t>(), 1);
    EXPECT_EQ(it.at("first_diff").get<std::int64_t>(), elements - 1);
  }
  EXPECT_TRUE(seen);
}

}  // namespace
}  // namespace lockstep
