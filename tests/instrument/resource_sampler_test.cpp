// Resource sampler tests: /proc parsing on crafted, missing and garbage files (a missing field is
// unknown, never 0 or a crash), this process's own RSS and CPU time, NVML absent (Open says why)
// and a fake NVML at the NvmlApi boundary (per-field unknowns, RAII shutdown), interval and
// extreme aggregates, the free-memory guard (host and GPU sources, mid-run trip), and the
// sampler thread's schedule, Stop() idempotence and bounded storage. No test sleeps to wait for
// the thread except the 250 ms schedule test; the rest poll with a 2 s failure bound.
#include "lockstep/instrument/resource_sampler.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

constexpr std::int64_t kMiB = std::int64_t{1024} * 1024;
constexpr std::int64_t kKbPerMiB = 1024;  // meminfo counts kB (KiB)
constexpr std::int64_t kGiB = 1024 * kMiB;

// A private scratch folder per test, removed afterwards.
class ResourceSamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "lockstep_rs_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // Writes `text` to dir_/name through a rename, so a concurrent reader sees the old or the new
  // file, never a half-written one. Returns the path.
  std::string Write(const std::string& name, const std::string& text) {
    fs::path tmp = dir_ / (name + ".tmp");
    {
      std::ofstream f(tmp, std::ios::binary);
      f << text;
    }
    fs::rename(tmp, dir_ / name);
    return (dir_ / name).string();
  }
  static std::string Meminfo(std::int64_t available_kb, std::int64_t swap_total_kb,
                             std::int64_t swap_free_kb) {
    std::string text = "MemTotal:       263842580 kB\nMemFree:         1000000 kB\n";
    text += "MemAvailable:   " + std::to_string(available_kb) + " kB\n";
    text += "Buffers:          123456 kB\n";
    text += "SwapTotal:      " + std::to_string(swap_total_kb) + " kB\n";
    text += "SwapFree:       " + std::to_string(swap_free_kb) + " kB\n";
    return text + "HugePages_Total:       0\n";
  }
  ProcPaths Paths(std::int64_t available_kb, std::int64_t swap_total_kb = 0,
                  std::int64_t swap_free_kb = 0) {
    ProcPaths p;
    p.meminfo = Write("meminfo", Meminfo(available_kb, swap_total_kb, swap_free_kb));
    p.self_status = Write("status", "Name:\ttest\nVmRSS:\t    2048 kB\nThreads:\t3\n");
    return p;
  }
  // Polls `cond` every millisecond for at most `limit` (tests never sleep a fixed time to wait
  // for the sampler thread; the limit only bounds a failure).
  template <typename Cond>
  static bool WaitFor(Cond cond, milliseconds limit = milliseconds(2000)) {
    auto end = std::chrono::steady_clock::now() + limit;
    while (!cond()) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(milliseconds(1));
    }
    return true;
  }

  fs::path dir_;
};

// ---- parsing ----

TEST(ResourceParse, MeminfoKilobytesBecomeBytes) {
  ResourceSample s;
  ParseMeminfo(
      "MemTotal: 100 kB\nMemAvailable:    1000 kB\nSwapTotal: 4096 kB\nSwapFree: 1024 kB\n", &s);
  EXPECT_EQ(s.host_available_bytes, 1000 * 1024);
  EXPECT_EQ(s.swap_used_bytes, (4096 - 1024) * 1024);
}

TEST(ResourceParse, NoSwapConfiguredIsAMeasuredZero) {
  ResourceSample s;
  ParseMeminfo("MemAvailable: 5 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n", &s);
  EXPECT_EQ(s.swap_used_bytes, 0);
}

TEST(ResourceParse, MissingFieldsAreUnknown) {
  ResourceSample s;
  ParseMeminfo("MemTotal: 100 kB\nMemFree: 50 kB\nSwapTotal: 10 kB\n", &s);  // pre-3.14 kernel
  EXPECT_EQ(s.host_available_bytes, kResourceUnknown);
  EXPECT_EQ(s.swap_used_bytes, kResourceUnknown);  // SwapFree missing
  ParseMeminfo("", &s);
  EXPECT_EQ(s.host_available_bytes, kResourceUnknown);
  ParseProcStatus("Name:\tkthreadd\nState:\tS\n", &s);  // kernel threads have no VmRSS
  EXPECT_EQ(s.rss_bytes, kResourceUnknown);
}

