// Resource sampler: host and GPU resource samples taken on a background thread while a request
// runs, the aggregates a bug report quotes (minimum free memory, peak temperature, SM clocks,
// PCIe links, sampling-interval median and maximum), and the free-memory resource guard.
//
// What one sample holds (DESIGN.md /trace/samples):
//   host  : MemAvailable and SwapTotal - SwapFree from /proc/meminfo, VmRSS from
//           /proc/self/status, process CPU time from CLOCK_PROCESS_CPUTIME_ID;
//   GPUs  : per device free/total memory, GPU temperature, SM clock, current PCIe generation and
//           width, read through NVML loaded with dlopen() at run time (no link-time dependency on
//           the driver, no nvml.h).
// Every quantity that could not be read is kResourceUnknown (-1), never 0: a missing
// /proc field, a missing NVML symbol (older drivers), a per-device NVML call that failed, or no
// NVML at all (then `devices` is empty and NvmlHandle::Open says why).
//
// Timestamps are CLOCK_MONOTONIC nanoseconds (the clock of the window trace), taken when a
// sample starts. Units: bytes, nanoseconds, degrees Celsius, MHz; PCIe width is in lanes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "lockstep/engine/status.h"

namespace lockstep {

// The value of every sample field that was not measured.
inline constexpr int kResourceUnknown = -1;

// ---- samples ----

// One GPU at one instant. Every field but `index` is kResourceUnknown when NVML could not
// provide it; the fields are independent (a failed temperature read leaves the clock valid).
struct DeviceSample {
  int index = kResourceUnknown;  // NVML device index (0-based, NVML's enumeration order)
  std::int64_t free_bytes = kResourceUnknown;   // nvmlDeviceGetMemoryInfo().free
  std::int64_t total_bytes = kResourceUnknown;  // nvmlDeviceGetMemoryInfo().total
  int temperature_c = kResourceUnknown;         // GPU core temperature (NVML_TEMPERATURE_GPU), C
  int sm_clock_mhz = kResourceUnknown;          // current SM clock (NVML_CLOCK_SM), MHz
  int pcie_gen = kResourceUnknown;              // current PCIe link generation (1..6)
  int pcie_width = kResourceUnknown;            // current PCIe link width, lanes (x1..x16)
};

// One sample of the host, this process and every GPU NVML enumerates.
struct ResourceSample {
  std::int64_t t_ns = kResourceUnknown;  // CLOCK_MONOTONIC ns when the sample started
  std::int64_t host_available_bytes = kResourceUnknown;  // MemAvailable (kB * 1024)
  std::int64_t swap_used_bytes = kResourceUnknown;       // SwapTotal - SwapFree; 0 without swap
  std::int64_t rss_bytes = kResourceUnknown;             // VmRSS of this process
  std::int64_t process_cpu_ns = kResourceUnknown;        // user + system CPU of all threads
  // How long taking this sample took (ns): the sampler's own cost, dominated by NVML calls
  // (each can take ~0.1-1 ms per device). Large values explain late samples.
  std::int64_t read_ns = kResourceUnknown;
  std::vector<DeviceSample> devices;  // ordered by index; empty without NVML
};

// Where the host fields come from. The defaults are the live files; tests point them at crafted
// files. An empty, missing or unreadable path leaves its fields unknown (no error: a container
// without /proc still gets GPU fields and CPU time).
struct ProcPaths {
  std::string meminfo = "/proc/meminfo";          // MemAvailable, SwapTotal, SwapFree
  std::string self_status = "/proc/self/status";  // VmRSS
};

// ---- NVML (the small ABI subset used here; nvml.h is deliberately not included) ----

namespace nvml {
struct Device;                 // opaque; NVML's `struct nvmlDevice_st`
using DeviceHandle = Device*;  // NVML's nvmlDevice_t
struct Memory {                // NVML's nvmlMemory_t (v1), bytes
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
inline constexpr int kSuccess = 0;         // NVML_SUCCESS; every nvmlReturn_t is an int
inline constexpr int kTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
inline constexpr int kClockSm = 1;         // NVML_CLOCK_SM
}  // namespace nvml

// The NVML entry points, as resolved by dlsym(). NvmlHandle::Open fills it from the driver's
// library; tests fill it with fakes (TEST_FromApi). `init`, `shutdown`, `device_count` and
// `handle_by_index` are required; every other pointer may be null (older drivers lack some), and
// the fields it would provide are then unknown.
struct NvmlApi {
  int (*init)() = nullptr;                                              // nvmlInit_v2 (or nvmlInit)
  int (*shutdown)() = nullptr;                                          // nvmlShutdown
  int (*device_count)(unsigned int*) = nullptr;                         // nvmlDeviceGetCount_v2
  int (*handle_by_index)(unsigned int, nvml::DeviceHandle*) = nullptr;  // ..GetHandleByIndex_v2
  int (*memory_info)(nvml::DeviceHandle, nvml::Memory*) = nullptr;      // nvmlDeviceGetMemoryInfo
  int (*temperature)(nvml::DeviceHandle, int, unsigned int*) = nullptr;  // ..GetTemperature
  int (*clock_info)(nvml::DeviceHandle, int, unsigned int*) = nullptr;   // ..GetClockInfo
  int (*pcie_gen)(nvml::DeviceHandle, unsigned int*) = nullptr;    // ..GetCurrPcieLinkGeneration
  int (*pcie_width)(nvml::DeviceHandle, unsigned int*) = nullptr;  // ..GetCurrPcieLinkWidth
  const char* (*error_string)(int) = nullptr;  // nvmlErrorString; only for messages
};

class NvmlHandle;
using NvmlHandlePtr = std::unique_ptr<NvmlHandle>;

// An initialised NVML session: the dlopen()ed library, nvmlInit done, device handles cached.
// The destructor calls nvmlShutdown and then dlclose (NVML counts inits, so other users in the
// process are unaffected).
// Absent NVML is "cannot", not "failed" (STYLE 17): Open returns nullptr plus a reason, and the
// GPU fields are recorded as unknown; no Status error is raised.
// Thread safety: immutable after Open; ReadDevices may be called from any thread concurrently
// (NVML itself is thread-safe).
class NvmlHandle {
 public:
  // Tries "libnvidia-ml.so.1", then "libnvidia-ml.so". Returns nullptr when no library loads, a
  // required symbol is missing, nvmlInit or nvmlDeviceGetCount fails; then *why_unavailable
  // (when non-null) says why, e.g. "libnvidia-ml.so.1 not found (dlopen: ...); ... (hint: no
  // NVIDIA driver on this machine; GPU fields are recorded as unknown)". On success
  // *why_unavailable is cleared. nvmlInit can take ~1 s on a GPU without persistence mode.
  static NvmlHandlePtr Open(std::string* why_unavailable = nullptr);
  // Open with an explicit list of library names tried in order (first that loads wins; a
  // library that loads but lacks a required symbol is reported and not retried with the next).
  static NvmlHandlePtr OpenLibrary(const std::vector<std::string>& names,
                                   std::string* why_unavailable);
  // A session over fake entry points (no dlopen; the destructor still calls api.shutdown).
  // Same failure contract as Open.
  static NvmlHandlePtr TEST_FromApi(const NvmlApi& api, std::string* why_unavailable);