TEST(ResourceParse, GarbageLinesAreIgnored) {
  ResourceSample s;
  ParseMeminfo(
      "garbage without colon\n"
      ": 12 kB\n"
      "MemAvailable: abc kB\n"                   // not a number: skipped
      "MemAvailable:\n"                          // no value
      "MemAvailable: -5 kB\n"                    // negative: skipped
      "MemAvailable: 12 MB\n"                    // unknown unit: skipped
      "MemAvailable: 99999999999999999999 kB\n"  // overflows uint64: skipped
      "SwapTotal: 18014398509481984 kB\n"        // 2^54 kB overflows int64 bytes: skipped
      "\x01\x02\xff\n\n\n"
      "MemAvailable:\t 777 kB \r\n"  // first well-formed value wins
      "MemAvailable: 888 kB\n"
      "SwapFree: 1 kB\n",
      &s);
  EXPECT_EQ(s.host_available_bytes, 777 * 1024);
  EXPECT_EQ(s.swap_used_bytes, kResourceUnknown);  // SwapTotal never parsed
}

TEST(ResourceParse, SwapFreeAboveTotalIsUnknown) {
  ResourceSample s;
  ParseMeminfo("SwapTotal: 10 kB\nSwapFree: 20 kB\n", &s);
  EXPECT_EQ(s.swap_used_bytes, kResourceUnknown);
}

TEST(ResourceParse, VmRssFromStatus) {
  ResourceSample s;
  ParseProcStatus("Name:\tx\nVmPeak:\t 9999 kB\nVmRSS:\t    2048 kB\nRssAnon:\t 1 kB\n", &s);
  EXPECT_EQ(s.rss_bytes, 2048 * 1024);
}

TEST_F(ResourceSamplerTest, MissingFilesLeaveHostFieldsUnknownWithoutCrashing) {
  ProcPaths p;
  p.meminfo = (dir_ / "does-not-exist").string();
  p.self_status = "";  // empty path: not read
  ResourceSample s = ReadResourceSample(nullptr, p);
  EXPECT_EQ(s.host_available_bytes, kResourceUnknown);
  EXPECT_EQ(s.swap_used_bytes, kResourceUnknown);
  EXPECT_EQ(s.rss_bytes, kResourceUnknown);
  EXPECT_GT(s.t_ns, 0);
  EXPECT_GT(s.process_cpu_ns, 0);  // not from a file
  EXPECT_TRUE(s.devices.empty());

  p.meminfo = dir_.string();  // a directory: read() fails with EISDIR
  s = ReadResourceSample(nullptr, p);
  EXPECT_EQ(s.host_available_bytes, kResourceUnknown);
}

TEST_F(ResourceSamplerTest, BinaryGarbageAndHugeFilesAreSafe) {
  std::string junk(3 << 20, '\0');  // 3 MiB, more than the read cap
  for (std::size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>((i * 131) % 251);
  ProcPaths p;
  p.meminfo = Write("junk", junk);
  p.self_status = p.meminfo;
  ResourceSample s = ReadResourceSample(nullptr, p);
  EXPECT_EQ(s.host_available_bytes, kResourceUnknown);
  EXPECT_EQ(s.rss_bytes, kResourceUnknown);
}

TEST(ResourceRead, ThisProcessOnLinux) {
  ResourceSample s = ReadResourceSample(nullptr);
  EXPECT_GT(s.t_ns, 0);
  EXPECT_GT(s.rss_bytes, 0);
  EXPECT_GT(s.process_cpu_ns, 0);
  EXPECT_GT(s.host_available_bytes, 0);
  EXPECT_GE(s.swap_used_bytes, 0);
  EXPECT_GE(s.read_ns, 0);
  ResourceSample later = ReadResourceSample(nullptr);
  EXPECT_GE(later.t_ns, s.t_ns);
  EXPECT_GE(later.process_cpu_ns, s.process_cpu_ns);
}

// ---- NVML ----

TEST(NvmlHandle, OpenEitherWorksOrSaysWhy) {
  std::string why = "stale";
  NvmlHandlePtr h = NvmlHandle::Open(&why);
  if (h) {
    EXPECT_TRUE(why.empty());
    GTEST_SKIP() << "NVML present: " << h->library() << ", " << h->device_count() << " devices";
  }
  EXPECT_NE(why.find("libnvidia-ml.so.1"), std::string::npos) << why;
  EXPECT_NE(why.find("unknown"), std::string::npos) << why;
  EXPECT_TRUE(ReadResourceSample(h.get()).devices.empty());
}

TEST(NvmlHandle, RealDevicesReportMemoryWhenPresent) {
  NvmlHandlePtr h = NvmlHandle::Open();
  if (!h) GTEST_SKIP() << "no NVML on this machine";
  std::vector<DeviceSample> d = h->ReadDevices();
  ASSERT_EQ(static_cast<int>(d.size()), h->device_count());
  for (const DeviceSample& x : d) {
    EXPECT_GT(x.total_bytes, 0) << "gpu" << x.index;
    EXPECT_GE(x.free_bytes, 0) << "gpu" << x.index;
    EXPECT_LE(x.free_bytes, x.total_bytes) << "gpu" << x.index;
    std::printf("gpu%d free %lld MiB / %lld MiB, %d C, SM %d MHz, PCIe gen%d x%d\n", x.index,
                static_cast<long long>(x.free_bytes / kMiB),
                static_cast<long long>(x.total_bytes / kMiB), x.temperature_c, x.sm_clock_mhz,
                x.pcie_gen, x.pcie_width);
  }
}

TEST(NvmlHandle, MissingLibraryAndMissingSymbolsAreReported) {
  std::string why;
  EXPECT_EQ(NvmlHandle::OpenLibrary({"liblockstep-no-such-nvml.so.1"}, &why), nullptr);
  EXPECT_NE(why.find("liblockstep-no-such-nvml.so.1 not found"), std::string::npos) << why;
  EXPECT_TRUE(why.starts_with("no NVIDIA driver on this machine")) << "the reason leads: " << why;
  // libc loads everywhere but is not NVML.
  EXPECT_EQ(NvmlHandle::OpenLibrary({"libc.so.6"}, &why), nullptr);
  EXPECT_NE(why.find("nvmlInit_v2"), std::string::npos) << why;
  EXPECT_EQ(NvmlHandle::OpenLibrary({}, &why), nullptr);
  EXPECT_FALSE(why.empty());
}

// A fake NVML with three devices: gpu0 healthy, gpu1 whose temperature read fails, gpu2 whose
// handle cannot be obtained. The PCIe-generation entry point is "missing" (older driver).
struct FakeGpu {
  std::atomic<unsigned long long> free_bytes;
  unsigned long long total_bytes;
  int temperature_rc;
  unsigned int temperature;
  unsigned int sm_clock;
  unsigned int width;
};
FakeGpu g_fake[2] = {{{40 * kGiB}, 80 * kGiB, 0, 55, 1980, 16},
                     {{30 * kGiB}, 80 * kGiB, 15, 0, 1410, 8}};
std::atomic<int> g_fake_inits{0};
std::atomic<int> g_fake_shutdowns{0};
int g_fake_init_rc = 0;

FakeGpu* Gpu(nvml::DeviceHandle h) { return reinterpret_cast<FakeGpu*>(h); }
int FakeInit() {
  ++g_fake_inits;
  return g_fake_init_rc;
}
int FakeShutdown() {
  ++g_fake_shutdowns;
  return 0;
}
int FakeCount(unsigned int* n) {
  *n = 3;
  return 0;
}
int FakeHandle(unsigned int i, nvml::DeviceHandle* h) {
  if (i >= 2) return 3;  // NVML_ERROR_NOT_FOUND-like
  *h = reinterpret_cast<nvml::DeviceHandle>(&g_fake[i]);
  return 0;
}
int FakeMemory(nvml::DeviceHandle h, nvml::Memory* m) {
  m->free = Gpu(h)->free_bytes.load();
  m->total = Gpu(h)->total_bytes;
  m->used = m->total - m->free;
  return 0;
}
int FakeTemperature(nvml::DeviceHandle h, int sensor, unsigned int* t) {
  if (sensor != nvml::kTemperatureGpu) return 2;
  *t = Gpu(h)->temperature;
  return Gpu(h)->temperature_rc;
}
int FakeClock(nvml::DeviceHandle h, int clock, unsigned int* c) {
  if (clock != nvml::kClockSm) return 2;
  *c = Gpu(h)->sm_clock;
  return 0;
}
int FakeWidth(nvml::DeviceHandle h, unsigned int* w) {
  *w = Gpu(h)->width;
  return 0;
}
const char* FakeErrorString(int rc) { return rc == 9 ? "Driver Not Loaded" : "Unknown Error"; }

NvmlApi FakeApi() {
  NvmlApi a;
  a.init = FakeInit;
  a.shutdown = FakeShutdown;
  a.device_count = FakeCount;
  a.handle_by_index = FakeHandle;
  a.memory_info = FakeMemory;
  a.temperature = FakeTemperature;
  a.clock_info = FakeClock;
  a.pcie_width = FakeWidth;  // pcie_gen left null: that entry point is "missing"
  a.error_string = FakeErrorString;
  return a;
}

TEST(NvmlHandle, EachFieldIsUnknownOnItsOwn) {
  std::string why = "stale";
  int shutdowns = g_fake_shutdowns.load();
  {
    NvmlHandlePtr h = NvmlHandle::TEST_FromApi(FakeApi(), &why);
    ASSERT_NE(h, nullptr) << why;
    EXPECT_TRUE(why.empty());
    EXPECT_EQ(h->device_count(), 3);
    EXPECT_EQ(h->missing_symbols(),
              std::vector<std::string>{"nvmlDeviceGetCurrPcieLinkGeneration"});
    std::vector<DeviceSample> d = h->ReadDevices();
    ASSERT_EQ(d.size(), 3u);
    EXPECT_EQ(d[0].index, 0);
    EXPECT_EQ(d[0].free_bytes, 40 * kGiB);
    EXPECT_EQ(d[0].total_bytes, 80 * kGiB);
    EXPECT_EQ(d[0].temperature_c, 55);
    EXPECT_EQ(d[0].sm_clock_mhz, 1980);
    EXPECT_EQ(d[0].pcie_gen, kResourceUnknown);  // symbol missing
    EXPECT_EQ(d[0].pcie_width, 16);
    EXPECT_EQ(d[1].temperature_c, kResourceUnknown);  // that call failed...
    EXPECT_EQ(d[1].sm_clock_mhz, 1410);               // ...the others did not
    EXPECT_EQ(d[2].index, 2);                         // no handle: listed, all unknown
    EXPECT_EQ(d[2].free_bytes, kResourceUnknown);
    EXPECT_EQ(d[2].total_bytes, kResourceUnknown);
    EXPECT_EQ(d[2].temperature_c, kResourceUnknown);
    EXPECT_EQ(d[2].sm_clock_mhz, kResourceUnknown);
    EXPECT_EQ(d[2].pcie_width, kResourceUnknown);
    EXPECT_EQ(ReadResourceSample(h.get()).devices.size(), 3u);
  }
  EXPECT_EQ(g_fake_shutdowns.load(), shutdowns + 1);  // RAII: nvmlShutdown once
}

TEST(NvmlHandle, InitFailureIsReportedWithNvmlsOwnWords) {
  g_fake_init_rc = 9;
  std::string why;
  int shutdowns = g_fake_shutdowns.load();
  EXPECT_EQ(NvmlHandle::TEST_FromApi(FakeApi(), &why), nullptr);
  g_fake_init_rc = 0;
  EXPECT_NE(why.find("nvmlInit failed: Driver Not Loaded (9)"), std::string::npos) << why;
  EXPECT_EQ(g_fake_shutdowns.load(), shutdowns);  // init failed: nothing to shut down

  NvmlApi no_count = FakeApi();
  no_count.device_count = nullptr;
  EXPECT_EQ(NvmlHandle::TEST_FromApi(no_count, &why), nullptr);
  EXPECT_FALSE(why.empty());
}

// ---- aggregates ----

ResourceSample At(std::int64_t t_ns) {
  ResourceSample s;
  s.t_ns = t_ns;
  return s;
}

TEST(ResourceAggregates, IntervalsMinMedianMax) {
  std::vector<ResourceSample> v = {At(0), At(10), At(40), At(60)};  // gaps 10, 30, 20
  IntervalStats st = ComputeIntervals(v);
  EXPECT_EQ(st.count, 3);
  EXPECT_EQ(st.min_ns, 10);
  EXPECT_EQ(st.median_ns, 20);
  EXPECT_EQ(st.max_ns, 30);
  v.push_back(At(100));  // gaps 10, 30, 20, 40: median (20 + 30) / 2
  EXPECT_EQ(ComputeIntervals(v).median_ns, 25);
}

TEST(ResourceAggregates, IntervalsUnknownWithFewerThanTwoSamples) {
  for (std::size_t n : {0u, 1u}) {
    std::vector<ResourceSample> v(n, At(5));
    IntervalStats st = ComputeIntervals(v);
    EXPECT_EQ(st.count, 0);
    EXPECT_EQ(st.min_ns, kResourceUnknown);
    EXPECT_EQ(st.median_ns, kResourceUnknown);
    EXPECT_EQ(st.max_ns, kResourceUnknown);
  }
}

TEST(ResourceAggregates, SummarySkipsUnknownValues) {
  auto sample = [](std::int64_t t, std::int64_t avail, std::int64_t swap, std::int64_t rss,
                   std::vector<DeviceSample> devices) {
    ResourceSample s = At(t);
    s.host_available_bytes = avail;
    s.swap_used_bytes = swap;
    s.rss_bytes = rss;
    s.devices = std::move(devices);
    return s;
  };
  //                         index free   total temp clock gen width
  std::vector<ResourceSample> v = {
      sample(100, 50, -1, 7, {{0, 1600, 9000, 59, 2520, 4, 16}, {1, 1700, 9000, 60, 2520, 4, 16}}),
      sample(200, -1, 3, -1, {{0, -1, -1, 63, -1, -1, -1}, {1, 1604, 9000, -1, 1800, 4, 16}}),
      sample(300, 40, 0, 9, {{1, -1, 9000, 61, 2520, 3, 8}}),
      sample(400, -1, -1, -1, {}),
  };
  Extremes e = Summarize(v);
  EXPECT_EQ(e.n_samples, 4);
  EXPECT_EQ(e.first_t_ns, 100);
  EXPECT_EQ(e.last_t_ns, 400);
  EXPECT_EQ(e.min_host_available_bytes, 40);
  EXPECT_EQ(e.max_swap_used_bytes, 3);
  EXPECT_EQ(e.max_rss_bytes, 9);
  ASSERT_EQ(e.devices.size(), 2u);
  EXPECT_EQ(e.devices[0].index, 0);
  EXPECT_EQ(e.devices[0].n_samples, 2);
  EXPECT_EQ(e.devices[0].min_free_bytes, 1600);
  EXPECT_EQ(e.devices[0].max_temperature_c, 63);
  EXPECT_EQ(e.devices[0].min_sm_clock_mhz, 2520);
  EXPECT_EQ(e.devices[0].pcie_links, (std::vector<PcieLink>{{4, 16}}));
  EXPECT_EQ(e.devices[1].min_free_bytes, 1604);
  EXPECT_EQ(e.devices[1].max_temperature_c, 61);
  EXPECT_EQ(e.devices[1].min_sm_clock_mhz, 1800);
  EXPECT_EQ(e.devices[1].max_sm_clock_mhz, 2520);
  EXPECT_EQ(e.devices[1].pcie_links, (std::vector<PcieLink>{{3, 8}, {4, 16}}));
  EXPECT_EQ(e.min_sm_clock_mhz, 1800);
  EXPECT_EQ(e.max_sm_clock_mhz, 2520);
  EXPECT_EQ(e.pcie_links, (std::vector<PcieLink>{{3, 8}, {4, 16}}));

  Extremes none = Summarize(std::vector<ResourceSample>{At(1)});
  EXPECT_EQ(none.min_host_available_bytes, kResourceUnknown);  // never measured: not 0
  EXPECT_EQ(none.max_rss_bytes, kResourceUnknown);
  EXPECT_TRUE(none.devices.empty());
}

// ---- guard (pure) ----

TEST(ResourceGuard, GpuFreeMemoryWinsOverHost) {
  ResourceSample s = At(42);
  s.host_available_bytes = 10;  // host is tiny, but GPUs report: the guard watches the GPUs
  s.devices = {{0, 5 * kGiB, -1, -1, -1, -1, -1},
               {1, 2 * kGiB, -1, -1, -1, -1, -1},
               {2, -1, -1, -1, -1, -1, -1}};
  std::optional<GuardTrip> f = GuardFreeMemory(s);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->source, "gpu1");
  EXPECT_EQ(f->free_bytes, 2 * kGiB);
  EXPECT_FALSE(EvaluateGuard(s, 2048));  // exactly at the threshold: not below
  std::optional<GuardTrip> t = EvaluateGuard(s, 2049);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->t_ns, 42);
  EXPECT_EQ(t->source, "gpu1");
  EXPECT_FALSE(EvaluateGuard(s, -1));  // off

  s.devices = {{0, -1, -1, -1, -1, -1, -1}};  // no device knows its free memory
  t = EvaluateGuard(s, 1);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->source, "host");
  s.host_available_bytes = kResourceUnknown;
  EXPECT_FALSE(GuardFreeMemory(s));  // nothing known: the guard cannot judge
}