  ~NvmlHandle();
  NvmlHandle(const NvmlHandle&) = delete;
  NvmlHandle& operator=(const NvmlHandle&) = delete;

  // Devices NVML enumerated at Open (fixed for the session; may be 0).
  int device_count() const { return static_cast<int>(devices_.size()); }
  // The library name that loaded ("libnvidia-ml.so.1"), or "fake" for TEST_FromApi.
  const std::string& library() const { return library_; }
  // Optional entry points this library lacks, e.g. {"nvmlDeviceGetCurrPcieLinkGeneration"}:
  // the fields they provide are unknown in every sample. Empty on a current driver.
  const std::vector<std::string>& missing_symbols() const { return missing_symbols_; }

  // One DeviceSample per device, in index order. A call that fails leaves only its own fields
  // unknown; a device whose handle could not be obtained has every field but `index` unknown.
  std::vector<DeviceSample> ReadDevices() const;

 private:
  NvmlHandle() = default;
  // Runs init + count + handles on api_; on failure returns false with *why set.
  bool Init(std::string* why);

  NvmlApi api_;
  void* lib_ = nullptr;  // dlopen handle; null for fakes
  bool initialised_ = false;
  std::string library_;
  std::vector<std::string> missing_symbols_;
  std::vector<nvml::DeviceHandle> devices_;  // null where nvmlDeviceGetHandleByIndex failed
};

// ---- reading one sample (no thread) ----

// Parses /proc/meminfo-style text ("Key:   <n> kB" lines) into host_available_bytes and
// swap_used_bytes of *out (other fields untouched). Unknown keys, malformed lines, non-numeric
// or overflowing values are ignored, so a missing or garbled field is unknown. Values with a
// "kB" unit are multiplied by 1024 (the kernel's kB is KiB); swap used is SwapTotal - SwapFree
// only when both are known and SwapFree <= SwapTotal. Exposed for tests.
void ParseMeminfo(std::string_view text, ResourceSample* out);
// Parses /proc/<pid>/status-style text for VmRSS into out->rss_bytes (unknown when absent, e.g.
// for kernel threads). Exposed for tests.
void ParseProcStatus(std::string_view text, ResourceSample* out);

// Takes one sample now: t_ns, host fields from `paths`, process CPU time, and one DeviceSample
// per NVML device when `nvml` is non-null (borrowed for the call; null = no GPU fields).
// Never fails: whatever cannot be read is unknown. Thread-safe (reads files, no shared state).
ResourceSample ReadResourceSample(const NvmlHandle* nvml, const ProcPaths& paths = {});

// ---- aggregates ----

// Gaps between consecutive sample timestamps (the seed quotes median ~100.4 ms, max ~111.6 ms
// at a 100 ms interval). `count` is the number of gaps: 0 with fewer than two samples (a count
// of zero is measured, so it is 0, not unknown), and the durations are kResourceUnknown then. The
// median of an even count is the mean of the two middle gaps (rounded down).
struct IntervalStats {
  std::int64_t count = 0;
  std::int64_t min_ns = kResourceUnknown;
  std::int64_t median_ns = kResourceUnknown;
  std::int64_t max_ns = kResourceUnknown;
};
// Intervals over samples in the given order (the sampler's order is time order).
IntervalStats ComputeIntervals(std::span<const ResourceSample> samples);

// A PCIe link state observed at least once: generation and width (either may be unknown when
// only the other was read; both unknown is never recorded).
struct PcieLink {
  int gen = kResourceUnknown;
  int width = kResourceUnknown;
  friend auto operator<=>(const PcieLink&, const PcieLink&) = default;
};

// Extremes of one GPU over all samples. Each value is over the samples where the field was
// known; kResourceUnknown when it never was.
struct DeviceExtremes {
  int index = kResourceUnknown;
  std::int64_t n_samples = 0;  // samples that listed this device
  std::int64_t min_free_bytes = kResourceUnknown;
  std::int64_t total_bytes = kResourceUnknown;  // last known total
  int max_temperature_c = kResourceUnknown;
  int min_sm_clock_mhz = kResourceUnknown;
  int max_sm_clock_mhz = kResourceUnknown;
  std::vector<PcieLink> pcie_links;  // distinct links seen, sorted (gen, width)
};

// What a report quotes about a run's resources ("minimum sampled free GPU memory 1600 MiB; peak
// temperature 63 C; host available above 100 GiB; all GPUs at PCIe Gen4 x16; SM clock 2520 MHz").
// Every extreme is over the samples where the field was known; kResourceUnknown when never.
struct Extremes {
  std::int64_t n_samples = 0;
  std::int64_t first_t_ns = kResourceUnknown;  // earliest known t_ns
  std::int64_t last_t_ns = kResourceUnknown;   // latest known t_ns
  std::int64_t min_host_available_bytes = kResourceUnknown;
  std::int64_t max_swap_used_bytes = kResourceUnknown;
  std::int64_t max_rss_bytes = kResourceUnknown;
  std::vector<DeviceExtremes> devices;  // sorted by index; every index ever seen
  // Over all devices together, for one-line summaries.
  int min_sm_clock_mhz = kResourceUnknown;
  int max_sm_clock_mhz = kResourceUnknown;
  std::vector<PcieLink> pcie_links;  // distinct links seen on any device, sorted