// ---- the sampler thread ----

TEST_F(ResourceSamplerTest, SamplesOnScheduleWithIntervalStats) {
  SamplerOptions o;
  o.interval_ms = 20;
  o.use_nvml = false;
  ResourceSampler rs(o);
  ASSERT_TRUE(rs.Start().ok());
  EXPECT_GE(rs.samples_taken(), 1);  // the first sample is taken by Start itself
  std::this_thread::sleep_for(milliseconds(250));
  rs.Stop();
  std::vector<ResourceSample> v = rs.Samples();
  ASSERT_GE(v.size(), 8u);  // ~13 expected; 8 leaves room for a loaded CI machine
  for (std::size_t i = 1; i < v.size(); ++i) EXPECT_GT(v[i].t_ns, v[i - 1].t_ns);
  IntervalStats st = rs.Intervals();
  EXPECT_EQ(st.count, static_cast<std::int64_t>(v.size()) - 1);
  EXPECT_GE(st.median_ns, 15'000'000);
  EXPECT_LE(st.median_ns, 60'000'000);
  EXPECT_LE(st.min_ns, st.median_ns);
  EXPECT_LE(st.median_ns, st.max_ns);
  EXPECT_EQ(rs.nvml_unavailable_reason(), "disabled (use_nvml = false)");
  for (const ResourceSample& s : v) {
    EXPECT_TRUE(s.devices.empty());
    EXPECT_GT(s.rss_bytes, 0);
  }
  EXPECT_EQ(rs.samples_dropped(), 0);
  EXPECT_EQ(rs.SamplesFrom(v.size() - 1).size(), 1u);
  EXPECT_TRUE(rs.SamplesFrom(v.size()).empty());
}

TEST_F(ResourceSamplerTest, StopIsIdempotentAndStartRunsOnce) {
  SamplerOptions o;
  o.interval_ms = 1000;  // Stop must not wait for the next slot
  o.use_nvml = false;
  {
    ResourceSampler never_started(o);
    never_started.Stop();  // no-op
  }
  ResourceSampler rs(o);
  auto t = std::chrono::steady_clock::now();
  ASSERT_TRUE(rs.Start().ok());
  Status again = rs.Start();
  EXPECT_EQ(again.code(), Status::Code::kInvalidArgument);
  rs.Stop();
  rs.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t, milliseconds(500));
  EXPECT_EQ(rs.samples_taken(), 1);
  EXPECT_EQ(rs.Samples().size(), 1u);
  // The destructor stops a sampler nobody stopped.
  ResourceSampler running(o);
  ASSERT_TRUE(running.Start().ok());
}

TEST_F(ResourceSamplerTest, BadOptionsAreInvalidArgument) {
  SamplerOptions o;
  o.use_nvml = false;
  o.interval_ms = 0;
  Status s = ResourceSampler(o).Start();
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("--sample-ms"), std::string::npos) << s.message();
  o.interval_ms = 10;
  o.guard_min_free_mib = -7;
  EXPECT_EQ(ResourceSampler(o).Start().code(), Status::Code::kInvalidArgument);
  o.guard_min_free_mib = -1;
  o.max_samples = 0;
  EXPECT_EQ(ResourceSampler(o).Start().code(), Status::Code::kInvalidArgument);
}