  // Folds one sample in; the result does not depend on the order samples are added.
  void Add(const ResourceSample& s);
};
Extremes Summarize(std::span<const ResourceSample> samples);

// ---- resource guard ----

// The guard's decision for one sample: where free memory was lowest and how low.
struct GuardTrip {
  std::int64_t t_ns = kResourceUnknown;        // the sample's timestamp (CLOCK_MONOTONIC ns)
  std::int64_t free_bytes = kResourceUnknown;  // free memory that fell below the threshold
  std::string source;                          // "host" or "gpu<index>", e.g. "gpu0"
};

// Free memory of a sample as the guard sees it: the minimum free_bytes over devices when any
// device reports it (ties: lowest index), else host_available_bytes, else nullopt (unknown).
// The returned GuardTrip carries the value and source whether or not it is below anything.
std::optional<GuardTrip> GuardFreeMemory(const ResourceSample& s);
// The trip for `s` under a threshold of `min_free_mib` MiB (1 MiB = 1048576 bytes): set when
// the guard's free memory is known and strictly below the threshold; nullopt otherwise,
// including min_free_mib < 0 (guard off) and unknown free memory.
std::optional<GuardTrip> EvaluateGuard(const ResourceSample& s, std::int64_t min_free_mib);

// ---- the sampler thread ----

struct SamplerOptions {
  int interval_ms = 100;                 // --sample-ms; 1 .. 3600000
  std::int64_t guard_min_free_mib = -1;  // --guard-min-free-mib; -1 = off, else >= 0
  ProcPaths paths;                       // host field sources (tests: crafted files)
  bool use_nvml = true;                  // open NVML at Start() unless a handle was given
  // Bounded memory: samples beyond this many are not stored (Samples() keeps the first
  // max_samples, samples_dropped() counts the rest), but Summary(), the guard and the interval
  // count/min/max still cover every sample taken. 1,000,000 samples at 100 ms is ~28 hours;
  // one sample is ~120 B plus ~48 B per GPU (~300 MB at the cap with 4 GPUs). >= 1.
  std::size_t max_samples = 1'000'000;
};

// Samples resources every interval_ms on its own thread.
//
// Start() takes the first sample on the calling thread (so the guard has judged the starting
// state before Start returns) and launches the thread, which samples on a fixed CLOCK_MONOTONIC
// schedule t0 + k * interval: a late sample does not shift the later ones, and slots missed
// entirely (a stall longer than an interval) are skipped, not caught up in a burst.
//
// Resource guard: when guard_min_free_mib >= 0 and a sample's free memory (GuardFreeMemory) is
// below it, the sampler latches guard_tripped() and records the first GuardTrip. The sampler
// never stops the request itself: the engine polls guard_tripped() (one atomic load)
// between windows, ends the request cleanly with the recorded reason and keeps partial output.
// Sampling continues after a trip, so the report shows how low memory went.
//
// Thread safety: Start(), Stop() and the destructor must be called from one owning thread.
// Every const accessor may be called from any thread at any time, concurrently with the
// sampler thread: samples and aggregates are guarded by mu_, the trip flag is an atomic.
class ResourceSampler {
 public:
  // Options are validated by Start(). NVML is opened by Start() (when opts.use_nvml).
  explicit ResourceSampler(SamplerOptions opts);
  // Uses `nvml` (ownership taken; may be null = no GPU fields) instead of opening NVML; tests
  // pass a TEST_FromApi fake here.
  ResourceSampler(SamplerOptions opts, NvmlHandlePtr nvml);
  ~ResourceSampler();  // Stop()
  ResourceSampler(const ResourceSampler&) = delete;
  ResourceSampler& operator=(const ResourceSampler&) = delete;

  // Validates options, opens NVML if asked, takes the first sample and starts the thread.
  // Errors: kInvalidArgument for bad options or a second Start(); kRuntime when the thread
  // cannot be created. NVML being unavailable is not an error (nvml_unavailable_reason()).
  Status Start();
  // Stops the thread (wakes it at once; waits for a sample in progress) and joins it.
  // Idempotent; a no-op before Start(). Samples and aggregates stay readable afterwards.
  void Stop();

  // True once any sample was below the guard threshold; never reset. Lock-free (one atomic
  // load, acquire): cheap enough to poll every window.
  bool guard_tripped() const { return guard_tripped_.load(std::memory_order_acquire); }
  // The first trip (nullopt until guard_tripped()). Takes mu_.
  std::optional<GuardTrip> guard_trip() const;
  // Samples where the guard was on but free memory was unknown (neither GPU nor host known):
  // non-zero means the guard was blind for that long. Takes mu_.
  std::int64_t guard_unknown_samples() const;

  // Copy of the stored samples, in time order (at most max_samples). Takes mu_ for the copy.
  std::vector<ResourceSample> Samples() const;
  // Stored samples from index `first` on (empty when first >= n_stored): lets a writer stream
  // samples incrementally. Takes mu_.
  std::vector<ResourceSample> SamplesFrom(std::size_t first) const;
  // Samples taken (stored + dropped), and those dropped beyond max_samples. Each takes mu_.
  std::int64_t samples_taken() const;
  std::int64_t samples_dropped() const;
  // Interval statistics: count/min/max over every sample taken, median over the stored ones
  // (exact until the cap is reached; unknown if fewer than two are stored). Takes mu_ and
  // copies the stored gaps: O(n) for the median.
  IntervalStats Intervals() const;
  // Extremes over every sample taken (kept incrementally, unaffected by the cap). Takes mu_.
  Extremes Summary() const;
  // Why GPU fields are unknown: empty when NVML is in use; "disabled (use_nvml = false)";
  // or NvmlHandle::Open's reason. Set by Start() (empty before). Takes mu_.
  std::string nvml_unavailable_reason() const;