TEST_F(ResourceSamplerTest, SamplerWithoutNvmlSaysWhy) {
  SamplerOptions o;
  o.interval_ms = 1000;
  o.paths = Paths(kKbPerMiB * 1024 * 64);
  ResourceSampler rs(o);  // use_nvml = true: opens NVML if this machine has it
  ASSERT_TRUE(rs.Start().ok());
  rs.Stop();
  std::string why;
  bool present = NvmlHandle::Open(&why) != nullptr;
  if (present) {
    EXPECT_TRUE(rs.nvml_unavailable_reason().empty());
  } else {
    EXPECT_FALSE(rs.nvml_unavailable_reason().empty());
    EXPECT_TRUE(rs.Samples().at(0).devices.empty());
  }
}

TEST_F(ResourceSamplerTest, GuardTripsOnLowHostMemory) {
  SamplerOptions o;
  o.interval_ms = 1000;
  o.use_nvml = false;
  o.guard_min_free_mib = 1;
  o.paths = Paths(1000);  // 1000 kB = 1024000 bytes < 1 MiB
  ResourceSampler rs(o);
  EXPECT_FALSE(rs.guard_tripped());
  EXPECT_FALSE(rs.guard_trip());
  ASSERT_TRUE(rs.Start().ok());
  EXPECT_TRUE(rs.guard_tripped());  // judged on Start's own sample
  std::optional<GuardTrip> t = rs.guard_trip();
  rs.Stop();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->source, "host");
  EXPECT_EQ(t->free_bytes, 1024000);
  EXPECT_EQ(t->t_ns, rs.Samples().at(0).t_ns);
  EXPECT_EQ(rs.guard_unknown_samples(), 0);
}