  const SamplerOptions& options() const { return opts_; }  // immutable after construction

 private:
  void Run(std::chrono::steady_clock::time_point t0);  // the sampler thread
  void Record(ResourceSample s);  // stores s, updates aggregates and the guard; takes mu_

  const SamplerOptions opts_;
  NvmlHandlePtr nvml_;  // set before the thread starts, read-only while it runs
  bool nvml_injected_ = false;
  bool started_ = false;  // owning thread only
  std::thread thread_;    // owning thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;                 // stop_ was set
  bool stop_ = false;                          // GUARDED_BY(mu_)
  std::vector<ResourceSample> samples_;        // GUARDED_BY(mu_); at most opts_.max_samples
  std::int64_t n_taken_ = 0;                   // GUARDED_BY(mu_)
  std::int64_t last_t_ns_ = kResourceUnknown;  // GUARDED_BY(mu_); previous sample, for gaps
  IntervalStats gaps_all_;                     // GUARDED_BY(mu_); count/min/max over every gap
  Extremes extremes_;                          // GUARDED_BY(mu_)
  std::optional<GuardTrip> trip_;              // GUARDED_BY(mu_); written once, before the flag
  std::int64_t guard_unknown_ = 0;             // GUARDED_BY(mu_)
  std::string nvml_reason_;                    // GUARDED_BY(mu_)
  std::atomic<bool> guard_tripped_{false};     // set (release) after trip_ is stored
};

}  // namespace lockstep