TEST_F(ResourceSamplerTest, GuardStaysQuietWithEnoughMemoryOrWhenOff) {
  SamplerOptions o;
  o.interval_ms = 5;
  o.use_nvml = false;
  o.guard_min_free_mib = 1024;
  o.paths = Paths(kKbPerMiB * 1024 * 64);  // 64 GiB available
  ResourceSampler rs(o);
  ASSERT_TRUE(rs.Start().ok());
  ASSERT_TRUE(WaitFor([&] { return rs.samples_taken() >= 4; }));
  rs.Stop();
  EXPECT_FALSE(rs.guard_tripped());
  EXPECT_FALSE(rs.guard_trip());

  SamplerOptions off = o;
  off.guard_min_free_mib = -1;
  off.paths = Paths(1);
  ResourceSampler rs_off(off);
  ASSERT_TRUE(rs_off.Start().ok());
  rs_off.Stop();
  EXPECT_FALSE(rs_off.guard_tripped());
}

TEST_F(ResourceSamplerTest, GuardTripsMidRunAndSummaryFollowsTheFiles) {
  SamplerOptions o;
  o.interval_ms = 2;
  o.use_nvml = false;
  o.guard_min_free_mib = 700;
  o.paths = Paths(1000 * kKbPerMiB, 1024 * kKbPerMiB,
                  1024 * kKbPerMiB - 100);  // 1000 MiB, 100 kB swap used
  ResourceSampler rs(o);
  ASSERT_TRUE(rs.Start().ok());
  ASSERT_TRUE(WaitFor([&] { return rs.samples_taken() >= 3; }));
  EXPECT_FALSE(rs.guard_tripped());
  Write("meminfo",
        Meminfo(500 * kKbPerMiB, 1024 * kKbPerMiB, 1024 * kKbPerMiB - 300));  // 500 MiB, 300 kB
  ASSERT_TRUE(WaitFor([&] { return rs.guard_tripped(); }));
  Write("meminfo",
        Meminfo(900 * kKbPerMiB, 1024 * kKbPerMiB, 1024 * kKbPerMiB));  // recovers: trip stays
  std::int64_t n = rs.samples_taken();
  ASSERT_TRUE(WaitFor([&] { return rs.samples_taken() >= n + 3; }));
  rs.Stop();
  std::optional<GuardTrip> t = rs.guard_trip();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->source, "host");
  EXPECT_EQ(t->free_bytes, 500 * kMiB);
  Extremes e = rs.Summary();
  EXPECT_EQ(e.n_samples, rs.samples_taken());
  EXPECT_EQ(e.min_host_available_bytes, 500 * kMiB);
  EXPECT_EQ(e.max_swap_used_bytes, 300 * 1024);
  EXPECT_EQ(e.max_rss_bytes, 2048 * 1024);
  EXPECT_TRUE(rs.guard_tripped());
  EXPECT_EQ(rs.Samples().back().host_available_bytes, 900 * kMiB);
}

TEST_F(ResourceSamplerTest, GuardWatchesGpusThroughNvml) {
  g_fake[1].free_bytes = 500 * kMiB;
  SamplerOptions o;
  o.interval_ms = 1000;
  o.guard_min_free_mib = 1000;
  o.paths = Paths(kKbPerMiB * 1024 * 64);  // plenty of host memory: GPU memory decides
  std::string why;
  ResourceSampler rs(o, NvmlHandle::TEST_FromApi(FakeApi(), &why));
  ASSERT_TRUE(rs.Start().ok());
  rs.Stop();
  g_fake[1].free_bytes = 30 * kGiB;
  EXPECT_TRUE(rs.nvml_unavailable_reason().empty());
  ASSERT_TRUE(rs.guard_tripped());
  EXPECT_EQ(rs.guard_trip()->source, "gpu1");
  EXPECT_EQ(rs.guard_trip()->free_bytes, 500 * kMiB);
  Extremes e = rs.Summary();
  ASSERT_EQ(e.devices.size(), 3u);
  EXPECT_EQ(e.devices[1].min_free_bytes, 500 * kMiB);
  EXPECT_EQ(e.devices[0].max_temperature_c, 55);
  EXPECT_EQ(e.devices[1].max_temperature_c, kResourceUnknown);
  EXPECT_EQ(e.devices[0].pcie_links, (std::vector<PcieLink>{{kResourceUnknown, 16}}));
}

TEST_F(ResourceSamplerTest, StorageIsBoundedButAggregatesSeeEverySample) {
  SamplerOptions o;
  o.interval_ms = 1;
  o.use_nvml = false;
  o.max_samples = 3;
  o.paths = Paths(2048);
  ResourceSampler rs(o);
  ASSERT_TRUE(rs.Start().ok());
  ASSERT_TRUE(WaitFor([&] { return rs.samples_taken() >= 10; }));
  Write("meminfo", Meminfo(1024, 0, 0));  // lower than anything stored
  std::int64_t n = rs.samples_taken();
  ASSERT_TRUE(WaitFor([&] { return rs.samples_taken() >= n + 2; }));
  rs.Stop();
  EXPECT_EQ(rs.Samples().size(), 3u);
  EXPECT_EQ(rs.samples_dropped(), rs.samples_taken() - 3);
  EXPECT_EQ(rs.Summary().n_samples, rs.samples_taken());
  EXPECT_EQ(rs.Summary().min_host_available_bytes, kMiB);  // seen only after the cap
  IntervalStats st = rs.Intervals();
  EXPECT_EQ(st.count, rs.samples_taken() - 1);
  EXPECT_GT(st.median_ns, 0);  // over the stored samples
}

}  // namespace
}  // namespace lockstep
